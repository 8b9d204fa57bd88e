"""What every service's ``__main__`` does: settings, logging, serve; bad settings exit 2, and so
does a setting that does not fit where the service starts (a ``SettingsError`` or an
``InvalidArgument`` out of ``serve``: ``kube=in-cluster`` outside a pod, an unreadable file).

Services run on uvloop: the same asyncio API, with less of each request spent in the event loop;
and with the garbage collector's full collections kept short (``gcpause``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import uvloop

from gpuledger_common import gcpause, logs
from gpuledger_common.settings import SettingsError, load
from gpuledger_core.errors import InvalidArgument

log = logging.getLogger(__name__)


class Logged(Protocol):
    @property
    def log_level(self) -> str: ...

    @property
    def log_format(self) -> str: ...


S = TypeVar("S", bound=Logged)


def run_service(
    prog: str,
    settings_type: type[S],
    serve: Callable[[S], Awaitable[None]],
    argv: Sequence[str] | None,
    start_errors: tuple[type[Exception], ...] = (),
) -> int:
    """``start_errors``: more errors that mean the service cannot start as set up (exit 2)."""
    try:
        settings = load(settings_type, argv, prog=prog)
    except SettingsError as err:
        print(f"{prog}: bad setting: {err}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve(serve, settings))
    except Exception as err:
        cause = _alone(err)
        if not isinstance(cause, (SettingsError, InvalidArgument, *start_errors)):
            raise
        log.error("%s cannot start: %s", prog, cause)
        return 2
    return 0


def _alone(err: Exception) -> Exception:
    """The one error inside a group of one (a task group's), else ``err``."""
    while isinstance(err, ExceptionGroup) and len(err.exceptions) == 1:
        err = err.exceptions[0]
    return err


async def _serve(serve: Callable[[S], Awaitable[None]], settings: S) -> None:
    gcpause.install()
    collecting = asyncio.create_task(gcpause.collect_thoroughly())
    try:
        await serve(settings)
    finally:
        collecting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collecting


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (in the running loop): a service's cue to shut down."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop
