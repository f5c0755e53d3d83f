//! Golden frames: `vectors/*.bin` are complete frames (length prefix included). Each must decode
//! to the message built here and re-encode to the same bytes. The Python package's tests read
//! the same files, so the two implementations cannot drift apart.
//!
//! To regenerate after a deliberate protocol change: `UPDATE_VECTORS=1 cargo test -p corral-protocol`.

use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use corral_protocol::*;
use serde::Serialize;
use tokio_util::codec::{Decoder, Encoder};

fn id(byte: u8) -> JobId {
    JobId::from_bytes([byte; 16])
}

/// msgpack of a small JSON-like value, as the proxy would transcode it.
fn mp(value: &serde_json::Value) -> Bytes {
    Bytes::from(rmp_serde::to_vec(value).unwrap())
}

fn worker_messages() -> Vec<(&'static str, WorkerMessage)> {
    vec![
        (
            "hello",
            WorkerMessage::Hello(Hello {
                version: 1,
                stage: "default".into(),
                pid: 4242,
                name: "Echo".into(),
                input_schema: None,
                output_schema: None,
                schema_components: None,
                features: vec![],
                inputs: vec![],
                outputs: vec![],
                weight: None,
                max_batch: None,
            }),
        ),
        (
            "hello_stream",
            WorkerMessage::Hello(Hello {
                version: 1,
                stage: "generate".into(),
                pid: 4243,
                name: "Generate".into(),
                input_schema: None,
                output_schema: None,
                schema_components: None,
                features: vec!["stream".into(), "cancel".into(), "join".into()],
                inputs: vec![],
                outputs: vec![],
                weight: None,
                max_batch: None,
            }),
        ),
        (
            "hello_tensors",
            WorkerMessage::Hello(Hello {
                version: 1,
                stage: "default".into(),
                pid: 4244,
                name: "Simple".into(),
                input_schema: None,
                output_schema: None,
                schema_components: None,
                features: vec![],
                inputs: vec![
                    TensorSpec { name: "INPUT0".into(), datatype: "FP32".into(), shape: vec![3] },
                    TensorSpec { name: "TEXT".into(), datatype: "BYTES".into(), shape: vec![-1] },
                ],
                outputs: vec![TensorSpec {
                    name: "OUTPUT0".into(),
                    datatype: "INT64".into(),
                    shape: vec![2, 2],
                }],
                weight: None,
                max_batch: None,
            }),
        ),
        (
            "hello_weight",
            WorkerMessage::Hello(Hello {
                version: 1,
                stage: "default".into(),
                pid: 4245,
                name: "Embedder".into(),
                input_schema: None,
                output_schema: None,
                schema_components: None,
                features: vec![],
                inputs: vec![],
                outputs: vec![],
                weight: Some("/text".into()),
                max_batch: None,
            }),
        ),
        (
            "results_raw",
            WorkerMessage::Results(Results {
                results: vec![JobResult {
                    content_type: Some("image/png".into()),
                    ..JobResult::ok(
                        id(1),
                        Bytes::from_static(&[0xc4, 0x04, 0x89, b'P', b'N', b'G']),
                    )
                }],
            }),
        ),
        (
            "chunks",
            WorkerMessage::Chunks(Chunks {
                chunks: vec![
                    Chunk { id: id(1), data: mp(&serde_json::json!("Hel")) },
                    Chunk { id: id(2), data: mp(&serde_json::json!({"token": 17})) },
                    Chunk { id: id(1), data: mp(&serde_json::json!("lo")) },
                ],
            }),
        ),
        ("pull", WorkerMessage::Pull(Pull { max: 3 })),
        (
            "results_end",
            WorkerMessage::Results(Results {
                results: vec![
                    JobResult::end(id(1)),
                    JobResult::error(id(2), "RuntimeError: out of memory"),
                ],
            }),
        ),
        (
            "results",
            WorkerMessage::Results(Results {
                results: vec![
                    JobResult::ok(id(1), mp(&serde_json::json!({"label": 7, "p": 0.5}))),
                    JobResult::invalid(id(2), "expected 64 pixels, got 3"),
                    JobResult::error(id(3), "ZeroDivisionError: division by zero"),
                ],
            }),
        ),
    ]
}

fn proxy_messages() -> Vec<(&'static str, ProxyMessage)> {
    vec![
        (
            "batch",
            ProxyMessage::Batch(Batch {
                jobs: vec![
                    BatchJob {
                        id: id(1),
                        timeout_ms: 4999,
                        payload: mp(&serde_json::json!([1, 2, 3])).into(),
                        content_type: None,
                        traceparent: None,
                        tracestate: None,
                        payload_at: None,
                    },
                    BatchJob {
                        id: id(2),
                        timeout_ms: 70_000,
                        payload: mp(&serde_json::json!({"text": "héllo"})).into(),
                        content_type: None,
                        traceparent: None,
                        tracestate: None,
                        payload_at: None,
                    },
                ],
            }),
        ),
        (
            "batch_raw",
            ProxyMessage::Batch(Batch {
                jobs: vec![BatchJob {
                    id: id(1),
                    timeout_ms: 1000,
                    // One msgpack bin (the 4-byte length form, as the proxy writes raw bodies).
                    payload: Bytes::from_static(&[0xc6, 0, 0, 0, 4, 0x89, b'P', b'N', b'G']).into(),
                    content_type: Some("image/png".into()),
                    traceparent: None,
                    tracestate: None,
                    payload_at: None,
                }],
            }),
        ),
        (
            "batch_traced",
            ProxyMessage::Batch(Batch {
                jobs: vec![
                    BatchJob {
                        id: id(1),
                        timeout_ms: 1000,
                        payload: Bytes::from_static(&[0x01]).into(),
                        content_type: None,
                        traceparent: Some(
                            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
                        ),
                        tracestate: Some("vendor=value".into()),
                        payload_at: None,
                    },
                    BatchJob {
                        id: id(2),
                        timeout_ms: 1000,
                        payload: Bytes::from_static(&[0x02]).into(),
                        content_type: None,
                        traceparent: Some(
                            "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01".into(),
                        ),
                        tracestate: None,
                        payload_at: None,
                    },
                ],
            }),
        ),
        (
            "batch_shared",
            ProxyMessage::Batch(Batch {
                jobs: vec![BatchJob {
                    id: id(1),
                    timeout_ms: 1000,
                    // The payload (a raw body's msgpack bin) lies in the shared memory.
                    payload: Bytes::new().into(),
                    content_type: Some("application/octet-stream".into()),
                    traceparent: None,
                    tracestate: None,
                    payload_at: Some([65_536, 1_000_005]),
                }],
            }),
        ),
        ("shm", ProxyMessage::Shm(Shm { size: 268_435_456 })),
        ("shutdown", ProxyMessage::Shutdown(Shutdown { message: "proxy shutting down".into() })),
        ("cancel", ProxyMessage::Cancel(Cancel { ids: vec![id(2), id(3)] })),
        (
            "reject",
            ProxyMessage::Reject(Reject {
                message: "protocol version 9 is not supported; this proxy speaks 1".into(),
            }),
        ),
    ]
}

fn vector_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("vectors").join(format!("{name}.bin"))
}

fn check<T>(name: &str, message: &T)
where
    T: Serialize + codec::Tagged + PartialEq + std::fmt::Debug,
{
    let mut codec = codec::MessageCodec::<T, T>::default();
    let mut frame = BytesMut::new();
    codec.encode(message, &mut frame).unwrap();
    let path = vector_path(name);
    if std::env::var_os("UPDATE_VECTORS").is_some() {
        std::fs::write(&path, &frame).unwrap();
    }
    let golden = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(frame.as_ref(), golden.as_slice(), "{name}: encoding differs from the golden frame");

    let mut buf = BytesMut::from(golden.as_slice());
    let decoded = codec.decode(&mut buf).unwrap().expect("one whole frame");
    assert!(buf.is_empty());
    assert_eq!(decoded, *message, "{name}: decoding differs");
}

#[test]
fn worker_message_vectors() {
    for (name, message) in worker_messages() {
        check(name, &message);
    }
}

#[test]
fn proxy_message_vectors() {
    for (name, message) in proxy_messages() {
        check(name, &message);
    }
}
