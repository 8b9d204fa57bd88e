"""The demo's MIG step, in classic and DRA mode (docs/mig.md), on the fleet's node ``a100-mig-0``:
four A100 40 GB, cards 0 and 1 in MIG mode with no instance (made on demand), card 2 an operator's
static layout (3g.20gb, 2g.10gb, 2 x 1g.5gb), card 3 not in MIG mode.

- a 1g.5gb takes a static instance of card 2 (nothing is made: no reconfiguration);
- a 4g.20gb and an 8000 MiB ask (the smallest profile holding it: 1g.10gb) are made on demand, on
  one card, so that the other stays whole;
- a 7g.40gb then takes that whole card (made on demand), and a second one waits, naming the
  profile;
- a whole card of the same node is card 3, beside the MIG cards.

Every container is given its MIG device (``CUDA_VISIBLE_DEVICES=MIG-...``) by the node's plugin,
which had the node's inventory make the instance first. A fleet without that node skips the step.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from gpuledger_dev.fake_cluster import Outcome, gpu_pod
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import DRIVER

if TYPE_CHECKING:  # scenario.py runs this step: no import of it at run time
    from gpuledger_dev.scenario import Checks

NODE = "a100-mig-0"
MIG_CLASS = f"mig.{DRIVER}"
Run = Callable[[str, dict[str, Any] | None, str], Awaitable[Outcome]]  # name, MIG ask, profile


def has_mig_node(stack: Stack) -> bool:
    return any(n.node.name == NODE for n in stack.fleet.nodes)


def mig_of(outcome: Outcome) -> tuple[str, str]:
    """What the container was given: (its MIG device's UUID, ``<profile>@<start>``)."""
    env = outcome.env.get("app", {})
    return env.get("CUDA_VISIBLE_DEVICES", ""), env.get("GPULEDGER_MIG", "")


async def run_mig(stack: Stack, checks: Checks, run: Run, whole_card: Callable[[], Awaitable[Outcome]]) -> None:
    """The step, asking through ``run`` (a pod's resources, or a claim) and ``whole_card``."""
    if not has_mig_node(stack):
        checks.say(f"     (no node {NODE} in this fleet: the MIG step is skipped)")
        return
    static = await run("mig-1g", None, "1g.5gb")
    made = await run("mig-4g", None, "4g.20gb")
    sized = await run("mig-8000", {"memory": 8000}, "")
    got = {o.pod: mig_of(o) for o in (static, made, sized)}
    for o in (static, made, sized):
        uuid, where = got[o.pod]
        ok = not o.pending and uuid.startswith("MIG-") and "," not in uuid
        checks.check(ok, f"{o.pod} on {o.node}: {where} as {uuid}", f"{o.pod}: {o.pending or o.env}")
    checks.check(
        got["mig-1g"][1].startswith("1g.5gb@") and got["mig-8000"][1].startswith("1g.10gb@"),
        f"the 8000 MiB ask got the smallest profile holding it ({got['mig-8000'][1]})",
        f"profiles given: {got}",
    )
    big = await run("mig-7g", None, "7g.40gb")
    checks.check(
        not big.pending and mig_of(big)[1] == "7g.40gb@0",
        f"a 7g.40gb still fits whole on the card the chooser kept free ({mig_of(big)[0]})",
        f"mig-7g: {big.pending or big.env}",
    )
    again = await run("mig-7g-2", None, "7g.40gb")
    checks.check(bool(again.pending), f"a second 7g.40gb waits: {again.pending}", f"mig-7g-2: {again}")
    card = await whole_card()
    given = card.env.get("app", {}).get("CUDA_VISIBLE_DEVICES", "")
    checks.check(
        given == str(stack.fleet.node(NODE).node.cards[3].uuid),
        f"{NODE}: a whole card beside the MIG cards is card 3",
        f"{NODE}: the whole card: {card.pending or card.env}",
    )


def classic_run(stack: Stack) -> Run:
    """A pod asking ``gpuledger.io/mig-<profile>: 1``, or ``gpuledger.io/mig: 1`` sized by gpu-mem."""

    async def run(name: str, sized: dict[str, Any] | None, profile: str) -> Outcome:
        if sized is None:
            limits = {f"gpuledger.io/mig-{profile}": "1"}
        else:
            limits = {"gpuledger.io/mig": "1", "gpuledger.io/gpu-mem": str(sized["memory"])}
        return await stack.cluster.run(gpu_pod(name, limits), [NODE])

    return run


async def run_classic_mig(stack: Stack, checks: Checks) -> None:
    async def card() -> Outcome:
        return await stack.cluster.run(gpu_pod("a100-whole", {"gpuledger.io/gpu": "1"}), [NODE])

    await run_mig(stack, checks, classic_run(stack), card)


def mig_request(profile: str, memory_mib: int | None = None) -> dict[str, Any]:
    """A claim's request of the MIG class: the profile by its attribute, or the smallest holding
    ``memory_mib``."""
    spec: dict[str, Any] = {"deviceClassName": MIG_CLASS}
    if memory_mib is None:
        spec["selectors"] = [{"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "{profile}"'}}]
    else:
        spec["capacity"] = {"requests": {"memory": f"{memory_mib}Mi"}}
    return {"name": "gpu", "exactly": spec}
