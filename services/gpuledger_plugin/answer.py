"""What a container gets: its Allocate answer, built from its grant (pure).

The device list (``AnswerPolicy.strategies``, the plugin's ``device_list_strategy``):
- ``volume-mounts`` (default): one mount of the host's ``/dev/null`` at
  ``/var/run/nvidia-container-devices/<card uuid>`` per card, and ``NVIDIA_VISIBLE_DEVICES`` set to
  that directory (as NVIDIA's device plugin does). The NVIDIA container toolkit reads the list from
  mounts whose source is ``/dev/null`` when ``accept-nvidia-visible-devices-as-volume-mounts`` is
  true; a pod can only make such a mount with a hostPath volume, which pod security forbids;
- ``cdi-cri``: the CDI names ``<cdi_kind>=<card uuid>`` in the answer's ``cdi_devices``;
- ``cdi-annotations``: the same names in one ``cdi.k8s.io/gpuledger_<digest>`` annotation;
- ``env``: ``NVIDIA_VISIBLE_DEVICES`` = the card UUIDs. A pod can set that variable itself: it is
  safe only where the toolkit ignores it for unprivileged containers.

Environment (always):
- ``CUDA_VISIBLE_DEVICES``: the card UUIDs in grant order, so that CUDA ordinal i is the grant's
  i-th card whatever order the runtime or an MPS server enumerates them in;
- ``GPULEDGER_ALLOCATION_ID``, ``GPULEDGER_CONTAINER``: which ledger entry this is;
- ``GPULEDGER_MEMORY_LIMIT_MIB``, ``GPULEDGER_CORE_LIMIT_PERCENT``: per card, comma-separated, the
  i-th entry for CUDA ordinal i;
- ``GPULEDGER_EXCLUSIVE``: ``true`` when the cards are the container's alone.

With MPS isolation (NVIDIA's MPS documentation, "Environment Variables"):
- ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: ``<ordinal>=<MiB>M`` per card, comma-separated, by the
  container's CUDA ordinal (``0=2048M,1=2048M``), not by UUID: NVIDIA's device plugin moved from
  UUIDs to device indexes because limits given by UUID were not applied;
- ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: one whole percent for every card (the floor of the
  smallest grant, at least 1); left out when the grant holds no compute share (memory only);
- ``CUDA_MPS_PIPE_DIRECTORY`` with the daemon's pipe directory mounted from the host, and the
  daemon's shared-memory directory mounted at ``/dev/shm`` (where the host one is set).
``CUDA_MPS_LOG_DIRECTORY`` is the control daemon's setting, not a client's: it is not set.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.model import Allocation, CardShare, Grant, Isolation, Node

NVIDIA_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/gpuledger_"
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")  # containerd's and CRI-O's defaults
DEVICE_LIST_MOUNT_ROOT = "/var/run/nvidia-container-devices"  # the toolkit's DeviceListAsVolumeMountsRoot
DEVICE_LIST_MOUNT_SOURCE = "/dev/null"  # the only mount source the toolkit takes as a device request
MPS_SHM_DIR = "/dev/shm"
STRATEGIES = ("volume-mounts", "env", "cdi-cri", "cdi-annotations")
DEFAULT_STRATEGIES = ("volume-mounts",)


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class Answer:
    envs: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceNode, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AnswerPolicy:
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    cdi_kind: str = "nvidia.com/gpu"
    device_specs: bool = False
    device_dir: str = "/dev"  # where the device nodes are on the host; containers always see /dev
    default_isolation: Isolation = Isolation.NONE
    mps_pipe_dir: str = "/tmp/nvidia-mps"
    mps_host_pipe_dir: str = "/run/nvidia/mps"
    mps_host_shm_dir: str = ""  # the MPS daemon's /dev/shm on the host; empty: not mounted
    cdi_spec_dirs: tuple[str, ...] = CDI_SPEC_DIRS  # where the runtime reads CDI specs (cdi_specs.py)

    def __post_init__(self) -> None:
        unknown = [s for s in self.strategies if s not in STRATEGIES]
        if unknown or not self.strategies:
            raise InvalidArgument(
                "device_list_strategy",
                f"strategies {list(self.strategies)}: "
                f"{'unknown ' + ', '.join(map(repr, unknown)) if unknown else 'none given'}; "
                f"choose from {', '.join(STRATEGIES)}",
            )

    @property
    def names_devices(self) -> bool:
        """Whether answers name device nodes or CDI devices, which the node must have."""
        return self.device_specs or any(s.startswith("cdi-") for s in self.strategies)


def answer(node: Node, allocation: Allocation, grant: Grant, policy: AnswerPolicy) -> Answer:
    shares = grant.cards
    uuids = [s.uuid for s in shares]
    envs = {
        "CUDA_VISIBLE_DEVICES": ",".join(uuids),
        "GPULEDGER_ALLOCATION_ID": allocation.id,
        "GPULEDGER_CONTAINER": grant.container,
        "GPULEDGER_MEMORY_LIMIT_MIB": ",".join(str(s.mem_mib) for s in shares),
        "GPULEDGER_CORE_LIMIT_PERCENT": ",".join(_percent(s.core_milli) for s in shares),
        "GPULEDGER_EXCLUSIVE": "true" if all(s.exclusive for s in shares) else "false",
    }
    mounts: list[Mount] = []
    if "env" in policy.strategies:
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
    if "volume-mounts" in policy.strategies:
        envs["NVIDIA_VISIBLE_DEVICES"] = DEVICE_LIST_MOUNT_ROOT
        mounts.extend(device_list_mounts(uuids))
    if isolation_of(allocation, grant, policy) is Isolation.MPS:
        envs.update(mps_env(shares, policy.mps_pipe_dir))
        mounts.extend(mps_mounts(policy))
    cdi = tuple(f"{policy.cdi_kind}={u}" for u in uuids)
    return Answer(
        envs=envs,
        mounts=tuple(mounts),
        devices=_device_nodes(node, shares, policy.device_dir) if policy.device_specs else (),
        annotations=_cdi_annotations(grant, cdi) if "cdi-annotations" in policy.strategies else {},
        cdi_devices=cdi if "cdi-cri" in policy.strategies else (),
    )


def device_list_mounts(uuids: Sequence[str]) -> tuple[Mount, ...]:
    """The ``volume-mounts`` device list: ``/dev/null`` at the toolkit's path for each card."""
    return tuple(Mount(f"{DEVICE_LIST_MOUNT_ROOT}/{u}", DEVICE_LIST_MOUNT_SOURCE, read_only=True) for u in uuids)


def isolation_of(allocation: Allocation, grant: Grant, policy: AnswerPolicy) -> Isolation:
    if allocation.isolation is Isolation.MPS:
        return Isolation.MPS
    shared = not all(s.exclusive for s in grant.cards)
    return policy.default_isolation if shared else Isolation.NONE


def mps_env(shares: tuple[CardShare, ...], pipe_dir: str) -> dict[str, str]:
    """The MPS client's environment: limits by the container's CUDA ordinal (see the module doc)."""
    envs = {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": ",".join(f"{i}={s.mem_mib}M" for i, s in enumerate(shares)),
        "CUDA_MPS_PIPE_DIRECTORY": pipe_dir,
    }
    threads = min((s.core_milli for s in shares), default=0)
    if threads > 0:
        envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, threads // 10))
    return envs


def mps_mounts(policy: AnswerPolicy) -> tuple[Mount, ...]:
    pipe = Mount(policy.mps_pipe_dir, policy.mps_host_pipe_dir)
    if not policy.mps_host_shm_dir:
        return (pipe,)
    return pipe, Mount(MPS_SHM_DIR, policy.mps_host_shm_dir)


def _percent(core_milli: int) -> str:
    return f"{core_milli / 10:g}"


def _device_nodes(node: Node, shares: tuple[CardShare, ...], device_dir: str) -> tuple[DeviceNode, ...]:
    minors = []
    for share in shares:
        card = node.card(share.uuid)
        minor = card.minor if card is not None and card.minor is not None else share.index
        minors.append(f"/dev/nvidia{minor}")
    return tuple(DeviceNode(p, on_host(p, device_dir)) for p in (*NVIDIA_CONTROL_DEVICES, *minors))


def on_host(path: str, device_dir: str) -> str:
    """Where the device node a container sees at ``path`` (under /dev) is on the host."""
    return str(PurePosixPath(device_dir) / PurePosixPath(path).relative_to("/dev"))


def _cdi_annotations(grant: Grant, names: tuple[str, ...]) -> dict[str, str]:
    # The key's name part allows only [A-Za-z0-9_.-] (at most 63): a digest of the device IDs.
    digest = hashlib.sha256(",".join(sorted(grant.device_ids)).encode()).hexdigest()[:20]
    return {f"{CDI_ANNOTATION_PREFIX}{digest}": ",".join(names)}
