"""gpuledger-inventory: parse settings, configure logging, serve."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence

from gpuledger_common import logs
from gpuledger_common.fleet import FleetError
from gpuledger_core.errors import GpuledgerError, InvalidArgument
from gpuledger_inventory.app import serve
from gpuledger_inventory.settings import load_settings

log = logging.getLogger("gpuledger_inventory")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load_settings(argv, os.environ)
    except InvalidArgument as err:
        print(f"gpuledger-inventory: {err}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format)
    log.info("settings: %s", json.dumps(settings.describe(), sort_keys=True))
    try:
        asyncio.run(serve(settings))
    except (FleetError, KeyError, InvalidArgument) as err:
        log.error("cannot start: %s", err)
        return 2
    except GpuledgerError as err:
        log.error("stopped: %s", err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
