//! The property the `body_transcoding` fuzz target in `fuzz/` checks, kept in the crate so that
//! every input the fuzzer ever crashed on is re-run by `cargo test`
//! (`proxy/tests/fuzz_regressions.rs`) on a stable toolchain. Not part of Corral's API.

use bytes::Bytes;

use super::format::{from_msgpack, to_msgpack, Format};
use super::items;

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
