"""The API server's ``Status`` bodies, shaped as the real one sends them (checked by the contract
tests in tests/e2e/test_fake_contract.py): ``reason``, ``message`` and ``details`` are left out
when the real server leaves them out, ``details.kind`` is the resource (``pods``) for NotFound and
Conflict but the kind (``Pod``) for Invalid, whose ``causes`` name each field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

_CAUSE = {"Invalid": "FieldValueInvalid", "Required": "FieldValueRequired", "Forbidden": "FieldValueForbidden"}


@dataclass(frozen=True, slots=True)
class FieldError:
    """One field of an object that validation refuses, as ``field.Error`` writes it."""

    field: str
    kind: str  # Invalid, Required or Forbidden
    detail: str
    value: str | None = None

    def message(self) -> str:
        if self.kind == "Invalid":
            body = f'Invalid value: "{self.value}"'
        else:
            body = "Required value" if self.kind == "Required" else self.kind
        return f"{body}: {self.detail}" if self.detail else body

    def cause(self) -> dict[str, str]:
        return {"reason": _CAUSE[self.kind], "message": self.message(), "field": self.field}


def status(code: int, reason: str = "", message: str = "", details: Mapping[str, Any] | None = None,
           coded: bool = True) -> web.Response:
    """A ``Status``; ``details=None`` leaves the key out (``{}`` sends it empty, as some answers do),
    ``coded=False`` leaves ``code`` out of the body (a deletion's success has none)."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Success" if code < 400 else "Failure"}
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = dict(details)
    if coded:
        body["code"] = code
    return web.json_response(body, status=code)


def not_found(resource: str, name: str) -> web.Response:
    return status(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource})


def conflict(resource: str, name: str, why: str) -> web.Response:
    return status(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": {why}',
                  {"name": name, "kind": resource})


def modified(resource: str, name: str) -> web.Response:
    """A write whose ``metadata.resourceVersion`` is not the object's."""
    why = "the object has been modified; please apply your changes to the latest version and try again"
    return conflict(resource, name, why)


def already_exists(resource: str, name: str) -> web.Response:
    return status(409, "AlreadyExists", f'{resource} "{name}" already exists', {"name": name, "kind": resource})


def bad_request(message: str) -> web.Response:
    return status(400, "BadRequest", message)


def invalid(kind: str, name: str, errors: Sequence[FieldError]) -> web.Response:
    """422 ``Invalid``: ``Pod "x" is invalid: <field>: <why>`` (several in brackets)."""
    each = [f"{error.field}: {error.message()}" for error in errors]
    listed = each[0] if len(each) == 1 else f"[{', '.join(each)}]"
    details = {"name": name, "kind": kind, "causes": [error.cause() for error in errors]}
    return status(422, "Invalid", f'{kind} "{name}" is invalid: {listed}', details)
