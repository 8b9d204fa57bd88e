"""Child processes that end with the process that started them, however it ends.

The test fixtures and the local stack start servers: nats-server, etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok, the services, dockerd. A run that is cut short must
not leave them behind, and clean-up code cannot see to it: pytest killed with SIGKILL runs none,
SIGTERM ends Python without any (its default action), and tox, interrupted, sends SIGINT, then
SIGTERM and SIGKILL within half a second, before a fixture's teardown is done. So each child asks
the kernel, between fork and exec, to be sent a signal when its parent goes
(``prctl(PR_SET_PDEATHSIG)``, Linux): SIGKILL unless a child needs the chance to clean up (dockerd
takes SIGTERM). A parent that died before the request was made is caught by comparing the parent
pid after it.

The kernel sends the signal when the *thread* that forked the child ends, not the process. A child
started from a worker thread (``asyncio.to_thread``) would be killed when that thread ends, so
``popen`` forks from the main thread or from one thread of this module's that lives as long as the
process. ``exec_child`` forks in the event loop's thread, which is the main thread wherever this
code runs an event loop (pytest, ``gpuledger dev up``).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
T = TypeVar("T")

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_work: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
_forker: threading.Thread | None = None
_forker_lock = threading.Lock()


def dies_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child sent ``sig`` when the thread that forked it ends (None
    where the kernel offers no such thing)."""
    if _libc is None:
        return None
    prctl, parent = _libc.prctl, os.getpid()

    def request() -> None:  # runs in the child, between fork and exec
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent went before the request was made
            os.kill(os.getpid(), sig)

    return request


def popen(argv: list[str], sig: int = signal.SIGKILL, **options: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **options)`` for a child that ends with this process (see above)."""
    return _lasting(lambda: subprocess.Popen(argv, preexec_fn=dies_with_parent(sig), **options))


async def exec_child(program: str, *args: str, **options: Any) -> asyncio.subprocess.Process:
    """``asyncio.create_subprocess_exec`` for a child that is sent SIGKILL when this process ends."""
    return await asyncio.create_subprocess_exec(program, *args, preexec_fn=dies_with_parent(), **options)


def _lasting(call: Callable[[], T]) -> T:
    """``call()`` in a thread that lives as long as the process: this one if it is the main thread,
    else this module's forking thread."""
    if threading.current_thread() is threading.main_thread():
        return call()
    done: Future[T] = Future()
    _work.put((call, done))
    _start_forker()
    return done.result()


def _start_forker() -> None:
    global _forker
    with _forker_lock:
        if _forker is None:
            _forker = threading.Thread(target=_fork_forever, name="gpuledger-forker", daemon=True)
            _forker.start()


def _fork_forever() -> None:
    while True:
        call, done = _work.get()
        try:
            done.set_result(call())
        except BaseException as err:  # handed to the caller, which raises it
            done.set_exception(err)
