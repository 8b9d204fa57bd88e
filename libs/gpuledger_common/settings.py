"""Typed settings for every service: flags over ``GPULEDGER_*`` environment over defaults.

A service declares a frozen dataclass; ``load`` builds the argument parser from its fields, so a
field ``nats_url`` is ``--nats-url`` and ``GPULEDGER_NATS_URL``. Validation lives in the
dataclass's ``__post_init__``; a bad value stops the service before it starts, naming the field.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, get_type_hints

S = TypeVar("S")
ENV_PREFIX = "GPULEDGER_"


class SettingsError(ValueError):
    pass


def option(default: Any, help: str, *, secret: bool = False) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, "secret": secret})


def _convert(name: str, kind: type, raw: str) -> Any:
    try:
        if kind is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        return kind(raw)
    except ValueError:
        raise SettingsError(f"{name}: {raw!r} is not a valid {kind.__name__}") from None


def load(
    cls: type[S], argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, prog: str | None = None
) -> S:
    env = os.environ if env is None else env
    hints = get_type_hints(cls)
    parser = argparse.ArgumentParser(prog=prog, description=cls.__doc__)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        envname = ENV_PREFIX + f.name.upper()
        helptext = f"{f.metadata.get('help', '')} (env {envname}; default {f.default!r})"
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=helptext)
        else:
            parser.add_argument(flag, dest=f.name, default=None, help=helptext)
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        kind = hints[f.name]
        given = getattr(args, f.name)
        envname = ENV_PREFIX + f.name.upper()
        if given is not None:
            values[f.name] = given if kind is bool else _convert(f"--{f.name.replace('_', '-')}", kind, given)
        elif envname in env:
            values[f.name] = _convert(envname, kind, env[envname])
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise SettingsError(str(err)) from err


def describe(settings: object) -> dict[str, Any]:
    """The effective settings, secrets redacted (passwords in URLs too), for the start-up log line."""
    shown: dict[str, Any] = {}
    for f in dataclasses.fields(settings):  # type: ignore[arg-type]
        value = getattr(settings, f.name)
        if f.metadata.get("secret") and value:
            value = "***"
        elif isinstance(value, str):
            value = redact_url(value)
        shown[f.name] = value
    return shown


def redact_url(url: str) -> str:
    """``nats://user:password@host:4222`` -> ``nats://***@host:4222``; other text unchanged."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return url
    return f"{scheme}://***@{authority.rsplit('@', 1)[1]}{slash}{path}"


def require(condition: bool, name: str, problem: str) -> None:
    if not condition:
        raise SettingsError(f"{name}: {problem}")
