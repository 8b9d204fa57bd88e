"""``gpuledger-inventory``: parse settings, set up logging, serve."""

from __future__ import annotations

from gpuledger_common.entry import run_service
from gpuledger_inventory.app import serve
from gpuledger_inventory.settings import InventorySettings


def main(argv: list[str] | None = None) -> int:
    return run_service("gpuledger-inventory", InventorySettings, serve, argv)


if __name__ == "__main__":
    raise SystemExit(main())
