//! msgpack as the proxy reads it, wherever a value comes from (a client's body, a worker's
//! result or chunk, a weight rule's field): the one check a value must pass ([`check`]), what a
//! JSON answer must treat apart ([`scan`]), the nesting bound every decoder keeps
//! ([`MAX_DEPTH`], [`reader`]), the bytes of a `bin` ([`bin_contents`]), and moving past a value
//! or to a map's key without decoding ([`skip`], [`after_key`]). Neither the HTTP edge's nor the
//! workers' own: both sides use it.
//!
//! The check walks a value marker by marker (no recursion, no allocation beyond one counter per
//! open container): exactly one value, nesting within [`MAX_DEPTH`], no reserved byte, and every
//! `str` valid UTF-8. Decoders built on serde cannot check the last: they hand an invalid string
//! to their visitor as bytes, exactly as they hand a `bin`.

use bytes::Bytes;
pub use corral_protocol::walk::Found;
use corral_protocol::walk::{walk_one, Strings};

/// Deepest nesting accepted in a msgpack value, as serde_json allows for JSON: every decoder here
/// recurses per level, and a body of a million nested arrays must be a 400, not a stack overflow.
pub const MAX_DEPTH: usize = 128;

/// A msgpack decoder over `input` with the nesting limit set, reading strings and bins where
/// they lie (serde's reading from a `Read` copied each into a scratch buffer first).
pub fn reader(input: &[u8]) -> rmp_serde::Deserializer<rmp_serde::decode::ReadRefReader<'_, [u8]>> {
    let mut de = rmp_serde::Deserializer::from_read_ref(input);
    // rmp_serde counts the value it is reading as a level: one more than MAX_DEPTH's containers.
    de.set_max_depth(MAX_DEPTH + 1);
    de
}

/// Moves `rest` past one msgpack value, within the nesting bound: its markers and lengths are
/// read, its strings not checked (the value was, by [`check`] or the worker's settling), nothing
/// copied. (serde's `IgnoredAny` over rmp_serde copied every `str`, `bin` and ext into a growing
/// buffer to move past it: 13% of the proxy's time answering a 1 MiB v2 tensor.)
pub fn skip(rest: &mut &[u8]) -> Result<(), String> {
    let (_, end) = walk_one(rest, Strings::Skip, MAX_DEPTH)?;
    *rest = &rest[end..];
    Ok(())
}

/// What follows the string key `name` in the map at the start of `map` — its value first, then
/// whatever came after it — if the map has that key; `Err` if `map` is no map, or a key or value
/// before it is malformed. Nothing is decoded but the keys.
pub fn after_key<'a>(map: &'a [u8], name: &str) -> Result<Option<&'a [u8]>, String> {
    find_key(map, name, false)
}

/// As [`after_key`], for a key a client gives: one given twice is an `Err`, as serde's
/// `duplicate field` is. Taking the first would run what a reader keeping the last (Python's
/// `json`, JavaScript, a gateway's log) never saw. The whole map is read.
pub fn after_only_key<'a>(map: &'a [u8], name: &str) -> Result<Option<&'a [u8]>, String> {
    find_key(map, name, true)
}

fn find_key<'a>(map: &'a [u8], name: &str, only: bool) -> Result<Option<&'a [u8]>, String> {
    let mut rest = map;
    let len = rmp::decode::read_map_len(&mut rest).map_err(|_| "not a map".to_string())?;
    let mut found = None;
    for _ in 0..len {
        let mut key = rest;
        let is_name = rmp::decode::read_str_len(&mut key)
            .is_ok_and(|n| key.get(..n as usize) == Some(name.as_bytes()));
        skip(&mut rest)?;
        if is_name {
            if found.is_some() {
                return Err(format!("{name:?} appears twice"));
            }
            found = Some(rest);
            if !only {
                break;
            }
        }
        skip(&mut rest)?;
    }
    Ok(found)
}

/// The bytes inside `value` if it is exactly one msgpack `bin` (a slice of the same buffer, no
/// copy).
pub fn bin_contents(value: &Bytes) -> Option<Bytes> {
    let mut rest = &value[..];
    let length = rmp::decode::read_bin_len(&mut rest).ok()? as usize;
    let header = value.len() - rest.len();
    (rest.len() == length).then(|| value.slice(header..))
}

/// Checks that `body` is exactly one well-formed msgpack value whose strings are all UTF-8.
pub fn check(body: &[u8]) -> Result<(), String> {
    walk(body, MAX_DEPTH).map(drop)
}

/// [`Found`] of `body` (all false for a malformed one, or one nested more than one level past
/// [`MAX_DEPTH`]), in one walk ([`scan_answer`]'s).
pub fn scan(body: &[u8]) -> Found {
    scan_answer(body).unwrap_or_default()
}

/// [`scan`] of an answer made of checked values (a worker's output, or an array gathering
/// them), walked one level past the bound, so that one array around values at the bound is
/// found to pass it (`deepest`); None where the walk fails, which for such an answer means it
/// nests deeper still. Scanned within the bound, such an answer was found malformed with
/// nothing in it, and went out.
pub fn scan_answer(body: &[u8]) -> Option<Found> {
    walk(body, MAX_DEPTH + 1).ok()
}

/// [`check`]'s walk, and what it found.
fn walk(body: &[u8], bound: usize) -> Result<Found, String> {
    if body.is_empty() {
        return Err("empty body".into());
    }
    let (found, end) = walk_one(body, Strings::Check, bound)?;
    match body.len() - end {
        0 => Ok(found),
        rest => Err(format!("{rest} bytes after the value")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(value: serde_json::Value) -> Vec<u8> {
        rmp_serde::to_vec(&value).unwrap()
    }

    #[test]
    fn accepts_every_kind_of_msgpack_value() {
        let value = serde_json::json!({
            "s": "héllo", "long": "x".repeat(300), "n": [0, -1, 200, -200, 70000, -70000,
            5_000_000_000_u64, -5_000_000_000_i64, u64::MAX, 0.5], "t": true, "f": false,
            "z": null, "nested": [[[]], {}],
        });
        assert_eq!(check(&packed(value)), Ok(()));
        let bin = [&[0xc5, 0x01, 0x2c][..], &[0xff; 300]].concat();
        assert_eq!(check(&bin), Ok(()), "bin 16 holds any bytes");
        for ext in [&[0xd4, 0x01, 0xff][..], &[0xc7, 0x02, 0x05, 0xff, 0xfe]] {
            assert_eq!(check(ext), Ok(()), "{ext:?}");
        }
    }

    #[test]
    fn skip_moves_past_one_value_and_keeps_the_depth_bound() {
        let value = serde_json::json!({"s": "héllo", "n": [1, -2, 0.5], "z": null});
        let bin = [&[0xc5, 0x01, 0x2c][..], &[0xff; 300]].concat();
        let ext = [0xc7, 0x02, 0x05, 0xff, 0xfe];
        for first in [packed(value), bin, ext.to_vec(), vec![0xa2, 0xff, 0xfe]] {
            // A string's bytes are not checked here (the value was, as a whole).
            let body = [&first[..], &[0x2a]].concat();
            let mut rest = &body[..];
            assert_eq!(skip(&mut rest), Ok(()), "{first:?}");
            assert_eq!(rest, &[0x2a], "{first:?}");
        }
        for truncated in [&[0x92, 0x01][..], &[0xc5, 0x01], &[0xda, 0x00, 0x05, b'a'], &[]] {
            assert!(skip(&mut &truncated[..]).is_err(), "{truncated:?}");
        }
        let deepest = [&vec![0x91; MAX_DEPTH][..], &[0xc0]].concat();
        assert_eq!(skip(&mut &deepest[..]), Ok(()));
        let deeper = [&vec![0x91; MAX_DEPTH + 1][..], &[0xc0]].concat();
        assert!(skip(&mut &deeper[..]).unwrap_err().contains("nested deeper than 128"));
    }

    #[test]
    fn refuses_a_string_that_is_not_utf8() {
        let error = check(&[0x91, 0xa2, 0xff, 0xfe]).unwrap_err();
        assert!(error.contains("byte 1 is not valid UTF-8"), "{error}");
        assert!(check(&[0xd9, 0x01, 0x80]).is_err(), "str 8");
        assert!(check(&[0x81, 0xa1, 0xc3, 0x01]).is_err(), "a map key");
    }

    #[test]
    fn refuses_what_is_not_one_whole_value() {
        assert!(check(&[]).is_err());
        assert!(check(&[0x92, 0x01]).unwrap_err().starts_with("truncated"));
        assert!(check(&[0xdd, 0xff, 0xff, 0xff, 0xff]).is_err(), "a huge array, no elements");
        assert!(check(&[0xc6, 0xff, 0xff, 0xff, 0xff]).is_err(), "a huge bin, no data");
        assert_eq!(check(&[0x01, 0x02]).unwrap_err(), "1 bytes after the value");
        assert!(check(&[0xc1]).is_err());
    }

    #[test]
    fn every_decoder_reads_as_deep_as_the_check_lets_through() {
        // The check is the gate: a value it takes must not be refused further on for its depth
        // (a worker's result read for v2 or expanded, a JSON answer, a weight rule's skip).
        for leaf in [&[0xc0][..], &[0xa1, b'a'], &[0xc4, 0x01, 0x00], &[0xd4, 0x05, 0x00]] {
            let deepest = [&vec![0x91; MAX_DEPTH - 1][..], &[0x81, 0xa1, b'k'], leaf].concat();
            assert_eq!(check(&deepest), Ok(()));
            assert!(crate::http::protocols::v2::tensor::read_value(&deepest).is_ok());
            let json = crate::http::format::from_msgpack(
                crate::http::format::Format::Json,
                bytes::Bytes::from(deepest.clone()),
            );
            assert!(json.is_ok() || leaf[0] == 0xd4, "{json:?}");
        }
    }

    #[test]
    fn bounds_nesting() {
        let nested = |depth: usize| [vec![0x91; depth], vec![0xc0]].concat();
        assert_eq!(check(&nested(MAX_DEPTH)), Ok(()));
        assert!(check(&nested(MAX_DEPTH + 1)).unwrap_err().contains("nested deeper"));
        assert!(check(&nested(1_000_000)).is_err());
    }

    #[test]
    fn finds_the_bytes_of_one_bin() {
        let bin = |bytes: &'static [u8]| bin_contents(&Bytes::from_static(bytes));
        assert_eq!(bin(b"\xc4\x02ab").as_deref(), Some(&b"ab"[..]));
        assert_eq!(bin(b"\xc5\x00\x01a").as_deref(), Some(&b"a"[..]));
        assert_eq!(bin(b"\xc6\x00\x00\x00\x00").as_deref(), Some(&b""[..]));
        assert_eq!(bin(b"\xc4\x02a"), None, "truncated");
        assert_eq!(bin(b"\xc4\x01ab"), None, "a value after it");
        assert_eq!(bin(b"\xa2ab"), None, "a str");
        assert_eq!(bin(b""), None);
        let bytes = Bytes::from_static(b"\xc4\x03PNG");
        assert_eq!(bin_contents(&bytes).unwrap().as_ptr(), bytes[2..].as_ptr(), "not a copy");
    }
}
