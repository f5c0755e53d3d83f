//! One row's result as a v2 answer reads it: a msgpack map from output name to that row's value,
//! looked up by name. A result of a few keys is scanned for each name; one of many is indexed
//! once. A worker that declares no outputs answers with whatever keys it likes — an echoing one
//! with the client's input names, which one request may give by the hundred thousand — and a
//! scan of every key for each output made such an answer take time quadratic in them (16.9 s of
//! a runtime thread for 160,000 keys in a release build).

use std::collections::HashMap;

use rmpv::ValueRef;

/// Up to this many names, a scan is cheaper than hashing them: a row's keys are scanned for each
/// name, and a request's input names compared pairwise for repeats ([`super::request`]).
pub(super) const SCANNED: usize = 16;

/// A row's result as its map's keys and each value's msgpack, unread: a value is read only when
/// its output is stacked ([`super::tensor::row`]), never as a tree of its elements. None for a
/// result that is not a map.
pub fn entries(data: &[u8]) -> Option<Vec<(ValueRef<'_>, &[u8])>> {
    let mut rest = data;
    let len = rmp::decode::read_map_len(&mut rest).ok()?;
    let mut entries = Vec::with_capacity((len as usize).min(rest.len()));
    for _ in 0..len {
        let key = super::tensor::read_value_from(&mut rest).ok()?;
        let value = rest;
        crate::msgpack::skip(&mut rest).ok()?;
        entries.push((key, &value[..value.len() - rest.len()]));
    }
    Some(entries)
}

/// What a row's result holds under one name: its value's msgpack.
pub enum Found<'a> {
    Missing,
    Once(&'a [u8]),
    /// A msgpack map may repeat a key, which no answer can carry.
    Twice,
}

pub struct ResultRow<'a> {
    entries: &'a [(ValueRef<'a>, &'a [u8])],
    /// With more than [`SCANNED`] keys: each name's value, None where it is named twice.
    index: Option<HashMap<&'a str, Option<&'a [u8]>>>,
}

impl<'a> ResultRow<'a> {
    pub fn new(entries: &'a [(ValueRef<'a>, &'a [u8])]) -> Self {
        let index = (entries.len() > SCANNED).then(|| {
            let mut index = HashMap::with_capacity(entries.len());
            for (name, value) in entries.iter().filter_map(|(k, v)| Some((name(k)?, *v))) {
                index.entry(name).and_modify(|slot| *slot = None).or_insert(Some(value));
            }
            index
        });
        Self { entries, index }
    }

    pub fn get(&self, wanted: &str) -> Found<'a> {
        if let Some(index) = &self.index {
            return match index.get(wanted) {
                None => Found::Missing,
                Some(Some(value)) => Found::Once(value),
                Some(None) => Found::Twice,
            };
        }
        let mut named = self.entries.iter().filter(|(k, _)| name(k) == Some(wanted));
        match (named.next(), named.next()) {
            (None, _) => Found::Missing,
            (Some((_, value)), None) => Found::Once(value),
            (Some(_), Some(_)) => Found::Twice,
        }
    }

    /// Each key in order: its name, or None for a key that is not a string.
    pub fn keys(&self) -> impl Iterator<Item = Option<&'a str>> + 'a {
        self.entries.iter().map(|(k, _)| name(k))
    }
}

/// A map key that is a string.
fn name<'a>(value: &'a ValueRef<'a>) -> Option<&'a str> {
    match value {
        ValueRef::String(s) => s.as_str(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `{"k0": 0, "k1": 1, …}` of `count` keys, then `"k1": 9` and `5: nil`, as msgpack.
    fn result(count: usize) -> Vec<u8> {
        let mut out = Vec::new();
        rmp::encode::write_map_len(&mut out, count as u32 + 2).unwrap();
        for i in 0..count {
            rmp::encode::write_str(&mut out, &format!("k{i}")).unwrap();
            rmp::encode::write_uint(&mut out, i as u64).unwrap();
        }
        rmp::encode::write_str(&mut out, "k1").unwrap();
        rmp::encode::write_uint(&mut out, 9).unwrap();
        rmp::encode::write_uint(&mut out, 5).unwrap();
        rmp::encode::write_nil(&mut out).unwrap();
        out
    }

    #[test]
    fn a_few_keys_and_many_are_found_alike() {
        // Scanned (a few keys) and indexed (many): the same answers, a key twice included, and
        // a key that is no name found under no name.
        for count in [3, SCANNED * 4] {
            let data = result(count);
            let entries = entries(&data).unwrap();
            let row = ResultRow::new(&entries);
            assert_eq!(row.index.is_some(), count + 2 > SCANNED);
            assert!(matches!(row.get("k0"), Found::Once([0x00])));
            assert!(matches!(row.get("k2"), Found::Once([0x02])));
            assert!(matches!(row.get("k1"), Found::Twice));
            assert!(matches!(row.get("5"), Found::Missing));
            assert!(matches!(row.get("nope"), Found::Missing));
            assert_eq!(row.keys().count(), count + 2);
            assert_eq!(row.keys().filter(Option::is_none).count(), 1);
        }
        assert!(entries(&[0x91, 0x01]).is_none(), "not a map");
    }
}
