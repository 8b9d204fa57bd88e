"""Placement over NATS request/reply (subjects in docs/nats-api.md).

``gpuledger.v1.placement.place``: the node and cards for a request from outside Kubernetes (the
allocator asks before it reserves). ``gpuledger.v1.placement.preferred``: the plugin shim's
GetPreferredAllocation when no reservation names the container.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from nats.aio.client import Client

from gpuledger_common.bus import SUBJECT_PREFIX, Handler, Responder
from gpuledger_core import codec
from gpuledger_core.codec import Reader
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.model import Isolation, Owner, OwnerKind
from gpuledger_core.packing import POLICIES
from gpuledger_core.pods import PodAsk
from gpuledger_placement.metrics import DECISIONS, NATS_SECONDS
from gpuledger_placement.service import Placed, PlacementService

PREFIX = f"{SUBJECT_PREFIX}.placement"
PLACE = f"{PREFIX}.place"
PREFERRED = f"{PREFIX}.preferred"


def place_request_from(raw: object) -> tuple[PodAsk, frozenset[str]]:
    r = Reader(raw)
    owner = codec.owner_from(r.obj("owner")) if r.raw.get("owner") else Owner(OwnerKind.TOOL, _anonymous())
    asks = r.items("containers", _container_from)
    if not asks:
        raise InvalidArgument("containers", "at least one container request is needed")
    policy = r.text("policy", "")
    if policy and policy not in POLICIES:
        raise InvalidArgument("policy", f"must be one of {', '.join(POLICIES)}, got {policy!r}")
    isolation = r.enum("isolation", Isolation, Isolation.NONE)
    pod = PodAsk(owner, asks, isolation, policy, r.integer("cpu_milli", 0), r.integer("memory_mib", 0))
    return pod, frozenset(r.strings("exclude"))


def _container_from(r: Reader) -> ContainerAsk:
    return ContainerAsk(r.text("container", ""), codec.request_from(r.obj("request")), r.flag("init"))


def _anonymous() -> str:
    return f"anonymous-{secrets.token_hex(6)}"


def placed_to(placed: Placed) -> dict[str, Any]:
    return {
        "node": placed.node,
        "containers": [
            {"container": g.container, "init": g.init, "cards": [s.index for s in g.cards]} for g in placed.grants
        ],
        "ranked": list(placed.ranked),
        "revision": placed.revision,
    }


def handlers(service: PlacementService) -> dict[str, Handler]:
    async def place(body: Any) -> Any:
        pod, exclude = place_request_from(body)
        placed = service.place(pod, exclude)
        DECISIONS.labels("place", "fit").inc()
        return placed_to(placed)

    async def preferred(body: Any) -> Any:
        r = Reader(body)
        size = r.integer("size")
        if size < 1:
            raise InvalidArgument("size", f"must be at least 1, got {size}")
        ids = service.preferred(r.text("node"), r.strings("available"), r.strings("must_include"), size)
        return {"device_ids": ids}

    return {PLACE: _timed(PLACE, place), PREFERRED: _timed(PREFERRED, preferred)}


def _timed(subject: str, handler: Handler) -> Handler:
    histogram = NATS_SECONDS.labels(subject)

    async def timed(body: Any) -> Any:
        started = time.perf_counter()
        try:
            return await handler(body)
        finally:
            histogram.observe(time.perf_counter() - started)

    return timed


async def serve_nats(nc: Client, service: PlacementService, queue: str) -> list[Responder]:
    return [
        await Responder(nc, subject, handler, queue=queue).start() for subject, handler in handlers(service).items()
    ]
