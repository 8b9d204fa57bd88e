"""DRA mode C's pure parts in placement: which claims a gated pod names, whether a pod is gated,
which DeviceClasses are mode C's, and the configuration copied into an allocation; and when a pod
that could not be settled is tried again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest

from gpuledger_placement.claim_allocator import ClaimAllocator
from gpuledger_placement.claim_cache import ClaimCache
from gpuledger_placement.claim_pods import GATE, claim_names, configs_of, gated, of_driver
from gpuledger_placement.preemption_note import PREEMPTION_ANNOTATION, Preemption

DRIVER = "gpu.gpuledger.io"
MPS = {"driver": DRIVER, "parameters": {"apiVersion": "gpuledger.io/v1alpha1", "kind": "SharingConfig"}}


def pod(claims: list[dict[str, Any]], statuses: list[dict[str, Any]] | None = None, gates: tuple[str, ...] = ()) -> Any:
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": "u"},
        "spec": {"resourceClaims": claims, "schedulingGates": [{"name": g} for g in gates]},
        "status": {"resourceClaimStatuses": statuses or []},
    }


def test_a_template_claim_is_named_once_kube_controller_manager_created_it() -> None:
    claims = [{"name": "a", "resourceClaimName": "shared"}, {"name": "b", "resourceClaimTemplateName": "t"}]
    assert claim_names(pod(claims)) is None
    assert claim_names(pod(claims, [{"name": "b", "resourceClaimName": "p-b-x1"}])) == ["shared", "p-b-x1"]


def test_only_our_gate_makes_a_pod_ours() -> None:
    assert gated(pod([], gates=("other", GATE)))
    assert not gated(pod([], gates=("other",)))


def test_a_class_is_ours_when_its_selector_names_our_driver() -> None:
    ours = {"spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}" && x'}}]}}
    theirs = {"spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]}}
    assert of_driver(ours, DRIVER) and not of_driver(theirs, DRIVER) and not of_driver({}, DRIVER)


def test_the_configs_are_copied_as_kube_scheduler_copies_them() -> None:
    classes = {"mps.gpu.gpuledger.io": {"spec": {"config": [{"opaque": MPS}, {"opaque": {"driver": "other"}}]}}}
    claim = {"spec": {"devices": {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "mps.gpu.gpuledger.io"}}],
        "config": [{"requests": ["gpu"], "opaque": MPS}, {"opaque": {"driver": "other"}}],
    }}}  # fmt: skip
    assert configs_of(claim, classes, DRIVER) == [
        {"source": "FromClass", "requests": ["gpu"], "opaque": MPS},
        {"source": "FromClaim", "requests": ["gpu"], "opaque": MPS},
    ]


class _View:
    """What the allocator asks of the fleet view when it is made: to be told of changes."""

    def __init__(self) -> None:
        self.listeners: list[Callable[[str], None]] = []

    def watch(self, listener: Callable[[str], None]) -> None:
        self.listeners.append(listener)


def known(allocator: ClaimAllocator) -> None:
    """The allocator has just listed the device classes: ours."""
    allocator._classes.at, allocator._classes.found = time.time(), {DRIVER: {"metadata": {"name": DRIVER}}}


def _allocator(view: _View) -> ClaimAllocator:
    claims = SimpleNamespace(cache=ClaimCache(), allocating=set(), driver=DRIVER, memory_step_mib=256)
    return ClaimAllocator(api=cast(Any, None), claims=cast(Any, claims), view=cast(Any, view), policy=cast(Any, None),
                          retry_s=1.5)  # fmt: skip


async def _waited(allocator: ClaimAllocator, backoff: float, meanwhile: Callable[[], None], after: float) -> float:
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiting = asyncio.ensure_future(allocator._wait("u", backoff))
    await asyncio.sleep(after)
    meanwhile()
    await waiting
    assert allocator._waiting == {} and allocator._on_change == set()
    return loop.time() - started


async def test_a_waiting_pod_is_tried_again_on_its_next_version_at_once() -> None:
    allocator = _allocator(_View())
    took = await _waited(allocator, 0.3, lambda: allocator.offer(pod([], gates=(GATE,))), 0.05)
    assert took < 0.25  # not the back-off's 0.3 s


async def test_a_change_of_a_node_ends_a_pods_wait_only_once_its_back_off_has_passed() -> None:
    view = _View()
    allocator = _allocator(view)
    took = await _waited(allocator, 0.3, lambda: view.listeners[0]("n1"), 0.05)  # changed early: waits the back-off
    assert 0.29 < took < 1.2  # the back-off, not retry_s
    took = await _waited(allocator, 0.1, lambda: view.listeners[0]("n1"), 0.25)  # changed after it: at once
    assert 0.24 < took < 1.2


async def test_a_pod_nothing_wakes_is_tried_again_after_retry_s() -> None:
    allocator = _allocator(_View())
    took = await _waited(allocator, 0.1, lambda: None, 0.0)
    assert took > 1.49


async def test_a_pod_whose_next_version_came_while_it_was_settled_waits_for_nothing() -> None:
    allocator = _allocator(_View())
    allocator._latest["u"] = pod([], gates=(GATE,))
    started = time.monotonic()
    await allocator._wait("u", 0.3)
    assert time.monotonic() - started < 0.2


def _made(owner: str, allocated: bool = False) -> dict[str, Any]:
    """A claim kube-controller-manager made from a template of pod ``owner``."""
    claim: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": "p-gpu-x1", "uid": "c1",
                     "ownerReferences": [{"kind": "Pod", "name": "p", "uid": owner, "controller": True}]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {},
    }  # fmt: skip
    if allocated:
        claim["status"] = {"allocation": {"devices": {"results": []}}}
    return claim


async def test_a_claim_made_for_a_waiting_pod_is_allocated_at_once_before_its_pod_names_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    allocator = _allocator(_View())
    started: list[tuple[str, str]] = []

    async def allocate(self: ClaimAllocator, pod: Any, raw: Any, ask: Any, classes: Any) -> None:
        started.append((pod["metadata"]["uid"], raw["metadata"]["uid"]))

    monkeypatch.setattr(ClaimAllocator, "_allocate", allocate)
    known(allocator)
    allocator._pods["u"] = pod([{"name": "gpu", "resourceClaimTemplateName": "t"}], gates=(GATE,))
    allocator._claim_added(_made("someone-else"))  # not a pod this allocator waits on
    allocator._claim_added(_made("u", allocated=True))  # allocated already
    await asyncio.sleep(0)
    assert started == [] and allocator._early == {}
    allocator._claim_added(_made("u"))
    allocator._claim_added(_made("u"))  # the same claim again: one allocation
    early = allocator._early["c1"]
    await early.task
    assert started == [("u", "c1")] and early.ask.ref.uid == "c1"


async def test_no_claim_is_allocated_at_once_without_known_classes_or_for_a_pod_waiting_on_victims() -> None:
    allocator = _allocator(_View())
    allocator._pods["u"] = pod([{"name": "gpu", "resourceClaimTemplateName": "t"}], gates=(GATE,))
    allocator._claim_added(_made("u"))  # the device classes were never listed
    assert allocator._early == {}
    known(allocator)
    note = Preemption("n1", time.time(), 60.0, ("ns/victim/v1",))
    allocator._pods["u"]["metadata"]["annotations"] = {PREEMPTION_ANNOTATION: note.encode()}
    allocator._claim_added(_made("u"))
    assert allocator._early == {}


def test_a_template_claim_seen_made_is_named_before_the_pods_status_names_it() -> None:
    claims = [{"name": "a", "resourceClaimName": "shared"}, {"name": "b", "resourceClaimTemplateName": "t"}]
    assert claim_names(pod(claims), {"other": "p-other-x"}) is None
    assert claim_names(pod(claims), {"b": "p-b-x1"}) == ["shared", "p-b-x1"]
    named = pod(claims, [{"name": "b", "resourceClaimName": "p-b-x2"}])
    assert claim_names(named, {"b": "p-b-x1"}) == ["shared", "p-b-x2"]  # the pod's status, once it names one


class _Api:
    """The pod patches the allocator makes (its gate lifted)."""

    def __init__(self) -> None:
        self.patched: list[tuple[str, Any]] = []

    async def patch_object(self, path: str, body: Any, content_type: str) -> dict[str, Any]:
        self.patched.append((path, body))
        return {}


async def test_a_pods_gate_is_lifted_once_its_template_claim_is_allocated_before_its_status_names_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kube-controller-manager makes the claim, then names it in the pod's status (a second write):
    the gate goes as soon as the claim it marked for the pod is allocated, not after that write,
    nor after the pod's back-off."""
    allocator = _allocator(_View())
    api = _Api()
    allocator.api = cast(Any, api)
    cache = allocator.claims.cache

    async def allocate(self: ClaimAllocator, pod: Any, raw: Any, ask: Any, classes: Any) -> None:
        await asyncio.sleep(0.02)  # the compare-and-set and the claim's write
        cache.watched("MODIFIED", {**raw, "status": {"allocation": {"devices": {"results": []}}}})

    monkeypatch.setattr(ClaimAllocator, "_allocate", allocate)
    known(allocator)
    allocator.offer(pod([{"name": "gpu", "resourceClaimTemplateName": "t"}], gates=(GATE,)))
    await asyncio.sleep(0.05)  # settled once: its claim is not made yet, it waits (back-off 0.5 s)
    assert api.patched == [] and "u" in allocator._waiting
    started = time.monotonic()
    made = _made("u")
    made["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    cache.watched("ADDED", made)
    await asyncio.wait_for(allocator.idle(), 2.0)
    assert time.monotonic() - started < 0.3
    assert api.patched == [("/api/v1/namespaces/ns/pods/p", [
        {"op": "test", "path": "/spec/schedulingGates/0/name", "value": GATE},
        {"op": "remove", "path": "/spec/schedulingGates/0"},
    ])]  # fmt: skip
    assert allocator._generated == {} and allocator._early == {}


async def test_a_claim_not_marked_for_the_pod_leaves_it_waiting_for_its_status() -> None:
    """A claim the pod owns without kube-controller-manager's mark is not taken for one of its
    template's claims: the pod waits for its status to name them."""
    allocator = _allocator(_View())
    api = _Api()
    allocator.api = cast(Any, api)
    known(allocator)
    allocator.offer(pod([{"name": "gpu", "resourceClaimTemplateName": "t"}], gates=(GATE,)))
    await asyncio.sleep(0.05)
    allocator.claims.cache.watched("ADDED", _made("u", allocated=True))
    await asyncio.sleep(0.2)
    assert api.patched == [] and "u" in allocator._waiting
    allocator.offer(pod([], gates=()), gone=True)
    await asyncio.wait_for(allocator.idle(), 2.0)
