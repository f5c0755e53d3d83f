//! Tensors as Open Inference Protocol v2 has them and as workers see them: the datatypes, a
//! row's **tensor value** on the worker socket (msgpack ext type 1: `[datatype, shape, bin]`,
//! PROTOCOL.md "Tensors and raw bytes"), and the conversions between a tensor's packed
//! little-endian bytes and the two other shapes its elements come in — JSON `data` arrays from
//! and to v2 clients, and plain msgpack values (numbers, booleans, strings, nested arrays) from
//! workers that return those instead of tensor values.
//!
//! Bytes are the one representation every path goes through: a binary request's tensor is
//! already them, a JSON one is packed once, and a row is a slice of them.
//!
//! This file holds the datatypes, shapes, the tensor value and the packing of one element;
//! [`json`] the JSON `data` arrays read from and written to v2 clients, and [`plain`] the plain
//! msgpack values of workers (a worker's row of an output, and tensor values expanded for a
//! native client).

mod json;
mod plain;

pub use json::{pack_json, JsonData, Leaves};
pub use plain::{expand, expand_with, read_value, read_value_from, row, widened, Row, Timestamps};

/// The ext type of a tensor value.
pub const TENSOR_EXT: i8 = 1;

/// Deepest nesting read in a worker's output (as for every msgpack value Corral reads).
const MAX_DEPTH: usize = crate::msgpack::MAX_DEPTH;

/// What no tensor element can be, in JSON's words whether the value came as JSON or as msgpack
/// (named by kind, never quoted: a map's contents are another client's output).
const NULL_ELEMENT: &str = "null is not a tensor element";
const OBJECT_ELEMENT: &str = "an object is not a tensor element";

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
        None => {
            let taken = bytes_elements(data, count)?.1;
            // Its size is what its elements' lengths say: "which takes 5" had named the first
            // element's bytes, as if the tensor's size were fixed.
            if taken != data.len() {
                return Err(format!(
                    "{} bytes of BYTES data for shape {}: its {count} element(s) end at byte \
                     {taken}, and {} bytes follow",
                    data.len(),
                    shown(shape),
                    data.len() - taken
                ));
            }
            taken as u64
        }
    };
    if expected != data.len() as u64 {
        return Err(format!(
            "{} bytes of {} data for shape {}, which takes {expected}",
            data.len(),
            datatype.name(),
            shown(shape)
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
    if rmp::decode::read_array_len(&mut rest).ok() != Some(3) {
        return Err(malformed.into());
    }
    let (datatype, after) = rmp::decode::read_str_from_slice(rest).map_err(|_| malformed)?;
    let datatype = DataType::parse(datatype)?;
    rest = after;
    // Read by its length first: a shape of millions of dimensions (a few bytes each in a 64 MiB
    // frame) was a tree of values of 32 bytes each, then a message of megabytes.
    let dims = rmp::decode::read_array_len(&mut rest).map_err(|_| malformed)? as usize;
    if dims > MAX_DIMENSIONS {
        return Err(format!("a tensor of {dims} dimensions; at most {MAX_DIMENSIONS} are taken"));
    }
    let not_dimension = "a tensor's shape must be non-negative integers";
    let shape = (0..dims)
        .map(|_| rmp::decode::read_int::<u64, _>(&mut rest).map_err(|_| not_dimension))
        .collect::<Result<Vec<u64>, _>>()?;
    let length = rmp::decode::read_bin_len(&mut rest).map_err(|_| malformed)? as usize;
    let data = rest.get(..length).ok_or(malformed)?;
    if rest.len() > length {
        return Err(format!("{malformed}: {} bytes after it", rest.len() - length));
    }
    check_length(datatype, &shape, data)?;
    Ok(Tensor { datatype, shape, data })
}

/// Most dimensions a tensor value may have: numpy takes 64, and each is a level of nesting
/// when the tensor is written out as arrays (at most [`MAX_DEPTH`]).
const MAX_DIMENSIONS: usize = 64;

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

/// A shape as an error message shows it: whole up to 16 dimensions, else its first 16 and how
/// many there are (a client's shape of a million dimensions made a 400 of 3 MB).
pub fn shown(shape: &[u64]) -> String {
    const SHOWN: usize = 16;
    match shape.len() {
        n if n <= SHOWN => format!("{shape:?}"),
        n => {
            let first: Vec<String> = shape[..SHOWN].iter().map(u64::to_string).collect();
            format!("[{}, … ({n} dimensions)]", first.join(", "))
        }
    }
}

/// Appends one `BYTES` element: its 4-byte little-endian length, then its bytes; Err for one of
/// 4 GiB or more, which no length says.
pub fn push_bytes(out: &mut Vec<u8>, bytes: &[u8]) -> Result<(), TooLong> {
    let length = u32::try_from(bytes.len()).map_err(|_| TooLong)?;
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

/// A `BYTES` element of 4 GiB or more, whose length no 4-byte prefix says.
#[derive(Debug)]
pub struct TooLong;

/// 2^63: the integers JSON may write that serde_json reads as floats are 2^64 and up and
/// below -2^63.
const TWO_TO_63: f64 = 9_223_372_036_854_775_808.0;

/// Packs one element as `datatype`: integers must fit, floats go to float types only (a float
/// in an integer tensor is refused rather than truncated), booleans to `BOOL` only.
fn push(out: &mut Vec<u8>, datatype: DataType, element: Element) -> Result<(), String> {
    use DataType as T;
    let fits = |what: &str| format!("{what} does not fit in {}", datatype.name());
    match (datatype, element) {
        (T::Bool, Element::Bool(b)) => out.push(u8::from(b)),
        (T::Bytes, Element::Bytes(b)) => {
            push_bytes(out, b).map_err(|_| fits("an element of 4 GiB"))?
        }
        // A finite number past the type's range would become infinity: refused as an integer
        // too large is (an infinity given stays one).
        (T::F16, e) => {
            let (wide, narrow) = (float(e)?, f16_nearest(e));
            let narrow = in_range(wide, narrow, narrow.is_infinite());
            out.extend_from_slice(&narrow.map_err(|wide| fits(&format!("{wide:?}")))?.to_le_bytes())
        }
        (T::F32, e) => {
            let (wide, narrow) = (float(e)?, f32_nearest(e));
            let narrow = in_range(wide, narrow, narrow.is_infinite());
            out.extend_from_slice(&narrow.map_err(|wide| fits(&format!("{wide:?}")))?.to_le_bytes())
        }
        (T::F64, e) => out.extend_from_slice(&float(e)?.to_le_bytes()),
        // An integer for a BOOL or BYTES tensor is of the wrong kind, not too large: "1 does
        // not fit in BOOL" said otherwise.
        (T::Bool | T::Bytes, element @ (Element::Uint(_) | Element::Int(_))) => {
            return Err(format!("{} is not {} element", describe(element), a(datatype)))
        }
        (integer, Element::Uint(u)) => {
            push_integer(out, integer, i128::from(u)).ok_or_else(|| fits(&format!("{u}")))?
        }
        (integer, Element::Int(i)) => {
            push_integer(out, integer, i128::from(i)).ok_or_else(|| fits(&format!("{i}")))?
        }
        // A JSON integer past 64 bits (2^64 and up, below -2^63) arrives as a float
        // (serde_json's), rounded (-2^63 - 1 to -2^63 itself, which as an integer arrives as
        // one): too large, not of the wrong kind ("a float is not a UINT64 element" had been
        // said of 2^64). A float within 64 bits (`1e19`) is still of the wrong kind.
        (integer, Element::Float(f))
            if !matches!(integer, T::Bool | T::Bytes)
                && f.fract() == 0.0
                && (f <= -TWO_TO_63 || f >= 2.0 * TWO_TO_63) =>
        {
            return Err(fits(&format!("{f}")))
        }
        (_, element) => {
            return Err(format!("{} is not {} element", describe(element), a(datatype)))
        }
    }
    Ok(())
}

/// The datatype's name with its article, as said aloud: "an INT64", "an FP32" ("eff"), "a
/// UINT8" ("you").
fn a(datatype: DataType) -> String {
    let name = datatype.name();
    let article = if name.starts_with(['I', 'F']) { "an" } else { "a" };
    format!("{article} {name}")
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

/// `narrow`, a number narrowed to a smaller float type, unless it became an infinity (`infinite`)
/// though the number (`wide`) is finite: past that type's range, Err with the number (an infinity
/// given stays one). A finite number is never silently made infinite.
fn in_range<T>(wide: f64, narrow: T, infinite: bool) -> Result<T, f64> {
    if wide.is_finite() && infinite {
        Err(wide)
    } else {
        Ok(narrow)
    }
}

/// A number as the float32 nearest it, rounded once: an integer is not taken through a float64
/// first, which rounded 2^53 + 2^29 + 1 to 2^53 (its nearest is 2^53 + 2^30). NaN for what is
/// no number (which [`float`] refuses first).
fn f32_nearest(element: Element) -> f32 {
    match element {
        Element::Uint(u) => u as f32,
        Element::Int(i) => i as f32,
        Element::Float(f) => f as f32,
        Element::Float32(f) => f,
        Element::Bool(_) | Element::Bytes(_) => f32::NAN,
    }
}

/// A number as the float16 nearest it (ties to even), rounded once. `half::f16::from_f64` goes
/// through a float32 (with F16C; without, it drops the low 32 bits of the mantissa), and two
/// roundings miss: 2049.0000001 became 2048 (its nearest is 2050), 65519.999 infinity (it is
/// 65504). A float64 is narrowed to float32 rounding to odd (toward zero, the last bit set when
/// inexact), which keeps enough of what was cut for the float16 rounding after it to be right
/// (float32 has more than 11 + 2 bits). Integers are exact in a float64 up to 2^53, far past
/// float16's range.
fn f16_nearest(element: Element) -> half::f16 {
    let wide = match element {
        Element::Float32(f) => return half::f16::from_f32(f),
        Element::Float(f) => f,
        Element::Uint(u) => u as f64,
        Element::Int(i) => i as f64,
        Element::Bool(_) | Element::Bytes(_) => f64::NAN,
    };
    half::f16::from_f32(f32_rounded_to_odd(wide))
}

/// `wide` as a float32, rounded toward zero, with the last mantissa bit set when that was
/// inexact. Infinities, NaNs and what float32 holds exactly are as they are.
fn f32_rounded_to_odd(wide: f64) -> f32 {
    let nearest = wide as f32;
    if !nearest.is_finite() || f64::from(nearest) == wide {
        return nearest;
    }
    // Sign and magnitude: one less in the bits is the next float32 toward zero (the nearest
    // is not zero here when it is farther out than `wide`).
    let bits = nearest.to_bits();
    let toward_zero = if f64::from(nearest).abs() > wide.abs() { bits - 1 } else { bits };
    f32::from_bits(toward_zero | 1)
}

fn describe(element: Element) -> &'static str {
    match element {
        Element::Bool(_) => "a boolean",
        Element::Uint(_) | Element::Int(_) => "an integer",
        Element::Float(_) | Element::Float32(_) => "a float",
        // A JSON string, or msgpack's str or bin (KServe v1's msgpack bodies).
        Element::Bytes(_) => "a string or bytes",
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

/// A numeric tensor's elements as float32s, each the nearest, in order whatever its shape (an
/// embedding a worker returned).
pub fn floats(datatype: DataType, shape: &[u64], data: &[u8]) -> Result<Vec<f32>, NotFloats> {
    if matches!(datatype, DataType::Bool | DataType::Bytes) {
        return Err(NotFloats::NotNumbers);
    }
    let elements = each(datatype, shape, data).map_err(|_| NotFloats::NotNumbers)?;
    elements
        .map(|element| {
            // Past float32's range, an infinity that base64 carries: a client got `inf` for
            // the worker's 1e39, with a 200.
            let wide = float(element).map_err(|_| NotFloats::NotNumbers)?;
            let narrow = f32_nearest(element);
            in_range(wide, narrow, narrow.is_infinite()).map_err(NotFloats::PastRange)
        })
        .collect()
}

/// Why [`floats`] found no float32s.
#[derive(Debug, PartialEq)]
pub enum NotFloats {
    /// `BOOL` or `BYTES`, or data that does not match its shape.
    NotNumbers,
    /// A finite number that float32 cannot hold.
    PastRange(f64),
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

#[cfg(test)]
mod tests {
    use rmpv::ValueRef;

    use super::*;

    /// A tensor value of `data` (also for the submodules' tests).
    pub fn tensor(datatype: DataType, shape: &[u64], data: &[u8]) -> Vec<u8> {
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
    fn an_element_of_the_wrong_kind_is_named_so_not_as_too_large() {
        let refused = |datatype, element| push(&mut Vec::new(), datatype, element).unwrap_err();
        // "5 does not fit in BYTES", "1 does not fit in BOOL" said otherwise.
        assert_eq!(refused(DataType::Bytes, Element::Uint(5)), "an integer is not a BYTES element");
        // 2^64 as JSON writes it, which serde_json reads as a float.
        let past = Element::Float(18_446_744_073_709_551_616.0);
        assert_eq!(refused(DataType::U64, past), "18446744073709552000 does not fit in UINT64");
        assert_eq!(refused(DataType::I8, past), "18446744073709552000 does not fit in INT8");
        assert_eq!(refused(DataType::I64, Element::Float(3.0)), "a float is not an INT64 element");
        // -2^63 - 1, which serde_json rounds to -2^63.
        let below = Element::Float(-9_223_372_036_854_775_808.0);
        assert_eq!(refused(DataType::I64, below), "-9223372036854776000 does not fit in INT64");
        let written_as_a_float = Element::Float(1e19);
        assert_eq!(refused(DataType::U64, written_as_a_float), "a float is not a UINT64 element");
        assert_eq!(refused(DataType::Bool, Element::Int(-1)), "an integer is not a BOOL element");
        assert_eq!(
            refused(DataType::I64, Element::Bool(true)),
            "a boolean is not an INT64 element"
        );
        assert_eq!(
            refused(DataType::U8, Element::Bytes(b"x")),
            "a string or bytes is not a UINT8 element"
        );
        assert_eq!(refused(DataType::U8, Element::Uint(256)), "256 does not fit in UINT8");
    }

    /// The float16 nearest `wide`, ties to even, found by comparing with the midpoint of the
    /// two float16s around it (exact in a float64: a float16 has 11 bits).
    fn f16_reference(wide: f64) -> half::f16 {
        // Positive float16s are ordered as their bits are.
        let bits: Vec<u16> = (0..0x7c00).collect();
        let count = bits.partition_point(|&b| half::f16::from_bits(b).to_f64() <= wide.abs());
        let below = half::f16::from_bits(bits[count - 1]);
        let above = half::f16::from_bits(below.to_bits() + 1);
        let middle = (below.to_f64() + above.to_f64()) / 2.0;
        let nearest = match wide.abs().partial_cmp(&middle).unwrap() {
            std::cmp::Ordering::Less => below,
            std::cmp::Ordering::Greater => above,
            std::cmp::Ordering::Equal if below.to_bits().is_multiple_of(2) => below,
            std::cmp::Ordering::Equal => above,
        };
        if wide < 0.0 {
            -nearest
        } else {
            nearest
        }
    }

    #[test]
    fn numbers_narrow_to_the_nearest_float16_rounded_once() {
        let f16 = |wide: f64| f16_nearest(Element::Float(wide)).to_f64();
        // Rounded through a float32 first (half's from_f64), each of these came out one step
        // off, and 65519.999 as an infinity, refused as too large.
        assert_eq!(f16(2049.0000001), 2050.0);
        assert_eq!(f16(1.0004882821813226), 1.0 + 2f64.powi(-10));
        assert_eq!(f16(0.50024414062501), 0.5 + 2f64.powi(-11));
        assert_eq!(f16(-65519.999), -65504.0);
        assert_eq!(f16(65520.0), f64::INFINITY, "the exact halfway past the largest");
        assert_eq!(f16(2049.0), 2048.0, "a tie goes to the even one");
        assert_eq!(f16(2.0f64.powi(-25) * 1.000001), 2.0f64.powi(-24), "past half the least");
        assert_eq!(f16(2.0f64.powi(-25)), 0.0, "a tie with zero");
        assert!(f16(f64::NAN).is_nan());
        assert_eq!(f16_nearest(Element::Uint(2049)).to_f64(), 2048.0);
        assert_eq!(f16_nearest(Element::Int(-2051)).to_f64(), -2052.0);
        let mut packed = Vec::new();
        push(&mut packed, DataType::F16, Element::Float(65519.999)).unwrap();
        assert_eq!(packed, half::f16::MAX.to_le_bytes());

        // Numbers of every float16 magnitude, with mantissa bits far below float32's.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let exponent = (state % 42) as i32 - 26; // 2^-26 to 2^15
            let fraction = 1.0 + (state >> 12) as f64 / (1u64 << 52) as f64;
            let wide = fraction * 2f64.powi(exponent) * if state & 1 == 0 { 1.0 } else { -1.0 };
            if wide.abs() < 65504.0 {
                assert_eq!(f16_nearest(Element::Float(wide)), f16_reference(wide), "{wide:e}");
            }
        }
    }

    #[test]
    fn integers_narrow_to_the_nearest_float32_rounded_once() {
        let big = (1u64 << 53) + (1 << 29) + 1;
        let mut packed = Vec::new();
        push(&mut packed, DataType::F32, Element::Uint(big)).unwrap();
        assert_eq!(
            f32::from_le_bytes(packed.try_into().unwrap()),
            ((1u64 << 53) + (1 << 30)) as f32
        );
        let data = big.to_le_bytes();
        assert_eq!(floats(DataType::U64, &[1], &data), Ok(vec![((1u64 << 53) + (1 << 30)) as f32]));
    }

    #[test]
    fn a_finite_number_past_float32s_range_is_no_float32() {
        let data: Vec<u8> = [1.0f64, 1e39].iter().flat_map(|f| f.to_le_bytes()).collect();
        assert_eq!(floats(DataType::F64, &[2], &data), Err(NotFloats::PastRange(1e39)));
        let data: Vec<u8> = [1.0f64, f64::INFINITY].iter().flat_map(|f| f.to_le_bytes()).collect();
        assert_eq!(floats(DataType::F64, &[2], &data), Ok(vec![1.0, f32::INFINITY]), "as given");
        assert_eq!(floats(DataType::Bool, &[1], &[1]), Err(NotFloats::NotNumbers));
    }

    #[test]
    fn a_long_shape_is_shown_cut() {
        assert_eq!(shown(&[2, 3]), "[2, 3]");
        let long = shown(&[1; 1_000_000]);
        assert!(long.ends_with(", … (1000000 dimensions)]") && long.len() < 100, "{long}");
    }
}
