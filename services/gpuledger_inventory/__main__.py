"""``gpuledger-inventory``: parse settings, set up logging, serve."""

from __future__ import annotations

from gpuledger_common.entry import run_service
from gpuledger_common.fleet import FleetError
from gpuledger_inventory.app import serve
from gpuledger_inventory.settings import InventorySettings


def main(argv: list[str] | None = None) -> int:
    # a bad fleet file, or one without this node, stops it at start, naming the line or the node
    return run_service("gpuledger-inventory", InventorySettings, serve, argv, start_errors=(FleetError, KeyError))


if __name__ == "__main__":
    raise SystemExit(main())
