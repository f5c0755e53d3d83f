"""The golden frames in worker-protocol/vectors/ decode to the documented messages, and this
package's message builders re-encode them byte for byte (the Rust crate checks the same files)."""

from pathlib import Path

import msgpack
import pytest

from corral import _protocol as protocol

VECTORS = Path(__file__).resolve().parents[2] / "worker-protocol" / "vectors"


def job_id(byte: int) -> bytes:
    return bytes([byte]) * 16


def mp(value: object) -> bytes:
    return msgpack.packb(value)


EXPECTED = {
    "hello": protocol.hello("default", 4242, "Echo"),
    "results": protocol.results(
        [
            protocol.ok(job_id(1), mp({"label": 7, "p": 0.5})),
            protocol.invalid(job_id(2), "expected 64 pixels, got 3"),
            protocol.error(job_id(3), "ZeroDivisionError: division by zero"),
        ]
    ),
    "batch": {
        "type": "batch",
        "jobs": [
            {"id": job_id(1), "timeout_ms": 4999, "payload": mp([1, 2, 3])},
            {"id": job_id(2), "timeout_ms": 70_000, "payload": mp({"text": "héllo"})},
        ],
    },
    "hello_stream": {
        **protocol.hello("generate", 4243, "Generate"),
        "features": ["stream", "cancel", "join"],
    },
    "chunks": {
        "type": "chunks",
        "chunks": [
            {"id": job_id(1), "data": mp("Hel")},
            {"id": job_id(2), "data": mp({"token": 17})},
            {"id": job_id(1), "data": mp("lo")},
        ],
    },
    "pull": {"type": "pull", "max": 3},
    "results_end": protocol.results(
        [
            {"id": job_id(1), "status": "end"},
            protocol.error(job_id(2), "RuntimeError: out of memory"),
        ]
    ),
    "cancel": {"type": "cancel", "ids": [job_id(2), job_id(3)]},
    "shutdown": {"type": "shutdown", "message": "proxy shutting down"},
    "reject": {
        "type": "reject",
        "message": "protocol version 9 is not supported; this proxy speaks 1",
    },
}


def test_every_vector_is_covered():
    assert sorted(p.stem for p in VECTORS.glob("*.bin")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_vector_round_trips(name):
    golden = (VECTORS / f"{name}.bin").read_bytes()
    assert protocol.encode_frame(EXPECTED[name]) == golden
    assert protocol.decode_body(golden[4:]) == EXPECTED[name]


def test_results_frames_are_written_item_by_item_into_the_same_bytes():
    golden = (VECTORS / "results.bin").read_bytes()
    assert protocol.encode_results(EXPECTED["results"]["results"]) == golden
