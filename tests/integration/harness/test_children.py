"""What the fixtures start dies with the run, however the run ends (gpuledger_dev.children): a
pytest run whose fixture started a nats-server, a control-plane process (from a worker thread, as
``RealCluster`` starts its control plane) and a service of the local stack is killed with SIGKILL,
SIGTERM or SIGINT (each followed, as tox does, by the harder ones if the run has not ended), and
afterwards none of those processes is left."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpuledger_dev import children
from tests.support.waiting import polled, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

INNER = '''
import asyncio
import os
from pathlib import Path

import pytest

from gpuledger_dev.processes import Supervisor
from gpuledger_dev.natsserver import embedded_nats
from gpuledger_dev.controlplane.cluster import Process


@pytest.fixture
async def started(tmp_path):
    async with embedded_nats() as nats:
        control = Process("sleeper", ["sleep", "600"], tmp_path / "sleeper.log")
        await asyncio.to_thread(control.start)
        supervisor = Supervisor(tmp_path)
        service = await supervisor.start("web", "http.server", ["0", "--bind", "127.0.0.1"])
        try:
            yield [nats.process.pid, control.popen.pid, service.process.pid]
        finally:
            await supervisor.stop()
            await asyncio.to_thread(control.stop)


async def test_waits_until_the_run_is_ended(started):
    Path(os.environ["CHILD_PIDS"]).write_text(" ".join(map(str, started)))
    # Awake every half second, as a test at work is: the kernel may hand SIGINT to another
    # thread (one waiting for a child), and asyncio's runner sets no wakeup fd for its SIGINT
    # handler, so a loop asleep with nothing due would never run it (seen under load).
    while True:
        await asyncio.sleep(0.5)
'''
INI = "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
# A run that has not ended after its signal is asked, with SIGUSR1, where every thread waits.
CONFTEST = "import faulthandler\nimport signal\n\nfaulthandler.register(signal.SIGUSR1, all_threads=True)\n"
ENDS_WITHIN_S = 60  # after SIGTERM or SIGKILL, even on a loaded machine
# tox, interrupted, sends SIGINT, then SIGTERM and SIGKILL a moment apart (its defaults are 0.3 and
# 0.2 s; given more here). A bare SIGINT sometimes left the inner run hanging at its end under load,
# with nothing in its log even for faulthandler: what must hold is that nothing outlives the run.
TOX_GRACE_S = 5.0
AS_SENT = {
    signal.SIGKILL: (signal.SIGKILL,),
    signal.SIGTERM: (signal.SIGTERM, signal.SIGKILL),
    signal.SIGINT: (signal.SIGINT, signal.SIGTERM, signal.SIGKILL),
}


def started_at(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def left(seen: dict[int, str]) -> list[int]:
    """The processes of ``seen`` still running (the same pid started at the same time)."""
    return [pid for pid, start in seen.items() if started_at(pid) == start]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
async def test_no_child_of_a_run_outlives_it(tmp_path: Path, sig: signal.Signals) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    pids = tmp_path / "pids"
    env = {**os.environ, "CHILD_PIDS": str(pids)}
    with (tmp_path / "inner.log").open("wb") as out:
        run = await children.exec_child(
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path / "test_inner.py"),
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    seen: dict[int, str] = {}
    try:
        await wait_for(polled(lambda: _listed(pids)), 60, "the inner run's children started", 0.05)
        listed = _listed(pids)
        seen = {pid: start for pid in listed if (start := started_at(pid)) is not None}
        assert len(seen) == 3, f"{listed} not all running: {(tmp_path / 'inner.log').read_text()}"
        for sent in AS_SENT[sig]:  # as tox ends a run it interrupts: SIGINT, then SIGTERM, then SIGKILL
            run.send_signal(sent)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(ENDS_WITHIN_S if sent is AS_SENT[sig][-1] else TOX_GRACE_S):
                    await run.wait()
            if run.returncode is not None:
                break
        if run.returncode is None:
            run.send_signal(signal.SIGUSR1)  # where it waits, into its log
            await asyncio.sleep(1.0)
            log = (tmp_path / "inner.log").read_text(errors="replace")
            pytest.fail(f"the run did not end after {sig.name}; it printed:\n{log}")

        async def none_left() -> bool:
            return not left(seen)

        try:
            await wait_for(none_left, 10, "every child of the run gone", 0.05)
        except TimeoutError:
            pytest.fail(f"after {sig.name} of the run, {left(seen)} of {sorted(seen)} still run")
    finally:
        for pid in left(seen):
            os.kill(pid, signal.SIGKILL)
        if run.returncode is None:
            run.kill()
            await run.wait()


def _listed(path: Path) -> list[int]:
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


def test_a_child_started_from_a_worker_thread_outlives_the_thread() -> None:
    """The parent-death signal follows the thread that forked: ``popen`` forks from a thread that
    lasts, so a thread that asked and ended takes no child with it."""
    made: list[subprocess.Popen[bytes]] = []
    worker = threading.Thread(target=lambda: made.append(children.popen(["sleep", "600"])))
    worker.start()
    worker.join()
    [child] = made
    try:
        assert worker.native_id is not None
        task = Path(f"/proc/self/task/{worker.native_id}")
        while task.exists():  # the thread has left Python; wait until the kernel has ended it too
            threading.Event().wait(0.01)
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=1.0)  # a child forked by the ended thread is killed within microseconds
    finally:
        child.kill()
        child.wait()
