"""``gpuledger-placement``: parse settings, set up logging, serve."""

from __future__ import annotations

import asyncio
import sys

from gpuledger_common import logs
from gpuledger_common.settings import SettingsError, load
from gpuledger_placement.app import serve
from gpuledger_placement.settings import PlacementSettings


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load(PlacementSettings, argv, prog="gpuledger-placement")
    except SettingsError as err:
        print(f"gpuledger-placement: bad setting: {err}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format)
    asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
