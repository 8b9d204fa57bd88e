"""MIG on a real kubelet v1.36 and containerd, classic and DRA mode on one node.

The node (``real_mig_fleet.yaml``) has three A100 40 GB: card 0 in MIG mode with no instance,
card 1 in MIG mode with an operator's layout, card 2 whole. Its device plugin registers a kubelet
resource per MIG profile, and its DRA plugin publishes the MIG placements. A container's own
output (its environment and /dev) shows what it got:

- classic, a profile made on demand: the node's inventory made the instance the ledger holds
  (``static: false``), the container sees its MIG UUID in ``CUDA_VISIBLE_DEVICES``, the card's
  ``/dev/nvidia<minor>`` and the two capability nodes of its GPU and compute instance; containerd
  resolved its CDI name from the spec the plugin wrote (the toolkit's spec lists no such
  instance), and the spec goes once the inventory destroys the instance;
- classic, the static layout's instance: the toolkit's own spec defines it, and the plugin writes
  none (two specs defining one device would be a conflict containerd refuses);
- DRA: a claim of ``mig.gpu.gpuledger.io`` prepared by the real kubelet, the container seeing the
  MIG device the inventory made for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gpuledger_core.mig_layout import gpu_instance_id
from gpuledger_core.mig_profiles import A100_40GB
from gpuledger_core.model import Allocation, MigInstance
from gpuledger_dev.fake_cluster import Outcome
from gpuledger_dev.fleet import load_fleet
from gpuledger_dev.local_stack import Stack, running_stack
from gpuledger_dev.natsserver import free_port
from gpuledger_dev.real_cluster import BOTH, MIG_ENV, NAMESPACE, TOOLKIT_ENV, TOOLKIT_SPEC, RealCluster
from gpuledger_dev.realnode.devices import mig_minors
from gpuledger_dev.scenario_dra import CLAIMS, claim_and_run
from gpuledger_dev.scenario_mig import mig_request
from gpuledger_plugin.mig_cdi import spec_file
from tests.e2e.helpers import SLOTS_PER_CARD, card_nodes, ledger, namespace, pod, released
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

FLEET = Path(__file__).with_name("real_mig_fleet.yaml")
REAL = "real-mig"
MIG_1G10 = "gpuledger.io/mig-1g.10gb"
KEEP_S = 60  # the inventory's --mig-keep-s (its default): an unheld on-demand instance lives that long


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def mig_stack() -> AsyncIterator[Stack]:
    fleet = load_fleet(FLEET)
    async with running_stack(fleet, free_port(), free_port(), _say, "real", BOTH, real_node=REAL) as stack:
        await wait_for(lambda: allocatable(stack, MIG_1G10), 90, f"{MIG_1G10} allocatable on {REAL}", 0.5)
        yield stack


def _say(message: str) -> None:
    print(f"[real-node MIG stack] {message}", flush=True)


def cluster_of(stack: Stack) -> RealCluster:
    assert isinstance(stack.cluster, RealCluster) and stack.cluster.api is not None
    return stack.cluster


async def node_status(stack: Stack) -> dict[str, dict[str, str]]:
    api = cluster_of(stack).api
    assert api is not None
    return dict((await api.get(f"/api/v1/nodes/{REAL}"))["status"])


async def allocatable(stack: Stack, resource: str) -> int:
    return int((await node_status(stack)).get("allocatable", {}).get(resource, "0"))


async def held_by(stack: Stack, uid_or_name: str) -> Allocation:
    (found,) = [a for a in (await ledger(stack))[REAL].live() if uid_or_name in (a.owner.id, a.owner.name)]
    return found


async def instance_of(stack: Stack, allocation: Allocation) -> tuple[int, MigInstance]:
    """The card index and the instance (as the node's inventory reports it) of the allocation's one placement."""
    (grant,) = allocation.grants
    (share,) = grant.cards
    assert share.mig is not None, share
    card = next(c for c in (await ledger(stack))[REAL].node.cards if c.uuid == share.uuid)
    (instance,) = [i for i in card.instances if i.slot == share.mig]
    return card.index, instance


def caps_of(card: int, instance: MigInstance) -> list[str]:
    """The capability nodes of the instance's GPU and compute instance, as the container lists them
    (card minor = index here; the fake NVML's GPU instance IDs; one compute instance, ID 0)."""
    profile = A100_40GB.by_name(instance.slot.profile)
    assert profile is not None
    gi = gpu_instance_id(A100_40GB, profile, instance.slot.start)
    minors = mig_minors([card])
    return sorted(f"nvidia-caps/nvidia-cap{minors[f'gpu{card}/gi{gi}/{c}access']}" for c in ("", "ci0/"))


def sees_the_instance(outcome: Outcome, card: int, instance: MigInstance) -> None:
    """What the container printed: the MIG device, its card's node and its capability nodes, no other."""
    env, dev = outcome.env["app"], outcome.dev["app"]
    assert env["CUDA_VISIBLE_DEVICES"] == instance.uuid, env
    assert env["GPULEDGER_MIG"] == f"{instance.slot.profile}@{instance.slot.start}", env
    assert card_nodes(dev) == [f"nvidia{card}"], dev
    assert sorted(d for d in dev if d.startswith("nvidia-caps/")) == caps_of(card, instance), dev
    assert {"nvidiactl", "nvidia-uvm"} <= set(dev), dev


@pytest.mark.timeout(300)
async def test_kubelet_registers_a_resource_per_profile_beside_the_whole_cards(mig_stack: Stack) -> None:
    mig_cards = str(2 * SLOTS_PER_CARD)  # cards 0 and 1 offer every profile
    wanted = {f"gpuledger.io/mig-{p}": mig_cards for p in ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "7g.40gb")}
    wanted |= {"gpuledger.io/mig": mig_cards, "gpuledger.io/gpu": str(SLOTS_PER_CARD)}  # card 2 alone is whole

    async def registered() -> dict[str, str] | None:
        capacity = (await node_status(mig_stack))["capacity"]
        return capacity if all(capacity.get(k) == v for k, v in wanted.items()) else None

    capacity = await wait_for(registered, 60, f"the capacity of every MIG resource on {REAL}", 0.5)
    assert capacity["gpuledger.io/mig-4g.20gb"] == mig_cards


@pytest.mark.timeout(300)
async def test_an_instance_made_on_demand_reaches_the_container_through_a_spec_the_plugin_wrote(
    mig_stack: Stack,
) -> None:
    cluster = cluster_of(mig_stack)
    assert cluster.api is not None
    spec = Path()
    async with namespace(cluster.api, "mig-on-demand", mig_stack) as ns:
        outcome = await cluster.run(pod("small", ns, {MIG_1G10: "1"}, node=REAL))
        assert outcome.node == REAL and not outcome.pending, outcome
        card, instance = await instance_of(mig_stack, await held_by(mig_stack, await cluster.pod_uid(ns, "small")))
        assert card == 0 and not instance.static and instance.slot.profile == "1g.10gb", instance
        sees_the_instance(outcome, card, instance)
        env = outcome.env["app"]
        assert env[TOOLKIT_ENV] == TOOLKIT_SPEC  # the toolkit's own edits, through the plugin's spec
        assert MIG_ENV not in env  # the toolkit's spec knows no such instance
        assert f"nvidia-container-devices/{instance.uuid}" in outcome.dev["app"]  # volume-mounts name it too
        spec = cluster.cdi_dir(REAL) / spec_file(instance.uuid)
        assert spec.exists(), sorted(p.name for p in cluster.cdi_dir(REAL).iterdir())

    async def destroyed() -> bool:
        cards = (await ledger(mig_stack))[REAL].node.cards
        return all(i.uuid != instance.uuid for c in cards for i in c.instances) and not spec.exists()

    # released with its pod, the instance is destroyed after the keep, and its spec goes with it
    await wait_for(destroyed, KEEP_S + 90, f"{instance.uuid} destroyed and {spec.name} removed", 1.0)


@pytest.mark.timeout(300)
async def test_a_static_instance_is_given_by_the_toolkits_own_spec(mig_stack: Stack) -> None:
    cluster = cluster_of(mig_stack)
    assert cluster.api is not None
    async with namespace(cluster.api, "mig-static", mig_stack) as ns:
        outcome = await cluster.run(pod("static", ns, {"gpuledger.io/mig-1g.5gb": "1"}, node=REAL))
        assert outcome.node == REAL and not outcome.pending, outcome
        card, instance = await instance_of(mig_stack, await held_by(mig_stack, await cluster.pod_uid(ns, "static")))
        assert card == 1 and instance.static, instance  # the operator's layout: nothing made
        sees_the_instance(outcome, card, instance)
        assert outcome.env["app"][MIG_ENV] == instance.uuid  # the toolkit's device, applied by containerd
        assert not (cluster.cdi_dir(REAL) / spec_file(instance.uuid)).exists()


@pytest.mark.timeout(300)
async def test_a_mig_claim_is_prepared_by_the_real_kubelet_and_the_container_sees_the_instance(
    mig_stack: Stack,
) -> None:
    cluster, name = cluster_of(mig_stack), "mig-claim"
    assert cluster.api is not None
    outcome = await claim_and_run(cluster, name, mig_request("4g.20gb"), REAL)
    try:
        assert outcome.node == REAL and not outcome.pending, outcome
        card, instance = await instance_of(mig_stack, await held_by(mig_stack, name))
        assert card == 0 and not instance.static and instance.slot.profile == "4g.20gb", instance
        sees_the_instance(outcome, card, instance)
        env = outcome.env["app"]
        assert env["NVIDIA_VISIBLE_DEVICES"] == instance.uuid and env["GPULEDGER_CLAIM"] == f"{NAMESPACE}/{name}"
    finally:
        await cluster.delete(NAMESPACE, name)
        await cluster.api.delete(f"{CLAIMS}/{name}")


@pytest.mark.timeout(300)
async def test_without_the_toolkits_spec_of_the_card_a_mig_pod_fails_with_the_plugins_reason(
    mig_stack: Stack,
) -> None:
    """The plugin builds an instance's spec from the toolkit's spec of its card; with none, kubelet
    fails the pod with the plugin's reason (containerd would fail its container later, naming no
    card), and the allocation is released."""
    cluster = cluster_of(mig_stack)
    assert cluster.api is not None and cluster.real is not None
    toolkit = cluster.real.cdi_dir / TOOLKIT_SPEC
    kept = toolkit.read_text()
    toolkit.unlink()
    card = next(c for c in (await ledger(mig_stack))[REAL].node.cards if c.index == 0)
    try:
        async with namespace(cluster.api, "mig-no-toolkit", mig_stack) as ns:
            outcome = await cluster.run(pod("unresolved", ns, {MIG_1G10: "1"}, node=REAL))
            assert outcome.node == REAL and outcome.pending.startswith("kubelet refused it"), outcome
            assert f"gpuledger-plugin on node {REAL}" in outcome.pending, outcome.pending
            assert f"defines the card nvidia.com/gpu={card.uuid}" in outcome.pending, outcome.pending
            found = await cluster.api.get(f"/api/v1/namespaces/{ns}/pods/unresolved")
            assert found["status"]["reason"] == "UnexpectedAdmissionError"
            await released(mig_stack, found["metadata"]["uid"])
            assert not list(cluster.cdi_dir(REAL).glob("gpuledger-mig-*"))
    finally:
        toolkit.write_text(kept)
