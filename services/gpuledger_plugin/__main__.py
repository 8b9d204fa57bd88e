"""``gpuledger-plugin``: parse settings, set up logging, serve."""

from __future__ import annotations

from gpuledger_common.entry import run_service
from gpuledger_plugin.app import serve
from gpuledger_plugin.settings import PluginSettings


def main(argv: list[str] | None = None) -> int:
    return run_service("gpuledger-plugin", PluginSettings, serve, argv)


if __name__ == "__main__":
    raise SystemExit(main())
