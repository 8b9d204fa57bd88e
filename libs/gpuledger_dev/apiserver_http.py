"""Reading the fake API server's requests as the real one reads them: objects in bodies, what a
PATCH (JSON merge patch; strategic merge patch taken as one) or PUT leaves of an object, a
deletion's grace period, and continue tokens. Each returns the value, or the ``Status`` refusing it."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

from aiohttp import web

from gpuledger_dev.apiserver_status import bad_request, status

PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
Object = dict[str, Any]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


async def read_object(request: web.Request, kind: str) -> Object | web.Response:
    """The body as a JSON object with a ``metadata`` object (400 otherwise)."""
    try:
        body = json.loads(await request.read())
    except ValueError as err:
        body, why = None, f"json parse error: {err}"
    else:
        why = "not an object with metadata"
    if not isinstance(body, dict) or not isinstance(body.setdefault("metadata", {}), dict):
        return bad_request(f"the object provided is unrecognized (must be of type {kind}): {why}")
    return body


async def written(request: web.Request, found: Object, kind: str) -> Object | web.Response:
    """A copy of ``found`` as the PATCH or PUT ``request`` leaves it, before the server's rules apply."""
    if request.method == "PATCH":
        if request.content_type not in PATCH_TYPES:
            return status(415, "UnsupportedMediaType", "415: Unsupported Media Type", {})
        try:
            patch = json.loads(await request.read())
        except ValueError as err:
            return bad_request(f"error decoding patch: {err}")
        new = merge_patch(found, patch)
        if not isinstance(new, dict) or not isinstance(new.get("metadata"), dict):
            return bad_request(f"the patch does not leave a {kind} with metadata")
    else:
        put = await read_object(request, kind)
        if isinstance(put, web.Response):
            return put
        new = put
    name, was = new["metadata"].get("name"), found["metadata"]
    if name != was["name"]:
        return bad_request(f"the name of the object ({name}) does not match the name on the URL ({was['name']})")
    if new["metadata"].setdefault("namespace", was.get("namespace")) != was.get("namespace"):
        return bad_request("the namespace of the provided object does not match the namespace sent on the request")
    result: Object = copy.deepcopy(new)
    return result


async def grace_period(request: web.Request) -> int | web.Response | None:
    """The DeleteOptions' gracePeriodSeconds (the body's, else the query's); None where not given."""
    raw: Any = request.query.get("gracePeriodSeconds")
    if request.can_read_body:
        options = await read_object(request, "DeleteOptions")
        if isinstance(options, web.Response):
            return options
        raw = options.get("gracePeriodSeconds", raw)
    if raw is None:
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return bad_request(f'gracePeriodSeconds: strconv.ParseInt: parsing "{raw}": invalid syntax')


def list_limit(request: web.Request) -> int | web.Response:
    """``limit``; none, zero or negative mean every item."""
    raw = request.query.get("limit") or "0"
    try:
        return max(int(raw), 0)
    except ValueError:
        return bad_request(f'strconv.ParseInt: parsing "{raw}": invalid syntax')


def continue_token(version: int, start: int) -> str:
    """Opaque to clients, like the real one (which also encodes a version and where to go on)."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": version, "start": start})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def continued(token: str) -> tuple[int, int] | web.Response:
    """The resourceVersion and the index a token goes on from; 400 for one that is not a token."""
    try:
        raw = json.loads(base64.urlsafe_b64decode(token.encode() + b"=="))
        return int(raw["rv"]), int(raw["start"])
    except (ValueError, KeyError, TypeError) as err:
        return bad_request(f"invalid continue token: continue key is not valid: {err}")


def route(request: web.Request) -> str:
    """The path pattern the request matched (``.../pods/{name}/status``)."""
    resource = request.match_info.route.resource
    return "" if resource is None else resource.canonical
