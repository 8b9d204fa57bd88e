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
from urllib.parse import urlsplit

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


def env_default(name: str, default: str, env: Mapping[str, str] | None = None) -> str:
    """A command-line tool's default for option ``name``: ``GPULEDGER_<NAME>`` if set."""
    env = os.environ if env is None else env
    return env.get(ENV_PREFIX + name.upper(), default)


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
    """``nats://user:password@host:4222`` -> ``nats://***@host:4222``; other text unchanged. A
    comma-separated list of URLs is redacted URL by URL."""
    if "," in url:
        return ",".join(redact_url(part) for part in url.split(","))
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return url
    return f"{scheme}://***@{authority.rsplit('@', 1)[1]}{slash}{path}"


NATS_SCHEMES = ("nats", "tls", "ws", "wss")


def nats_servers(raw: str, name: str = "nats_url") -> tuple[str, ...]:
    """The servers of a ``nats_url`` setting: one URL or a comma-separated list of them
    (``nats://a:4222,nats://b:4222``), each checked; ``SettingsError`` names the bad entry
    (its password hidden)."""
    problem = nats_url_problem(raw)
    if problem:
        raise SettingsError(f"{name}: {problem}")
    return tuple(part.strip() for part in raw.split(","))


def nats_url_problem(raw: str) -> str:
    """What is wrong with a ``nats_url`` setting, naming the bad entry; empty when nothing is."""
    entries = [part.strip() for part in raw.split(",")]
    if entries == [""]:
        return "must name at least one server, e.g. nats://127.0.0.1:4222"
    for i, entry in enumerate(entries, 1):
        problem = _server_problem(entry)
        if problem:
            where = f"entry {i} of {len(entries)}" if len(entries) > 1 else "the URL"
            return f"{where} ({redact_url(entry)!r}) {problem}"
    if len({urlsplit(e).scheme in ("ws", "wss") for e in entries}) > 1:
        return "mixes websocket (ws://, wss://) and plain (nats://, tls://) servers"
    return ""


def _server_problem(entry: str) -> str:
    """What is wrong with one server URL; empty when nothing is."""
    if not entry:
        return "is empty (two commas in a row, or one at an end)"
    url = urlsplit(entry)
    if url.scheme not in NATS_SCHEMES:
        return "must start with nats://, tls://, ws:// or wss://"
    if not url.hostname:
        return "names no host"
    try:
        port = url.port
    except ValueError:
        return "has a port that is not a number in 1..65535"
    if port == 0:
        return "has port 0"
    if url.path not in ("", "/") or url.query or url.fragment:
        return "must be scheme://[user:password@]host[:port], with nothing after the port"
    return ""


LOOPBACK = "127.0.0.1"
EVERY_ADDRESS = "0.0.0.0"


def listen_host(configured: str, authenticated: bool) -> str:
    """Where a port that serves an API listens: ``configured`` when set; else every address when
    its callers are authenticated (TLS with client certificates), and only loopback when they are
    not, so that an API without authentication is not offered to the network unless asked for."""
    return configured or (EVERY_ADDRESS if authenticated else LOOPBACK)


def require(condition: bool, name: str, problem: str) -> None:
    if not condition:
        raise SettingsError(f"{name}: {problem}")
