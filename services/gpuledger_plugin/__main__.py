"""``gpuledger-plugin``: parse settings, set up logging, serve (``--mode dra``: the DRA plugin)."""

from __future__ import annotations

import os
import sys

from gpuledger_common.entry import run_service
from gpuledger_plugin.app import serve
from gpuledger_plugin.dra.settings import DraSettings, wants_dra
from gpuledger_plugin.settings import PluginSettings


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if wants_dra(args, os.environ):
        from gpuledger_plugin.dra.app import serve as serve_dra

        return run_service("gpuledger-plugin", DraSettings, serve_dra, args)
    return run_service("gpuledger-plugin", PluginSettings, serve, argv)


if __name__ == "__main__":
    raise SystemExit(main())
