//! A job's payload: one msgpack value, held as one buffer or as several segments that follow each
//! other on the wire.
//!
//! Why segments: the bytes of a large payload may already be in memory where they arrived — a v2
//! tensor row in its request's body — and only a few bytes of msgpack (a map of tensor headers)
//! go in front of or between them. Gathering them into one buffer would copy every byte once more; as segments,
//! [`crate::BatchFrame`] hands each to the socket's vectored write where it lies. The frame's
//! bytes are the same either way: a worker never sees the difference.
//!
//! Clones share the segments (reference counts, no copy), since a batch message clones the
//! payloads of the jobs it carries.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One msgpack value as one or more byte segments, in order.
#[derive(Clone, Default)]
pub struct Payload {
    parts: Parts,
    len: usize,
}

#[derive(Clone)]
enum Parts {
    One(Bytes),
    /// Two or more segments, none empty.
    Many(Arc<[Bytes]>),
}

impl Default for Parts {
    fn default() -> Self {
        Parts::One(Bytes::new())
    }
}

impl Payload {
    /// The segments in order, empty ones left out; a single segment is held as it is.
    pub fn from_segments(segments: impl IntoIterator<Item = Bytes>) -> Self {
        let mut parts: Vec<Bytes> = segments.into_iter().filter(|s| !s.is_empty()).collect();
        let len = parts.iter().map(Bytes::len).sum();
        let parts = match parts.len() {
            0 => Parts::default(),
            1 => Parts::One(parts.pop().expect("one segment")),
            _ => Parts::Many(parts.into()),
        };
        Self { parts, len }
    }

    /// Its length in bytes, all segments together.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segments in order (none empty, unless the payload is empty and held as one).
    pub fn segments(&self) -> &[Bytes] {
        match &self.parts {
            Parts::One(one) => std::slice::from_ref(one),
            Parts::Many(many) => many,
        }
    }

    /// The bytes in one piece: borrowed when held in one, gathered (copied) otherwise. For the
    /// few readers that parse a payload (a weight rule, tests), not for the way to the socket.
    pub fn contiguous(&self) -> Cow<'_, [u8]> {
        match &self.parts {
            Parts::One(one) => Cow::Borrowed(one),
            Parts::Many(many) => Cow::Owned(many.concat()),
        }
    }

    /// The bytes as one `Bytes`: shared when held in one, gathered (copied) otherwise.
    pub fn to_bytes(&self) -> Bytes {
        match &self.parts {
            Parts::One(one) => one.clone(),
            Parts::Many(many) => Bytes::from(many.concat()),
        }
    }
}

impl From<Bytes> for Payload {
    fn from(bytes: Bytes) -> Self {
        Self { len: bytes.len(), parts: Parts::One(bytes) }
    }
}

impl From<Vec<u8>> for Payload {
    fn from(bytes: Vec<u8>) -> Self {
        Bytes::from(bytes).into()
    }
}

impl From<&'static [u8]> for Payload {
    fn from(bytes: &'static [u8]) -> Self {
        Bytes::from_static(bytes).into()
    }
}

/// Equal when the bytes are, however they are cut.
impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.contiguous() == other.contiguous()
    }
}

impl Eq for Payload {}

/// The length and the number of segments, not the bytes: a payload may be megabytes.
impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let segments = self.segments().len();
        if self.len <= 32 && segments == 1 {
            return write!(f, "Payload({:?})", self.segments()[0]);
        }
        let plural = if segments == 1 { "" } else { "s" };
        write!(f, "Payload({} bytes in {segments} segment{plural})", self.len)
    }
}

/// As one msgpack `bin`, like `Bytes`.
impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.contiguous())
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Bytes::deserialize(deserializer).map(Payload::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_keep_their_order_and_drop_the_empty_ones() {
        let payload = Payload::from_segments([
            Bytes::from_static(b"\xc6\0\0\0\x05"),
            Bytes::new(),
            Bytes::from_static(b"ab"),
            Bytes::from_static(b"cde"),
        ]);
        assert_eq!(payload.len(), 10);
        assert_eq!(payload.segments().len(), 3);
        assert_eq!(&payload.contiguous()[..], b"\xc6\0\0\0\x05abcde");
        assert_eq!(payload, Payload::from(b"\xc6\0\0\0\x05abcde".to_vec()), "equal by bytes");
    }

    #[test]
    fn one_segment_is_shared_not_copied() {
        let bytes = Bytes::from(vec![7u8; 100]);
        let payload = Payload::from_segments([Bytes::new(), bytes.clone()]);
        assert_eq!(payload.segments().len(), 1);
        assert_eq!(payload.to_bytes().as_ptr(), bytes.as_ptr());
        assert!(matches!(payload.contiguous(), Cow::Borrowed(_)));
        assert!(Payload::from_segments([]).is_empty());
    }

    #[test]
    fn it_travels_as_one_bin_however_it_is_cut() {
        let cut =
            Payload::from_segments([Bytes::from_static(b"\x92"), Bytes::from_static(b"\x01\x02")]);
        let whole = Payload::from(Bytes::from_static(b"\x92\x01\x02"));
        let encoded = rmp_serde::to_vec(&cut).unwrap();
        assert_eq!(encoded, rmp_serde::to_vec(&whole).unwrap());
        let back: Payload = rmp_serde::from_slice(&encoded).unwrap();
        assert_eq!(back, whole);
        assert_eq!(
            format!("{:?}", Payload::from(vec![0u8; 1000])),
            "Payload(1000 bytes in 1 segment)"
        );
    }
}
