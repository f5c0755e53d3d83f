//! Workers' plain msgpack values, beside tensor values: [`row`] reads what a worker returned
//! for one output (a tensor value, or numbers, booleans, strings and arrays of them) as a row
//! of a datatype, declared or inferred ([`widened`] joins two rows' inferences); [`expand`]
//! writes a result's tensor values out as nested arrays for a native client; [`read_value`]
//! reads a result with the nesting bound Corral keeps everywhere.

use std::borrow::Cow;

use rmpv::ValueRef;

use super::{
    each, elements, push, read_tensor, shown, DataType, Element, Tensor, MAX_DEPTH, TENSOR_EXT,
};

/// A worker's row of one output: its datatype, shape and packed data.
#[derive(Debug, PartialEq)]
pub struct Row<'a> {
    pub datatype: DataType,
    pub shape: Vec<u64>,
    /// A tensor value's data as it is in the result (not copied: a 1 MiB output was copied
    /// once more here); a plain value's, packed.
    pub data: Cow<'a, [u8]>,
}

/// A row from what a worker returned for one output: a tensor value (of the declared datatype,
/// if one is declared) or a plain value — a number, boolean, string or bin, or arrays of them
/// nested to a rectangular shape — packed as the declared datatype or, with none declared, as
/// the one its elements suggest (booleans `BOOL`, integers `INT64`, any float `FP64`, strings
/// and bins `BYTES`).
pub fn row(value: &[u8], declared: Option<DataType>) -> Result<Row<'_>, String> {
    let mut rest = value;
    if let ValueRef::Ext(ext_type, ext) = peek_ext(value)? {
        if ext_type != TENSOR_EXT {
            return Err(format!("ext type {ext_type} is not a tensor value (ext type 1)"));
        }
        let tensor = read_tensor(ext)?;
        if declared.is_some_and(|d| d != tensor.datatype) {
            return Err(format!(
                "a tensor of {} where {} is declared",
                tensor.datatype.name(),
                declared.map_or("", DataType::name)
            ));
        }
        let Tensor { datatype, shape, data } = tensor;
        return Ok(Row { datatype, shape, data: Cow::Borrowed(data) });
    }
    // A plain value is read twice as msgpack, never as a tree of its elements (32 bytes and more
    // each: an 8M-element answer took over 400 MiB): its shape from the first element of each
    // level, then every element checked against it (and the datatype they suggest), then packed.
    let mut shape = Vec::new();
    let mut probe = value;
    while let Some(length) = array_len(&mut probe) {
        shape.push(u64::from(length));
        if length == 0 || shape.len() >= MAX_DEPTH {
            break;
        }
    }
    let (mut count, mut kinds) = (0u64, Kinds::default());
    walk(&mut rest, &shape, &mut |element| {
        count += 1;
        kinds.add(&element);
        Ok(())
    })?;
    let datatype = match declared {
        Some(datatype) => datatype,
        None => kinds.datatype()?,
    };
    let capacity = usize::try_from(count).unwrap_or(0).saturating_mul(datatype.size().unwrap_or(8));
    let mut data = Vec::with_capacity(capacity.min(value.len().saturating_mul(8)));
    let mut index = 0u64;
    walk(&mut &value[..], &shape, &mut |element| {
        push(&mut data, datatype, element).map_err(|e| format!("element {index}: {e}"))?;
        index += 1;
        Ok(())
    })?;
    Ok(Row { datatype, shape, data: Cow::Owned(data) })
}

/// The value at the start of `data` if it is an ext value; `Nil` otherwise (not read).
fn peek_ext(data: &[u8]) -> Result<ValueRef<'_>, String> {
    match data.first() {
        Some(0xc7..=0xc9 | 0xd4..=0xd8) => read_value(data),
        _ => Ok(ValueRef::Nil),
    }
}

/// The length of the array at the start of `rest`, moving past its header; None (and `rest`
/// left as it was) where no array starts.
fn array_len(rest: &mut &[u8]) -> Option<u32> {
    match rest.first() {
        Some(0x90..=0x9f | 0xdc | 0xdd) => rmp::decode::read_array_len(rest).ok(),
        _ => None,
    }
}

/// Walks a plain row (`rest`), a rectangular nest of arrays of `shape`, calling `leaf` on each
/// element in row-major order, each read on its own.
fn walk<'a>(
    rest: &mut &'a [u8],
    shape: &[u64],
    leaf: &mut impl FnMut(Element<'a>) -> Result<(), String>,
) -> Result<(), String> {
    let uneven = || "arrays nested unevenly (not a tensor)".to_string();
    let Some((&length, inner)) = shape.split_first() else {
        if array_len(&mut &rest[..]).is_some() {
            return Err(uneven());
        }
        let element = match read_value_from(rest)? {
            ValueRef::Boolean(b) => Element::Bool(b),
            ValueRef::Integer(i) => match (i.as_u64(), i.as_i64()) {
                (Some(u), _) => Element::Uint(u),
                (None, Some(i)) => Element::Int(i),
                _ => return Err("an integer out of range".into()),
            },
            ValueRef::F32(f) => Element::Float(f64::from(f)),
            ValueRef::F64(f) => Element::Float(f),
            // Strings in a result were checked to be UTF-8 as it arrived.
            ValueRef::String(s) => match s.into_str() {
                Some(text) => Element::Bytes(text.as_bytes()),
                None => return Err("a string that is not UTF-8".into()),
            },
            ValueRef::Binary(b) => Element::Bytes(b),
            // Named by kind, as the JSON form's own check says it (`super::NULL_ELEMENT`).
            ValueRef::Nil => return Err(super::NULL_ELEMENT.into()),
            ValueRef::Map(_) => return Err(super::OBJECT_ELEMENT.into()),
            ValueRef::Ext(..) => return Err("an extension value is not a tensor element".into()),
            // Found by `array_len` above; here for the match to say every kind.
            ValueRef::Array(_) => return Err(uneven()),
        };
        return leaf(element);
    };
    match array_len(rest) {
        Some(len) if u64::from(len) == length => (0..len).try_for_each(|_| walk(rest, inner, leaf)),
        _ => Err(uneven()),
    }
}

/// The datatype a plain row's elements suggest, gathered one element at a time: booleans
/// `BOOL`, integers `INT64` (`UINT64` once one is past INT64's range and none is negative: a
/// worker echoing a valid UINT64 tensor was answered 500), any float `FP64` (with integers too),
/// strings and bins `BYTES`.
#[derive(Default)]
struct Kinds {
    seen: Option<DataType>,
    mixed: Option<(DataType, DataType)>,
    negative: bool,
}

impl Kinds {
    fn add(&mut self, element: &Element) {
        let next = match element {
            Element::Bool(_) => DataType::Bool,
            Element::Uint(u) if *u > i64::MAX as u64 => DataType::U64,
            Element::Uint(_) => DataType::I64,
            Element::Int(i) => {
                self.negative |= *i < 0;
                DataType::I64
            }
            Element::Float(_) | Element::Float32(_) => DataType::F64,
            Element::Bytes(_) => DataType::Bytes,
        };
        self.seen = match self.seen {
            None => Some(next),
            Some(seen) => match widened(seen, next) {
                Some(joint) => Some(joint),
                None => {
                    self.mixed.get_or_insert((seen, next));
                    Some(seen)
                }
            },
        };
    }

    fn datatype(&self) -> Result<DataType, String> {
        if let Some((a, b)) = self.mixed {
            return Err(format!("elements of {} and {} in one tensor", a.name(), b.name()));
        }
        if self.seen == Some(DataType::U64) && self.negative {
            return Err("integers past INT64's range and negative ones in one tensor".into());
        }
        Ok(self.seen.unwrap_or(DataType::F64))
    }
}

/// The datatype that holds elements suggesting `a` and `b` (see [`Kinds`]): either, if they are
/// the same; INT64 and UINT64 in UINT64; any other two numbers in FP64; else none.
pub fn widened(a: DataType, b: DataType) -> Option<DataType> {
    let number = |t: DataType| matches!(t, DataType::I64 | DataType::U64 | DataType::F64);
    match (a, b) {
        _ if a == b => Some(a),
        (DataType::I64 | DataType::U64, DataType::I64 | DataType::U64) => Some(DataType::U64),
        _ if number(a) && number(b) => Some(DataType::F64),
        _ => None,
    }
}

/// Most empty arrays a tensor with no elements may expand to (as the Python package allows).
const MAX_EMPTY_ARRAYS: u64 = 65_536;

/// A worker's output with every tensor value in it written out plainly, for a native client:
/// nested arrays of numbers (booleans for `BOOL`; `BYTES` elements as strings when UTF-8, else
/// `bin`). Other ext values are left as they are. Written as it is read, one marker and one
/// element at a time: built as a tree of values first (32 bytes and more an element, twice),
/// a 30 MB answer of UINT8s took the proxy to 1.9 GB.
pub fn expand(data: &[u8]) -> Result<Vec<u8>, String> {
    expand_with(data, Timestamps::Kept)
}

/// What [`expand`] does with msgpack's own timestamp values (ext type -1).
#[derive(Clone, Copy, PartialEq)]
pub enum Timestamps {
    /// Left as they are: a msgpack client reads them as timestamps.
    Kept,
    /// Written as RFC 3339 strings in UTC (`2026-11-27T23:22:46.5Z`, the fraction as long as it
    /// needs), for a JSON client. JSON has no timestamp; a Python worker returning an aware
    /// `datetime` (which msgspec's msgpack writes as a timestamp) had answered its JSON clients
    /// 500 `unrepresentable_output`. The same instant as msgspec's own JSON writes it, spelled
    /// its own way: msgspec keeps the offset and six digits of fraction.
    AsText,
}

/// [`expand`], with timestamps as `timestamps` says.
pub fn expand_with(data: &[u8], timestamps: Timestamps) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(data.len() * 2);
    expand_into(&mut &data[..], &mut out, 0, timestamps)?;
    Ok(out)
}

/// msgpack's timestamp extension type.
const TIMESTAMP_EXT: i8 = -1;

/// A msgpack timestamp's body (4, 8 or 12 bytes, as the msgpack spec lays them out) as an
/// RFC 3339 string in UTC; none for a body of another size, nanoseconds past a second, or a
/// time outside the years 0 to 9999 (which RFC 3339 cannot write): such a value stays an ext,
/// which JSON refuses when the answer is written.
fn timestamp_text(body: &[u8]) -> Option<String> {
    let (seconds, nanos) = match body.len() {
        4 => (i64::from(u32::from_be_bytes(body.try_into().ok()?)), 0),
        8 => {
            let both = u64::from_be_bytes(body.try_into().ok()?);
            ((both & 0x3_ffff_ffff) as i64, (both >> 34) as u32)
        }
        12 => {
            let (nanos, seconds) = body.split_at(4);
            (
                i64::from_be_bytes(seconds.try_into().ok()?),
                u32::from_be_bytes(nanos.try_into().ok()?),
            )
        }
        _ => return None,
    };
    let when =
        time::OffsetDateTime::from_unix_timestamp(seconds).ok()?.replace_nanosecond(nanos).ok()?;
    when.format(&time::format_description::well_known::Rfc3339).ok()
}

/// Writes the value at the start of `rest` into `out`, its tensor values expanded, and moves
/// `rest` past it.
fn expand_into(
    rest: &mut &[u8],
    out: &mut Vec<u8>,
    depth: usize,
    timestamps: Timestamps,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
    }
    let start = *rest;
    match start.first().copied().ok_or("the value ends early")? {
        0x90..=0x9f | 0xdc | 0xdd => {
            let len = rmp::decode::read_array_len(rest).map_err(|e| e.to_string())?;
            rmp::encode::write_array_len(out, len).expect(TO_VEC);
            (0..len).try_for_each(|_| expand_into(rest, out, depth + 1, timestamps))
        }
        0x80..=0x8f | 0xde | 0xdf => {
            let len = rmp::decode::read_map_len(rest).map_err(|e| e.to_string())?;
            rmp::encode::write_map_len(out, len).expect(TO_VEC);
            (0..2 * u64::from(len)).try_for_each(|_| expand_into(rest, out, depth + 1, timestamps))
        }
        0xd4..=0xd8 | 0xc7..=0xc9 => {
            let meta = rmp::decode::read_ext_meta(rest).map_err(|e| e.to_string())?;
            let size = meta.size as usize;
            let body = rest.get(..size).ok_or("an ext value ends early")?;
            *rest = &rest[size..];
            match meta.typeid {
                TENSOR_EXT => write_plain(out, body, depth),
                TIMESTAMP_EXT if timestamps == Timestamps::AsText => {
                    match timestamp_text(body) {
                        Some(text) => rmp::encode::write_str(out, &text).expect(TO_VEC),
                        None => out.extend_from_slice(&start[..start.len() - rest.len()]),
                    }
                    Ok(())
                }
                // Other ext values are not Corral's: a msgpack client gets them as sent, and
                // JSON refuses them when the answer is written (`format::from_msgpack`).
                _ => {
                    out.extend_from_slice(&start[..start.len() - rest.len()]);
                    Ok(())
                }
            }
        }
        _ => {
            crate::msgpack::skip(rest)?;
            out.extend_from_slice(&start[..start.len() - rest.len()]);
            Ok(())
        }
    }
}

/// A tensor value's elements as nested arrays (a scalar for an empty shape), one level per
/// dimension, at `depth` in the value around it.
fn write_plain(out: &mut Vec<u8>, ext: &[u8], depth: usize) -> Result<(), String> {
    let Tensor { datatype, shape, data } = read_tensor(ext)?;
    // Each dimension is a level of nesting written (and of recursion here): a shape of 100,000
    // ones, one element in 100 KB, overflowed the stack and aborted the proxy.
    if depth + shape.len() > MAX_DEPTH {
        return Err(format!(
            "a tensor of {} dimensions nests deeper than {MAX_DEPTH} levels",
            shape.len()
        ));
    }
    // A tensor with no elements still nests one empty array per leading index: a shape such
    // as [2^62, 0] would be a few bytes that write billions of them.
    let containers = shape
        .iter()
        .take_while(|&&d| d != 0)
        .try_fold(1u64, |n, &d| n.checked_mul(d).filter(|&n| n <= MAX_EMPTY_ARRAYS));
    if containers.is_none() && elements(&shape) == Some(0) {
        return Err(format!("a tensor of shape {} nests too many empty arrays", shown(&shape)));
    }
    let mut flat = each(datatype, &shape, data)?;
    nest_into(out, &shape, &mut flat)
}

const TO_VEC: &str = "writing to a Vec cannot fail";

/// Flat elements nested to `shape`, written.
fn nest_into<'a>(
    out: &mut Vec<u8>,
    shape: &[u64],
    flat: &mut impl Iterator<Item = Element<'a>>,
) -> Result<(), String> {
    let Some((&length, inner)) = shape.split_first() else {
        write_element(out, flat.next());
        return Ok(());
    };
    let length = u32::try_from(length).map_err(|_| format!("a dimension of {length}"))?;
    rmp::encode::write_array_len(out, length).expect(TO_VEC);
    (0..length).try_for_each(|_| nest_into(out, inner, flat))
}

/// One element as its plain msgpack value (nil if the data ran out, which its check forbids).
fn write_element(out: &mut Vec<u8>, element: Option<Element<'_>>) {
    use rmp::encode as to;
    match element {
        None => to::write_nil(out).expect(TO_VEC),
        Some(Element::Bool(b)) => to::write_bool(out, b).expect(TO_VEC),
        Some(Element::Uint(u)) => drop(to::write_uint(out, u).expect(TO_VEC)),
        Some(Element::Int(i)) => drop(to::write_sint(out, i).expect(TO_VEC)),
        Some(Element::Float(f)) => to::write_f64(out, f).expect(TO_VEC),
        Some(Element::Float32(f)) => to::write_f32(out, f).expect(TO_VEC),
        Some(Element::Bytes(b)) => match std::str::from_utf8(b) {
            Ok(text) => to::write_str(out, text).expect(TO_VEC),
            Err(_) => to::write_bin(out, b).expect(TO_VEC),
        },
    }
}

/// [`MAX_DEPTH`] as rmpv counts: two steps for each container (the value, then its contents)
/// and up to three for the leaf in the deepest (a string: the value, the string, its bytes).
/// Passing MAX_DEPTH itself refused from 64 levels on what the body's check took to 128.
const RMPV_DEPTH: usize = 2 * MAX_DEPTH + 3;

/// Reads one msgpack value from the start of `rest`, moving past it; nesting is bounded as
/// everywhere.
pub fn read_value_from<'a>(rest: &mut &'a [u8]) -> Result<ValueRef<'a>, String> {
    rmpv::decode::read_value_ref_with_max_depth(rest, RMPV_DEPTH).map_err(|e| e.to_string())
}

/// Reads a worker's result (one msgpack value) for its rows; nesting is bounded as everywhere.
pub fn read_value(data: &[u8]) -> Result<ValueRef<'_>, String> {
    let mut rest = data;
    rmpv::decode::read_value_ref_with_max_depth(&mut rest, RMPV_DEPTH).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::tests::tensor;
    use super::super::{check_length, write_tensor};
    use super::*;

    fn plain(value: serde_json::Value) -> Vec<u8> {
        rmp_serde::to_vec(&value).unwrap()
    }

    #[test]
    fn plain_rows_pack_as_declared_or_as_they_look() {
        let nested = plain(serde_json::json!([[1, 2], [3, 4]]));
        let declared = row(&nested, Some(DataType::U8)).unwrap();
        assert_eq!((declared.shape, &*declared.data), (vec![2, 2], &[1, 2, 3, 4][..]));
        let inferred = row(&nested, None).unwrap();
        assert_eq!((inferred.datatype, inferred.data.len()), (DataType::I64, 32));
        let mixed = plain(serde_json::json!([1, 2.5]));
        assert_eq!(row(&mixed, None).unwrap().datatype, DataType::F64);
        // Past INT64's range: UINT64, which holds it (INT64 refused it, a valid echo's 500).
        let big = plain(serde_json::json!([1, u64::MAX]));
        let big = row(&big, None).unwrap();
        assert_eq!(big.datatype, DataType::U64);
        assert_eq!(&big.data[8..], &u64::MAX.to_le_bytes());
        assert!(check_length(DataType::Bool, &[2], &[1, 0]).is_ok());
        let odd = check_length(DataType::Bool, &[2], &[1, 2]).unwrap_err();
        assert_eq!(odd, "a BOOL tensor's bytes must each be 0 or 1");
        // BYTES takes what its elements' lengths say: two elements where one is declared.
        let two = [&1u32.to_le_bytes()[..], b"a", &1u32.to_le_bytes()[..], b"b"].concat();
        let extra = check_length(DataType::Bytes, &[1, 1], &two).unwrap_err();
        assert!(extra.contains("its 1 element(s) end at byte 5, and 5 bytes follow"), "{extra}");
        assert!(check_length(DataType::Bytes, &[2], &two).is_ok());
        let both = plain(serde_json::json!([-1, u64::MAX]));
        assert!(row(&both, None).unwrap_err().contains("past INT64's range and negative"));
        let scalar = plain(serde_json::json!(true));
        let scalar = row(&scalar, None).unwrap();
        assert_eq!(
            (scalar.datatype, scalar.shape, &*scalar.data),
            (DataType::Bool, vec![], &[1][..])
        );
        let ragged = plain(serde_json::json!([[1, 2], [3]]));
        assert!(row(&ragged, None).unwrap_err().contains("unevenly"));
        let words = plain(serde_json::json!(["a", 1]));
        assert!(row(&words, None).is_err());
    }

    #[test]
    fn an_element_that_is_no_tensor_element_is_named_by_kind_never_quoted() {
        let null = plain(serde_json::json!([1, null]));
        assert_eq!(row(&null, None).unwrap_err(), "null is not a tensor element");
        let object = plain(serde_json::json!([{"secret": "alice"}]));
        assert_eq!(row(&object, None).unwrap_err(), "an object is not a tensor element");
        let mut ext = vec![0x91]; // [ext 8 of type 5, one byte]
        ext.extend([0xd4, 5, 0]);
        assert_eq!(row(&ext, None).unwrap_err(), "an extension value is not a tensor element");
    }

    #[test]
    fn timestamps_of_each_width_are_rfc3339_text() {
        // The msgpack spec's three layouts: 32-bit seconds; 30-bit nanoseconds and 34-bit
        // seconds; 32-bit nanoseconds and signed 64-bit seconds (before 1970 too).
        assert_eq!(timestamp_text(&0u32.to_be_bytes()).unwrap(), "1970-01-01T00:00:00Z");
        let both = (1u64 << 34) | 86_400;
        assert_eq!(timestamp_text(&both.to_be_bytes()).unwrap(), "1970-01-02T00:00:00.000000001Z");
        let before = [&250_000_000u32.to_be_bytes()[..], &(-1i64).to_be_bytes()].concat();
        assert_eq!(timestamp_text(&before).unwrap(), "1969-12-31T23:59:59.25Z");
        let too_many_nanos = [&1_000_000_000u32.to_be_bytes()[..], &0i64.to_be_bytes()].concat();
        assert_eq!(timestamp_text(&too_many_nanos), None);
        assert_eq!(timestamp_text(&[0; 5]), None);
        let year_zero = [&[0; 4][..], &(-62_167_219_200i64).to_be_bytes()].concat();
        assert_eq!(timestamp_text(&year_zero).unwrap(), "0000-01-01T00:00:00Z");
        let before_year_zero = [&[0; 4][..], &(-62_167_219_201i64).to_be_bytes()].concat();
        assert_eq!(timestamp_text(&before_year_zero), None);
    }

    #[test]
    fn tensor_values_expand_to_nested_arrays_for_native_clients() {
        let mut out = Vec::new();
        rmp::encode::write_map_len(&mut out, 1).unwrap();
        rmp::encode::write_str(&mut out, "y").unwrap();
        let data: Vec<u8> = [1i32, 2, 3, 4].iter().flat_map(|i| i.to_le_bytes()).collect();
        write_tensor(&mut out, DataType::I32, &[2, 2], &data);
        let plain: serde_json::Value = rmp_serde::from_slice(&expand(&out).unwrap()).unwrap();
        assert_eq!(plain, serde_json::json!({"y": [[1, 2], [3, 4]]}));
        let words = tensor(DataType::Bytes, &[2], &[1, 0, 0, 0, b'a', 1, 0, 0, 0, b'b']);
        let plain: serde_json::Value = rmp_serde::from_slice(&expand(&words).unwrap()).unwrap();
        assert_eq!(plain, serde_json::json!(["a", "b"]));
        assert_eq!(expand(&[0xd4, 0x05, 0x00]).unwrap(), [0xd4, 0x05, 0x00], "not ours: kept");
        let empty = tensor(DataType::F32, &[1 << 62, 0], &[]);
        assert!(expand(&empty).unwrap_err().contains("too many empty arrays"));
        let few = tensor(DataType::F32, &[2, 0], &[]);
        let plain: serde_json::Value = rmp_serde::from_slice(&expand(&few).unwrap()).unwrap();
        assert_eq!(plain, serde_json::json!([[], []]));
    }

    #[test]
    fn a_tensor_row_must_have_the_declared_datatype() {
        let packed = tensor(DataType::F64, &[1], &0f64.to_le_bytes());
        assert!(row(&packed, Some(DataType::F32)).unwrap_err().contains("FP32 is declared"));
        assert_eq!(row(&packed, None).unwrap().datatype, DataType::F64);
    }

    #[test]
    fn a_tensor_of_more_dimensions_than_nesting_allows_is_refused_not_recursed() {
        // One element, 100,000 dimensions: written out as nested arrays it overflowed the stack.
        let shape = vec![1u64; 100_000];
        let deep = tensor(DataType::F32, &shape, &1f32.to_le_bytes());
        assert!(expand(&deep).unwrap_err().contains("100000 dimensions"));
        let fits = tensor(DataType::F32, &[1u64; 64], &1f32.to_le_bytes());
        assert!(expand(&fits).is_ok(), "numpy's most dimensions");
        let more = tensor(DataType::F32, &[1u64; 65], &1f32.to_le_bytes());
        assert!(expand(&more).unwrap_err().contains("at most 64"));
    }
}
