"""The ledger's hot paths for cards that are not in MIG mode, this checkout beside another
(``--base``, a directory with that checkout's ``libs``): ``reserve`` of a share on a node of 8
cards with 24 holders, ``room.refusal`` over those cards, and the store's encode and decode of the
node's value (``store.values.Values``, a value another writer changed). Each side runs in its own
process, in interleaved rounds; prints each side's median microseconds per call and the ratio.

    python -m benchmarks.ledger_hot_paths --base /path/to/other/checkout [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

PROBE = r"""
import json, time, dataclasses
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Allocation, Card, CardShare, Grant, Node, Owner, OwnerKind
from gpuledger_core.room import Want, card_state, refusal
from gpuledger_common.store.values import Values

cards = tuple(Card(CardUuid(f"GPU-{i}"), i, "NVIDIA H100 80GB HBM3", 81559, numa=0, minor=i) for i in range(8))
node = Node(NodeName("n"), cards)
def alloc(n, card):
    share = CardShare(cards[card].uuid, card, 8000, 100)
    owner = Owner(OwnerKind.POD, f"u{n}", "ns", f"p{n}")
    return Allocation(AllocationId(f"a{n}"), owner, node.name, (Grant("main", (share,)),))
ledger = NodeLedger(node, tuple(alloc(n, n % 8) for n in range(24)))
new = alloc(99, 3)
def timed(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6
use = ledger.use()
states = [card_state(c, use.get(c.uuid)) for c in cards]
want = Want(False, 100, 8000)
values = Values()
data = values.encoded(ledger)
changed = dataclasses.replace(ledger, allocations=ledger.allocations[:-1] + (alloc(98, 5),))
other = Values().encoded(changed)
def decode():
    values.decoded("n", other); values.decoded("n", data)
def reserve_fresh():
    reserve(NodeLedger(node, ledger.allocations), new)
out = {
    "reserve": timed(reserve_fresh, 3000),
    "refusal x8": timed(lambda: [refusal(s, want) for s in states], 20000),
    "card_state x8": timed(lambda: [card_state(c, use.get(c.uuid)) for c in cards], 20000),
    "encode": timed(lambda: Values().encoded(changed), 2000),
    "decode (2 values)": timed(decode, 2000),
}
print(json.dumps(out))
"""


def run(libs: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{libs}:{libs.parent / 'services'}:{libs.parent / 'proto'}"}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True, help="the other checkout (its libs/ is used)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    here = Path(__file__).resolve().parents[1] / "libs"
    sides: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
    for _ in range(args.rounds):
        sides["base"].append(run(args.base / "libs"))
        sides["this"].append(run(here))
    print("| path | base (us, median) | this (us, median) | this / base |")
    print("|---|---|---|---|")
    for name in sides["base"][0]:
        base = statistics.median(r[name] for r in sides["base"])
        this = statistics.median(r[name] for r in sides["this"])
        print(f"| {name} | {base:.2f} | {this:.2f} | {this / base:.3f} |")


if __name__ == "__main__":
    main()
