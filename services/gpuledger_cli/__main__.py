"""``gpuledger``: the command line for people and scripts."""

from __future__ import annotations

import argparse
import asyncio
import sys

from gpuledger_cli import commands, health, localcreds, natsconfig, sim
from gpuledger_core.errors import GpuledgerError, InvalidArgument

EXIT_CODES = {"invalid_argument": 2, "not_found": 3, "resource_exhausted": 4, "unavailable": 5}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="gpuledger", description="Schedules and shares GPUs around a global ledger of cards."
    )
    sub = top.add_subparsers(dest="command", required=True)
    commands.register(sub)
    register_dev(sub)
    health.register(sub)
    natsconfig.register(sub)
    localcreds.register(sub)
    sim.register(sub)
    return top


def register_dev(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``gpuledger dev``, where the local stack's simulated fleet and cluster are installed."""
    try:
        from gpuledger_dev import up as devup
    except ModuleNotFoundError as err:
        if err.name != "gpuledger_dev":
            raise
        dev = sub.add_parser("dev", help="the local development stack (not in this install)")
        dev.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        dev.set_defaults(run=_no_dev)
        return
    devup.register(sub)


async def _no_dev(args: argparse.Namespace) -> int:
    print(
        "gpuledger dev: this install has no local stack (the production image leaves out the "
        "simulated fleet and cluster); use the image's dev target or a development install",
        file=sys.stderr,
    )
    return 2


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["sim"]:  # the replay parses its own options, --help included
        return sim.main(given[1:])
    args = parser().parse_args(given)
    try:
        code: int = asyncio.run(args.run(args))
    except InvalidArgument as err:
        print(f"gpuledger {args.command}: invalid {err}", file=sys.stderr)
        return EXIT_CODES[err.code]
    except GpuledgerError as err:
        print(f"gpuledger {args.command}: {err}", file=sys.stderr)
        return EXIT_CODES.get(err.code, 1)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
