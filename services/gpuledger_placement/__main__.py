"""``gpuledger-placement``: parse settings, set up logging, serve."""

from __future__ import annotations

from gpuledger_common.entry import run_service
from gpuledger_placement.app import serve
from gpuledger_placement.settings import PlacementSettings


def main(argv: list[str] | None = None) -> int:
    return run_service("gpuledger-placement", PlacementSettings, serve, argv)


if __name__ == "__main__":
    raise SystemExit(main())
