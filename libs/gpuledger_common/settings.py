"""Typed settings for every service: flags over ``GPULEDGER_*`` environment over defaults.

A service declares a frozen dataclass; ``load`` builds the argument parser from its fields, so a
field ``nats_url`` is ``--nats-url`` and ``GPULEDGER_NATS_URL``. Validation lives in the
dataclass's ``__post_init__``; a bad value stops the service before it starts, naming the field.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

S = TypeVar("S")
ENV_PREFIX = "GPULEDGER_"
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off", "")


class SettingsError(ValueError):
    pass


def option(
    default: Any, help: str, *, secret: bool = False, aliases: Sequence[str] = (), env: Sequence[str] = ()
) -> Any:
    """A setting: its default and help; ``secret``: shown as ``***`` by ``describe``; ``aliases``:
    more flags for it (``--nats``); ``env``: more environment variables read after ``GPULEDGER_<NAME>``."""
    return dataclasses.field(default=default, metadata=_metadata(help, secret, aliases, env))


def computed_option(factory: Callable[[], Any], help: str, *, shown: str, env: Sequence[str] = ()) -> Any:
    """A setting whose default is worked out when the settings are made (``shown`` in the help)."""
    return dataclasses.field(default_factory=factory, metadata=_metadata(help, False, (), env) | {"shown": shown})


def _metadata(help: str, secret: bool, aliases: Sequence[str], env: Sequence[str]) -> dict[str, Any]:
    return {"help": help, "secret": secret, "aliases": tuple(aliases), "env": tuple(env)}


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_names(f: dataclasses.Field[Any]) -> tuple[str, ...]:
    """The environment variables of a setting, in the order they are read."""
    return (ENV_PREFIX + f.name.upper(), *f.metadata.get("env", ()))


def _convert(name: str, kind: Any, raw: str) -> Any:
    if get_origin(kind) in (frozenset, tuple):
        return _convert_list(name, kind, raw)
    try:
        if kind is bool:
            if raw.strip().lower() in TRUE:
                return True
            if raw.strip().lower() in FALSE:
                return False
            raise ValueError(raw)
        return kind(raw)
    except ValueError:
        raise SettingsError(f"{name}: {raw!r} is not a valid {kind.__name__}") from None


def _convert_list(name: str, kind: Any, raw: str) -> Any:
    """A comma-separated list (``13, 43``) as a ``frozenset[T]`` or a ``tuple[T, ...]``."""
    item = get_args(kind)[0]
    try:
        return get_origin(kind)(item(part.strip()) for part in raw.split(",") if part.strip())
    except ValueError:
        raise SettingsError(f"{name}: {raw!r} is not a comma-separated list of {item.__name__}") from None


def _parser(cls: type[Any], hints: Mapping[str, Any], prog: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=cls.__doc__)
    for f in dataclasses.fields(cls):
        default = f.metadata.get("shown", f.default)
        helptext = f"{f.metadata.get('help', '')} (env {', '.join(env_names(f))}; default {default!r})"
        flags = [flag_of(f.name), *f.metadata.get("aliases", ())]
        if hints[f.name] is bool:  # --x, --x true|false, --no-x
            parser.add_argument(
                *flags, dest=f.name, nargs="?", const="true", default=None, metavar="true|false", help=helptext
            )
            no = [flag.replace("--", "--no-", 1) for flag in flags]
            parser.add_argument(*no, dest=f.name, action="store_const", const="false", help=f"{flags[0]} false")
        else:
            parser.add_argument(*flags, dest=f.name, default=None, help=helptext)
    return parser


def load(
    cls: type[S], argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, prog: str | None = None
) -> S:
    """The settings from flags (``argv``), else ``env``, else the defaults; ``SettingsError`` names
    the flag, variable or field that is wrong."""
    env = os.environ if env is None else env
    hints = get_type_hints(cls)
    args = _parser(cls, hints, prog).parse_args(argv)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        given = getattr(args, f.name)
        if given is not None:
            values[f.name] = _convert(flag_of(f.name), hints[f.name], given)
            continue
        found = next((name for name in env_names(f) if name in env), None)
        if found is not None:
            values[f.name] = _convert(found, hints[f.name], env[found])
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
        elif isinstance(value, frozenset):
            value = sorted(value)
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
