"""An Event about a pod or a Node, as placement records one (mode C's allocator, the preemptor,
the drainer): the body and the collection it is created in. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

MESSAGE_LIMIT = 1024


def pod_event(pod: Mapping[str, Any], reason: str, message: str, kind: str, at: float) -> tuple[str, dict[str, Any]]:
    """The events collection of the pod's namespace, and an Event of ``kind`` (Warning, Normal)
    about the pod, stamped ``at`` (seconds since the epoch)."""
    meta = pod["metadata"]
    now = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": meta["namespace"],
                           "name": meta["name"], "uid": meta["uid"]},
        "reason": reason, "message": message[:MESSAGE_LIMIT], "type": kind,
        "source": {"component": "gpuledger-placement"}, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }  # fmt: skip
    return f"/api/v1/namespaces/{meta['namespace']}/events", body


def node_event(node: str, reason: str, message: str, kind: str, at: float) -> tuple[str, dict[str, Any]]:
    """The events collection of the namespace ``default``, and an Event of ``kind`` about the Node
    ``node``, stamped ``at``. As kubelet's own, the reference's uid is the node's name (``kubectl
    describe node`` looks for that and for the Node's uid), so no Node needs to be read."""
    now = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "metadata": {"generateName": f"{node}.", "namespace": "default"},
        "involvedObject": {"kind": "Node", "apiVersion": "v1", "name": node, "uid": node},
        "reason": reason, "message": message[:MESSAGE_LIMIT], "type": kind,
        "source": {"component": "gpuledger-placement"}, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }  # fmt: skip
    return "/api/v1/namespaces/default/events", body
