"""A real headless Chromium driven over the DevTools protocol, for the dashboard's tests.

Debian's ``chromium`` package provides the browser; nothing else is needed (aiohttp speaks the
DevTools websocket).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from gpuledger_dev.children import exec_child
from gpuledger_dev.natsserver import free_port

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError("no Chromium found: install Debian's chromium package (python3 dev.py test does)")


class Page:
    """One browser tab: navigate, evaluate JavaScript, take a screenshot."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        async for msg in self.ws:
            data = json.loads(msg.data)
            if data.get("id") == call_id:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                result: dict[str, Any] = data.get("result", {})
                return result
        raise RuntimeError("the browser closed the connection")

    async def goto(self, url: str) -> None:
        await self.send("Page.enable")
        await self.send("Page.navigate", url=url)

    async def evaluate(self, expression: str) -> Any:
        reply = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"page script failed: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 10.0) -> Any:
        """Evaluate until the result is truthy; return it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last: Any = None
        while loop.time() < deadline:
            last = await self.evaluate(expression)
            if last:
                return last
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{expression!r} stayed {last!r} for {timeout:g}s")

    async def screenshot(self) -> bytes:
        reply = await self.send("Page.captureScreenshot", format="png")
        return base64.b64decode(reply["data"])


@contextlib.asynccontextmanager
async def chromium(width: int = 1280, height: int = 900) -> AsyncIterator[Page]:
    port = free_port()
    # Chromium's helper processes may still be writing the profile as the main one exits.
    with tempfile.TemporaryDirectory(prefix="gpuledger-chromium-", ignore_cleanup_errors=True) as profile:
        process = await exec_child(
            chromium_binary(),
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--remote-debugging-port={port}",
            f"--window-size={width},{height}",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            async with aiohttp.ClientSession() as session:
                ws_url = await _page_socket(session, port, process)
                async with session.ws_connect(ws_url, max_msg_size=0) as ws:
                    yield Page(ws)
        finally:
            if process.returncode is None:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), 10)
                except TimeoutError:
                    process.kill()
                    await process.wait()


async def _page_socket(session: aiohttp.ClientSession, port: int, process: asyncio.subprocess.Process) -> str:
    for _ in range(200):
        if process.returncode is not None:
            raise RuntimeError(f"chromium exited with {process.returncode}")
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(f"http://127.0.0.1:{port}/json/list") as reply:
                pages = [t for t in await reply.json() if t.get("type") == "page"]
                if pages:
                    url: str = pages[0]["webSocketDebuggerUrl"]
                    return url
        await asyncio.sleep(0.1)
    raise RuntimeError("chromium did not open its DevTools port")
