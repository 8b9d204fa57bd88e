"""The dashboard's first view at 5,000 nodes: how long until a person sees the cluster.

A replica's view is filled with ``--nodes`` nodes (``tests/support/big_fleet.py``: H100 and A100
nodes of 8 cards, RTX 3090 and Tesla P4 nodes, about 23,750 cards and 10,000 holders at 5,000) and
served by the allocator's own dashboard app on a free port. It times, each as the median of
``--rounds``:

- the rows made cold (what the trends' sampler does once at start, 250 nodes a turn of the loop);
- ``GET /api/summary`` over HTTP (totals, cards per model, the first page of 50 node rows);
- the first view in a real headless Chromium: from navigation until the page has drawn the
  cluster view (totals, models, plots and the node list; ``document.body.dataset.ready``, in the
  page's own clock), with a fresh browser each round (no cache).

    python -m benchmarks.dashboard_first_view [--nodes 5000] [--rounds 3] [--screenshot FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gpuledger_allocator.dashboard import dashboard_app
from gpuledger_allocator.overview import Overview
from gpuledger_allocator.trends import Ring, Trends
from gpuledger_core.errors import Unavailable
from gpuledger_core.ids import NodeName
from gpuledger_dev.natsserver import free_port
from tests.support.big_fleet import fill, offline_view
from tests.support.browser import chromium


async def no_inventory(node: NodeName) -> Mapping[str, Any]:
    raise Unavailable(f"no inventory of {node} here")


async def main(nodes: int, rounds: int, screenshot: str) -> None:
    view = fill(offline_view(), nodes)
    overview = Overview(view)
    started = time.perf_counter()
    await overview.warm()
    cold = time.perf_counter() - started
    trends = Trends(Ring(30, 24), Ring(300, 6))
    trends.sample(time.time(), overview.rows())
    runner = web.AppRunner(dashboard_app(view, no_inventory, overview, trends))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}/"
    try:
        summary = await _summary_times(url, rounds)
        first = [await _first_view(url, screenshot if i == 0 else "") for i in range(rounds)]
    finally:
        await runner.cleanup()
    print(f"dashboard, {nodes} nodes ({sum(r.cards for r in overview.rows())} cards), {rounds} rounds, medians:")
    print(f"  rows made cold (once, at start):    {cold * 1000:7.0f} ms")
    print(f"  GET /api/summary (first page of 50): {statistics.median(summary) * 1000:7.1f} ms")
    print(f"  first view in Chromium:             {statistics.median(first):7.0f} ms (from navigation)")


async def _summary_times(url: str, rounds: int) -> list[float]:
    times = []
    async with aiohttp.ClientSession() as session:
        for _ in range(rounds):
            started = time.perf_counter()
            async with session.get(url + "api/summary") as reply:
                await reply.read()
            times.append(time.perf_counter() - started)
    return times


async def _first_view(url: str, screenshot: str) -> float:
    async with chromium(1400, 1000) as page:
        await page.goto(url)
        ready = float(await page.wait_for("document.body?.dataset.ready", timeout=30.0))
        if screenshot:
            image = await page.screenshot()
            await asyncio.to_thread(Path(screenshot).write_bytes, image)
        return ready


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--screenshot", default="", help="save the first round's view to this PNG")
    args = parser.parse_args()
    asyncio.run(main(args.nodes, args.rounds, args.screenshot))
