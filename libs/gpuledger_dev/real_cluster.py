"""The local stack on a real control plane: kube-apiserver, kube-scheduler with gpuledger's
extender, kube-controller-manager, etcd and kwok (built from Go modules on first use), and a
simulated kubelet per kwok node that plays the device manager's side for the plugin shim.

Every demo pod goes the real way: created through the API, scheduled by kube-scheduler (our
extender filters and binds), admitted by the node's kubelet (Allocate from the plugin shim), and
turned Running by kwok. A pod that cannot be placed is Pending with kube-scheduler's
FailedScheduling event, which carries the extender's reason.

In DRA mode (``mode="dra"``) the nodes publish ResourceSlices instead, the demo pods ask for their
cards through ResourceClaims of the DeviceClasses in deploy/kubernetes/dra, and each simulated
kubelet also plays kubelet's DRA side: the DRA plugin registers with it, and a pod runs only once
NodePrepareResources wrote its claims' CDI specs (their environment is what the pod's containers
get).

With ``real_node`` one node of the fleet is a real one instead (``gpuledger_dev.realnode``):
kubelet v1.36 and containerd run its pods as containers of the workload image, its cards' device
nodes are made under the run directory (the plugin answers with them), and what a container got is
what it printed itself: its environment and its ``/dev``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import yaml

from gpuledger_dev.controlplane.api import ApiError, KubeApi
from gpuledger_dev.controlplane.cluster import KWOK_NODE_LABEL, ControlPlane, ControlPlaneError, scheduler_config
from gpuledger_dev.extender_pki import ExtenderPki
from gpuledger_dev.fake_cluster import Outcome
from gpuledger_dev.fake_nvml.model import cards_of
from gpuledger_dev.fleet import Fleet, FleetNode
from gpuledger_dev.fleet_script import node_script
from gpuledger_dev.kwok_dra import KwokDraSettings
from gpuledger_dev.kwok_kubelet import KwokKubelet
from gpuledger_dev.realnode.devices import make_device_nodes, make_mig_caps
from gpuledger_dev.realnode.images import WORKLOAD_IMAGE
from gpuledger_dev.realnode.node import RealNode
from gpuledger_dev.realnode.residue import DEVICE_PLUGIN_DIR

NAMESPACE = "demo"
TOOLKIT_SPEC = "gpuledger-dev-toolkit.json"  # the real node's stand-in for NVIDIA's CDI spec
CDI_ENV_PREFIX = "GPULEDGER_DEV_CDI_"
TOOLKIT_ENV = "GPULEDGER_DEV_DRIVER"  # the stand-in's own edits: the driver's libraries and hooks
MIG_ENV = f"{CDI_ENV_PREFIX}MIG"  # set by the stand-in's MIG devices (those that existed at its start)
SCHEDULER = "gpuledger-scheduler"
DEFAULT_CAPACITY = {"cpu": "64", "memory": "512Gi", "pods": "110"}
OUTCOME_S = 60.0
DRIVER = "gpu.gpuledger.io"
DEVICE_CLASSES = Path("deploy") / "kubernetes" / "dra" / "deviceclass.yaml"
ALLOCATION_GATE = Path("deploy") / "kubernetes" / "dra" / "allocation-gate.yaml"
ALLOCATION_LABEL = "gpuledger.io/allocation"  # a namespace labelled "ledger" gets mode C's gate
DRA_ALLOCATIONS = ("ledger", "scheduler")
UNSCHEDULABLE = ("FailedScheduling", "GpuledgerUnschedulable")  # kube-scheduler's, and mode C's for a gated pod
MODES = ("classic", "dra")  # what dev up offers
BOTH = "both"  # classic and DRA on every node: the same nodes for benchmarks of the two paths


def node_object(name: str, cpu_milli: int = 0, memory_mib: int = 0) -> dict[str, Any]:
    """A kwok Node with its cpu, memory and pods capacity set at creation (kwok keeps them)."""
    capacity = dict(DEFAULT_CAPACITY)
    if cpu_milli:
        capacity["cpu"] = f"{cpu_milli}m"
    if memory_mib:
        capacity["memory"] = f"{memory_mib}Mi"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, KWOK_NODE_LABEL[0]: KWOK_NODE_LABEL[1]},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


class RealCluster:
    def __init__(
        self,
        run_dir: Path,
        fleet: Fleet,
        mode: str = "classic",
        real_node: str = "",
        topology_policy: str = "none",
        dra_allocation: str = "ledger",
    ) -> None:
        if mode not in (*MODES, BOTH):
            raise ValueError(f"mode must be one of {'|'.join((*MODES, BOTH))}, got {mode!r}")
        if dra_allocation not in DRA_ALLOCATIONS:
            raise ValueError(f"dra_allocation must be one of {'|'.join(DRA_ALLOCATIONS)}, got {dra_allocation!r}")
        # DRA: "ledger" gates the pods of the stack's namespace, whose claims the ledger allocates
        # (mode C, docs/dra-mode-c.md); "scheduler" leaves allocation to kube-scheduler (mode B)
        self.dra_allocation = dra_allocation
        self.run_dir, self.fleet, self.mode = run_dir, fleet, mode
        self.nodes = [str(n.node.name) for n in fleet.nodes]
        if real_node and real_node not in self.nodes:
            raise ValueError(f"the real node {real_node!r} is not in the fleet ({', '.join(self.nodes)})")
        self.real_node, self.topology_policy = real_node, topology_policy
        self.real: RealNode | None = None
        self.control_plane = ControlPlane(run_dir / "cp")
        self.kubelets: dict[str, KwokKubelet] = {}
        self.extender = ""
        self.api: KubeApi | None = None

    @property
    def dra(self) -> bool:
        """The nodes publish ResourceSlices and run the DRA plugin."""
        return self.mode in ("dra", BOTH)

    @property
    def classic(self) -> bool:
        """The nodes run the device plugin."""
        return self.mode in ("classic", BOTH)

    def _real(self, node: str) -> RealNode | None:
        """The started real node, if ``node`` is it."""
        return self.real if node == self.real_node else None

    def plugin_dir(self, node: str) -> Path:
        if node == self.real_node:
            return DEVICE_PLUGIN_DIR  # kubelet's, whatever its root directory
        return self.run_dir / node / "device-plugins"

    def pod_resources(self, node: str) -> Path:
        if (real := self._real(node)) is not None:
            return real.pod_resources_socket
        return self.run_dir / node / "pod-resources.sock"

    def device_dir(self, node: str) -> Path:
        """The real node's cards' device nodes (``/dev`` in production)."""
        return self.run_dir / node / "dev"

    def plugin_flags(self, node: str) -> list[str]:
        """What the real node's plugin adds to its flags: device nodes in every answer, from
        device_dir, and the cards as CDI devices, which containerd resolves with the stand-in for
        the NVIDIA container toolkit's spec (``toolkit_spec``)."""
        if node != self.real_node:
            return []
        device = ["--device-specs", "--device-dir", str(self.device_dir(node))]
        cdi = ["--device-list-strategy", "volume-mounts,cdi-cri", "--cdi-spec-dirs", str(self.cdi_dir(node))]
        return [*device, *cdi, "--mig-minors-file", str(self.mig_minors_file(node))]

    def dra_plugin_flags(self, node: str) -> list[str]:
        """What the real node's DRA plugin adds: its CDI specs name the device nodes in device_dir,
        the MIG capability nodes among them."""
        if node != self.real_node:
            return []
        return ["--device-dir", str(self.device_dir(node)), "--mig-minors-file", str(self.mig_minors_file(node))]

    def mig_minors_file(self, node: str) -> Path:
        """The real node's stand-in for the driver's ``/proc/driver/nvidia-caps/mig-minors``."""
        return self.run_dir / node / "mig-minors"

    def registry_dir(self, node: str) -> Path:
        """DRA mode: kubelet's plugins_registry of the node."""
        if (real := self._real(node)) is not None:
            return real.plugins_registry_dir
        return self.run_dir / node / "reg"

    def dra_plugin_dir(self, node: str) -> Path:
        """DRA mode: where the node's DRA plugin serves its socket (``<dir>/<driver>/dra.sock``)."""
        if (real := self._real(node)) is not None:
            return real.plugins_dir
        return self.run_dir / node / "plugins"

    def cdi_dir(self, node: str) -> Path:
        """DRA mode: where the DRA plugin writes CDI specs (the real node's runtime reads them there)."""
        if (real := self._real(node)) is not None:
            return real.cdi_dir
        return self.run_dir / node / "cdi"

    @property
    def kubeconfig(self) -> Path:
        assert self.control_plane.admin_kubeconfig is not None
        return self.control_plane.admin_kubeconfig

    async def start(self) -> Path:
        """Build (if needed) and start the control plane, create the nodes, start their kubelets."""
        await asyncio.to_thread(self.control_plane.start)
        assert self.control_plane.access is not None
        self.api = await KubeApi(self.control_plane.access).__aenter__()
        labels = {ALLOCATION_LABEL: "ledger"} if self.dra and self.dra_allocation == "ledger" else {}
        await self.api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE, "labels": labels}})
        for member in self.fleet.nodes:
            node = str(member.node.name)
            if node == self.real_node:
                await self._start_real(member)
                continue
            await self.api.create("/api/v1/nodes", node_object(node, member.node.cpu_milli, member.node.memory_mib))
            self.plugin_dir(node).mkdir(parents=True, exist_ok=True)
            dra = None
            if self.dra:
                for path in (self.registry_dir(node), self.dra_plugin_dir(node), self.cdi_dir(node)):
                    path.mkdir(parents=True, exist_ok=True)
                # kubelet deletes the node's ResourceSlices at every start (the real node's does)
                dra = KwokDraSettings(str(self.registry_dir(node)), str(self.cdi_dir(node)), wipe_slices=True)
            access = self.control_plane.access
            kubelet = KwokKubelet(node, self.plugin_dir(node), self.pod_resources(node), access, dra=dra)
            await kubelet.__aenter__()
            self.kubelets[node] = kubelet
        if self.dra:
            for body in yaml.safe_load_all(find_deploy(DEVICE_CLASSES).read_text()):
                await self.api.create("/apis/resource.k8s.io/v1/deviceclasses", body)
            for body in yaml.safe_load_all(find_deploy(ALLOCATION_GATE).read_text()):  # mode C's gate, as shipped
                kind = "mutatingadmissionpolicies" if body["kind"] == "MutatingAdmissionPolicy" else (
                    "mutatingadmissionpolicybindings")  # fmt: skip
                await self.api.create(f"/apis/admissionregistration.k8s.io/v1/{kind}", body)
        return self.kubeconfig

    async def _start_real(self, member: FleetNode) -> None:
        node = str(member.node.name)
        minors = [card.minor if card.minor is not None else card.index for card in member.node.cards]
        make_device_nodes(self.device_dir(node), minors)
        make_mig_caps(self.device_dir(node), self.mig_minors_file(node), minors)
        self.real = RealNode(
            self.control_plane,
            name=node,
            topology_manager_policy=self.topology_policy,
            workdir=self.run_dir / "real-node",
        )
        await asyncio.to_thread(self.real.start)
        toolkit_spec(self.real.cdi_dir, self.fleet, member)

    async def use_extender(self, url: str, pki: ExtenderPki) -> None:
        """Start kube-scheduler with gpuledger's configuration from deploy/, pointed at ``url``,
        presenting its client certificate from ``pki``."""
        self.extender = url
        config = scheduler_config(url, pki.scheduler_tls())
        await asyncio.to_thread(self.control_plane.start_scheduler, "kube-scheduler", config)

    async def stop(self) -> None:
        for kubelet in self.kubelets.values():
            await kubelet.__aexit__(None, None, None)
        if self.real is not None:
            await asyncio.to_thread(self.real.stop)
        if self.api is not None:
            await self.api.__aexit__(None, None, None)
        await asyncio.to_thread(self.control_plane.stop)

    async def devices_ready(self) -> bool:
        """Every kubelet has the plugin registered and wrote its devices into the Node's status (a
        node whose cards are all in MIG mode has no gpuledger.io/gpu; in DRA mode: the DRA plugin
        registered and the node's ResourceSlices published)."""
        assert self.api is not None
        if self.dra:
            if not all(k.dra is not None and DRIVER in k.dra.plugins for k in self.kubelets.values()):
                return False
            found = await self.api.get("/apis/resource.k8s.io/v1/resourceslices")
            if not {s["spec"].get("nodeName") for s in found["items"]} >= set(self.nodes):
                return False
            if self.mode == "dra":
                return True
        if not all(k.registered and any(e.devices for e in k.device_manager.endpoints.values())
                   for k in self.kubelets.values()):  # fmt: skip
            return False
        for node in self.nodes:  # whole cards as gpuledger.io/gpu, MIG cards as gpuledger.io/mig (and per profile)
            found = await self.api.get(f"/api/v1/nodes/{node}")
            allocatable = found.get("status", {}).get("allocatable", {})
            if not any(int(allocatable.get(r, "0")) for r in ("gpuledger.io/gpu", "gpuledger.io/mig")):
                return False
        return True

    async def pod_uid(self, namespace: str, name: str) -> str:
        assert self.api is not None
        return str((await self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}"))["metadata"]["uid"])

    async def run(self, pod: dict[str, Any], nodes: list[str] | None = None) -> Outcome:
        """Create ``pod`` (kept to ``nodes`` by node affinity if given) and wait until it runs or is refused."""
        assert self.api is not None
        body = dict(pod)
        if nodes:
            body["spec"] = {**pod["spec"], "affinity": _on_nodes(nodes)}
        if self.real_node:
            body["spec"] = reporting(body["spec"])
        namespace = body["metadata"].get("namespace", NAMESPACE)
        created = await self.api.create(f"/api/v1/namespaces/{namespace}/pods", body)
        return await self.outcome(namespace, created["metadata"]["name"], created["metadata"]["uid"])

    async def outcome(self, namespace: str, name: str, uid: str, timeout: float = OUTCOME_S) -> Outcome:
        """Running (with what its containers got), refused by kubelet, or Pending with the scheduler's reason."""
        assert self.api is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pod = await self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            status, node = pod.get("status", {}), pod.get("spec", {}).get("nodeName", "")
            if status.get("phase") == "Running" and node == self.real_node:
                return await self._reported(namespace, name, node, pod)
            if status.get("phase") == "Running":
                return Outcome(name, node, self._envs(node, pod, uid))
            if status.get("phase") == "Failed":
                return Outcome(name, node, pending=f"kubelet refused it: {status.get('message', '')}")
            why = await self.scheduling_failure(namespace, name, uid)
            if why and not node:
                return Outcome(name, pending=why)
            await asyncio.sleep(0.1)
        raise TimeoutError(f"pod {namespace}/{name} neither ran nor was refused within {timeout:g}s")

    def _envs(self, node: str, pod: dict[str, Any], uid: str) -> dict[str, dict[str, str]]:
        """What each container got: its Allocate answer's environment, or in DRA mode the
        environment of the CDI specs of its claims' devices."""
        kubelet = self.kubelets[node]
        if kubelet.dra is None or not pod["spec"].get("resourceClaims"):
            return kubelet.container_envs(uid)
        envs = {}
        for container in pod["spec"]["containers"]:
            ids = set(kubelet.dra.cdi_ids(pod, container["name"]))
            envs[container["name"]] = cdi_env(self.cdi_dir(node), ids)
        return envs

    async def _reported(self, namespace: str, name: str, node: str, pod: dict[str, Any]) -> Outcome:
        """What each container of a pod on the real node printed of itself (``reporting``)."""
        env: dict[str, dict[str, str]] = {}
        dev: dict[str, tuple[str, ...]] = {}
        spec = pod["spec"]
        for container in (*spec.get("initContainers", []), *spec["containers"]):
            report = await self._report(namespace, name, container["name"])
            env[container["name"]], dev[container["name"]] = report
        return Outcome(name, node, env, dev=dev)

    async def _report(self, namespace: str, name: str, container: str) -> tuple[dict[str, str], tuple[str, ...]]:
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/log?container={container}"
        deadline = time.monotonic() + OUTCOME_S
        while time.monotonic() < deadline:
            with contextlib.suppress(ControlPlaneError):
                text = await asyncio.to_thread(self.control_plane.request, "GET", path)
                if isinstance(text, str) and REPORT_END in text.splitlines():
                    return parse_report(text)
            await asyncio.sleep(0.2)
        raise TimeoutError(f"container {container} of {namespace}/{name} printed no report within {OUTCOME_S:g}s")

    async def scheduling_failure(self, namespace: str, name: str, uid: str) -> str:
        """The message of the pod's latest FailedScheduling event, or in DRA mode C of the ledger's
        GpuledgerUnschedulable (its pod is gated: kube-scheduler says nothing), '' if none."""
        assert self.api is not None
        events = await self.api.get(f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"involvedObject.uid={uid}")
        found = [e for e in events.get("items", []) if e.get("reason") in UNSCHEDULABLE]
        items = sorted(found, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        return str(items[-1].get("message", "")) if items else ""

    async def delete(self, namespace: str, name: str) -> None:
        assert self.api is not None
        try:
            await self.api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiError as err:
            if err.status != 404:
                raise


REPORT_ENV, REPORT_DEV, REPORT_END = "== env", "== dev", "== end"
# A container's report of itself: its environment, its /dev (and the MIG capability nodes in
# /dev/nvidia-caps) and the devices NVIDIA's volume-mounts name (under
# /var/run/nvidia-container-devices), then it waits to be deleted (an init container ends).
REPORT = (
    f"echo '{REPORT_ENV}'; env; echo '{REPORT_DEV}'; ls /dev; ls /dev/nvidia-caps 2>/dev/null "
    "| sed 's|^|nvidia-caps/|'; ls /var/run/nvidia-container-devices 2>/dev/null "
    f"| sed 's|^|nvidia-container-devices/|'; echo '{REPORT_END}'"
)


STAY = "; trap 'exit 0' TERM; while true; do sleep 1; done"


def reporting(spec: dict[str, Any]) -> dict[str, Any]:
    """The pod spec with every container running the workload image built here and reporting
    what it got; the app containers then wait until the pod is deleted, and end at once on its
    SIGTERM, as a well-behaved workload does (a shell that ``exec``s sleep as PID 1 ignores it,
    and the pod's cards would be held for its whole grace period)."""

    def container(found: dict[str, Any], then: str) -> dict[str, Any]:
        return {**found, "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never", "command": ["sh", "-c", REPORT + then]}

    changed = {**spec, "containers": [container(c, STAY) for c in spec["containers"]]}
    if spec.get("initContainers"):
        changed["initContainers"] = [container(c, "") for c in spec["initContainers"]]
    return changed


def parse_report(text: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """The environment and the /dev entries a container printed (``REPORT``)."""
    env: dict[str, str] = {}
    dev: list[str] = []
    section = ""
    for line in text.splitlines():
        if line in (REPORT_ENV, REPORT_DEV, REPORT_END):
            section = line
        elif section == REPORT_ENV and "=" in line:
            key, value = line.split("=", 1)
            env[key] = value
        elif section == REPORT_DEV and line:
            dev.append(line)
    return env, tuple(dev)


def _on_nodes(nodes: list[str]) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": list(nodes)}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def find_deploy(relative: Path) -> Path:
    """A file of deploy/ in the checkout (``relative`` to it): the first found from the working
    directory upwards, or beside this source tree (tox and dev.py run from the checkout)."""
    for directory in (Path.cwd(), *Path.cwd().parents, *Path(__file__).resolve().parents):
        if (directory / relative).is_file():
            return directory / relative
    raise ControlPlaneError(f"cannot find {relative} from {Path.cwd()}: run from the gpuledger checkout")


def toolkit_spec(cdi_dir: Path, fleet: Fleet, member: FleetNode) -> Path:
    """The real node's stand-in for the spec NVIDIA's container toolkit writes (``nvidia-ctk cdi
    generate --device-name-strategy uuid``): kind ``nvidia.com/gpu``, a device per card named by
    its UUID and per MIG device that exists as the node starts (an operator's layout in the fleet
    file) named by its MIG UUID. Where the toolkit's devices add the device nodes (the plugin's
    device specs do that here), each card sets ``GPULEDGER_DEV_CDI_<minor>`` to its UUID and each
    MIG device ``GPULEDGER_DEV_CDI_MIG`` to its, so a container's environment shows which CDI
    devices the runtime applied; where the toolkit's own edits add the driver's libraries and
    hooks, the stand-in sets ``GPULEDGER_DEV_DRIVER`` to its file name."""
    devices = []
    for card in member.node.cards:
        minor = card.minor if card.minor is not None else card.index
        devices.append({"name": card.uuid, "containerEdits": {"env": [f"{CDI_ENV_PREFIX}{minor}={card.uuid}"]}})
    for fake in cards_of(node_script(fleet, member)):
        for mig in fake.mig.devices() if fake.mig is not None else ():
            devices.append({"name": mig.uuid, "containerEdits": {"env": [f"{MIG_ENV}={mig.uuid}"]}})
    edits = {"env": [f"{TOOLKIT_ENV}={TOOLKIT_SPEC}"]}
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "containerEdits": edits, "devices": devices}
    path = cdi_dir / TOOLKIT_SPEC
    path.write_text(json.dumps(spec, indent=1))
    return path


def cdi_env(cdi_dir: Path, ids: set[str]) -> dict[str, str]:
    """The environment a runtime gives a container with the CDI devices ``ids`` (``kind=name``):
    the edits of every spec that holds one of them, and of those devices."""
    env: dict[str, str] = {}
    for path in sorted(cdi_dir.glob("*.json")):
        spec = json.loads(path.read_text())
        mine = [d for d in spec.get("devices", []) if f"{spec.get('kind')}={d.get('name')}" in ids]
        if not mine:
            continue
        for edits in (spec.get("containerEdits") or {}, *(d.get("containerEdits") or {} for d in mine)):
            env.update(e.split("=", 1) for e in edits.get("env", []) if "=" in e)
    return env
