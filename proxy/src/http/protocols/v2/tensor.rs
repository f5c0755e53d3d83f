//! Tensors as Open Inference Protocol v2 has them and as workers see them: the datatypes, a
//! row's **tensor value** on the worker socket (msgpack ext type 1: `[datatype, shape, bin]`,
//! PROTOCOL.md "Tensors and raw bytes"), and the conversions between a tensor's packed
//! little-endian bytes and the two other shapes its elements come in — JSON `data` arrays from
//! and to v2 clients, and plain msgpack values (numbers, booleans, strings, nested arrays) from
//! workers that return those instead of tensor values.
//!
//! Bytes are the one representation every path goes through: a binary request's tensor is
//! already them, a JSON one is packed once, and a row is a slice of them.

use std::borrow::Cow;

use rmpv::ValueRef;
use serde::de::DeserializeSeed;

/// The ext type of a tensor value.
pub const TENSOR_EXT: i8 = 1;

/// Deepest nesting read in a worker's output (as for every msgpack value Corral reads).
const MAX_DEPTH: usize = crate::msgpack::MAX_DEPTH;

/// A v2 datatype. `BF16` is not among them: neither JSON nor numpy has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    Bool,
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F16,
    F32,
    F64,
    Bytes,
}

const ALL: [DataType; 13] = [
    DataType::Bool,
    DataType::U8,
    DataType::U16,
    DataType::U32,
    DataType::U64,
    DataType::I8,
    DataType::I16,
    DataType::I32,
    DataType::I64,
    DataType::F16,
    DataType::F32,
    DataType::F64,
    DataType::Bytes,
];

impl DataType {
    pub fn parse(name: &str) -> Result<DataType, String> {
        ALL.into_iter().find(|t| t.name() == name).ok_or_else(|| {
            let known: Vec<&str> = ALL.iter().map(|t| t.name()).collect();
            format!("unsupported datatype {name:?}; Corral takes {}", known.join(", "))
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::U8 => "UINT8",
            DataType::U16 => "UINT16",
            DataType::U32 => "UINT32",
            DataType::U64 => "UINT64",
            DataType::I8 => "INT8",
            DataType::I16 => "INT16",
            DataType::I32 => "INT32",
            DataType::I64 => "INT64",
            DataType::F16 => "FP16",
            DataType::F32 => "FP32",
            DataType::F64 => "FP64",
            DataType::Bytes => "BYTES",
        }
    }

    /// Bytes per element; None for `BYTES`, whose elements carry their own lengths.
    pub fn size(self) -> Option<usize> {
        match self {
            DataType::Bool | DataType::U8 | DataType::I8 => Some(1),
            DataType::U16 | DataType::I16 | DataType::F16 => Some(2),
            DataType::U32 | DataType::I32 | DataType::F32 => Some(4),
            DataType::U64 | DataType::I64 | DataType::F64 => Some(8),
            DataType::Bytes => None,
        }
    }
}

/// Elements in a tensor of `shape`, or None if the count overflows.
pub fn elements(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d))
}

/// Whether a row's shape is one a declaration allows (`-1`: any length).
pub fn fits(shape: &[u64], declared: &[i64]) -> bool {
    shape.len() == declared.len()
        && shape.iter().zip(declared).all(|(&d, &s)| s < 0 || d == s as u64)
}

/// The byte ranges of the first `count` elements of packed `BYTES` data (each a 4-byte
/// little-endian length, then that many bytes), and the length they take.
pub fn bytes_elements(data: &[u8], count: u64) -> Result<(Vec<(usize, usize)>, usize), String> {
    let mut spans = Vec::with_capacity(count.min(data.len() as u64 / 4) as usize);
    let mut at = 0usize;
    for index in 0..count {
        let head = data.get(at..at + 4).ok_or_else(|| {
            format!("BYTES element {index} is cut short: no 4-byte length at byte {at}")
        })?;
        let length = u32::from_le_bytes(head.try_into().expect("four bytes")) as usize;
        let start = at + 4;
        if data.len() - start < length {
            return Err(format!("BYTES element {index} claims {length} bytes past the data"));
        }
        spans.push((start, start + length));
        at = start + length;
    }
    Ok((spans, at))
}

/// The length packed data of `datatype` and `shape` must have, checked against `data` (the
/// whole of it); and a `BOOL` tensor's bytes, each 0 or 1 (another byte was a worker's 422,
/// "the model rejected this row", for a malformed request).
pub fn check_length(datatype: DataType, shape: &[u64], data: &[u8]) -> Result<(), String> {
    let count = elements(shape).ok_or("the shape's element count overflows")?;
    let expected = match datatype.size() {
        Some(size) => count.checked_mul(size as u64).ok_or("the tensor's size overflows")?,
        None => bytes_elements(data, count)?.1 as u64,
    };
    if expected != data.len() as u64 {
        return Err(format!(
            "{} bytes of {} data for shape {shape:?}, which takes {expected}",
            data.len(),
            datatype.name()
        ));
    }
    if datatype == DataType::Bool && data.iter().any(|&b| b > 1) {
        return Err("a BOOL tensor's bytes must each be 0 or 1".into());
    }
    Ok(())
}

/// Appends a tensor value (ext type 1) holding one row.
pub fn write_tensor(out: &mut Vec<u8>, datatype: DataType, shape: &[u64], data: &[u8]) {
    write_tensor_head(out, datatype, shape, data.len());
    out.extend_from_slice(data);
}

/// Appends the start of a tensor value (ext type 1) whose `length` bytes of data follow it:
/// for a row whose data stays where it lies in the request's body.
pub fn write_tensor_head(out: &mut Vec<u8>, datatype: DataType, shape: &[u64], length: usize) {
    let mut head = Vec::with_capacity(16 + 9 * shape.len());
    let write = "writing to a Vec cannot fail";
    rmp::encode::write_array_len(&mut head, 3).expect(write);
    rmp::encode::write_str(&mut head, datatype.name()).expect(write);
    rmp::encode::write_array_len(&mut head, shape.len() as u32).expect(write);
    for &dim in shape {
        rmp::encode::write_uint(&mut head, dim).expect(write);
    }
    rmp::encode::write_bin_len(&mut head, length as u32).expect(write);
    rmp::encode::write_ext_meta(out, (head.len() + length) as u32, TENSOR_EXT).expect(write);
    out.extend_from_slice(&head);
}

/// A tensor value's contents, read from its ext data and checked.
#[derive(Debug)]
pub struct Tensor<'a> {
    pub datatype: DataType,
    pub shape: Vec<u64>,
    pub data: &'a [u8],
}

pub fn read_tensor(ext: &[u8]) -> Result<Tensor<'_>, String> {
    let malformed = "a tensor value must be [datatype, shape, data]";
    let mut rest = ext;
    let value = rmpv::decode::read_value_ref_with_max_depth(&mut rest, 8)
        .map_err(|e| format!("{malformed}: {e}"))?;
    if !rest.is_empty() {
        return Err(format!("{malformed}: {} bytes after it", rest.len()));
    }
    let ValueRef::Array(parts) = value else { return Err(malformed.into()) };
    let [ValueRef::String(datatype), ValueRef::Array(dims), ValueRef::Binary(data)] = &parts[..]
    else {
        return Err(malformed.into());
    };
    let datatype = DataType::parse(datatype.as_str().ok_or(malformed)?)?;
    let shape = dims
        .iter()
        .map(|d| d.as_u64().ok_or("a tensor's shape must be non-negative integers"))
        .collect::<Result<Vec<u64>, _>>()?;
    check_length(datatype, &shape, data)?;
    Ok(Tensor { datatype, shape, data })
}

/// Packs a JSON `data` array (flat, or nested any way) of `count` elements, as its text: each
/// element is packed as it is read, never held as a `serde_json::Value` (32 bytes and more
/// each: a valid 16 MiB request of numbers took 419 MiB that way, four at once 1.8 GiB).
pub fn pack_json(
    datatype: DataType,
    data: &serde_json::value::RawValue,
    count: u64,
) -> Result<Vec<u8>, String> {
    // Each element takes two characters at least (a digit and a comma).
    let elements = usize::try_from(count).unwrap_or(usize::MAX).min(data.get().len() / 2 + 1);
    let mut leaves = Leaves::new(datatype, count, elements);
    let mut reader = serde_json::Deserializer::from_str(data.get());
    let read = (&mut leaves).deserialize(&mut reader).map_err(|e| e.to_string());
    leaves.finish(read)
}

/// What [`pack_json`] reads: every leaf of the nested arrays, in order, packed as `datatype`
/// while there are no more than `count` and none was refused (past that only counted, for the
/// count's error). A seed: a request's reader packs `data` with it as it reads the header, where
/// the datatype and shape came first.
pub struct Leaves {
    datatype: DataType,
    count: u64,
    seen: u64,
    out: Vec<u8>,
    /// Nesting past [`MAX_DEPTH`], in Corral's words (serde_json's would add a position): the
    /// reading stops there.
    too_deep: Option<String>,
    /// The first element refused, in Corral's words.
    refused: Option<String>,
}

impl Leaves {
    /// Ready to pack `count` elements of `datatype`, with room for `elements` of them at first.
    pub fn new(datatype: DataType, count: u64, elements: usize) -> Self {
        let capacity = elements.saturating_mul(datatype.size().unwrap_or(1));
        Leaves {
            datatype,
            count,
            seen: 0,
            out: Vec::with_capacity(capacity),
            too_deep: None,
            refused: None,
        }
    }

    /// The packed data once `read` (the reading's own result) is over, or the error, in the
    /// order the data was always judged: too deep, then JSON that does not parse, then a count
    /// that does not match the shape, then the first element refused.
    pub fn finish(self, read: Result<(), String>) -> Result<Vec<u8>, String> {
        if let Some(too_deep) = self.too_deep {
            return Err(too_deep);
        }
        read.map_err(|e| format!("data is not JSON: {e}"))?;
        if self.seen != self.count {
            return Err(format!("{} elements of data for a shape of {}", self.seen, self.count));
        }
        match self.refused {
            Some(refused) => Err(refused),
            None => Ok(self.out),
        }
    }

    fn leaf(&mut self, element: Result<Element, String>) {
        let index = self.seen;
        self.seen += 1;
        if index >= self.count || self.refused.is_some() {
            return;
        }
        let packed = element.and_then(|element| push(&mut self.out, self.datatype, element));
        if let Err(e) = packed {
            self.refused = Some(format!("element {index}: {e}"));
        }
    }
}

/// One level of nesting of [`Leaves`].
struct Level<'a> {
    leaves: &'a mut Leaves,
    depth: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for &mut Leaves {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, reader: D) -> Result<(), D::Error> {
        reader.deserialize_any(Level { leaves: self, depth: 0 })
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Level<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, reader: D) -> Result<(), D::Error> {
        reader.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Level<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("tensor elements")
    }

    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<(), E> {
        self.leaves.leaf(Ok(Element::Bool(b)));
        Ok(())
    }

    fn visit_u64<E: serde::de::Error>(self, u: u64) -> Result<(), E> {
        self.leaves.leaf(Ok(Element::Uint(u)));
        Ok(())
    }

    fn visit_i64<E: serde::de::Error>(self, i: i64) -> Result<(), E> {
        self.leaves.leaf(Ok(Element::Int(i)));
        Ok(())
    }

    fn visit_f64<E: serde::de::Error>(self, f: f64) -> Result<(), E> {
        self.leaves.leaf(Ok(Element::Float(f)));
        Ok(())
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<(), E> {
        self.leaves.leaf(Ok(Element::Bytes(s.as_bytes())));
        Ok(())
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.leaves.leaf(Err("null is not a tensor element".into()));
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut entries: A) -> Result<(), A::Error> {
        // Read past without building it.
        while entries.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
        self.leaves.leaf(Err("an object is not a tensor element".into()));
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
        // serde_json's own recursion limit (128) comes first as the data is read today; kept
        // so that the bound does not hang on it.
        if self.depth >= MAX_DEPTH {
            self.leaves.too_deep = Some(format!("data nested deeper than {MAX_DEPTH} levels"));
            return Err(serde::de::Error::custom("too deep"));
        }
        let depth = self.depth + 1;
        while items.next_element_seed(Level { leaves: &mut *self.leaves, depth })?.is_some() {}
        Ok(())
    }
}

/// One element as a client or worker wrote it, before it is packed.
#[derive(Debug, Clone, Copy)]
enum Element<'a> {
    Bool(bool),
    Uint(u64),
    Int(i64),
    Float(f64),
    /// An `FP16` or `FP32` element read from packed data: kept single, so that a native answer
    /// writes `0.1`, not the `0.10000000149011612` its widening would.
    Float32(f32),
    Bytes(&'a [u8]),
}

/// Packs one element as `datatype`: integers must fit, floats go to float types only (a float
/// in an integer tensor is refused rather than truncated), booleans to `BOOL` only.
fn push(out: &mut Vec<u8>, datatype: DataType, element: Element) -> Result<(), String> {
    use DataType as T;
    let fits = |what: &str| format!("{what} does not fit in {}", datatype.name());
    match (datatype, element) {
        (T::Bool, Element::Bool(b)) => out.push(u8::from(b)),
        (T::Bytes, Element::Bytes(b)) => {
            let length = u32::try_from(b.len()).map_err(|_| fits("an element of 4 GiB"))?;
            out.extend_from_slice(&length.to_le_bytes());
            out.extend_from_slice(b);
        }
        // A finite number past the type's range would become infinity: refused as an integer
        // too large is (an infinity given stays one).
        (T::F16, e) => {
            let (wide, narrow) = float(e).map(|f| (f, half::f16::from_f64(f)))?;
            if wide.is_finite() && narrow.is_infinite() {
                return Err(fits(&format!("{wide:?}")));
            }
            out.extend_from_slice(&narrow.to_le_bytes())
        }
        (T::F32, e) => {
            let (wide, narrow) = float(e).map(|f| (f, f as f32))?;
            if wide.is_finite() && narrow.is_infinite() {
                return Err(fits(&format!("{wide:?}")));
            }
            out.extend_from_slice(&narrow.to_le_bytes())
        }
        (T::F64, e) => out.extend_from_slice(&float(e)?.to_le_bytes()),
        (integer, Element::Uint(u)) => {
            push_integer(out, integer, i128::from(u)).ok_or_else(|| fits(&format!("{u}")))?
        }
        (integer, Element::Int(i)) => {
            push_integer(out, integer, i128::from(i)).ok_or_else(|| fits(&format!("{i}")))?
        }
        (_, element) => {
            return Err(format!("{} is not a {} element", describe(element), datatype.name()))
        }
    }
    Ok(())
}

fn float(element: Element) -> Result<f64, String> {
    match element {
        Element::Uint(u) => Ok(u as f64),
        Element::Int(i) => Ok(i as f64),
        Element::Float(f) => Ok(f),
        Element::Float32(f) => Ok(f64::from(f)),
        other => Err(format!("{} is not a number", describe(other))),
    }
}

fn describe(element: Element) -> &'static str {
    match element {
        Element::Bool(_) => "a boolean",
        Element::Uint(_) | Element::Int(_) => "an integer",
        Element::Float(_) | Element::Float32(_) => "a float",
        Element::Bytes(_) => "a string",
    }
}

/// Packs an integer as an integer datatype; None if it does not fit (or the type is not one).
fn push_integer(out: &mut Vec<u8>, datatype: DataType, value: i128) -> Option<()> {
    use DataType as T;
    match datatype {
        T::U8 => out.extend_from_slice(&u8::try_from(value).ok()?.to_le_bytes()),
        T::U16 => out.extend_from_slice(&u16::try_from(value).ok()?.to_le_bytes()),
        T::U32 => out.extend_from_slice(&u32::try_from(value).ok()?.to_le_bytes()),
        T::U64 => out.extend_from_slice(&u64::try_from(value).ok()?.to_le_bytes()),
        T::I8 => out.extend_from_slice(&i8::try_from(value).ok()?.to_le_bytes()),
        T::I16 => out.extend_from_slice(&i16::try_from(value).ok()?.to_le_bytes()),
        T::I32 => out.extend_from_slice(&i32::try_from(value).ok()?.to_le_bytes()),
        T::I64 => out.extend_from_slice(&i64::try_from(value).ok()?.to_le_bytes()),
        _ => return None,
    }
    Some(())
}

/// A tensor's packed data as v2 JSON `data`: a flat array of its elements, written into the
/// answer as they are read, never held as `serde_json::Value`s (with its elements collected
/// first, 80 bytes and more each: a 16 MiB answer of UINT8s took the proxy past 1 GiB). JSON has
/// no NaN nor infinity: written as `null` (serde_json's way) they would reach the client as
/// another value, or none; they fail the answer instead, naming `output` (the client can ask for
/// binary data), as do BYTES elements that are not UTF-8.
pub struct JsonData<'a> {
    pub output: &'a str,
    pub datatype: DataType,
    pub shape: &'a [u64],
    pub data: &'a [u8],
}

const NOT_UTF8: &str =
    "a BYTES element is not UTF-8, which JSON cannot carry: ask for it with binary_data";

impl serde::Serialize for JsonData<'_> {
    fn serialize<S: serde::Serializer>(&self, writer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeSeq};
        let fail = |why: &str| S::Error::custom(format!("output {:?}: {why}", self.output));
        let elements = each(self.datatype, self.shape, self.data).map_err(|e| fail(&e))?;
        let number = |f: f64| {
            f.is_finite().then_some(f).ok_or_else(|| {
                fail(&format!("{f} is not a number JSON can carry: ask for it with binary_data"))
            })
        };
        let mut seq = writer.serialize_seq(None)?;
        for element in elements {
            match element {
                Element::Bool(b) => seq.serialize_element(&b)?,
                Element::Uint(u) => seq.serialize_element(&u)?,
                Element::Int(i) => seq.serialize_element(&i)?,
                Element::Float(f) => seq.serialize_element(&number(f)?)?,
                // As a float32: the shortest form reading back to the same float32, not its
                // float64 widening (2.7 times the text, and a tenth of the proxy's time).
                Element::Float32(f) => {
                    number(f64::from(f))?;
                    seq.serialize_element(&f)?
                }
                Element::Bytes(b) => {
                    let text = std::str::from_utf8(b).map_err(|_| fail(NOT_UTF8))?;
                    seq.serialize_element(text)?
                }
            }
        }
        seq.end()
    }
}

/// Packed data's elements, row-major (its length already checked against the shape), read as
/// they are asked for: no list of them is made.
fn each<'a>(
    datatype: DataType,
    shape: &[u64],
    data: &'a [u8],
) -> Result<Box<dyn Iterator<Item = Element<'a>> + 'a>, String> {
    let Some(size) = datatype.size() else {
        let (spans, _) = bytes_elements(data, elements(shape).unwrap_or(0))?;
        return Ok(Box::new(
            spans.into_iter().map(|(start, end)| Element::Bytes(&data[start..end])),
        ));
    };
    let word = |b: &[u8]| {
        let mut bytes = [0u8; 8];
        bytes[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(bytes)
    };
    // Sign-extends a little-endian integer of `b.len()` bytes.
    let signed = move |b: &[u8]| {
        let shift = 64 - 8 * b.len() as u32;
        ((word(b) << shift) as i64) >> shift
    };
    Ok(Box::new(data.chunks_exact(size).map(move |b| match datatype {
        DataType::Bool => Element::Bool(b[0] != 0),
        DataType::U8 | DataType::U16 | DataType::U32 | DataType::U64 => Element::Uint(word(b)),
        DataType::I8 | DataType::I16 | DataType::I32 | DataType::I64 => Element::Int(signed(b)),
        DataType::F16 => Element::Float32(half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
        DataType::F32 => Element::Float32(f32::from_bits(word(b) as u32)),
        DataType::F64 => Element::Float(f64::from_bits(word(b))),
        DataType::Bytes => unreachable!("BYTES has no fixed size"),
    })))
}

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
            other => return Err(format!("{other} is not a tensor element")),
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
/// `bin`). Other ext values are left as they are.
pub fn expand(data: &[u8]) -> Result<Vec<u8>, String> {
    let value = read_value(data)?;
    let plain = expand_value(value)?;
    let mut out = Vec::with_capacity(data.len() * 2);
    rmpv::encode::write_value_ref(&mut out, &plain).map_err(|e| e.to_string())?;
    Ok(out)
}

fn expand_value(value: ValueRef<'_>) -> Result<ValueRef<'_>, String> {
    Ok(match value {
        ValueRef::Ext(TENSOR_EXT, ext) => {
            let Tensor { datatype, shape, data } = read_tensor(ext)?;
            // A tensor with no elements still nests one empty array per leading index: a shape
            // such as [2^62, 0] would be a few bytes that build billions of them.
            let containers = shape
                .iter()
                .take_while(|&&d| d != 0)
                .try_fold(1u64, |n, &d| n.checked_mul(d).filter(|&n| n <= MAX_EMPTY_ARRAYS));
            if containers.is_none() && elements(&shape) == Some(0) {
                return Err(format!("a tensor of shape {shape:?} nests too many empty arrays"));
            }
            let flat = elements_of(datatype, &shape, data)?;
            nest(&shape, &mut flat.into_iter())
        }
        // Other ext values are not Corral's: a msgpack client gets them as sent, and JSON
        // refuses them when the answer is written (`format::from_msgpack`).
        other @ ValueRef::Ext(..) => other,
        ValueRef::Array(items) => {
            ValueRef::Array(items.into_iter().map(expand_value).collect::<Result<_, _>>()?)
        }
        ValueRef::Map(entries) => ValueRef::Map(
            entries
                .into_iter()
                .map(|(k, v)| Ok((expand_value(k)?, expand_value(v)?)))
                .collect::<Result<_, String>>()?,
        ),
        plain => plain,
    })
}

/// A tensor's elements as msgpack values, row-major.
fn elements_of<'a>(
    datatype: DataType,
    shape: &[u64],
    data: &'a [u8],
) -> Result<Vec<ValueRef<'a>>, String> {
    let values = each(datatype, shape, data)?.map(|element| match element {
        Element::Bool(b) => ValueRef::Boolean(b),
        Element::Uint(u) => ValueRef::from(u),
        Element::Int(i) => ValueRef::from(i),
        Element::Float(f) => ValueRef::F64(f),
        Element::Float32(f) => ValueRef::F32(f),
        Element::Bytes(b) => match std::str::from_utf8(b) {
            Ok(text) => ValueRef::from(text),
            Err(_) => ValueRef::Binary(b),
        },
    });
    Ok(values.collect())
}

/// Flat elements nested to `shape` (a scalar for an empty shape).
fn nest<'a>(shape: &[u64], flat: &mut impl Iterator<Item = ValueRef<'a>>) -> ValueRef<'a> {
    match shape.split_first() {
        None => flat.next().unwrap_or(ValueRef::Nil),
        Some((&length, inner)) => ValueRef::Array((0..length).map(|_| nest(inner, flat)).collect()),
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
    use super::*;

    fn tensor(datatype: DataType, shape: &[u64], data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_tensor(&mut out, datatype, shape, data);
        out
    }

    #[test]
    fn a_tensor_value_reads_back() {
        let data: Vec<u8> = [1.5f32, -2.0, 3.25].iter().flat_map(|f| f.to_le_bytes()).collect();
        let packed = tensor(DataType::F32, &[3], &data);
        let ValueRef::Ext(1, ext) = read_value(&packed).unwrap() else { panic!("not ext 1") };
        let read = read_tensor(ext).unwrap();
        assert_eq!((read.datatype, read.shape, read.data), (DataType::F32, vec![3], &data[..]));
    }

    #[test]
    fn tensor_values_must_hold_what_their_shape_says() {
        let short = tensor(DataType::F32, &[3], &[0; 11]);
        let ValueRef::Ext(1, ext) = read_value(&short).unwrap() else { panic!() };
        assert!(read_tensor(ext).unwrap_err().contains("11 bytes"));
        let bytes = tensor(DataType::Bytes, &[1], &[9, 0, 0, 0, b'x']);
        let ValueRef::Ext(1, ext) = read_value(&bytes).unwrap() else { panic!() };
        assert!(read_tensor(ext).unwrap_err().contains("past the data"));
        assert!(read_tensor(&[0x93, 0xa1, b'X', 0x90, 0xc4, 0x00]).unwrap_err().contains("X"));
    }

    #[test]
    fn json_data_packs_by_datatype() {
        let pack_json = |datatype, json: &serde_json::Value, count| {
            pack_json(datatype, &serde_json::value::to_raw_value(json).unwrap(), count)
        };
        let json = serde_json::json!([[1, 2], [3, 4]]);
        assert_eq!(pack_json(DataType::I16, &json, 4).unwrap(), [1, 0, 2, 0, 3, 0, 4, 0]);
        assert!(pack_json(DataType::U8, &serde_json::json!([256]), 1).unwrap_err().contains("fit"));
        assert!(pack_json(DataType::I32, &serde_json::json!([1.5]), 1).is_err(), "no truncation");
        assert!(pack_json(DataType::I32, &json, 3).unwrap_err().contains("4 elements"));
        let text = pack_json(DataType::Bytes, &serde_json::json!(["ab", ""]), 2).unwrap();
        assert_eq!(text, [2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]);
        let half = pack_json(DataType::F16, &serde_json::json!([1.0]), 1).unwrap();
        assert_eq!(half, [0x00, 0x3c]);
        // Past the type's range a number is refused, as an integer too large is.
        let error = pack_json(DataType::F16, &serde_json::json!([70000.0]), 1).unwrap_err();
        assert_eq!(error, "element 0: 70000.0 does not fit in FP16");
        assert!(pack_json(DataType::F32, &serde_json::json!([1e39]), 1).is_err());
        assert!(pack_json(DataType::F32, &serde_json::json!([3.4e38]), 1).is_ok());
        assert!(pack_json(DataType::F16, &serde_json::json!([65504]), 1).is_ok(), "FP16's max");
    }

    #[test]
    fn json_data_is_read_as_text_with_corral_s_own_refusals() {
        let pack = |datatype, text: &str, count| {
            let raw = serde_json::value::RawValue::from_string(text.to_string()).unwrap();
            pack_json(datatype, &raw, count)
        };
        assert_eq!(pack(DataType::I8, "[[-1], [2]]", 2).unwrap(), [0xff, 2]);
        assert_eq!(pack(DataType::U64, "[18446744073709551615]", 1).unwrap(), [0xff; 8]);
        let escaped = pack(DataType::Bytes, r#"["a\"\u00e9"]"#, 1).unwrap();
        assert_eq!(escaped, [4, 0, 0, 0, b'a', b'"', 0xc3, 0xa9]);
        assert_eq!(
            pack(DataType::I8, "[1, null]", 2).unwrap_err(),
            "element 1: null is not a tensor element"
        );
        assert_eq!(
            pack(DataType::I8, r#"[{"a": 1}]"#, 1).unwrap_err(),
            "element 0: an object is not a tensor element"
        );
        assert_eq!(
            pack(DataType::I8, "[1, 2, 3]", 2).unwrap_err(),
            "3 elements of data for a shape of 2"
        );
        assert_eq!(
            pack(DataType::I8, "[1]", 2).unwrap_err(),
            "1 elements of data for a shape of 2"
        );
        assert_eq!(pack(DataType::I8, "7", 1).unwrap(), [7], "a scalar is one element");
        // As when read whole: the count before any element's refusal, wherever it is.
        let over = "3 elements of data for a shape of 2";
        assert_eq!(pack(DataType::U8, "[256, 1, 2]", 2).unwrap_err(), over);
        assert_eq!(pack(DataType::U8, r#"[1, 2, {"a": 1}]"#, 2).unwrap_err(), over);
        let first = pack(DataType::U8, "[1, 256, null]", 3).unwrap_err();
        assert_eq!(first, "element 1: 256 does not fit in UINT8");
        // serde_json's recursion limit (128) is met first: a 400 all the same.
        let deep = format!("{}1{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        let refused = pack(DataType::I8, &deep, 1).unwrap_err();
        assert!(refused.contains("recursion limit"), "{refused}");
    }

    fn unpack_json(
        datatype: DataType,
        shape: &[u64],
        data: &[u8],
    ) -> Result<serde_json::Value, String> {
        let json = JsonData { output: "o", datatype, shape, data };
        serde_json::to_value(json).map_err(|e| e.to_string())
    }

    #[test]
    fn packed_data_unpacks_to_json() {
        let data: Vec<u8> = [7i64, -1].iter().flat_map(|i| i.to_le_bytes()).collect();
        assert_eq!(unpack_json(DataType::I64, &[2], &data).unwrap(), serde_json::json!([7, -1]));
        let text = [1, 0, 0, 0, b'z'];
        assert_eq!(unpack_json(DataType::Bytes, &[1], &text).unwrap(), serde_json::json!(["z"]));
        assert!(unpack_json(DataType::Bytes, &[1], &[1, 0, 0, 0, 0xff]).is_err());
        // FP32 as float32's shortest form (0.1, not 0.10000000149011612); FP64 as it is.
        let tenths: Vec<u8> = [0.1f32, 1.0 / 3.0].iter().flat_map(|f| f.to_le_bytes()).collect();
        let json = JsonData { output: "o", datatype: DataType::F32, shape: &[2], data: &tenths };
        assert_eq!(serde_json::to_string(&json).unwrap(), "[0.1,0.33333334]");
        let tenth = 0.1f64.to_le_bytes();
        let json = JsonData { output: "o", datatype: DataType::F64, shape: &[1], data: &tenth };
        assert_eq!(serde_json::to_string(&json).unwrap(), "[0.1]");
        let nan = f32::NAN.to_le_bytes();
        assert!(unpack_json(DataType::F32, &[1], &nan).unwrap_err().contains("binary_data"));
    }

    #[test]
    fn a_float_json_cannot_carry_is_refused_not_written_as_null() {
        for value in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let data = [1.5f32, value].iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<_>>();
            let error = unpack_json(DataType::F32, &[2], &data).unwrap_err();
            assert!(error.contains("binary_data"), "{error}");
        }
        let data = f64::INFINITY.to_le_bytes();
        assert!(unpack_json(DataType::F64, &[1], &data).is_err());
        let half_infinity = [0x00, 0x7c];
        assert!(unpack_json(DataType::F16, &[1], &half_infinity).is_err());
    }

    #[test]
    fn every_integer_width_unpacks_with_its_sign() {
        let cases: [(DataType, Vec<u8>, serde_json::Value); 6] = [
            (DataType::I8, vec![0xff, 0x7f], serde_json::json!([-1, 127])),
            (DataType::I16, vec![0xfe, 0xff, 0x00, 0x80], serde_json::json!([-2, -32768])),
            (DataType::U16, vec![0xff, 0xff], serde_json::json!([65535])),
            (DataType::I32, (-5i32).to_le_bytes().to_vec(), serde_json::json!([-5])),
            (DataType::U32, u32::MAX.to_le_bytes().to_vec(), serde_json::json!([u32::MAX])),
            (DataType::F32, 0.5f32.to_le_bytes().to_vec(), serde_json::json!([0.5])),
        ];
        for (datatype, data, expected) in cases {
            let shape = [(data.len() / datatype.size().unwrap()) as u64];
            assert_eq!(unpack_json(datatype, &shape, &data).unwrap(), expected, "{datatype:?}");
            let mut packed = Vec::new();
            write_tensor(&mut packed, datatype, &shape, &data);
            let plain: serde_json::Value =
                rmp_serde::from_slice(&expand(&packed).unwrap()).unwrap();
            assert_eq!(plain, expected, "{datatype:?} for a native client");
        }
    }

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
}
