"""``gpuledger sim``: replay a cluster trace through the real placement code (see docs/placement.md)."""

from __future__ import annotations

import argparse

from gpuledger_sim import cli


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Listed in ``gpuledger --help``; ``gpuledger.__main__`` hands its arguments to ``main``."""
    sub.add_parser("sim", help="replay a cluster trace through the placement code (FGD simulator protocol)")


def main(argv: list[str]) -> int:
    return cli.main(argv)
