"""The allocator's internal NATS API: the same operations, the error envelope for bad input."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from gpuledger_common import bus
from gpuledger_core.errors import Exhausted, InvalidArgument, NotFound
from tests.support.replicas import RunningAllocator, wait_for

SUBJECT = "gpuledger.v1.allocator"


def body(owner: str, **request: object) -> dict[str, object]:
    return {
        "owner": {"kind": "tool", "id": owner},
        "containers": [{"container": "", "request": request}],
        "commit": True,
    }


async def test_allocate_and_release_over_nats(allocator: RunningAllocator, nc: Client) -> None:
    result = await bus.request(nc, f"{SUBJECT}.allocate", body("n1", count=1, mem_mib=1000, models=["Tesla P4"]))
    allocation = result["allocation"]
    assert (allocation["node"], allocation["state"], result["existing"]) == ("p4-0", "bound", False)
    got = await bus.request(nc, f"{SUBJECT}.get", {"allocation_id": allocation["id"]})
    assert got["allocation"]["id"] == allocation["id"]
    listed = await bus.request(nc, f"{SUBJECT}.list", {"node": "p4-0"})
    assert [a["id"] for a in listed["allocations"]] == [allocation["id"]]
    assert listed["next_page_token"] == ""
    other = (await bus.request(nc, f"{SUBJECT}.allocate", body("n2", count=1)))["allocation"]
    first = await bus.request(nc, f"{SUBJECT}.list", {"page_size": 1})
    rest = await bus.request(nc, f"{SUBJECT}.list", {"page_size": 1, "page_token": first["next_page_token"]})
    in_order = sorted([allocation, other], key=lambda a: (a["node"], a["id"]))
    assert [a["id"] for a in first["allocations"] + rest["allocations"]] == [a["id"] for a in in_order]
    assert rest["next_page_token"] == ""
    await bus.request(nc, f"{SUBJECT}.release", {"allocation_id": other["id"]})
    released = await bus.request(nc, f"{SUBJECT}.release", {"allocation_id": allocation["id"]})
    assert released["allocation"]["state"] == "released"
    cluster = await bus.request(nc, f"{SUBJECT}.cluster", {"node": "p4-0"})
    assert all(c["free_mem_mib"] == 7611 for c in cluster["nodes"][0]["cards"])


@pytest.mark.parametrize(
    ("verb", "payload", "error", "text"),
    [
        ("allocate", {"owner": {"kind": "tool"}}, InvalidArgument, "owner.id"),
        ("allocate", body("x", count="two"), InvalidArgument, "containers[0].request.count"),
        ("allocate", body("x", count=1, mem_mib=-5), InvalidArgument, "gpu-mem"),
        ("allocate", [1, 2], InvalidArgument, "body"),
        ("allocate", body("x", count=1, mem_mib=999999), Exhausted, "short of 999999 MiB"),
        ("get", {"allocation_id": "a-nope"}, NotFound, "a-nope"),
        ("get", {}, InvalidArgument, "allocation_id"),
        ("cluster", {"node": "nope"}, NotFound, "node nope is not in the ledger"),
        ("list", {"page_token": "nope"}, InvalidArgument, "page_token"),
    ],
)
async def test_errors_come_back_typed(
    allocator: RunningAllocator, nc: Client, verb: str, payload: object, error: type[Exception], text: str
) -> None:
    with pytest.raises(error) as caught:
        await bus.request(nc, f"{SUBJECT}.{verb}", payload)
    assert text in str(caught.value)


async def test_malformed_json_is_invalid_argument(allocator: RunningAllocator, nc: Client) -> None:
    msg = await nc.request(f"{SUBJECT}.allocate", b"{not json", timeout=5)
    reply = bus.decode(msg.data)
    assert reply["ok"] is False and reply["error"]["code"] == "invalid_argument"


async def test_an_allocations_events_follow_its_answer(allocator: RunningAllocator, nc: Client) -> None:
    """The ledger's events of a change are published once the request that made it is answered:
    a watcher of both sees the answer first (one connection delivers in the order published)."""
    seen: list[str] = []
    inbox = nc.new_inbox()

    async def note(msg: Msg) -> None:
        if msg.subject == inbox or msg.subject.startswith("gpuledger.v1.events."):
            seen.append("answer" if msg.subject == inbox else "event")

    sub = await nc.subscribe(">", cb=note)
    try:
        await nc.publish(f"{SUBJECT}.allocate", bus.encode(body("ordered", count=1)), reply=inbox)
        await wait_for(both_in(seen), 10, "the answer and an event")
    finally:
        await sub.unsubscribe()
    assert seen[0] == "answer", seen


def both_in(seen: list[str]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return "event" in seen and "answer" in seen

    return check
