//! JSON `data` arrays of v2 clients, in and out: [`pack_json`] (and its seed [`Leaves`], which
//! a request's reader packs with as it reads the header) packs a request's nested arrays into a
//! tensor's bytes element by element, and [`JsonData`] writes packed bytes back as a flat array
//! into an answer. Neither holds the elements as `serde_json::Value`s.

use serde::de::DeserializeSeed;

use super::{each, push, DataType, Element, MAX_DEPTH};

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
        self.leaves.leaf(Err(super::NULL_ELEMENT.into()));
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut entries: A) -> Result<(), A::Error> {
        // Read past without building it.
        while entries.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
        self.leaves.leaf(Err(super::OBJECT_ELEMENT.into()));
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

/// A tensor's packed data as v2 JSON `data`: a flat array of its elements, written into the
/// answer as they are read, never held as `serde_json::Value`s (with its elements collected
/// first, 80 bytes and more each: a 16 MiB answer of UINT8s took the proxy past 1 GiB). JSON has
/// no NaN nor infinity: written as `null` (serde_json's way) they would reach the client as
/// another value, or none; they fail the answer instead, naming the row and `output` (the
/// client can ask for binary data), as do BYTES elements that are not UTF-8. The first of
/// `shape` is the answer's rows (its outputs are stacked).
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
        // Elements per row: the row of a failing element is named, as every other failure of
        // a row is (a shape with a 0 in it has no element to fail).
        let per_row = self.shape.iter().skip(1).product::<u64>().max(1);
        let in_row = |at: u64, why: &str| {
            S::Error::custom(format!("row {}, output {:?}: {why}", at / per_row, self.output))
        };
        let number = |at: u64, f: f64| {
            f.is_finite().then_some(f).ok_or_else(|| {
                in_row(
                    at,
                    &format!("{f} is not a number JSON can carry: ask for it with binary_data"),
                )
            })
        };
        let mut seq = writer.serialize_seq(None)?;
        for (at, element) in (0u64..).zip(elements) {
            match element {
                Element::Bool(b) => seq.serialize_element(&b)?,
                Element::Uint(u) => seq.serialize_element(&u)?,
                Element::Int(i) => seq.serialize_element(&i)?,
                Element::Float(f) => seq.serialize_element(&number(at, f)?)?,
                // As a float32: the shortest form reading back to the same float32, not its
                // float64 widening (2.7 times the text, and a tenth of the proxy's time).
                Element::Float32(f) => {
                    number(at, f64::from(f))?;
                    seq.serialize_element(&f)?
                }
                Element::Bytes(b) => {
                    let text = std::str::from_utf8(b).map_err(|_| in_row(at, NOT_UTF8))?;
                    seq.serialize_element(text)?
                }
            }
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{expand, write_tensor};
    use super::*;

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
}
