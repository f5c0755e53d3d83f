//! The properties the `body_transcoding`, `v2_request` and `worker_results` fuzz targets in
//! `fuzz/` check, kept in
//! the crate so that every input the fuzzer ever crashed on is re-run by `cargo test`
//! (`proxy/tests/fuzz_regressions.rs`) on a stable toolchain. Not part of Corral's API.

use bytes::{Buf, Bytes};

use corral_protocol::{Batch, BatchFrame, BatchJob, JobId, Payload, ProxyMessage, TensorSpec};

use super::events::Framing;
use super::format::{from_msgpack, to_msgpack, Format};
use super::items;
use super::protocols::v2::{request, response, tensor};
use super::protocols::{kserve_v1, openai};
use crate::job::Outcome;
use crate::msgpack::bin_contents;

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
        let parsed = request::parse(&body, header_length, 0, declared);
        // Data packed as the header is read is what packing its text after gives, errors too.
        let by_text = request::parse_by_text(&body, header_length, 0, declared);
        assert_eq!(format!("{parsed:?}"), format!("{by_text:?}"), "one pass reads as two");
        let Ok(mut parsed) = parsed else { continue };
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

/// Arbitrary bytes as the results a worker gives the rows of one request, written into every
/// answer a client may have asked for: native JSON and msgpack, a stream's events, KServe v1's
/// predictions, OpenAI's embeddings, and v2's outputs (as JSON data and as binary data, declared
/// and not). Workers are not trusted to send sense: nothing may panic, and whatever is answered
/// is well-formed in its own protocol.
///
/// The first byte chooses the v2 request's outputs and declarations; the rest is up to four
/// results, each a two-byte little-endian length and that many bytes. Only results that pass the
/// connection's own check ([`crate::msgpack::check`]) go on, as only those reach an answer.
pub fn worker_results(data: &[u8]) {
    let Some((&choice, mut rest)) = data.split_first() else { return };
    let mut results = Vec::new();
    while results.len() < 4 && rest.len() >= 2 {
        let length = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let result = &rest[2..2 + length];
        rest = &rest[2 + length..];
        if crate::msgpack::check(result).is_ok() {
            results.push(Bytes::copy_from_slice(result));
        }
    }
    if results.is_empty() {
        return;
    }
    // JSON past serde_json's own depth limit (128) is still JSON: a value the check lets
    // through is answered whatever its depth (`msgpack::tests`, "the check is the gate"), and
    // wrapped in an answer's object or array it nests a level or two deeper.
    let parsed = |json: &[u8]| match serde_json::from_slice::<serde_json::Value>(json) {
        Ok(value) => Some(Ok(value)),
        Err(e) if e.to_string().starts_with("recursion limit exceeded") => None,
        Err(e) => Some(Err(e)),
    };
    let json_parses = |json: &[u8]| !matches!(parsed(json), Some(Err(_)));
    for (index, result) in results.iter().enumerate() {
        if let Ok(json) = from_msgpack(Format::Json, result.clone()) {
            assert!(json_parses(&json), "a JSON answer is JSON");
        }
        if let Ok(msgpack) = from_msgpack(Format::Msgpack, result.clone()) {
            assert!(crate::msgpack::check(&msgpack).is_ok(), "a msgpack answer is msgpack");
            let value = tensor::read_value(&msgpack).expect("msgpack");
            assert!(!holds_tensor(&value), "tensor values are written out");
        }
        let event = Framing::Sse.chunk(result.clone()).unwrap_or_else(|e| e);
        assert!(event.starts_with(b"data: ") || event.starts_with(b"event: error\ndata: "));
        let line = Framing::Ndjson.chunk(result.clone()).unwrap_or_else(|e| e);
        assert!(line.ends_with(b"\n") && json_parses(&line), "an NDJSON line is JSON");
        let _ = bin_contents(result);
        for base64 in [false, true] {
            let outcome = Outcome::Done(result.clone(), None);
            if let Ok(embedding) = openai::embedding(index, outcome, None, base64) {
                assert!(serde_json::to_vec(&embedding).is_ok());
            }
        }
    }
    let outcomes = || results.iter().map(|r| Outcome::Done(r.clone(), None)).collect::<Vec<_>>();
    if let Ok(json) = kserve_v1::predictions(outcomes()) {
        if let Some(answer) = parsed(&json) {
            let answer = answer.expect("v1 answers JSON");
            let predictions = answer["predictions"].as_array().expect("a predictions array");
            assert_eq!(predictions.len(), results.len(), "one prediction per instance");
        }
    }
    if let Ok(array) = items::assemble(outcomes(), Format::Msgpack) {
        assert!(crate::msgpack::check(&array).is_ok(), "the results' array is msgpack");
        // A native client's items are written out as a single item's are.
        let value = tensor::read_value(&array).expect("msgpack");
        assert!(!holds_tensor(&value), "tensor values are written out in the array too");
    }
    v2_answer(choice, &results);
}

/// Whether a tensor value (Corral's ext type) is anywhere in `value`; other ext types are the
/// worker's own and pass as they are.
fn holds_tensor(value: &rmpv::ValueRef) -> bool {
    match value {
        rmpv::ValueRef::Ext(kind, _) => *kind == tensor::TENSOR_EXT,
        rmpv::ValueRef::Array(items) => items.iter().any(holds_tensor),
        rmpv::ValueRef::Map(entries) => {
            entries.iter().any(|(k, v)| holds_tensor(k) || holds_tensor(v))
        }
        _ => false,
    }
}

/// [`worker_results`] as a v2 answer to a request of as many rows.
fn v2_answer(choice: u8, results: &[Bytes]) {
    let outputs = match choice % 4 {
        0 => "[]",
        1 => r#"[{"name": "y"}]"#,
        2 => r#"[{"name": "y", "parameters": {"binary_data": true}}]"#,
        _ => r#"[{"name": "y"}, {"name": "z", "parameters": {"binary_data": true}}]"#,
    };
    let rows = results.len();
    let header = format!(
        r#"{{"inputs": [{{"name": "X", "shape": [{rows}], "datatype": "FP32", "data": {:?}}}],
            "outputs": {outputs}, "parameters": {{"binary_data_output": {}}}}}"#,
        vec![0.0f32; rows],
        choice & 4 != 0,
    );
    let body = Bytes::from(header);
    let spec = |datatype: &str, shape: Vec<i64>| TensorSpec {
        name: "y".into(),
        datatype: datatype.into(),
        shape,
    };
    let declared = match (choice >> 3) % 4 {
        0 => vec![],
        1 => vec![spec("FP32", vec![-1])],
        2 => vec![spec("BYTES", vec![-1, 2])],
        _ => vec![spec("INT8", vec![])],
    };
    let request = request::parse(&body, None, 0, &[]).expect("a valid v2 request");
    let results: Vec<&[u8]> = results.iter().map(|r| &r[..]).collect();
    let Ok(answer) = response::build("fuzz", &request, &declared, &results) else { return };
    let json_end = answer.header_length.unwrap_or(answer.body.len());
    let header: serde_json::Value =
        serde_json::from_slice(&answer.body[..json_end]).expect("a v2 answer's header is JSON");
    let outputs = header["outputs"].as_array().expect("the answer lists its outputs");
    let names: std::collections::HashSet<&str> =
        outputs.iter().map(|output| output["name"].as_str().expect("a named output")).collect();
    assert!(!outputs.is_empty(), "a v2 answer gives some output");
    assert_eq!(names.len(), outputs.len(), "each output once");
    let sizes: u64 =
        outputs.iter().filter_map(|output| output["parameters"]["binary_data_size"].as_u64()).sum();
    assert_eq!(sizes, (answer.body.len() - json_end) as u64, "binary data as its sizes say");
}
