"""The ledger's store on JetStream key-value buckets (``LedgerStore``), in modules by concern.

``ledgerstore`` holds the face every service uses; the modules beside it each own one part of it
(its docstring names them). ``outage``, ``jsacks`` and ``keywatch`` are what the store's requests
and watches are made of; ``follow`` follows the ledger for ever and ``ledgerwait`` waits for it to
open. The names below are the store's public ones.
"""

from gpuledger_common.store.buckets import KEY_PREFIX, LEDGER_BUCKET, OWNER_BUCKET, node_key, owner_key
from gpuledger_common.store.events import EVENTS_SUBJECT
from gpuledger_common.store.feed import Following, stream_sequence
from gpuledger_common.store.ledgerstore import LedgerStore
from gpuledger_common.store.owners import OwnerRecord
from gpuledger_common.store.writes import CasStats, Transition, Written

__all__ = [
    "EVENTS_SUBJECT",
    "KEY_PREFIX",
    "LEDGER_BUCKET",
    "OWNER_BUCKET",
    "CasStats",
    "Following",
    "LedgerStore",
    "OwnerRecord",
    "Transition",
    "Written",
    "node_key",
    "owner_key",
    "stream_sequence",
]
