//! The properties the `body_transcoding` and `v2_request` fuzz targets in `fuzz/` check, kept in
//! the crate so that every input the fuzzer ever crashed on is re-run by `cargo test`
//! (`proxy/tests/fuzz_regressions.rs`) on a stable toolchain. Not part of Corral's API.

use bytes::{Buf, Bytes};

use corral_protocol::{Batch, BatchFrame, BatchJob, JobId, Payload, ProxyMessage, TensorSpec};

use super::format::{from_msgpack, to_msgpack, Format};
use super::items;
use super::protocols::v2::{request, response, tensor};

/// Arbitrary bytes as a request body, read as msgpack and as JSON. Either may be refused; nothing
/// may panic. A msgpack body that is accepted goes to the worker unchanged; a JSON body that is
/// accepted becomes valid msgpack that comes back as the same JSON value. Splitting either as a
/// multi-item body never panics.
pub fn body(data: &[u8]) {
    if let Ok(payload) = to_msgpack(Format::Msgpack, Bytes::copy_from_slice(data)) {
        assert_eq!(&payload[..], data, "a valid msgpack body is passed on as is");
        let _ = items::split(&payload);
        let _ = from_msgpack(Format::Json, payload);
    }
    if let Ok(payload) = to_msgpack(Format::Json, Bytes::copy_from_slice(data)) {
        let again =
            to_msgpack(Format::Msgpack, payload.clone()).expect("transcoded JSON is valid msgpack");
        let _ = items::split(&again);
        let json = from_msgpack(Format::Json, payload).expect("JSON comes back as JSON");
        let parse = |bytes: &[u8]| serde_json::from_slice::<serde_json::Value>(bytes).ok();
        assert_eq!(parse(&json), parse(data), "the same JSON value after the round trip");
    }
}

/// Arbitrary bytes as an Open Inference Protocol v2 request: the first byte says where the JSON
/// header ends (0: no `Inference-Header-Content-Length`; else that share of the rest), the rest is
/// the body; it is read with and without declared inputs. Nothing may panic. A request that is
/// accepted has one payload per row, each of which a native client could be given; echoed back
/// as a worker's results, the rows stack into tensors holding the request's own bytes. Read with
/// room after its header (as the route reads a binary request), it is accepted or refused
/// alike, and its rows are the same bytes.
pub fn v2_request(data: &[u8]) {
    let Some((&split, body)) = data.split_first() else { return };
    let header_length = (split != 0).then(|| body.len() * usize::from(split) / 255);
    let body = Bytes::copy_from_slice(body);
    let declared = [
        TensorSpec { name: "X".into(), datatype: "FP32".into(), shape: vec![-1] },
        TensorSpec { name: "T".into(), datatype: "BYTES".into(), shape: vec![1] },
    ];
    for declared in [&declared[..], &[]] {
        let Ok(mut parsed) = request::parse(&body, header_length, 0, declared) else { continue };
        // Rows may be segments around the body's data: none empty, adding up to the row, and
        // framed byte for byte as the codec frames the row in one piece.
        let rows = parsed.payloads();
        for row in &rows {
            assert!(row.segments().iter().all(|s| !s.is_empty()) || row.is_empty());
            assert_eq!(row.segments().iter().map(Bytes::len).sum::<usize>(), row.len());
        }
        let job = |payload: Payload| BatchJob {
            id: JobId::from_bytes([0; 16]),
            timeout_ms: 1,
            payload,
            content_type: None,
            traceparent: None,
            tracestate: None,
            payload_at: None,
        };
        let framed = Batch { jobs: rows.iter().cloned().map(job).collect() };
        let whole = Batch { jobs: rows.iter().map(|row| job(row.to_bytes().into())).collect() };
        if let Ok(mut frame) = BatchFrame::new(&framed) {
            let bytes = frame.copy_to_bytes(frame.remaining());
            let encoded = corral_protocol::encode(&ProxyMessage::Batch(whole));
            assert_eq!(&bytes[4..], &encoded[..], "segmented rows frame as one piece would");
        }
        let payloads: Vec<Vec<u8>> = rows.iter().map(|p| p.contiguous().into_owned()).collect();
        assert_eq!(payloads.len(), parsed.rows, "one payload per row");
        for payload in &payloads {
            tensor::expand(payload).expect("a row's tensor values expand for a native client");
        }
        let results: Vec<&[u8]> = payloads.iter().map(|p| &p[..]).collect();
        let _ = response::build("fuzz", &parsed, &[], &results);
    }
    // Read as the route reads a binary request, with room after the header filled with a
    // one-row head: accepted and refused alike, and with the same rows, byte for byte.
    if let Some(at) = header_length {
        let mut room = vec![0u8; request::HEAD_ROOM];
        if let Some(head) = request::single_row_head(&body[..at]) {
            if head.len() <= room.len() {
                let start = room.len() - head.len();
                room[start..].copy_from_slice(&head);
            }
        }
        let roomy = Bytes::from([&body[..at], &room[..], &body[at..]].concat());
        let plain = request::parse(&body, header_length, 0, &[]).map(|mut r| r.payloads());
        let in_place =
            request::parse(&roomy, header_length, room.len(), &[]).map(|mut r| r.payloads());
        assert_eq!(plain.is_ok(), in_place.is_ok(), "the room changes nothing accepted");
        if let (Ok(plain), Ok(in_place)) = (plain, in_place) {
            assert_eq!(plain, in_place, "the same rows");
        }
    }
}
