//! How a streamed answer is written: Server-Sent Events (`Accept: text/event-stream`) or
//! newline-delimited JSON (`Accept: application/x-ndjson`). Chunks are msgpack from the worker,
//! written as JSON; the end is a `done` event, or an `error` event with the same code words as a
//! one-shot answer's error body.

use bytes::Bytes;
use http::HeaderValue;

use super::error::ApiError;
use super::format::{self, Format};

/// A streamed answer's framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Sse,
    Ndjson,
}

impl Framing {
    pub fn content_type(self) -> &'static str {
        match self {
            Framing::Sse => "text/event-stream",
            Framing::Ndjson => "application/x-ndjson",
        }
    }

    /// The streamed framing an `Accept` header asks for, if any: a stream is what a client that
    /// names one wants, unless it prefers JSON or msgpack (a higher `q`:
    /// `text/event-stream;q=0.1, application/json` is JSON); among streams the highest `q`, the
    /// first listed on a tie. Wildcards, and types only a raw output could meet (`text/plain`),
    /// do not count against a stream named beside them: a one-shot answer might not meet them,
    /// and a client refused after its job ran (406) is worse off than one streamed to.
    pub fn requested(accept: Option<&HeaderValue>) -> Option<Framing> {
        let accept = accept?.to_str().ok()?;
        let mut stream: Option<(f32, Framing)> = None;
        let mut one_shot = 0.0f32;
        // Refused ranges (`q=0`, in any spelling) are left out by `ranges`.
        for (media, quality) in format::ranges(accept) {
            let framing = match media {
                m if m.eq_ignore_ascii_case("text/event-stream") => Framing::Sse,
                m if m.eq_ignore_ascii_case("application/x-ndjson") => Framing::Ndjson,
                m if Format::from_media_type(m).is_some() => {
                    one_shot = one_shot.max(quality);
                    continue;
                }
                _ => continue,
            };
            if stream.is_none_or(|(best, _)| quality > best) {
                stream = Some((quality, framing));
            }
        }
        stream.filter(|&(quality, _)| quality >= one_shot).map(|(_, framing)| framing)
    }

    /// One chunk (a msgpack value) as an event; an error event if it has no JSON form.
    pub fn chunk(self, data: Bytes) -> Result<Bytes, Bytes> {
        self.try_chunk(data).map_err(|error| self.error(&error))
    }

    /// One chunk as an event, or why it has none (no JSON form): what the first chunk is
    /// turned into, where that error is still a plain HTTP error.
    pub fn try_chunk(self, data: Bytes) -> Result<Bytes, ApiError> {
        let (prefix, suffix): (&[u8], &[u8]) = match self {
            Framing::Sse => (b"data: ", b"\n\n"),
            Framing::Ndjson => (b"", b"\n"),
        };
        format::from_msgpack_between(Format::Json, data, prefix, suffix)
            .map_err(|e| ApiError::internal(e.code(), e.message))
    }

    /// The end of a stream that went well.
    pub fn done(self) -> Bytes {
        match self {
            Framing::Sse => Bytes::from_static(b"event: done\ndata: {}\n\n"),
            Framing::Ndjson => Bytes::from_static(b"{\"done\":true}\n"),
        }
    }

    /// The end of a stream that failed, with the error's code word and message.
    pub fn error(self, error: &ApiError) -> Bytes {
        let body = serde_json::json!({ "error": error.code, "message": error.message });
        let json = serde_json::to_vec(&body).expect("a JSON object of strings always serializes");
        match self {
            Framing::Sse => [b"event: error\ndata: ", &json[..], b"\n\n"].concat().into(),
            Framing::Ndjson => [&json[..], b"\n"].concat().into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mp(value: serde_json::Value) -> Bytes {
        Bytes::from(rmp_serde::to_vec(&value).unwrap())
    }

    #[test]
    fn a_stream_is_what_a_client_naming_one_gets() {
        let accept = |v: &'static str| Framing::requested(Some(&HeaderValue::from_static(v)));
        assert_eq!(accept("text/event-stream"), Some(Framing::Sse));
        assert_eq!(accept("application/json, application/x-ndjson"), Some(Framing::Ndjson));
        assert_eq!(accept("text/event-stream;q=0, application/json"), None);
        assert_eq!(accept("text/event-stream;Q=0, application/json"), None);
        assert_eq!(accept("text/event-stream; q=0.0000, application/json"), None);
        assert_eq!(accept("text/event-stream;q=0.5"), Some(Framing::Sse));
        // A one-shot form preferred by q is taken; a tie, or a wildcard beside it, is a stream.
        assert_eq!(accept("text/event-stream;q=0.1, application/json"), None);
        assert_eq!(accept("application/json;q=0.9, text/event-stream"), Some(Framing::Sse));
        assert_eq!(accept("application/json, text/event-stream"), Some(Framing::Sse));
        assert_eq!(accept("text/event-stream;q=0.2, */*"), Some(Framing::Sse));
        assert_eq!(accept("text/event-stream;q=0.5, text/plain"), Some(Framing::Sse));
        assert_eq!(
            accept(
                "application/x-ndjson;q=0.5, text/event-stream;q=0.8, application/msgpack;q=0.6"
            ),
            Some(Framing::Sse)
        );
        assert_eq!(accept("application/x-ndjson, text/event-stream"), Some(Framing::Ndjson));
        assert_eq!(accept("application/json"), None);
        assert_eq!(Framing::requested(None), None);
    }

    #[test]
    fn events_are_json_lines() {
        let chunk = mp(serde_json::json!({"token": "hé"}));
        assert_eq!(Framing::Sse.chunk(chunk.clone()).unwrap(), "data: {\"token\":\"hé\"}\n\n");
        assert_eq!(Framing::Ndjson.chunk(chunk).unwrap(), "{\"token\":\"hé\"}\n");
        let error = ApiError::slow_client();
        let sse = Framing::Sse.error(&error);
        assert!(sse.starts_with(b"event: error\ndata: {\"error\":\"slow_client\""), "{sse:?}");
        assert_eq!(Framing::Ndjson.done(), "{\"done\":true}\n");
    }
}
