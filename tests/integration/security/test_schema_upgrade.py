"""A rolling upgrade, with two versions of the codec side by side on one real nats-server: the
codec as it was before values recorded their schema (its source as commit 67708c1 had it, kept
under ``data/`` so the test needs no git history), this one, and a value of a newer schema than
this one knows, as a later release would write it."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import orjson
import pytest
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.store import LedgerStore, node_key
from gpuledger_core import codec
from gpuledger_core.errors import FailedPrecondition
from gpuledger_core.ledger import NodeLedger, set_mode, with_node
from gpuledger_core.model import CardMode
from gpuledger_dev.fleet import Fleet

# libs/gpuledger_core/codec.py of 67708c1, the last commit whose codec wrote no schema
OLD_CODEC = Path(__file__).with_name("data") / "codec_before_schemas.py.txt"


@pytest.fixture(scope="module")
def old_codec(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    source = OLD_CODEC.read_text()
    assert "def ledger_to" in source and "schema" not in source
    path = tmp_path_factory.mktemp("codec") / "codec_before_schemas.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("codec_before_schemas", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def ledger_of(fleet: Fleet) -> NodeLedger:
    return NodeLedger(fleet.nodes[0].node)


async def test_the_old_codec_reads_what_this_one_writes(nc: Client, fleet: Fleet, old_codec: ModuleType) -> None:
    store = await LedgerStore.open(nc)
    ledger = ledger_of(fleet)
    await store.mutate(ledger.node.name, lambda _: ledger)
    entry = await store.kv.get(node_key(ledger.node.name))
    assert orjson.loads(entry.value or b"")["schema"] == codec.SCHEMA
    assert old_codec.ledger_from(orjson.loads(entry.value or b"")) == ledger


async def test_this_codec_reads_and_writes_over_what_the_old_one_wrote(
    nc: Client, fleet: Fleet, old_codec: ModuleType
) -> None:
    store = await LedgerStore.open(nc)
    ledger = ledger_of(fleet)
    name = ledger.node.name
    await store.kv.put(node_key(name), orjson.dumps(old_codec.ledger_to(ledger)))
    assert (await store.read(name))[0] == ledger
    relabelled = with_node(ledger, dataclasses.replace(ledger.node, labels=(("zone", "b"),)))
    await store.mutate(name, lambda _: relabelled)
    entry = await store.kv.get(node_key(name))
    assert codec.schema_of(orjson.loads(entry.value or b"")) == codec.SCHEMA
    assert old_codec.ledger_from(orjson.loads(entry.value or b"")) == relabelled


async def test_a_value_of_a_newer_schema_is_read_and_never_written_over(nc: Client, fleet: Fleet) -> None:
    store = await LedgerStore.open(nc, retry_s=1.0)
    ledger = ledger_of(fleet)
    name = ledger.node.name
    newer = codec.ledger_to(ledger) | {"schema": codec.KNOWN + 1, "placement_hints": {"rack": "r4"}}
    newer["node"] = newer["node"] | {"power_cap_w": 300}  # additive: a field this codec does not know
    revision = await store.kv.put(node_key(name), orjson.dumps(newer))
    assert (await store.read(name))[0] == ledger  # read as far as it is known
    relabelled = with_node(ledger, dataclasses.replace(ledger.node, labels=(("zone", "b"),)))
    with pytest.raises(FailedPrecondition, match=rf"schema {codec.KNOWN + 1} .* knows schema {codec.KNOWN}"):
        await store.mutate(name, lambda _: relabelled)
    entry = await store.kv.get(node_key(name))
    assert entry.revision == revision and orjson.loads(entry.value or b"") == newer  # nothing lost
    # Once the newer release has taken the value back to this schema, this one writes again.
    await store.kv.put(node_key(name), orjson.dumps(codec.ledger_to(ledger)))
    assert (await store.mutate(name, lambda _: relabelled)).new == relabelled


async def test_a_schema_that_is_not_a_number_is_refused_by_name(nc: Client, fleet: Fleet) -> None:
    store = await LedgerStore.open(nc, retry_s=1.0)
    ledger = ledger_of(fleet)
    await store.kv.put(node_key(ledger.node.name), orjson.dumps(codec.ledger_to(ledger) | {"schema": "2"}))
    with pytest.raises(Exception, match="schema: must be a positive whole number"):
        await store.read(ledger.node.name)


async def test_nats_bodies_carry_their_schema_and_extra_fields_are_tolerated(nc: Client) -> None:
    seen: list[object] = []

    async def handler(body: dict[str, object]) -> dict[str, object]:
        seen.append(body)
        return {"fine": True}

    responder = await bus.Responder(nc, "gpuledger.v1.test.schema", handler).start()
    try:
        reply = await nc.request("gpuledger.v1.test.schema", orjson.dumps({"schema": 7, "new_field": 1}), timeout=5)
        assert orjson.loads(reply.data) == {"ok": True, "result": {"fine": True}, "schema": codec.SCHEMA}
        assert await bus.request(nc, "gpuledger.v1.test.schema", {"x": 1}) == {"fine": True}
    finally:
        await responder.close()
    assert seen == [{"schema": 7, "new_field": 1}, {"schema": codec.SCHEMA, "x": 1}]


async def test_an_answer_over_the_servers_max_payload_is_refused_saying_so(nc: Client) -> None:
    """nats-py will not publish more than the server's max_payload (1 MB by default): the asker
    gets a refusal that says so at once, not a timeout."""

    async def handler(body: dict[str, object]) -> dict[str, object]:
        return {"blob": "x" * int(str(body["size"]))}

    responder = await bus.Responder(nc, "gpuledger.v1.test.big", handler).start()
    try:
        assert await bus.request(nc, "gpuledger.v1.test.big", {"size": 1000}, timeout=5) == {"blob": "x" * 1000}
        with pytest.raises(FailedPrecondition, match=r"over the NATS server's max_payload of 1,048,576"):
            await bus.request(nc, "gpuledger.v1.test.big", {"size": nc.max_payload}, timeout=5)
    finally:
        await responder.close()


async def test_a_node_with_a_mig_card_is_schema_2_and_a_replica_that_knows_1_never_writes_it(
    nc: Client, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica of before MIG would take a MIG card for a whole one and drop its instances: the
    node's value says schema 2, which that replica reads and refuses to write over."""
    store = await LedgerStore.open(nc)
    ledger = ledger_of(fleet)
    name = ledger.node.name
    mig = set_mode(ledger, ledger.node.cards[0].uuid, CardMode.MIG)
    await store.mutate(name, lambda _: mig)
    entry = await store.kv.get(node_key(name))
    assert orjson.loads(entry.value or b"")["schema"] == codec.MIG_SCHEMA
    monkeypatch.setattr(codec, "KNOWN", codec.SCHEMA)  # the replica of before
    older = await LedgerStore.open(nc, retry_s=1.0)
    relabelled = with_node(mig, dataclasses.replace(mig.node, labels=(("zone", "b"),)))
    with pytest.raises(FailedPrecondition, match=rf"schema {codec.MIG_SCHEMA} .* knows schema {codec.SCHEMA}"):
        await older.mutate(name, lambda _: relabelled)
    assert (await store.kv.get(node_key(name))).revision == entry.revision
