//! TensorFlow Serving's form for binary values in v1 instances and predictions: `{"b64":
//! "<base64>"}` stands for the bytes it encodes (JSON has no bytes). For an input declared
//! `BYTES`, each such object in an instance's value is read as those bytes, a msgpack `bin`,
//! before the value becomes a tensor; any other string stays the UTF-8 bytes of its text. In a
//! prediction, bytes are written back so ([`encoded`]): as JSON's array of numbers, a `BYTES`
//! element that is not UTF-8 read as an integer tensor of another shape.

use std::borrow::Cow;

use base64::Engine;

use crate::msgpack;

/// The deepest nesting read: a tensor's most dimensions (numpy's 64), and the object.
const MAX_DEPTH: usize = 65;

/// Whether `value` is one `{"b64": "<text>"}` object.
pub fn is_b64(value: &[u8]) -> bool {
    matches!(value.first(), Some(0x81)) && msgpack::after_key(value, "b64").ok().flatten().is_some()
}

/// `value` with each `{"b64": "<base64>"}` object in it (at any depth of its arrays) replaced by
/// the bytes it encodes; borrowed as it is where it holds none.
pub fn decoded(value: &[u8]) -> Result<Cow<'_, [u8]>, String> {
    // Most values hold no object at all: a map's first byte is then nowhere in them.
    if !value.iter().any(|&b| matches!(b, 0x80..=0x8f | 0xde | 0xdf)) {
        return Ok(Cow::Borrowed(value));
    }
    let mut out = Vec::with_capacity(value.len());
    let mut rest = value;
    copy(&mut rest, &mut out, 0)?;
    Ok(Cow::Owned(out))
}

/// Copies the value at the start of `rest` to `out`, its `b64` objects decoded.
fn copy(rest: &mut &[u8], out: &mut Vec<u8>, depth: usize) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err("arrays nested deeper than a tensor's 64 dimensions".into());
    }
    match rest.first() {
        Some(0x90..=0x9f | 0xdc | 0xdd) => {
            let len = rmp::decode::read_array_len(rest).map_err(|e| e.to_string())?;
            rmp::encode::write_array_len(out, len).expect("writing to a Vec cannot fail");
            (0..len).try_for_each(|_| copy(rest, out, depth + 1))
        }
        Some(0x81) if is_b64(rest) => {
            let mut map = *rest;
            rmp::decode::read_map_len(&mut map).map_err(|e| e.to_string())?;
            msgpack::skip(&mut map)?; // the key
            let (text, after) = rmp::decode::read_str_from_slice(map)
                .map_err(|_| "a \"b64\" value that is not a string".to_string())?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| format!("a \"b64\" value that is not base64: {e}"))?;
            let len = u32::try_from(bytes.len()).map_err(|_| "a \"b64\" value too large")?;
            rmp::encode::write_bin_len(out, len).expect("writing to a Vec cannot fail");
            out.extend_from_slice(&bytes);
            *rest = after;
            Ok(())
        }
        _ => as_it_is(rest, out),
    }
}

/// `value` with each `bin` in it (at any depth of its arrays and maps) written as a `{"b64":
/// "<base64>"}` object. A copy: the caller asks only of a value a walk found a `bin` in.
pub fn encoded(value: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(value.len() * 2);
    let mut rest = value;
    encode(&mut rest, &mut out, 0)?;
    Ok(out)
}

/// Copies the value at the start of `rest` to `out`, its bins as `b64` objects.
fn encode(rest: &mut &[u8], out: &mut Vec<u8>, depth: usize) -> Result<(), String> {
    if depth > msgpack::MAX_DEPTH {
        return Err(format!("nested deeper than {} levels", msgpack::MAX_DEPTH));
    }
    match rest.first() {
        Some(0x90..=0x9f | 0xdc | 0xdd) => {
            let len = rmp::decode::read_array_len(rest).map_err(|e| e.to_string())?;
            rmp::encode::write_array_len(out, len).expect("writing to a Vec cannot fail");
            (0..len).try_for_each(|_| encode(rest, out, depth + 1))
        }
        Some(0x80..=0x8f | 0xde | 0xdf) => {
            let len = rmp::decode::read_map_len(rest).map_err(|e| e.to_string())?;
            rmp::encode::write_map_len(out, len).expect("writing to a Vec cannot fail");
            (0..2 * len).try_for_each(|_| encode(rest, out, depth + 1))
        }
        Some(0xc4..=0xc6) => {
            let len = rmp::decode::read_bin_len(rest).map_err(|e| e.to_string())? as usize;
            let bytes = rest.get(..len).ok_or("a bin that ends early")?;
            *rest = &rest[len..];
            let text = base64::engine::general_purpose::STANDARD.encode(bytes);
            rmp::encode::write_map_len(out, 1).expect("writing to a Vec cannot fail");
            rmp::encode::write_str(out, "b64").expect("writing to a Vec cannot fail");
            rmp::encode::write_str(out, &text).expect("writing to a Vec cannot fail");
            Ok(())
        }
        _ => as_it_is(rest, out),
    }
}

/// Copies the value at the start of `rest` to `out` unchanged.
fn as_it_is(rest: &mut &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let start = *rest;
    msgpack::skip(rest)?;
    out.extend_from_slice(&start[..start.len() - rest.len()]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(value: serde_json::Value) -> Vec<u8> {
        rmp_serde::to_vec(&value).unwrap()
    }

    #[test]
    fn bins_become_b64_objects_at_any_depth_and_back() {
        let mut value = Vec::new();
        rmp::encode::write_map_len(&mut value, 2).unwrap();
        rmp::encode::write_str(&mut value, "UPPER").unwrap();
        rmp::encode::write_array_len(&mut value, 2).unwrap();
        rmp::encode::write_bin(&mut value, b"\xff").unwrap();
        rmp::encode::write_str(&mut value, "HI").unwrap();
        rmp::encode::write_str(&mut value, "N").unwrap();
        rmp::encode::write_uint(&mut value, 196).unwrap(); // 0xc4 as a number, not a bin
        let written = encoded(&value).unwrap();
        let read: serde_json::Value = rmp_serde::from_slice(&written).unwrap();
        assert_eq!(read, serde_json::json!({"UPPER": [{"b64": "/w=="}, "HI"], "N": 196}));
        let array = pack(serde_json::json!([{"b64": "/w=="}]));
        assert_eq!(decoded(&array).unwrap().as_ref(), [0x91, 0xc4, 1, 0xff]);
    }

    #[test]
    fn b64_objects_become_bytes_at_any_depth() {
        let value = pack(serde_json::json!([{"b64": "aGk="}, [{"b64": ""}], "plain"]));
        let decoded = decoded(&value).unwrap();
        let read: rmpv::Value = rmpv::decode::read_value(&mut &decoded[..]).unwrap();
        let expected = rmpv::Value::Array(vec![
            rmpv::Value::Binary(b"hi".to_vec()),
            rmpv::Value::Array(vec![rmpv::Value::Binary(vec![])]),
            rmpv::Value::from("plain"),
        ]);
        assert_eq!(read, expected);
    }

    #[test]
    fn a_value_without_objects_is_borrowed_and_bad_base64_is_named() {
        let plain = pack(serde_json::json!(["a", ["b"]]));
        assert!(matches!(decoded(&plain).unwrap(), Cow::Borrowed(_)));
        let bad = pack(serde_json::json!([{"b64": "not base64!"}]));
        assert!(decoded(&bad).unwrap_err().contains("not base64"));
        let number = pack(serde_json::json!({"b64": 3}));
        assert!(decoded(&number).unwrap_err().contains("not a string"));
        assert!(is_b64(&pack(serde_json::json!({"b64": "aGk="}))));
        assert!(!is_b64(&pack(serde_json::json!({"x": "aGk="}))));
    }
}
