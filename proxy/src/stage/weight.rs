//! A worker's weight rule: how heavy each job is, read from its payload. A worker declares it
//! in `hello` as a JSON Pointer (RFC 6901, e.g. `/text`); a job then weighs the length of what
//! it finds there — a string's characters, an array's elements, a map's entries, bytes — and 1
//! when the pointer leads nowhere or to anything else. Lengths are the proxy's business; what a
//! length costs (tokens, pixels) is the worker's, and the cost model learns it per weight.
//!
//! The payload is walked, not decoded: values off the pointer's path are skipped in place, so a
//! rule on a small field of a large payload costs a scan, not a copy.

use corral_protocol::Payload;

use crate::msgpack;
use crate::traffic::MAX_WEIGHT;

/// A parsed JSON Pointer: its reference tokens, unescaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightRule {
    tokens: Vec<String>,
}

impl WeightRule {
    /// Parses a JSON Pointer: empty (the whole payload) or `/`-separated tokens with `~1` for
    /// `/` and `~0` for `~`.
    pub fn parse(pointer: &str) -> Result<Self, String> {
        if pointer.is_empty() {
            return Ok(Self { tokens: vec![] });
        }
        let Some(rest) = pointer.strip_prefix('/') else {
            return Err(format!("weight {pointer:?} is not a JSON Pointer: it must start with /"));
        };
        // RFC 6901: `~` only as `~0` or `~1`.
        let escapes_ok = |token: &str| {
            let mut after_tilde = token.split('~').skip(1);
            after_tilde.all(|rest| rest.starts_with(['0', '1']))
        };
        if let Some(token) = rest.split('/').find(|token| !escapes_ok(token)) {
            return Err(format!(
                "weight {pointer:?} is not a JSON Pointer: {token:?} has a ~ not followed by 0 or 1"
            ));
        }
        Ok(Self { tokens: rest.split('/').map(unescape).collect() })
    }

    /// The weight of a job whose payload (one msgpack value) is `payload`: between 1 and
    /// [`MAX_WEIGHT`].
    pub fn weigh(&self, payload: &[u8]) -> u32 {
        let length = self.find(payload).and_then(length).unwrap_or(1);
        length.clamp(1, MAX_WEIGHT as usize) as u32
    }

    /// The weight of a job's payload. All of it is read when it is one buffer. A payload in
    /// several segments is a v2 row (a map of tensor values: its headers in the first segment,
    /// each tensor's data in the next), and a rule gives such a row the same weight from its
    /// first segment alone — the map's length for `""`, and 1 for anything under it, since a
    /// tensor value has no length a rule counts and a walk that runs past the first segment
    /// ends at 1 too — so a row's data is never gathered to be weighed (tested below against
    /// the whole row).
    pub fn weigh_payload(&self, payload: &Payload) -> u32 {
        self.weigh(&payload.segments()[0])
    }

    /// The bytes of the value the pointer names, from its marker on.
    fn find<'a>(&self, payload: &'a [u8]) -> Option<&'a [u8]> {
        let mut rest = payload;
        for token in &self.tokens {
            // Each read of a marker moves its own copy: a failed one has taken the marker.
            let mut probe = rest;
            if rmp::decode::read_map_len(&mut { rest }).is_ok() {
                rest = msgpack::after_key(rest, token).ok()??;
            } else if let Ok(len) = rmp::decode::read_array_len(&mut probe) {
                rest = probe;
                let index = array_index(token).filter(|&i| i < len)?;
                for _ in 0..index {
                    msgpack::skip(&mut rest).ok()?;
                }
            } else {
                return None;
            }
        }
        Some(rest)
    }
}

/// A token as an array index: RFC 6901's `0` or digits without a leading zero (`01` and `+1`,
/// which `u32`'s parse takes, name no element).
fn array_index(token: &str) -> Option<u32> {
    let digits = token.bytes().all(|b| b.is_ascii_digit());
    let canonical = token == "0" || (digits && !token.is_empty() && !token.starts_with('0'));
    canonical.then(|| token.parse().ok()).flatten()
}

/// A JSON Pointer's reference token unescaped (RFC 6901: `~1` to `/` first, then `~0` to `~`, so
/// that `~01` is `~1`). Here because a weight rule is where the proxy parses JSON Pointers, and
/// `/openapi.json` unescapes a `$ref`'s segment with it too: the stages sit below the HTTP edge,
/// which may use them, not the other way round.
pub(crate) fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// The length of the value at the start of `value`, if it has one.
fn length(value: &[u8]) -> Option<usize> {
    use rmp::Marker;
    let mut rest = value;
    let marker = rmp::decode::read_marker(&mut rest).ok()?;
    let mut probe = value;
    match marker {
        Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
            let n = rmp::decode::read_str_len(&mut probe).ok()? as usize;
            let bytes = probe.get(..n)?;
            Some(std::str::from_utf8(bytes).map_or(n, |text| text.chars().count()))
        }
        Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => {
            Some(rmp::decode::read_bin_len(&mut probe).ok()? as usize)
        }
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
            Some(rmp::decode::read_array_len(&mut probe).ok()? as usize)
        }
        Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
            Some(rmp::decode::read_map_len(&mut probe).ok()? as usize)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tilde_is_only_an_escape() {
        assert!(WeightRule::parse("/a~0b~1c").is_ok());
        for bad in ["/a~2b", "/a~", "/~x"] {
            let error = WeightRule::parse(bad).unwrap_err();
            assert!(error.contains("not followed by 0 or 1"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_token_unescapes_slash_first_then_tilde() {
        assert_eq!(unescape("a~1b~0c"), "a/b~c");
        // `~01` is an escaped `~` then `1`, not `~` then an escaped `/`.
        assert_eq!((unescape("~01"), unescape("~10")), ("~1".into(), "/0".into()));
    }

    fn mp(value: serde_json::Value) -> Vec<u8> {
        rmp_serde::to_vec(&value).unwrap()
    }

    fn weigh(pointer: &str, value: serde_json::Value) -> u32 {
        WeightRule::parse(pointer).unwrap().weigh(&mp(value))
    }

    #[test]
    fn lengths_of_what_the_pointer_finds() {
        use serde_json::json;
        assert_eq!(weigh("/text", json!({"id": 1, "text": "héllo"})), 5);
        assert_eq!(weigh("/tokens", json!({"tokens": [1, 2, 3]})), 3);
        assert_eq!(weigh("/a/1/b", json!({"a": [{}, {"b": "xyz"}]})), 3);
        assert_eq!(weigh("", json!("whole")), 5);
        assert_eq!(weigh("/m", json!({"m": {"x": 1, "y": 2}})), 2);
        assert_eq!(weigh("/a~1b/~0", json!({"a/b": {"~": "four"}})), 4);
    }

    #[test]
    fn anything_else_weighs_one() {
        use serde_json::json;
        assert_eq!(weigh("/text", json!({"other": "long text"})), 1);
        assert_eq!(weigh("/text", json!({"text": 12345})), 1);
        assert_eq!(weigh("/text", json!({"text": ""})), 1);
        assert_eq!(weigh("/0", json!("not a container")), 1);
        assert_eq!(weigh("/9", json!([1, 2])), 1);
        // RFC 6901's array indexes only: these name no element.
        for token in ["01", "+1", "1x", "", " 1", "-1"] {
            assert_eq!(weigh(&format!("/{token}"), json!(["a", "abcdefgh"])), 1, "{token:?}");
        }
        assert_eq!(weigh("/1", json!(["a", "abcdefgh"])), 8);
        assert_eq!(weigh("/0", json!(["abc"])), 3);
        assert_eq!(WeightRule::parse("/x").unwrap().weigh(b"\x81\xa1x"), 1); // truncated
    }

    #[test]
    fn bytes_count_and_weights_are_capped() {
        let payload = [&b"\xc4\x0a"[..], &[0u8; 10]].concat();
        assert_eq!(WeightRule::parse("").unwrap().weigh(&payload), 10);
        let huge = "x".repeat(MAX_WEIGHT as usize + 5);
        assert_eq!(weigh("", serde_json::json!(huge)), MAX_WEIGHT);
    }

    #[test]
    fn a_v2_row_in_segments_weighs_the_same_from_its_first_segment() {
        use crate::http::protocols::v2::request;
        // Two binary inputs of 3 rows, large enough to stay in the body as segments.
        let (a, x) = (vec![1u8; 3 * 8192], vec![2u8; 3 * 4096]);
        let header = serde_json::json!({"inputs": [
            {"name": "A", "shape": [3, 8192], "datatype": "UINT8",
             "parameters": {"binary_data_size": a.len()}},
            {"name": "X", "shape": [3, 1024], "datatype": "FP32",
             "parameters": {"binary_data_size": x.len()}},
        ]});
        let json = serde_json::to_vec(&header).unwrap();
        let body = bytes::Bytes::from([&json[..], &a, &x].concat());
        let rows = request::parse(&body, Some(json.len()), 0, &[]).unwrap().payloads();
        assert!(rows[0].segments().len() > 1, "the test is about rows held in segments");
        for pointer in ["", "/A", "/X", "/X/0", "/Z", "/A/1"] {
            let rule = WeightRule::parse(pointer).unwrap();
            for row in &rows {
                let whole = rule.weigh(&row.contiguous());
                assert_eq!(rule.weigh_payload(row), whole, "{pointer}");
            }
        }
    }

    #[test]
    fn a_large_value_off_the_path_is_skipped_not_decoded() {
        // {"image": <8 MiB of bytes>, "text": "héllo"}: the rule walks past the image.
        let image = serde_bytes_value(8 * 1024 * 1024);
        let mut payload = vec![0x82, 0xa5];
        payload.extend_from_slice(b"image");
        payload.extend_from_slice(&image);
        payload.push(0xa4);
        payload.extend_from_slice(b"text");
        payload.extend_from_slice(&mp(serde_json::json!("héllo")));
        assert_eq!(WeightRule::parse("/text").unwrap().weigh(&payload), 5);
        assert_eq!(WeightRule::parse("/image").unwrap().weigh(&payload), MAX_WEIGHT);
    }

    /// A msgpack `bin32` of `len` zero bytes.
    fn serde_bytes_value(len: usize) -> Vec<u8> {
        let mut value = vec![0xc6];
        value.extend_from_slice(&(len as u32).to_be_bytes());
        value.resize(5 + len, 0);
        value
    }

    #[test]
    fn a_pointer_must_start_with_a_slash() {
        assert!(WeightRule::parse("text").unwrap_err().contains("JSON Pointer"));
    }
}
