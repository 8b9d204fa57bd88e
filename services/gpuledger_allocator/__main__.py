"""``gpuledger-allocator``: parse settings, set up logging, serve."""

from __future__ import annotations

from gpuledger_allocator.app import serve
from gpuledger_allocator.settings import AllocatorSettings
from gpuledger_common.entry import run_service


def main(argv: list[str] | None = None) -> int:
    return run_service("gpuledger-allocator", AllocatorSettings, serve, argv)


if __name__ == "__main__":
    raise SystemExit(main())
