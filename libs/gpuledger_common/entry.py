"""What every service's ``__main__`` does: settings, logging, serve; bad settings exit 2.

Services run on uvloop: the same asyncio API, with less of each request spent in the event loop;
and with the garbage collector's full collections kept short (``gcpause``)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import uvloop

from gpuledger_common import gcpause, logs
from gpuledger_common.settings import SettingsError, load


class Logged(Protocol):
    @property
    def log_level(self) -> str: ...

    @property
    def log_format(self) -> str: ...


S = TypeVar("S", bound=Logged)


def run_service(
    prog: str, settings_type: type[S], serve: Callable[[S], Awaitable[None]], argv: Sequence[str] | None
) -> int:
    try:
        settings = load(settings_type, argv, prog=prog)
    except SettingsError as err:
        print(f"{prog}: bad setting: {err}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve(serve, settings))
    return 0


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
