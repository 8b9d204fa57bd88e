"""The fake API server's pod field selectors and watches (of pods, and of Nodes with no selector), as
kube-apiserver serves them (checked by tests/e2e/test_fake_contract.py).

Field selectors: ``field=value``, ``field==value`` and ``field!=value`` joined by commas (all must
hold), over the fields the real server indexes for pods; any other field is 400 ``field label not
supported``. A watch (``watch=true``) streams one JSON event per line: from resourceVersion ``""``
or ``"0"`` an ADDED event per current pod first, from a version a listing returned the changes
since that listing, from any other version one ERROR event (410, ``too old resource version``):
the real server says that only of versions etcd has compacted away (``compact`` here), and replays
history this fake does not keep for the others.
Then ADDED, MODIFIED and DELETED as pods change (a deleted pod is MODIFIED with its
deletionTimestamp and then DELETED, as the real server writes a deletion before removing the pod; a
pod that stops matching the selector is DELETED for that watch), BOOKMARK events when
``allowWatchBookmarks`` is set, and the end of the stream after ``timeoutSeconds``. Changes are
found by comparing the pods with what the watch has sent, so a test that edits a stored pod in
place is seen too.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gpuledger_dev.apiserver_status import bad_request

Object = dict[str, Any]
POD_FIELDS: dict[str, Callable[[Object], str]] = {
    "metadata.name": lambda p: str(p["metadata"].get("name") or ""),
    "metadata.namespace": lambda p: str(p["metadata"].get("namespace") or ""),
    "spec.nodeName": lambda p: str((p.get("spec") or {}).get("nodeName") or ""),
    "spec.schedulerName": lambda p: str((p.get("spec") or {}).get("schedulerName") or ""),
    "spec.restartPolicy": lambda p: str((p.get("spec") or {}).get("restartPolicy") or ""),
    "spec.serviceAccountName": lambda p: str((p.get("spec") or {}).get("serviceAccountName") or ""),
    "status.phase": lambda p: str((p.get("status") or {}).get("phase") or ""),
    "status.podIP": lambda p: str((p.get("status") or {}).get("podIP") or ""),
    "status.nominatedNodeName": lambda p: str((p.get("status") or {}).get("nominatedNodeName") or ""),
}
TRUE = ("1", "t", "T", "TRUE", "true", "True")  # what Go's strconv.ParseBool takes as true
POLL_S = 0.02
BOOKMARK_S = 1.0  # the real server sends one about every minute; sooner here, tests are short
TOO_OLD = "too old resource version: {wanted} ({oldest})"


@dataclass(frozen=True, slots=True)
class Selector:
    terms: tuple[tuple[str, bool, str], ...] = ()  # (field, equal, value)

    def matches(self, pod: Object) -> bool:
        return all((POD_FIELDS[f](pod) == value) == equal for f, equal, value in self.terms)


def selector_from(raw: str) -> Selector | web.Response:
    """The selector in ``raw``, or the 400 the real server gives for it."""
    terms = []
    for term in (t.strip() for t in raw.split(",")):
        if not term:
            continue
        for operator in ("!=", "==", "="):
            field, found, value = term.partition(operator)
            if found:
                break
        else:
            return bad_request(f'invalid field selector: "{term}": cannot parse')
        equal = operator != "!="
        field = field.strip()
        if field not in POD_FIELDS:
            return bad_request(
                f'Unable to find "/v1, Resource=pods" that match label selector "", field selector "{raw}": '
                f'field label not supported: {field}'
            )
        terms.append((field, equal, value.strip()))
    return Selector(tuple(terms))


class Watches:
    """The snapshots watches start from: the pods as each listing saw them, by resourceVersion."""

    def __init__(self, kept: int = 32) -> None:
        self.kept = kept
        self.compacted = 0  # a watch from an older version is too old
        self._seen: dict[int, dict[str, Object]] = {}

    def listed(self, version: int, pods: Mapping[Any, Object]) -> None:
        if version not in self._seen:
            self._seen[version] = _by_uid(pods.values())
            while len(self._seen) > self.kept:
                del self._seen[min(self._seen)]

    def forget(self) -> None:
        """Every snapshot is gone: a watch from a listed version is now too old (410)."""
        self._seen.clear()

    def start(self, wanted: str, version: int, pods: Mapping[Any, Object]) -> dict[str, Object] | None:
        """What the watch is taken to have sent already; None if ``wanted`` is too old."""
        if wanted in ("", "0"):
            return {}
        try:
            number = int(wanted)
        except ValueError:
            return None
        if number < self.compacted:
            return None
        if number == version:
            return _by_uid(pods.values())
        found = self._seen.get(number)
        return None if found is None else copy.deepcopy(found)

    def oldest(self, version: int) -> int:
        return max(self.compacted, min(self._seen, default=version))


async def serve_watch(
    request: web.Request,
    selector: Selector,
    namespace: str,
    sent: dict[str, Object] | None,
    pods: Callable[[], Mapping[Any, Object]],
    final: Mapping[str, Object],
    version: Callable[[], int],
    oldest: int,
    stopping: asyncio.Event,
    bookmark_s: float = BOOKMARK_S,
    object_kind: str = "Pod",
) -> web.StreamResponse:
    """Stream the changes of the objects ``pods()`` gives (pods, or Nodes with ``object_kind``)."""
    reply = web.StreamResponse(headers={"Content-Type": "application/json"})
    await reply.prepare(request)
    wanted = request.query.get("resourceVersion", "")
    if sent is None:
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Expired",
                  "message": TOO_OLD.format(wanted=wanted, oldest=oldest), "code": 410}  # fmt: skip
        await _send(reply, "ERROR", status)
        return reply
    bookmarks = request.query.get("allowWatchBookmarks") in TRUE
    try:
        timeout = float(request.query.get("timeoutSeconds") or 1800)
    except ValueError:
        timeout = 1800.0
    end, bookmark_at = time.monotonic() + timeout, time.monotonic() + bookmark_s
    with contextlib.suppress(ConnectionResetError):
        while time.monotonic() < end and not stopping.is_set():
            now = {
                uid: pod for uid, pod in _by_uid(pods().values()).items()
                if (not namespace or pod["metadata"].get("namespace") == namespace) and selector.matches(pod)
            }  # fmt: skip
            events: list[tuple[int, str, Object]] = []
            for uid in [u for u in sent if u not in now]:
                gone = sent.pop(uid)
                last = final.get(uid)
                if last is not None and _version_of(last) > _version_of(gone):  # marked, then removed
                    gone = copy.deepcopy(last)
                    events.append((_version_of(gone), "MODIFIED", copy.deepcopy(gone)))
                deleted_at = _version_of(gone) + 1 if last is not None else version()
                gone["metadata"]["resourceVersion"] = str(deleted_at)
                events.append((deleted_at, "DELETED", gone))
            for uid, pod in now.items():
                if uid not in sent:
                    events.append((_version_of(pod), "ADDED", pod))
                elif sent[uid] != pod:
                    events.append((_version_of(pod), "MODIFIED", pod))
                sent[uid] = pod
            for _, kind, obj in sorted(events, key=lambda e: e[0]):  # in the order the changes were made
                await _send(reply, kind, obj)
            if bookmarks and time.monotonic() >= bookmark_at:
                bookmark_at = time.monotonic() + bookmark_s
                mark = {"kind": object_kind, "apiVersion": "v1", "metadata": {"resourceVersion": str(version())}}
                await _send(reply, "BOOKMARK", mark)
            await asyncio.sleep(POLL_S)
    return reply


def _version_of(pod: Object) -> int:
    try:
        return int(pod["metadata"].get("resourceVersion") or 0)
    except ValueError:
        return 0


def _by_uid(pods: Any) -> dict[str, Object]:
    return {str(p["metadata"]["uid"]): copy.deepcopy(p) for p in pods}


async def _send(reply: web.StreamResponse, kind: str, obj: Object) -> None:
    await reply.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
