"""A real dockerd, Docker Compose and the images built from deploy/Dockerfile.

``python -m tests.support.engine prepare`` installs and builds them first (tox -e compose
runs it). The engine is the one that answers, or a dockerd started for the session and stopped
after it; the stack is up for the module that asks for it, and down after it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.support.engine import dockerd
from tests.support.engine.compose_stack import ComposeStack
from tests.support.engine.images import DEV_IMAGE, PRODUCTION_IMAGE, Checkout

TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="session")
def engine() -> Iterator[dockerd.Engine]:
    with dockerd.engine() as found:
        for image in (DEV_IMAGE, PRODUCTION_IMAGE):
            present = subprocess.run([found.docker, "image", "inspect", image], capture_output=True, check=False)
            assert present.returncode == 0, f"no image {image}: run python -m tests.support.engine prepare"
        yield found


@pytest.fixture(scope="module")
def stack(engine: dockerd.Engine) -> Iterator[ComposeStack]:
    running = ComposeStack(engine.docker, Checkout.here(), "gpuledger-test")
    running.down()  # what a run killed halfway may have left
    try:
        TIMINGS["compose up until every service is healthy (s)"] = running.up()
        yield running
    finally:
        running.down()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for what, value in TIMINGS.items():
        terminalreporter.write_line(f"{what}: {value:.1f}")
