//! Body formats: content negotiation and JSON ↔ msgpack transcoding.
//!
//! Workers always see msgpack: a JSON body is transcoded once at the edge (streamed through
//! serde-transcode, no intermediate tree), a msgpack body is checked and passed on untouched.
//! Results travel back the same way.

use bytes::Bytes;
use http::HeaderValue;
use serde::de::IgnoredAny;
use serde::Deserialize;

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

/// Turns a request body into one msgpack value, or says why it is malformed.
pub fn to_msgpack(format: Format, body: &[u8]) -> Result<Bytes, String> {
    match format {
        Format::Json => {
            let mut out = Vec::with_capacity(body.len());
            let mut de = serde_json::Deserializer::from_slice(body);
            serde_transcode::transcode(&mut de, &mut rmp_serde::Serializer::new(&mut out))
                .map_err(|e| format!("body is not valid JSON: {e}"))?;
            de.end().map_err(|e| format!("body is not valid JSON: {e}"))?;
            Ok(Bytes::from(out))
        }
        Format::Msgpack => {
            check_msgpack(body).map_err(|e| format!("body is not valid msgpack: {e}"))?;
            Ok(Bytes::copy_from_slice(body))
        }
    }
}

/// Turns a worker's msgpack output into the answer format.
pub fn from_msgpack(format: Format, data: Bytes) -> Result<Bytes, String> {
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

/// Exactly one well-formed msgpack value, nothing after it.
fn check_msgpack(body: &[u8]) -> Result<(), String> {
    if body.is_empty() {
        return Err("empty body".into());
    }
    let mut rest = body;
    IgnoredAny::deserialize(&mut msgpack_reader(&mut rest)).map_err(|e| e.to_string())?;
    if !rest.is_empty() {
        return Err(format!("{} bytes after the value", rest.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_numbers_reach_the_worker_correctly_rounded() {
        // Found by the body_transcoding fuzz target: serde_json's default float parser can be
        // one unit in the last place off; the worker must get the same f64 as any correct parser
        // (Python's float(), say) would give.
        for (text, bits) in
            [("4.4074073709595514e39", 0x4829e787910aa736_u64), ("0.1", 0x3fb999999999999a)]
        {
            let payload = to_msgpack(Format::Json, text.as_bytes()).unwrap();
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
        let packed = to_msgpack(Format::Json, body).unwrap();
        let back = from_msgpack(Format::Json, packed).unwrap();
        assert_eq!(&back[..], br#"{"a":[1,-2,3.5,"x",null,true]}"#);
    }

    #[test]
    fn malformed_bodies_are_refused() {
        assert!(to_msgpack(Format::Json, b"{\"a\": ").is_err());
        assert!(to_msgpack(Format::Json, b"1 2").is_err());
        assert!(to_msgpack(Format::Json, b"").is_err());
        assert!(to_msgpack(Format::Msgpack, &[0x92, 0x01]).is_err(), "truncated array");
        assert!(to_msgpack(Format::Msgpack, &[0x01, 0x02]).is_err(), "trailing bytes");
        assert!(to_msgpack(Format::Msgpack, &[]).is_err());
        assert!(to_msgpack(Format::Msgpack, &[0xc1]).is_err(), "reserved byte");
        assert!(to_msgpack(Format::Msgpack, &[0x92, 0x01, 0x02]).is_ok());
    }

    #[test]
    fn deep_msgpack_is_refused_not_overflowed() {
        let mut deep = vec![0x91u8; 1_000_000];
        deep.push(0xc0);
        assert!(to_msgpack(Format::Msgpack, &deep).is_err());
        assert!(from_msgpack(Format::Json, Bytes::from(deep)).is_err());
        let mut fine = vec![0x91u8; 100];
        fine.push(0xc0);
        assert!(to_msgpack(Format::Msgpack, &fine).is_ok());
    }

    #[test]
    fn deep_json_is_refused_not_overflowed() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert!(to_msgpack(Format::Json, deep.as_bytes()).is_err());
    }
}
