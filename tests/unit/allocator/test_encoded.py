"""The gRPC replies clusterwire writes, made in a fresh interpreter (one that has not used the
proto's classes yet, as an allocator answering its first call)."""

from __future__ import annotations

import subprocess
import sys

import pytest

FRESH = """
from gpuledger_allocator import api_grpc
for made in (
    api_grpc.EncodedAllocation(b"\\n\\x01a"),
    api_grpc.EncodedAllocateResponse(b"\\x10\\x01"),
    api_grpc.EncodedAllocations(b""),
    api_grpc.EncodedCluster(b"\\x12\\x01t"),
):
    print(type(made).__name__, made.SerializeToString().hex())
"""


def test_each_encoded_reply_is_its_bytes_in_a_fresh_process() -> None:
    done = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == [
        "EncodedAllocation 0a0161",
        "EncodedAllocateResponse 1001",
        "EncodedAllocations ",
        "EncodedCluster 120174",
    ]


@pytest.mark.parametrize(
    "name", ["EncodedAllocation", "EncodedAllocateResponse", "EncodedAllocations", "EncodedCluster"]
)
def test_each_encoded_reply_passes_grpclibs_type_check(name: str) -> None:
    from grpclib.encoding.proto import ProtoCodec

    from gpuledger_allocator import api_grpc
    from gpuledger_proto.gpuledger.allocator import v1 as pb

    made = getattr(api_grpc, name)(b"\x0a\x00")
    reply_type = getattr(pb, name.removeprefix("Encoded").replace("Allocations", "ListAllocationsResponse"))
    assert ProtoCodec().encode(made, reply_type) == b"\x0a\x00"
