"""What a container gets: its Allocate answer, built from its grant (pure).

Environment (always):
- ``NVIDIA_VISIBLE_DEVICES``: the grant's card UUIDs, comma-separated (strategy ``env``);
- ``GPULEDGER_ALLOCATION_ID``, ``GPULEDGER_CONTAINER``: which ledger entry this is;
- ``GPULEDGER_MEMORY_LIMIT_MIB``, ``GPULEDGER_CORE_LIMIT_PERCENT``: per card, comma-separated in
  the order of the visible devices (CUDA ordinal i is the i-th entry);
- ``GPULEDGER_EXCLUSIVE``: ``true`` when the cards are the container's alone.
With MPS isolation: ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``<uuid>=<MiB>M,...``),
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PIPE_DIRECTORY`` with the pipe directory
mounted from the host.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from gpuledger_core.model import Allocation, CardShare, Grant, Isolation, Node

NVIDIA_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/gpuledger_"


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
    strategies: tuple[str, ...] = ("env",)
    cdi_kind: str = "nvidia.com/gpu"
    device_specs: bool = False
    default_isolation: Isolation = Isolation.NONE
    mps_pipe_dir: str = "/tmp/nvidia-mps"
    mps_host_pipe_dir: str = "/run/nvidia/mps"


def answer(node: Node, allocation: Allocation, grant: Grant, policy: AnswerPolicy) -> Answer:
    shares = grant.cards
    uuids = [s.uuid for s in shares]
    envs = {
        "GPULEDGER_ALLOCATION_ID": allocation.id,
        "GPULEDGER_CONTAINER": grant.container,
        "GPULEDGER_MEMORY_LIMIT_MIB": ",".join(str(s.mem_mib) for s in shares),
        "GPULEDGER_CORE_LIMIT_PERCENT": ",".join(_percent(s.core_milli) for s in shares),
        "GPULEDGER_EXCLUSIVE": "true" if all(s.exclusive for s in shares) else "false",
    }
    if "env" in policy.strategies:
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
    mounts: tuple[Mount, ...] = ()
    if isolation_of(allocation, grant, policy) is Isolation.MPS:
        envs.update(mps_env(shares, policy.mps_pipe_dir))
        mounts = (Mount(policy.mps_pipe_dir, policy.mps_host_pipe_dir),)
    cdi = tuple(f"{policy.cdi_kind}={u}" for u in uuids)
    return Answer(
        envs=envs,
        mounts=mounts,
        devices=_device_nodes(node, shares) if policy.device_specs else (),
        annotations=_cdi_annotations(grant, cdi) if "cdi-annotations" in policy.strategies else {},
        cdi_devices=cdi if "cdi-cri" in policy.strategies else (),
    )


def isolation_of(allocation: Allocation, grant: Grant, policy: AnswerPolicy) -> Isolation:
    if allocation.isolation is Isolation.MPS:
        return Isolation.MPS
    shared = not all(s.exclusive for s in grant.cards)
    return policy.default_isolation if shared else Isolation.NONE


def mps_env(shares: tuple[CardShare, ...], pipe_dir: str) -> dict[str, str]:
    threads = min((s.core_milli for s in shares), default=1000)
    return {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": ",".join(f"{s.uuid}={s.mem_mib}M" for s in shares),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, threads // 10)),
        "CUDA_MPS_PIPE_DIRECTORY": pipe_dir,
    }


def _percent(core_milli: int) -> str:
    return f"{core_milli / 10:g}"


def _device_nodes(node: Node, shares: tuple[CardShare, ...]) -> tuple[DeviceNode, ...]:
    minors = []
    for share in shares:
        card = node.card(share.uuid)
        minor = card.minor if card is not None and card.minor is not None else share.index
        minors.append(f"/dev/nvidia{minor}")
    return tuple(DeviceNode(p, p) for p in (*NVIDIA_CONTROL_DEVICES, *minors))


def _cdi_annotations(grant: Grant, names: tuple[str, ...]) -> dict[str, str]:
    # The key's name part allows only [A-Za-z0-9_.-] (at most 63): a digest of the device IDs.
    digest = hashlib.sha256(",".join(sorted(grant.device_ids)).encode()).hexdigest()[:20]
    return {f"{CDI_ANNOTATION_PREFIX}{digest}": ",".join(names)}
