"""What the dashboard's tests read of the page, and the screenshots they save for docs/."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from tests.support.browser import Page

SHOTS = "GPULEDGER_SCREENSHOTS"  # a folder: each view saved as dashboard-<view>.png


def node_rows() -> str:
    return "[...document.querySelectorAll('#node-rows tr[data-node]')].map(r => r.dataset.node)"


def holder_rows() -> str:
    rows = "document.querySelectorAll('#holders table.holders tbody tr[data-allocation]')"
    return f"[...{rows}].map(r => [...r.cells].map(c => c.textContent))"


def card_tile(node: str, index: int) -> str:
    return f'document.querySelector(\'.card[data-node="{node}"][data-index="{index}"]\')'


def plot_points(plot: str, series: str) -> str:
    return f"Number(document.querySelector('[data-plot={plot}] path[data-series=\"{series}\"]')?.dataset.points || 0)"


async def tile(page: Page, name: str) -> str:
    value: str = await page.evaluate(f"document.querySelector('[data-tile={name}] .value').textContent")
    return value


async def choose(page: Page, select: str, value: str) -> None:
    await page.evaluate(
        f"(e => {{ e.value = {json.dumps(value)}; e.dispatchEvent(new Event('change')); }})"
        f"(document.getElementById({json.dumps(select)}))"
    )


async def search(page: Page, text: str) -> None:
    await page.evaluate(
        f"(e => {{ e.value = {json.dumps(text)}; e.dispatchEvent(new Event('input')); }})(document.getElementById('q'))"
    )


async def labels_apart(page: Page, node: str, index: int) -> bool:
    """Whether the card's number, state and model are each drawn, and none overlaps another."""
    found: bool = await page.evaluate(
        f"""(() => {{
        const card = {card_tile(node, index)};
        const boxes = ['.index', '.badge', '.model'].map(s => card.querySelector(s).getBoundingClientRect());
        const apart = (a, b) => a.right <= b.left || b.right <= a.left || a.bottom <= b.top || b.bottom <= a.top;
        return boxes.every(b => b.width > 0 && b.height > 0)
            && apart(boxes[0], boxes[1]) && apart(boxes[0], boxes[2]) && apart(boxes[1], boxes[2]);
        }})()"""
    )
    return found


async def save_screenshot(page: Page, view: str) -> None:
    """Save the view as ``dashboard-<view>.png`` in the folder ``GPULEDGER_SCREENSHOTS`` names, if set."""
    folder = os.environ.get(SHOTS)
    if folder:
        await asyncio.sleep(0.5)  # let the last answer draw (only for the picture; nothing is asserted on it)
        image = await page.screenshot()
        await asyncio.to_thread(Path(folder, f"dashboard-{view}.png").write_bytes, image)
