"""Service processes of the local stack: start, watch, stop, and say which one died and why."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpuledger_dev.children import exec_child

TAIL_LINES = 15


class ServiceDied(Exception):
    """A service of the stack exited while it should be running."""

    def __init__(self, service: ServiceProcess) -> None:
        code = service.process.returncode if service.process else None
        super().__init__(f"{service.name} exited with {code}; the end of {service.log}:\n{service.tail()}")
        self.service = service


@dataclass
class ServiceProcess:
    name: str
    module: str
    args: list[str]
    log: Path
    process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = await exec_child(  # it dies with the stack's process, however that ends
                sys.executable,
                "-m",
                self.module,
                *self.args,
                stdout=out,
                stderr=out,
                stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-TAIL_LINES:]) or "(empty log)"

    async def stop(self, timeout: float = 10.0) -> None:
        if not self.alive or self.process is None:
            return
        self.process.terminate()
        try:
            await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


@dataclass
class Supervisor:
    """Owns every process of the stack; stops them all, newest first."""

    run_dir: Path
    services: list[ServiceProcess] = field(default_factory=list)

    async def start(self, name: str, module: str, args: list[str]) -> ServiceProcess:
        service = ServiceProcess(name, module, args, self.run_dir / f"{name}.log")
        self.services.append(service)
        await service.start()
        return service

    def get(self, name: str) -> ServiceProcess:
        found = next((s for s in self.services if s.name == name), None)
        if found is None:
            raise KeyError(f"no service {name!r} (have {', '.join(s.name for s in self.services)})")
        return found

    async def kill(self, name: str) -> None:
        """SIGKILL the service, as a crash or an OOM kill would."""
        service = self.get(name)
        if service.alive and service.process is not None:
            service.process.kill()
            await service.process.wait()

    async def restart(self, name: str) -> ServiceProcess:
        """Start the service again with the same arguments (what a pod restart does)."""
        service = self.get(name)
        await service.stop()
        await service.start()
        return service

    def check(self) -> None:
        """Raise ``ServiceDied`` for the first service that is no longer running."""
        for service in self.services:
            if not service.alive:
                raise ServiceDied(service)

    async def watch(self, interval: float = 0.5) -> None:
        """Return only by raising ``ServiceDied``."""
        while True:
            self.check()
            await asyncio.sleep(interval)

    async def stop(self) -> None:
        for service in reversed(self.services):
            with contextlib.suppress(ProcessLookupError):
                await service.stop()
