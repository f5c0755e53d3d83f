//! Body formats: content negotiation and JSON ↔ msgpack transcoding.
//!
//! Workers always see msgpack: a JSON body is transcoded once at the edge (streamed through
//! serde-transcode, no intermediate tree) and dropped, a msgpack body is checked
//! ([`super::validate`]) and passed on as the same buffer, so that a queued request holds one
//! copy of its body. Results travel back the same way.

use bytes::Bytes;
use http::HeaderValue;

use super::protocols::v2::tensor;
use super::validate;

/// A body format Corral speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Msgpack,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Msgpack => "application/msgpack",
        }
    }

    /// The format a `Content-Type` names (parameters such as `charset` are ignored).
    pub fn from_media_type(media_type: &str) -> Option<Format> {
        let essence = media_type.split(';').next().unwrap_or("").trim();
        if essence.eq_ignore_ascii_case("application/json") {
            Some(Format::Json)
        } else if essence.eq_ignore_ascii_case("application/msgpack")
            || essence.eq_ignore_ascii_case("application/x-msgpack")
            || essence.eq_ignore_ascii_case("application/vnd.msgpack")
        {
            Some(Format::Msgpack)
        } else {
            None
        }
    }
}

/// The answer format for an `Accept` header: the first listed media range (by quality, then order)
/// that Corral speaks; wildcards and a missing header mean `default` (the request's format).
/// None means nothing acceptable (406).
pub fn negotiate(accept: Option<&HeaderValue>, default: Format) -> Option<Format> {
    let Some(accept) = accept else {
        return Some(default);
    };
    let accept = accept.to_str().ok()?;
    let mut best: Option<(f32, Format)> = None;
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim();
        let quality = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        if quality <= 0.0 {
            continue;
        }
        let format = match media {
            "*/*" | "application/*" => Some(default),
            "" => continue,
            other => Format::from_media_type(other),
        };
        if let Some(format) = format {
            if best.is_none_or(|(q, _)| quality > q) {
                best = Some((quality, format));
            }
        }
    }
    best.map(|(_, format)| format)
}

/// Turns a request body into one msgpack value, or says why it is malformed. A msgpack body comes
/// back as itself (no copy); a JSON body is consumed, so that only its transcoding lives on.
pub fn to_msgpack(format: Format, body: Bytes) -> Result<Bytes, String> {
    match format {
        Format::Json => {
            let mut out = Vec::with_capacity(body.len());
            let mut de = serde_json::Deserializer::from_slice(&body);
            serde_transcode::transcode(&mut de, &mut rmp_serde::Serializer::new(&mut out))
                .map_err(|e| format!("body is not valid JSON: {e}"))?;
            de.end().map_err(|e| format!("body is not valid JSON: {e}"))?;
            validate::json_integers(&body)?;
            // Numbers pack smaller than they are written, mostly, floats larger: the buffer
            // sized by the JSON is rarely the right size, and a queued job would keep its slack.
            out.shrink_to_fit();
            Ok(Bytes::from(out))
        }
        Format::Msgpack => {
            validate::msgpack(&body).map_err(|e| format!("body is not valid msgpack: {e}"))?;
            Ok(body)
        }
    }
}

/// Turns a worker's msgpack output into the answer format. Tensor values in it (from a worker
/// that also serves Open Inference Protocol v2 clients) are written out as nested arrays first:
/// a native client gets plain values in either format.
pub fn from_msgpack(format: Format, data: Bytes) -> Result<Bytes, String> {
    let data = if validate::has_ext(&data) {
        let plain = tensor::expand(&data)
            .map_err(|e| format!("the worker's output has a value Corral cannot write: {e}"))?;
        Bytes::from(plain)
    } else {
        data
    };
    match format {
        Format::Msgpack => Ok(data),
        Format::Json => {
            let mut out = Vec::with_capacity(data.len() + data.len() / 2);
            let mut de = msgpack_reader(&data[..]);
            serde_transcode::transcode(&mut de, &mut serde_json::Serializer::new(&mut out))
                .map_err(|e| format!("the worker's output cannot be written as JSON: {e}"))?;
            Ok(Bytes::from(out))
        }
    }
}

/// Deepest nesting accepted in a msgpack value, as serde_json allows for JSON: every decoder here
/// recurses per level, and a body of a million nested arrays must be a 400, not a stack overflow.
pub const MAX_DEPTH: usize = 128;

/// A msgpack decoder over `input` with the nesting limit set.
pub fn msgpack_reader<R: std::io::Read>(
    input: R,
) -> rmp_serde::Deserializer<rmp_serde::decode::ReadReader<R>> {
    let mut de = rmp_serde::Deserializer::new(input);
    de.set_max_depth(MAX_DEPTH);
    de
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(format: Format, body: &[u8]) -> Result<Bytes, String> {
        to_msgpack(format, Bytes::copy_from_slice(body))
    }

    #[test]
    fn json_numbers_reach_the_worker_correctly_rounded() {
        // Found by the body_transcoding fuzz target: serde_json's default float parser can be
        // one unit in the last place off; the worker must get the same f64 as any correct parser
        // (Python's float(), say) would give.
        for (text, bits) in
            [("4.4074073709595514e39", 0x4829e787910aa736_u64), ("0.1", 0x3fb999999999999a)]
        {
            let payload = pack(Format::Json, text.as_bytes()).unwrap();
            let value: f64 = rmp_serde::from_slice(&payload).unwrap();
            assert_eq!(value.to_bits(), bits, "{text}");
        }
    }

    fn accept(value: &'static str) -> Option<Format> {
        negotiate(Some(&HeaderValue::from_static(value)), Format::Json)
    }

    #[test]
    fn negotiates_accept() {
        assert_eq!(negotiate(None, Format::Msgpack), Some(Format::Msgpack));
        assert_eq!(accept("*/*"), Some(Format::Json));
        assert_eq!(accept("application/msgpack"), Some(Format::Msgpack));
        assert_eq!(accept("text/html, application/msgpack;q=0.5"), Some(Format::Msgpack));
        assert_eq!(accept("application/msgpack;q=0.2, application/json"), Some(Format::Json));
        assert_eq!(accept("text/html"), None);
        assert_eq!(accept("application/json;q=0"), None);
    }

    #[test]
    fn reads_content_types() {
        assert_eq!(Format::from_media_type("application/json; charset=utf-8"), Some(Format::Json));
        assert_eq!(Format::from_media_type("application/x-msgpack"), Some(Format::Msgpack));
        assert_eq!(Format::from_media_type("text/plain"), None);
    }

    #[test]
    fn json_round_trips_through_msgpack() {
        let body = br#"{"a": [1, -2, 3.5, "x", null, true]}"#;
        let packed = pack(Format::Json, body).unwrap();
        let back = from_msgpack(Format::Json, packed).unwrap();
        assert_eq!(&back[..], br#"{"a":[1,-2,3.5,"x",null,true]}"#);
    }

    #[test]
    fn malformed_bodies_are_refused() {
        assert!(pack(Format::Json, b"{\"a\": ").is_err());
        assert!(pack(Format::Json, b"1 2").is_err());
        assert!(pack(Format::Json, b"").is_err());
        assert!(pack(Format::Msgpack, &[0x92, 0x01]).is_err(), "truncated array");
        assert!(pack(Format::Msgpack, &[0x01, 0x02]).is_err(), "trailing bytes");
        assert!(pack(Format::Msgpack, &[]).is_err());
        assert!(pack(Format::Msgpack, &[0xc1]).is_err(), "reserved byte");
        assert!(pack(Format::Msgpack, &[0x92, 0x01, 0x02]).is_ok());
    }

    #[test]
    fn deep_msgpack_is_refused_not_overflowed() {
        let mut deep = vec![0x91u8; 1_000_000];
        deep.push(0xc0);
        assert!(pack(Format::Msgpack, &deep).is_err());
        assert!(from_msgpack(Format::Json, Bytes::from(deep)).is_err());
        let mut fine = vec![0x91u8; 100];
        fine.push(0xc0);
        assert!(pack(Format::Msgpack, &fine).is_ok());
    }

    #[test]
    fn deep_json_is_refused_not_overflowed() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert!(pack(Format::Json, deep.as_bytes()).is_err());
    }

    #[test]
    fn integers_stay_exact_or_are_refused() {
        let body = b"[18446744073709551615, -9223372036854775808, 12345678901234567]";
        let values: (u64, i64, u64) =
            rmp_serde::from_slice(&pack(Format::Json, body).unwrap()).unwrap();
        assert_eq!(values, (u64::MAX, i64::MIN, 12_345_678_901_234_567));
        let error = pack(Format::Json, b"{\"id\": 12345678901234567890123}").unwrap_err();
        assert!(error.contains("does not fit in 64 bits"), "{error}");
        assert!(pack(Format::Json, b"1.2345678901234567890123e22").is_ok(), "a float stays one");
    }

    #[test]
    fn msgpack_strings_must_be_utf8() {
        let error = pack(Format::Msgpack, &[0xa2, 0xff, 0xfe]).unwrap_err();
        assert!(error.contains("not valid UTF-8"), "{error}");
        assert!(pack(Format::Msgpack, &[0xc4, 0x02, 0xff, 0xfe]).is_ok(), "bin is raw bytes");
    }

    #[test]
    fn a_msgpack_body_is_passed_on_without_a_copy() {
        let body = Bytes::from_static(&[0x92, 0x01, 0x02]);
        let payload = to_msgpack(Format::Msgpack, body.clone()).unwrap();
        assert_eq!(payload.as_ptr(), body.as_ptr());
    }
}
