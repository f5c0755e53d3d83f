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
    "batch": protocol.batch(
        [
            protocol.job(job_id(1), 4999, mp([1, 2, 3])),
            protocol.job(job_id(2), 70_000, mp({"text": "héllo"})),
        ]
    ),
    "hello_stream": protocol.hello(
        "generate", 4243, "Generate", features=["stream", "cancel", "join"]
    ),
    "chunks": protocol.chunks(
        [
            protocol.chunk(job_id(1), mp("Hel")),
            protocol.chunk(job_id(2), mp({"token": 17})),
            protocol.chunk(job_id(1), mp("lo")),
        ]
    ),
    "pull": protocol.pull(3),
    "results_end": protocol.results(
        [
            protocol.end(job_id(1)),
            protocol.error(job_id(2), "RuntimeError: out of memory"),
        ]
    ),
    "cancel": protocol.cancel([job_id(2), job_id(3)]),
    "shutdown": protocol.shutdown("proxy shutting down"),
    "hello_tensors": protocol.hello(
        "default",
        4244,
        "Simple",
        inputs=[
            {"name": "INPUT0", "datatype": "FP32", "shape": [3]},
            {"name": "TEXT", "datatype": "BYTES", "shape": [-1]},
        ],
        outputs=[{"name": "OUTPUT0", "datatype": "INT64", "shape": [2, 2]}],
    ),
    "hello_weight": protocol.hello("default", 4245, "Embedder", weight="/text"),
    "batch_raw": protocol.batch(
        [protocol.job(job_id(1), 1000, b"\xc6\x00\x00\x00\x04\x89PNG", content_type="image/png")]
    ),
    "batch_traced": protocol.batch(
        [
            protocol.job(
                job_id(1),
                1000,
                b"\x01",
                traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                tracestate="vendor=value",
            ),
            protocol.job(
                job_id(2),
                1000,
                b"\x02",
                traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01",
            ),
        ]
    ),
    "results_raw": protocol.results(
        [protocol.ok(job_id(1), b"\xc4\x04\x89PNG", content_type="image/png")]
    ),
    "batch_shared": protocol.batch(
        [
            {
                **protocol.job(job_id(1), 1000, b"", content_type="application/octet-stream"),
                "payload_at": [65536, 1000005],
            }
        ]
    ),
    "shm": {"type": "shm", "size": 268435456},
    "reject": protocol.reject("protocol version 9 is not supported; this proxy speaks 1"),
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


def test_chunks_frames_are_written_entry_by_entry_into_the_same_bytes():
    golden = (VECTORS / "chunks.bin").read_bytes()
    assert protocol.encode_chunks(EXPECTED["chunks"]["chunks"]) == ([golden], [])


def test_a_streaming_workers_hello_with_schemas_keeps_features_last():
    hello = protocol.hello("s", 1, "W", schemas={"input_schema": "{}"}, features=["stream"])
    assert list(hello) == ["type", "version", "stage", "pid", "name", "input_schema", "features"]
