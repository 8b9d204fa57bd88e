"""What a container holding MIG instances gets: its Allocate answer, from its grant and the
instances the node's inventory made for it (pure, but for ``read_mig_minors``).

As for whole cards (``answer``), by the plugin's ``device_list_strategy``, with each instance's MIG
device UUID (``MIG-...``) where a whole card's UUID would be:

- ``volume-mounts``: ``/dev/null`` at ``/var/run/nvidia-container-devices/<MIG uuid>``;
  ``env``: ``NVIDIA_VISIBLE_DEVICES`` = the MIG UUIDs; ``cdi-cri``/``cdi-annotations``: the CDI
  names ``<cdi_kind>=<MIG uuid>`` (the runtime's CDI spec must define the instance);
- ``CUDA_VISIBLE_DEVICES``: the MIG UUIDs in grant order (CUDA ordinal i is the i-th instance);
- ``GPULEDGER_MEMORY_LIMIT_MIB``, ``GPULEDGER_CORE_LIMIT_PERCENT``: each instance's profile's;
  ``GPULEDGER_EXCLUSIVE`` true (an instance is its holder's alone); ``GPULEDGER_MIG``: each
  instance's ``<profile>@<start>`` on its card, comma-separated. No MPS: the hardware isolates.
- With ``device_specs``: ``/dev/nvidiactl``, ``/dev/nvidia-uvm*``, each instance's card's
  ``/dev/nvidia<minor>``, and, where the driver's MIG minors file exists, the capability device
  nodes ``/dev/nvidia-caps/nvidia-cap<minor>`` of each instance's GPU instance and compute instance
  access (``gpu<card minor>/gi<GI>/access`` and ``gpu<card minor>/gi<GI>/ci<CI>/access``; NVIDIA's
  MIG user guide, "Device Nodes and Capabilities"). A minors file that lists no access for an
  instance is refused: the container could not use it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuledger_common.inventory_api import MadeMig
from gpuledger_core.errors import FailedPrecondition
from gpuledger_core.model import Allocation, Grant, Node
from gpuledger_plugin.answer import (
    CDI_ANNOTATION_PREFIX,
    DEVICE_LIST_MOUNT_ROOT,
    NVIDIA_CONTROL_DEVICES,
    Answer,
    AnswerPolicy,
    DeviceNode,
    Mount,
    device_list_mounts,
    on_host,
)

MIG_MINORS_FILE = "/proc/driver/nvidia-caps/mig-minors"
CAPS_DIR = "/dev/nvidia-caps"
_LINE = re.compile(r"^(\S+)\s+(\d+)$")

MigMinors = Mapping[str, int]  # capability ("gpu0/gi1/access") -> the minor of its device node


def parse_mig_minors(text: str, where: str = MIG_MINORS_FILE) -> dict[str, int]:
    """The MIG minors file's lines (``<capability> <minor>``); a line of another form is refused."""
    found: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = _LINE.match(line.strip())
        if match is None:
            raise FailedPrecondition(f"{where} line {number} is not '<capability> <minor>': {line!r}")
        found[match.group(1)] = int(match.group(2))
    return found


def read_mig_minors(path: str) -> dict[str, int] | None:
    """The MIG minors file at ``path``; None where it does not exist (no MIG-capable driver here)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise FailedPrecondition(f"cannot read the MIG minors file {path}: {err}") from err
    return parse_mig_minors(text, path)


def card_minor(node: Node, grant: Grant, index: int, made: MadeMig) -> int:
    """The device minor of the card of the grant's ``index``-th instance: the inventory's answer,
    else the ledger's card, else its index."""
    if made.minor is not None:
        return made.minor
    share = grant.cards[index]
    card = node.card(share.uuid)
    return card.minor if card is not None and card.minor is not None else share.index


def mig_answer(
    node: Node,
    allocation: Allocation,
    grant: Grant,
    made: Sequence[MadeMig],
    policy: AnswerPolicy,
    minors: MigMinors | None,
) -> Answer:
    """The answer for ``grant``, whose i-th share's instance is ``made[i]``."""
    if len(made) != len(grant.cards):
        raise FailedPrecondition(f"{len(made)} MIG instances for a container of {len(grant.cards)}")
    uuids = [m.uuid for m in made]
    shares = grant.cards
    envs = {
        "CUDA_VISIBLE_DEVICES": ",".join(uuids),
        "GPULEDGER_ALLOCATION_ID": allocation.id,
        "GPULEDGER_CONTAINER": grant.container,
        "GPULEDGER_MEMORY_LIMIT_MIB": ",".join(str(s.mem_mib) for s in shares),
        "GPULEDGER_CORE_LIMIT_PERCENT": ",".join(f"{s.core_milli / 10:g}" for s in shares),
        "GPULEDGER_EXCLUSIVE": "true",
        "GPULEDGER_MIG": ",".join(f"{s.mig.profile}@{s.mig.start}" for s in shares if s.mig is not None),
    }
    mounts: tuple[Mount, ...] = ()
    if "env" in policy.strategies:
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
    if "volume-mounts" in policy.strategies:
        envs["NVIDIA_VISIBLE_DEVICES"] = DEVICE_LIST_MOUNT_ROOT
        mounts = device_list_mounts(uuids)
    cdi = tuple(f"{policy.cdi_kind}={u}" for u in uuids)
    devices = _device_nodes(node, grant, made, policy.device_dir, minors) if policy.device_specs else ()
    return Answer(
        envs=envs,
        mounts=mounts,
        devices=devices,
        annotations=_annotations(grant, cdi) if "cdi-annotations" in policy.strategies else {},
        cdi_devices=cdi if "cdi-cri" in policy.strategies else (),
    )


def _device_nodes(
    node: Node, grant: Grant, made: Sequence[MadeMig], device_dir: str, minors: MigMinors | None
) -> tuple[DeviceNode, ...]:
    paths = list(NVIDIA_CONTROL_DEVICES)
    for index, instance in enumerate(made):
        card, capabilities = instance_nodes(node, grant, index, instance, minors)
        if card not in paths:
            paths.append(card)
        paths.extend(capabilities)
    return tuple(DeviceNode(p, on_host(p, device_dir)) for p in paths)


def instance_nodes(
    node: Node, grant: Grant, index: int, made: MadeMig, minors: MigMinors | None
) -> tuple[str, list[str]]:
    """The device node of the card of the grant's ``index``-th instance (``/dev/nvidia<minor>``)
    and the instance's capability nodes (none without the minors file)."""
    gpu = card_minor(node, grant, index, made)
    return f"/dev/nvidia{gpu}", caps(minors, gpu, made) if minors is not None else []


def caps(minors: MigMinors, gpu: int, made: MadeMig) -> list[str]:
    """The capability device nodes of the instance's GPU instance and compute instance."""
    names = (
        f"gpu{gpu}/gi{made.gpu_instance}/access",
        f"gpu{gpu}/gi{made.gpu_instance}/ci{made.compute_instance}/access",
    )
    missing = [n for n in names if n not in minors]
    if missing:
        raise FailedPrecondition(
            f"the MIG minors file lists no {' or '.join(missing)} for {made.uuid}: "
            "the container could not open its MIG instance"
        )
    return [f"{CAPS_DIR}/nvidia-cap{minors[n]}" for n in names]


def _annotations(grant: Grant, names: tuple[str, ...]) -> dict[str, str]:
    # As the whole cards' (answer.py): the key's name part is a digest of the device IDs.
    digest = hashlib.sha256(",".join(sorted(grant.device_ids)).encode()).hexdigest()[:20]
    return {f"{CDI_ANNOTATION_PREFIX}{digest}": ",".join(names)}
