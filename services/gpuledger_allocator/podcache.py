"""The pods the reconciler follows, kept current by one list and then a watch.

``run`` lists the pods once (in pages, one snapshot), then watches from the listing's
resourceVersion: every ADDED, MODIFIED and DELETED event updates the cache, bookmarks move the
resourceVersion on, and a watch the server ends (``timeoutSeconds``) is made again from where it
stopped. A listing starts again only when the watch cannot go on: 410 Gone (the version is too old),
any failure (the API server away, a broken stream), or every ``relist_s`` as a safety net. Until a
listing has succeeded again after a failure the cache is not ``synced`` and the reconciler changes
nothing: a cache that may have missed events must not decide that a pod is gone.

Against the API server this costs one listing at start and one long request per ``WATCH_S``,
instead of a full listing of every pod each reconcile round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuledger_allocator.kube import WATCH_S, Expired, PodEvent, PodLister
from gpuledger_allocator.metrics import LIST_FAILURES, POD_EVENTS, POD_LISTINGS
from gpuledger_allocator.repairs import PodSeen
from gpuledger_core.errors import GpuledgerError
from gpuledger_core.ids import PodUid

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PodCache:
    source: PodLister
    relist_s: float = 600.0
    retry_s: float = 2.0
    watch_s: int = WATCH_S
    clock: Callable[[], float] = time.monotonic
    pods: dict[PodUid, PodSeen] = field(default_factory=dict)
    synced: bool = False
    # A pod ended or went away, or the cache (re)synced: a round is due now, not at the next interval.
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    failures: int = 0  # in a row, for the log

    async def run(self) -> None:
        while True:
            try:
                await self._list_then_watch()
            except GpuledgerError as err:
                self.synced = False
                self.failures += 1
                LIST_FAILURES.inc()
                log_at = logging.WARNING if self.failures <= 3 or self.failures % 30 == 0 else logging.DEBUG
                log.log(log_at, "pod watch lost (%s); listing again in %.0f s", err, self.retry_s)
                await asyncio.sleep(self.retry_s)

    async def _list_then_watch(self) -> None:
        listed = await self.source.list_pods()
        POD_LISTINGS.inc()
        before = set(self.pods)
        self.pods = {pod.uid: pod for pod in listed.pods}
        if before - set(self.pods) or any(pod.finished for pod in listed.pods):
            self.changed.set()
        if not self.synced:
            # The first listing, or the first after a gap: until now the reconciler could decide
            # nothing (a replica started beside a lost ledger would wait a whole interval to
            # rebuild it).
            log.info("following %d pod(s) from resourceVersion %s", len(self.pods), listed.resource_version)
            self.changed.set()
        self.synced, self.failures = True, 0
        version, relist_at = listed.resource_version, self.clock() + self.relist_s
        while self.clock() < relist_at:
            timeout = max(1, min(self.watch_s, int(relist_at - self.clock()) + 1))
            try:
                async for event in self.source.watch_pods(version, timeout):
                    version = event.resource_version or version
                    self._apply(event)
            except Expired as err:
                log.info("pod watch expired (%s): listing again", err)
                return
        log.debug("listing the pods again (every %.0f s)", self.relist_s)

    def _apply(self, event: PodEvent) -> None:
        pod = event.pod
        if pod is None:  # a bookmark
            return
        POD_EVENTS.labels(event.kind.lower()).inc()
        if event.kind == "DELETED":
            if self.pods.pop(pod.uid, None) is not None:
                self.changed.set()
            return
        was = self.pods.get(pod.uid)
        self.pods[pod.uid] = pod
        if pod.finished and (was is None or not was.finished):
            self.changed.set()
