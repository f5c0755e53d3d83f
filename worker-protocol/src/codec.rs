//! Frames and the msgpack step.
//!
//! Framing is tokio-util's [`LengthDelimitedCodec`] (4-byte big-endian length, then that many
//! bytes) capped at [`MAX_FRAME_BYTES`]; this module adds the msgpack map inside each frame, and
//! room for a frame from a peer not yet trusted that grows with its bytes ([`MessageCodec`]).
//! [`ProxyCodec`] is the proxy's end of a connection (reads worker messages, writes proxy
//! messages); [`WorkerCodec`] is the other end, for Rust workers and tests.
//!
//! A decode error means the peer is broken or hostile: the caller drops that connection.

use std::io;
use std::marker::PhantomData;

use bytes::{Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

use crate::walk::{self, Strings};
use crate::{ProxyMessage, WorkerMessage, MAX_FRAME_BYTES};

/// Deepest nesting accepted in a frame (payloads are opaque `bin`, so messages are shallow).
const MAX_DEPTH: usize = 32;

/// The words [`DecodeError`]'s messages begin with where the rest is the decoder's own, which
/// quotes the value it could not read: a proxy that tells clients why a worker failed tells
/// them these words and not the rest (a value in a frame may be another client's output).
pub const NOT_A_MESSAGE: &str = "frame is not a valid message";

/// Why a frame could not be turned into a message.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("frame is not a msgpack map (first byte {0:#04x})")]
    NotAMap(u8),
    #[error("frame is empty")]
    Empty,
    #[error("{NOT_A_MESSAGE}: {}", in_plain_words(.0))]
    Msgpack(#[from] rmp_serde::decode::Error),
    #[error("frame has {0} bytes after its message")]
    TrailingBytes(usize),
    #[error("frame's `type` is a number, not the name of a message (`results`, `hello`, …)")]
    TypeIsANumber,
    /// A `str` whose bytes are not UTF-8: serde's reader hands such a string to a visitor of
    /// bytes as if it were a `bin`, which a job's id or a result's `data` would have taken.
    #[error("{NOT_A_MESSAGE}: {0}")]
    NotUtf8(String),
}

/// The decoder's error, in a worker author's words where its own are its internals: a map cut
/// short had read "IO error while reading marker: failed to fill whole buffer", and a frame
/// nested too deep "depth limit exceeded", with no limit. Others are serde's, which name what
/// was expected.
fn in_plain_words(error: &rmp_serde::decode::Error) -> String {
    use rmp_serde::decode::Error;
    match error {
        Error::InvalidMarkerRead(e) | Error::InvalidDataRead(e)
            if e.kind() == std::io::ErrorKind::UnexpectedEof =>
        {
            "the frame ends inside its message (a map or array holds fewer entries than its \
             header says, or a value is cut short)"
                .to_string()
        }
        Error::DepthLimitExceeded => format!(
            "maps and arrays nested deeper than {} levels, the most a frame may have",
            MAX_DEPTH - 1
        ),
        other => other.to_string(),
    }
}

/// The length-delimited framing both sides use.
pub fn frame_codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_length(4)
        .big_endian()
        .max_frame_length(MAX_FRAME_BYTES)
        .new_codec()
}

/// Encodes a message as a msgpack map (struct fields by name). Frame body only: no length.
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    // Serializing our own message types into a Vec cannot fail: every key is a string and every
    // value a msgpack type.
    rmp_serde::to_vec_named(message).expect("protocol messages always serialize")
}

/// A message type whose variant a frame's `type` names. When `type` is the map's first key (as
/// both reference implementations write it), [`decode`] may read that variant's struct straight
/// from the frame, which ignores the `type` key as it ignores any key it does not know; else
/// serde's reading of the tagged enum, which first copies the whole map into a tree of its own
/// (an allocation per key, value and result: 1.5% of the proxy's CPU per echo request in its
/// results frames). Both readings take and refuse the same frames (a fuzz property).
pub trait Tagged: DeserializeOwned {
    /// The message of type `tag`, read from the whole frame body; None for a tag this reading
    /// leaves to serde's.
    fn by_tag(tag: &str, body: &[u8]) -> Option<Result<Self, DecodeError>>;
}

impl Tagged for WorkerMessage {
    fn by_tag(tag: &str, body: &[u8]) -> Option<Result<Self, DecodeError>> {
        // The messages of every batch, and only as the protocol has them, `type` and one key:
        // the struct's reading ignores keys it does not know, a second `type` among them (which
        // serde's refuses as a duplicate). A hello, once a connection, keeps serde's reading and
        // its refusals exactly.
        if map_len(body) != Some(2) {
            return None;
        }
        Some(match tag {
            "results" => read(body).map(WorkerMessage::Results),
            "chunks" => read(body).map(WorkerMessage::Chunks),
            "pull" => read(body).map(WorkerMessage::Pull),
            _ => return None,
        })
    }
}

fn map_len(body: &[u8]) -> Option<u32> {
    rmp::decode::read_map_len(&mut &body[..]).ok()
}

impl Tagged for ProxyMessage {
    fn by_tag(_: &str, _: &[u8]) -> Option<Result<Self, DecodeError>> {
        None // read by workers (and tests) only: serde's reading is enough there
    }
}

/// Decodes one frame body into a message; the body must be exactly one msgpack map.
pub fn decode<T: Tagged>(body: &[u8]) -> Result<T, DecodeError> {
    check_map(body)?;
    match first_key_type(body) {
        Some(tag) => {
            if let Some(message) = T::by_tag(tag, body) {
                return message;
            }
        }
        // Else `type` is not first, or not a string: only then may it be a number.
        None => check_type(body)?,
    }
    read(body)
}

/// [`decode`] by serde's reading of the tagged enum alone (what the fuzz property compares).
pub(crate) fn decode_by_serde<T: DeserializeOwned>(body: &[u8]) -> Result<T, DecodeError> {
    check_map(body)?;
    check_type(body)?;
    read(body)
}

fn check_type(body: &[u8]) -> Result<(), DecodeError> {
    if type_is_a_number(body) {
        return Err(DecodeError::TypeIsANumber);
    }
    Ok(())
}

fn check_map(body: &[u8]) -> Result<(), DecodeError> {
    let first = *body.first().ok_or(DecodeError::Empty)?;
    let is_map = matches!(first, 0x80..=0x8f | 0xde | 0xdf);
    if !is_map {
        return Err(DecodeError::NotAMap(first));
    }
    Ok(())
}

/// Whether the map's `type` is an integer, which serde's reading of a tagged enum takes for the
/// index of a variant (`0` a hello, `1` results; `3`, read as a pull, was refused for a missing
/// `max`): PROTOCOL.md names the message. Its key is looked for as serde reads keys, `str` or
/// `bin` of any length's encoding; a map too malformed to walk is left to the reading after.
/// Looked at only where `type` is not a first key with a string (the usual frame's).
fn type_is_a_number(body: &[u8]) -> bool {
    let mut rest = body;
    let Ok(len) = rmp::decode::read_map_len(&mut rest) else { return false };
    let mut at = body.len() - rest.len();
    for _ in 0..len {
        let Ok((_, key_len)) = walk::walk_one(&body[at..], Strings::Skip, MAX_DEPTH) else {
            return false;
        };
        let key = &body[at..at + key_len];
        at += key_len;
        if name_of(key) == Some(b"type".as_slice()) {
            let integer = |marker: u8| matches!(marker, 0x00..=0x7f | 0xcc..=0xd3 | 0xe0..=0xff);
            return body.get(at).copied().is_some_and(integer);
        }
        let Ok((_, value_len)) = walk::walk_one(&body[at..], Strings::Skip, MAX_DEPTH) else {
            return false;
        };
        at += value_len;
    }
    false
}

/// The bytes of a walked `str` or `bin` key (None for a key of another type).
fn name_of(key: &[u8]) -> Option<&[u8]> {
    let header = match *key.first()? {
        0xa0..=0xbf => 1,
        0xc4 | 0xd9 => 2,
        0xc5 | 0xda => 3,
        0xc6 | 0xdb => 5,
        _ => return None,
    };
    key.get(header..)
}

/// The value of a map's first key if that key is `type` and the value a string.
fn first_key_type(body: &[u8]) -> Option<&str> {
    let mut rest = body;
    rmp::decode::read_map_len(&mut rest).ok()?;
    let (key, rest) = rmp::decode::read_str_from_slice(rest).ok()?;
    if key != "type" {
        return None;
    }
    rmp::decode::read_str_from_slice(rest).ok().map(|(tag, _)| tag)
}

/// Reads `T` from the whole body, with nothing after it.
fn read<T: DeserializeOwned>(body: &[u8]) -> Result<T, DecodeError> {
    // Read from the body's own bytes: a `bin` is copied once, into its `Bytes` (serde's reading
    // from a `Read` copied it into a scratch buffer first, grown as it went).
    let mut de = rmp_serde::Deserializer::from_read_ref(body);
    // Messages are a few levels deep; a hostile frame nesting an ignored key a million levels
    // deep must be an error, not a stack overflow.
    de.set_max_depth(MAX_DEPTH);
    let message = T::deserialize(&mut de)?;
    // That reader does not say where it stopped: the walk does (markers and lengths), and that
    // every `str` is UTF-8: serde's reader passes one that is not to a visitor of bytes, so a
    // `str` was taken for the `bin` of an id or a result's `data` exactly when its bytes were not
    // text. (A `bin` is not looked into: a result's `data` is checked as a value of its own.)
    // Nothing else can fail on a message serde just read, whose nesting is within its looser
    // bound; were it to, the whole body would count as the message, and nothing as trailing.
    // Which of the two failed, a walk that skips strings tells (only then, rarely, walked again):
    // by the error's text, a reworded message would have let such a `str` through again.
    let end = match walk::walk_one(body, Strings::Check, MAX_DEPTH) {
        Ok((_, end)) => end,
        Err(why) if walk::walk_one(body, Strings::Skip, MAX_DEPTH).is_ok() => {
            return Err(DecodeError::NotUtf8(why))
        }
        Err(_) => body.len(),
    };
    if end != body.len() {
        return Err(DecodeError::TrailingBytes(body.len() - end));
    }
    Ok(message)
}

/// A codec that reads `In` and writes `Out`, one msgpack map per length-delimited frame.
///
/// The framing reserves room for a whole frame as soon as its 4-byte length is read: from a
/// peer not yet trusted ([`MessageCodec::trust`]: the proxy's end, before a hello) that was 64
/// MiB of address space per connection for 4 bytes sent, and 40 such connections aborted a
/// proxy under a 3 GiB limit. Until trusted, room grows with the bytes that come, at most
/// doubling what arrived (a step of 64 KiB at least).
pub struct MessageCodec<In, Out> {
    frames: LengthDelimitedCodec,
    trusted: bool,
    _types: PhantomData<fn(Out) -> In>,
}

/// The least room an untrusted frame grows by.
const UNTRUSTED_STEP: usize = 64 * 1024;

impl<In, Out> MessageCodec<In, Out> {
    /// A codec that reserves room for a whole frame on reading its length (a peer known to
    /// speak the protocol: the other end of the proxy's socket, or a worker that said hello).
    pub fn trusted() -> Self {
        Self { frames: frame_codec(), trusted: true, _types: PhantomData }
    }

    /// A codec for a peer not yet known: room for a frame grows as its bytes come.
    pub fn untrusted() -> Self {
        Self { frames: frame_codec(), trusted: false, _types: PhantomData }
    }

    /// From now on, reserve room for a whole frame on reading its length: the peer said hello.
    pub fn trust(&mut self) {
        self.trusted = true;
    }
}

/// The proxy's end: reads what workers send, writes what the proxy sends.
pub type ProxyCodec = MessageCodec<WorkerMessage, ProxyMessage>;
/// A worker's end: reads what the proxy sends, writes what workers send.
pub type WorkerCodec = MessageCodec<ProxyMessage, WorkerMessage>;

impl<In, Out> Default for MessageCodec<In, Out> {
    fn default() -> Self {
        Self::trusted()
    }
}

impl<In: Tagged, Out> Decoder for MessageCodec<In, Out> {
    type Item = In;
    type Error = io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> io::Result<Option<In>> {
        // The announced length, for the message if the framing refuses it ("frame size too
        // big" said neither the size nor the limit).
        let announced = src.get(..4).map(|head| u32::from_be_bytes(head.try_into().unwrap()));
        // Untrusted, the framing is handed a frame only once it is all here: it then reserves
        // nothing (and, never having read a head alone, each time starts from one).
        if let Some(length) = announced.filter(|&n| !self.trusted && n as usize <= MAX_FRAME_BYTES)
        {
            let whole = 4 + length as usize;
            if src.len() < whole {
                let missing = whole - src.len();
                if missing <= src.len() && src.capacity() < whole {
                    // Half or more has come: room for exactly the rest (a reserve at least
                    // doubles, and a frame at the limit would have taken 128 MiB).
                    let mut exact = BytesMut::with_capacity(whole);
                    exact.extend_from_slice(src);
                    *src = exact;
                } else {
                    src.reserve(missing.min(src.len().max(UNTRUSTED_STEP)));
                }
                return Ok(None);
            }
        }
        let frame = self.frames.decode(src).map_err(|e| match announced {
            Some(length) if length as usize > MAX_FRAME_BYTES => io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a frame of {length} bytes is over the limit of {MAX_FRAME_BYTES}"),
            ),
            _ => e,
        })?;
        match frame {
            None => Ok(None),
            Some(body) => {
                decode(&body).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            }
        }
    }
}

impl<In, Out: Serialize> Encoder<&Out> for MessageCodec<In, Out> {
    type Error = io::Error;

    fn encode(&mut self, message: &Out, dst: &mut BytesMut) -> io::Result<()> {
        // A frame over the limit is refused here (InvalidInput) rather than sent to a peer that
        // would refuse it; the proxy keeps batches under the limit so this is a last guard.
        self.frames.encode(Bytes::from(encode(message)), dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Chunk, Chunks, Hello, JobId, JobResult, Pull, ResultStatus, Results};

    fn hello(stage: &str) -> WorkerMessage {
        WorkerMessage::Hello(Hello {
            version: 1,
            stage: stage.into(),
            pid: 1,
            name: String::new(),
            input_schema: None,
            output_schema: None,
            schema_components: None,
            features: vec![],
            inputs: vec![],
            outputs: vec![],
            weight: None,
            max_batch: None,
        })
    }

    fn hello_map() -> Vec<u8> {
        encode(&hello("default"))
    }

    #[test]
    fn refuses_a_frame_that_is_not_a_map() {
        let err = decode::<WorkerMessage>(&[0x93, 1, 2, 3]).unwrap_err();
        assert!(matches!(err, DecodeError::NotAMap(0x93)), "{err}");
        assert!(matches!(decode::<WorkerMessage>(&[]), Err(DecodeError::Empty)));
    }

    #[test]
    fn a_type_that_is_a_number_is_refused_not_read_as_a_variant_s_index() {
        use rmpv::Value;
        let frame = |type_key: Value, type_value: Value, first: bool| {
            let results = ("results".into(), Value::Array(vec![]));
            let tag = (type_key, type_value);
            let entries = if first { vec![tag, results] } else { vec![results, tag] };
            let mut frame = Vec::new();
            rmpv::encode::write_value(&mut frame, &Value::Map(entries)).unwrap();
            frame
        };
        // Every width of an integer's encoding (1 as fixint, uint8, uint64; -1 as negative
        // fixint and int8), and the key as str or bin.
        let numbers: [Value; 5] =
            [1u8.into(), 200u8.into(), u64::MAX.into(), (-1).into(), (-100).into()];
        for first in [true, false] {
            for key in [Value::from("type"), Value::Binary(b"type".to_vec())] {
                for number in &numbers {
                    let err = decode::<WorkerMessage>(&frame(key.clone(), number.clone(), first));
                    assert!(matches!(err, Err(DecodeError::TypeIsANumber)), "{number}: {err:?}");
                }
                let named = decode::<WorkerMessage>(&frame(key, "results".into(), first));
                assert!(matches!(named, Ok(WorkerMessage::Results(_))), "{named:?}");
            }
        }
        // A key written as str 8 (not the shortest encoding), the number as uint 8.
        let mut long_key = vec![0x82, 0xd9, 4];
        long_key.extend_from_slice(b"type");
        long_key.extend_from_slice(&[0xcc, 1, 0xa7]);
        long_key.extend_from_slice(b"results");
        long_key.push(0x90);
        let err = decode::<WorkerMessage>(&long_key);
        assert!(matches!(err, Err(DecodeError::TypeIsANumber)), "{err:?}");
        // A hello, whose reading is always serde's.
        let mut hello = hello_map();
        let at = hello.windows(6).position(|w| w == b"\xa5hello").unwrap();
        hello.splice(at..at + 6, [0x00]);
        let err = decode::<WorkerMessage>(&hello);
        assert!(matches!(err, Err(DecodeError::TypeIsANumber)), "{err:?}");
    }

    #[test]
    fn refuses_trailing_bytes() {
        let mut body = hello_map();
        body.push(0xc0);
        let err = decode::<WorkerMessage>(&body).unwrap_err();
        assert!(matches!(err, DecodeError::TrailingBytes(1)), "{err}");
    }

    #[test]
    fn refuses_an_unknown_type_and_a_truncated_map() {
        let unknown = rmp_serde::to_vec_named(&serde_json::json!({"type": "nope"})).unwrap();
        assert!(decode::<WorkerMessage>(&unknown).is_err());
        let body = hello_map();
        assert!(decode::<WorkerMessage>(&body[..body.len() - 3]).is_err());
    }

    #[test]
    fn nil_is_left_out_for_the_schemas_and_weight_and_refused_elsewhere() {
        let hello = |extra: serde_json::Value| {
            let mut value = serde_json::json!({
                "type": "hello", "version": 1, "stage": "s", "pid": 7,
            });
            value.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            decode::<WorkerMessage>(&rmp_serde::to_vec_named(&value).unwrap())
        };
        let left_out = serde_json::json!({
            "input_schema": null, "output_schema": null, "schema_components": null, "weight": null,
        });
        let Ok(WorkerMessage::Hello(read)) = hello(left_out) else { panic!("refused") };
        assert_eq!((read.input_schema, read.weight), (None, None));
        for key in ["name", "features", "inputs", "outputs"] {
            assert!(hello(serde_json::json!({ key: null })).is_err(), "{key}: nil is refused");
        }
    }

    #[test]
    fn refuses_a_listed_key_given_twice() {
        // PROTOCOL.md: each key comes once. A hello with `stage` twice, a results frame with
        // `results` twice, and one with `type` twice (`results`, then `hello`).
        let mut hello = vec![0x85];
        for (key, value) in [("type", "hello"), ("stage", "a"), ("stage", "b")] {
            hello.extend(rmp_serde::to_vec(key).unwrap());
            hello.extend(rmp_serde::to_vec(value).unwrap());
        }
        hello.extend(rmp_serde::to_vec("version").unwrap());
        hello.push(1);
        hello.extend(rmp_serde::to_vec("pid").unwrap());
        hello.push(7);
        let refused = |body: &[u8]| decode::<WorkerMessage>(body).unwrap_err().to_string();
        assert!(refused(&hello).contains("duplicate field `stage`"), "{}", refused(&hello));
        let mut results = vec![0x83];
        results.extend(rmp_serde::to_vec("type").unwrap());
        results.extend(rmp_serde::to_vec("results").unwrap());
        for _ in 0..2 {
            results.extend(rmp_serde::to_vec("results").unwrap());
            results.push(0x90);
        }
        assert!(refused(&results).contains("duplicate field `results`"), "{}", refused(&results));
        // Whole frames both ways: `results`, then `type` again saying hello.
        let mut types = vec![0x83];
        for (key, value) in [("type", "results"), ("results", ""), ("type", "hello")] {
            types.extend(rmp_serde::to_vec(key).unwrap());
            match value {
                "" => types.push(0x90),
                value => types.extend(rmp_serde::to_vec(value).unwrap()),
            }
        }
        assert!(refused(&types).contains("duplicate"), "{}", refused(&types));
    }

    #[test]
    fn ignores_unknown_keys() {
        let value = serde_json::json!({
            "type": "hello", "version": 1, "stage": "s", "pid": 7, "future": [1, 2],
        });
        let body = rmp_serde::to_vec_named(&value).unwrap();
        let WorkerMessage::Hello(hello) = decode(&body).unwrap() else { panic!("not a hello") };
        assert_eq!((hello.pid, hello.name.as_str()), (7, ""));
    }

    #[test]
    fn refuses_deep_nesting_without_overflowing() {
        // A hello whose ignored extra key nests a million arrays deep.
        let mut body = vec![0x82];
        body.extend(rmp_serde::to_vec(&"type").unwrap());
        body.extend(rmp_serde::to_vec(&"hello").unwrap());
        body.extend(rmp_serde::to_vec(&"x").unwrap());
        body.extend(std::iter::repeat_n(0x91u8, 1_000_000));
        body.push(0xc0);
        assert!(decode::<WorkerMessage>(&body).is_err());
    }

    #[test]
    fn a_frame_nests_at_most_31_levels_counting_its_own_map() {
        // A valid hello with an ignored key holding arrays `levels - 1` deep inside the map.
        let hello = |levels: usize| {
            let mut body = vec![0x85];
            for (key, value) in [("type", "hello"), ("stage", "s")] {
                body.extend(rmp_serde::to_vec(key).unwrap());
                body.extend(rmp_serde::to_vec(value).unwrap());
            }
            for key in ["version", "pid"] {
                body.extend(rmp_serde::to_vec(key).unwrap());
                body.push(0x01);
            }
            body.extend(rmp_serde::to_vec(&"future").unwrap());
            body.extend(std::iter::repeat_n(0x91u8, levels - 1));
            body.push(0xc0);
            body
        };
        // MAX_DEPTH (32) admits one level fewer counted this way, the frame's own map included:
        // PROTOCOL.md gives this count.
        assert!(decode::<WorkerMessage>(&hello(31)).is_ok());
        let deep = decode::<WorkerMessage>(&hello(32)).unwrap_err().to_string();
        // With its limit, in PROTOCOL.md's count: it had said "depth limit exceeded".
        assert!(
            deep.ends_with("nested deeper than 31 levels, the most a frame may have"),
            "{deep}"
        );
    }

    #[test]
    fn a_map_cut_short_is_said_so_not_in_the_readers_words() {
        // Three entries said, two sent: "IO error while reading marker: failed to fill whole
        // buffer".
        let short = vec![0x83, 0xa4, b't', b'y', b'p', b'e', 0xa4, b'p', b'u', b'l', b'l'];
        // And a value cut short: `max` a u32 of which two bytes of four came.
        let mut cut = short.clone();
        cut[0] = 0x82;
        cut.extend([0xa3, b'm', b'a', b'x', 0xce, 0, 0]);
        for frame in [short, cut] {
            let said = decode::<WorkerMessage>(&frame).unwrap_err().to_string();
            assert!(said.starts_with(NOT_A_MESSAGE), "{said}");
            assert!(said.contains("the frame ends inside its message"), "{said}");
        }
    }

    #[test]
    fn type_first_or_not_reads_the_same_message() {
        let id = JobId::from_bytes([7; 16]);
        let messages = [
            WorkerMessage::Results(Results { results: vec![JobResult::ok(id, vec![0xc0])] }),
            WorkerMessage::Chunks(Chunks { chunks: vec![Chunk { id, data: Bytes::from("x") }] }),
            WorkerMessage::Pull(Pull { max: 3 }),
        ];
        for message in messages {
            let first = encode(&message);
            let tag = first_key_type(&first).expect("type first").len();
            assert_eq!(decode::<WorkerMessage>(&first).unwrap(), message);
            assert_eq!(decode_by_serde::<WorkerMessage>(&first).unwrap(), message);
            // The same map with `type` last (a fixmap; the key a 5-byte fixstr, the tag a
            // fixstr): serde's reading of the tagged enum.
            let pair = 1..1 + 5 + 1 + tag;
            let mut last = vec![first[0]];
            last.extend(&first[pair.end..]);
            last.extend(&first[pair]);
            assert_eq!(first_key_type(&last), None);
            assert_eq!(decode::<WorkerMessage>(&last).unwrap(), message);
        }
        // What serde's reading refuses, the type-first one refuses too (a review found a
        // status given as its index, and a second `type`, taken only with `type` first).
        let id = rmpv::Value::Binary(vec![7; 16]);
        let refused = [
            rmpv::Value::Map(vec![
                ("type".into(), "results".into()),
                (
                    "results".into(),
                    rmpv::Value::Array(vec![rmpv::Value::Map(vec![
                        ("id".into(), id),
                        ("status".into(), 1.into()),
                    ])]),
                ),
            ]),
            rmpv::Value::Map(vec![("type".into(), "pull".into()), ("type".into(), "hello".into())]),
        ];
        for value in refused {
            let mut body = Vec::new();
            rmpv::encode::write_value(&mut body, &value).unwrap();
            assert!(decode_by_serde::<WorkerMessage>(&body).is_err());
            assert!(decode::<WorkerMessage>(&body).is_err(), "{value}");
        }
        // A type no reading knows is an error either way.
        let unknown = rmp_serde::to_vec_named(&serde_json::json!({"type": "nope", "max": 1}));
        assert!(decode::<WorkerMessage>(&unknown.unwrap()).is_err());
    }

    #[test]
    fn a_status_may_come_as_a_bin_of_utf8_as_any_str_may() {
        use rmpv::Value;
        let frame = |status: Value| {
            let entry = Value::Map(vec![
                (Value::from("id"), Value::Binary(vec![7; 16])),
                (Value::from("status"), status),
                (Value::from("data"), Value::Binary(vec![0xc0])),
            ]);
            let map = Value::Map(vec![
                (Value::from("type"), Value::from("results")),
                (Value::from("results"), Value::Array(vec![entry])),
            ]);
            let mut body = Vec::new();
            rmpv::encode::write_value(&mut body, &map).unwrap();
            body
        };
        let Ok(WorkerMessage::Results(results)) = decode(&frame(Value::Binary(b"ok".to_vec())))
        else {
            panic!("a bin of \"ok\" is the status ok")
        };
        assert_eq!(results.results[0].status, ResultStatus::Ok);
        for refused in [b"okay".to_vec(), vec![0xff]] {
            assert!(decode::<WorkerMessage>(&frame(Value::Binary(refused))).is_err());
        }
    }

    #[test]
    fn refuses_a_job_id_that_is_not_16_bytes() {
        let value = serde_json::json!({"type": "results", "results": [
            {"id": "not-bytes", "status": "ok", "data": []},
        ]});
        let body = rmp_serde::to_vec_named(&value).unwrap();
        assert!(decode::<WorkerMessage>(&body).is_err());
    }

    #[test]
    fn data_is_a_bin_and_nothing_else() {
        use rmpv::Value;
        let frame = |kind: &str, entry: Vec<(Value, Value)>| {
            let entry = [vec![(Value::from("id"), Value::Binary(vec![7; 16]))], entry].concat();
            let list = if kind == "results" { "results" } else { "chunks" };
            let map = Value::Map(vec![
                (Value::from("type"), Value::from(kind)),
                (Value::from(list), Value::Array(vec![Value::Map(entry)])),
            ]);
            let mut body = Vec::new();
            rmpv::encode::write_value(&mut body, &map).unwrap();
            body
        };
        let ok = |data: Value| {
            let status = (Value::from("status"), Value::from("ok"));
            frame("results", vec![status, (Value::from("data"), data)])
        };
        let chunk = |data: Value| frame("chunks", vec![(Value::from("data"), data)]);
        // A str's bytes were taken as msgpack ("1" answered 49), and so was an array of numbers.
        for data in [Value::from("1"), Value::Array(vec![Value::from(0xc0)])] {
            for body in [ok(data.clone()), chunk(data.clone())] {
                let refused = decode::<WorkerMessage>(&body).unwrap_err().to_string();
                assert!(refused.contains("a msgpack bin"), "{refused}");
                assert!(decode_by_serde::<WorkerMessage>(&body).is_err());
            }
        }
        let Ok(WorkerMessage::Results(results)) = decode(&ok(Value::Binary(vec![0xc0]))) else {
            panic!("a bin is data")
        };
        assert_eq!(results.results[0].data.as_deref(), Some(&[0xc0][..]));
        let error = frame(
            "results",
            vec![(Value::from("status"), Value::from("error")), (Value::from("data"), Value::Nil)],
        );
        assert!(decode::<WorkerMessage>(&error).is_ok(), "nil counts as left out");
    }

    #[test]
    fn a_frame_s_list_is_an_array_and_no_bin() {
        // rmp_serde reads a bin asked for as a sequence as its bytes: `results: b""` was an
        // empty answer with `type` first and refused with it last; `b"\x90"` was "integer 144".
        let frame = |kind: &str, list: Vec<u8>, type_first: bool| {
            let mut body = vec![0x82];
            let tag = [&[0xa4][..], b"type", &[0xa0 + kind.len() as u8], kind.as_bytes()].concat();
            let key = [&[0xa0 + kind.len() as u8][..], kind.as_bytes()].concat();
            let entry = [key, list].concat();
            if type_first {
                body.extend([tag, entry].concat());
            } else {
                body.extend([entry, tag].concat());
            }
            body
        };
        for kind in ["results", "chunks"] {
            for bin in [vec![0xc4, 0], vec![0xc4, 1, 0x90]] {
                for type_first in [true, false] {
                    let body = frame(kind, bin.clone(), type_first);
                    let refused = decode::<WorkerMessage>(&body).unwrap_err().to_string();
                    assert!(refused.contains("byte array"), "{kind} {type_first}: {refused}");
                    assert!(decode_by_serde::<WorkerMessage>(&body).is_err());
                }
            }
            for type_first in [true, false] {
                let empty = decode::<WorkerMessage>(&frame(kind, vec![0x90], type_first));
                assert!(empty.is_ok(), "{kind}: an empty array is still a frame: {empty:?}");
            }
        }
    }

    #[test]
    fn a_str_that_is_not_utf8_is_no_bin() {
        // serde's reader hands such a `str` to a visitor of bytes: a result's `data` of str
        // `c3` was answered `true` (0xc3, read as msgpack) with a 200, and a str of an id's 16
        // bytes was taken for the id.
        let results = |id: &[u8], data: &[u8]| {
            let mut body = vec![0x82, 0xa4];
            body.extend(b"type\xa7results\xa7results\x91\x83\xa2id");
            body.extend(id);
            body.extend(b"\xa6status\xa2ok\xa4data");
            body.extend(data);
            body
        };
        let bin_id = [&[0xc4, 16][..], &[0xff; 16]].concat();
        assert!(decode::<WorkerMessage>(&results(&bin_id, &[0xc4, 1, 0xc3])).is_ok());
        let str_id = [&[0xb0][..], &[0xff; 16]].concat();
        for body in [results(&bin_id, &[0xa1, 0xc3]), results(&str_id, &[0xc4, 1, 0xc3])] {
            let refused = decode::<WorkerMessage>(&body).unwrap_err().to_string();
            assert!(refused.contains("not valid UTF-8"), "{refused}");
        }
    }

    #[test]
    fn refuses_a_length_prefix_over_the_limit() {
        let mut codec = ProxyCodec::default();
        let mut buf = BytesMut::from(&((MAX_FRAME_BYTES as u32) + 1).to_be_bytes()[..]);
        let refused = codec.decode(&mut buf).unwrap_err().to_string();
        // It said "frame size too big", naming neither.
        let said = format!("a frame of {} bytes is over the limit of {MAX_FRAME_BYTES}", {
            MAX_FRAME_BYTES + 1
        });
        assert_eq!(refused, said);
    }

    #[test]
    fn a_partial_frame_is_not_an_error() {
        let mut codec = ProxyCodec::default();
        let mut whole = BytesMut::new();
        let results = WorkerMessage::Results(Results {
            results: vec![JobResult::ok(JobId::new(), vec![0xc0])],
        });
        WorkerCodec::default().encode(&results, &mut whole).unwrap();
        let mut buf = BytesMut::from(&whole[..whole.len() - 1]);
        assert!(codec.decode(&mut buf).unwrap().is_none());
        buf.extend_from_slice(&whole[whole.len() - 1..]);
        assert_eq!(codec.decode(&mut buf).unwrap(), Some(results));
    }

    #[test]
    fn an_untrusted_peer_gets_room_as_its_bytes_come_not_as_announced() {
        // Four bytes announcing 64 MiB had 64 MiB reserved for them.
        let mut codec = ProxyCodec::untrusted();
        let mut buf = BytesMut::from(&(MAX_FRAME_BYTES as u32).to_be_bytes()[..]);
        buf.extend_from_slice(b"x");
        assert!(codec.decode(&mut buf).unwrap().is_none());
        assert!(buf.capacity() < 1024 * 1024, "{} bytes reserved", buf.capacity());
        // A frame that comes in pieces, and one after it, read as ever; trusted, the same.
        let hello = hello(&"s".repeat(200_000));
        let mut whole = BytesMut::new();
        WorkerCodec::default().encode(&hello, &mut whole).unwrap();
        WorkerCodec::default().encode(&hello, &mut whole).unwrap();
        for mut codec in [ProxyCodec::untrusted(), ProxyCodec::trusted()] {
            let mut buf = BytesMut::new();
            let mut read = Vec::new();
            for piece in whole.chunks(7_000) {
                buf.extend_from_slice(piece);
                while let Some(message) = codec.decode(&mut buf).unwrap() {
                    // Trusted once its hello is read, with the next frame's start buffered.
                    codec.trust();
                    read.push(message);
                }
                assert!(buf.capacity() <= whole.len() + UNTRUSTED_STEP, "{}", buf.capacity());
            }
            assert_eq!(read, [hello.clone(), hello.clone()]);
        }
    }
}
