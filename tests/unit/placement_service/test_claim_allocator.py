"""DRA mode C's pure parts in placement: which claims a gated pod names, whether a pod is gated,
which DeviceClasses are mode C's, and the configuration copied into an allocation; and when a pod
that could not be settled is tried again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from gpuledger_placement.claim_allocator import GATE, ClaimAllocator, _configs, _of_driver, claim_names, gated

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
    assert _of_driver(ours, DRIVER) and not _of_driver(theirs, DRIVER) and not _of_driver({}, DRIVER)


def test_the_configs_are_copied_as_kube_scheduler_copies_them() -> None:
    classes = {"mps.gpu.gpuledger.io": {"spec": {"config": [{"opaque": MPS}, {"opaque": {"driver": "other"}}]}}}
    claim = {"spec": {"devices": {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "mps.gpu.gpuledger.io"}}],
        "config": [{"requests": ["gpu"], "opaque": MPS}, {"opaque": {"driver": "other"}}],
    }}}  # fmt: skip
    assert _configs(claim, classes, DRIVER) == [
        {"source": "FromClass", "requests": ["gpu"], "opaque": MPS},
        {"source": "FromClaim", "requests": ["gpu"], "opaque": MPS},
    ]


class _View:
    """What the allocator asks of the fleet view when it is made: to be told of changes."""

    def __init__(self) -> None:
        self.listeners: list[Callable[[str], None]] = []

    def watch(self, listener: Callable[[str], None]) -> None:
        self.listeners.append(listener)


def _allocator(view: _View) -> ClaimAllocator:
    return ClaimAllocator(api=cast(Any, None), claims=cast(Any, None), view=cast(Any, view), policy=cast(Any, None),
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
