//! OpenAI embeddings for a worker that declares tensors, so that one worker serves v2, KServe v1
//! and OpenAI clients alike: each string goes as the row a v2 request would make of it (the
//! lone declared `BYTES` input, one element), and each embedding is read from a declared output
//! (the first floating-point one, else the first numeric one, else the first). Sent as bare
//! strings, every embeddings request to such a worker had been a 500, and so had the v2 rows
//! batched with it.

use bytes::Bytes;
use corral_protocol::TensorSpec;

use super::super::super::error::ApiError;
use super::super::v2::tensor::{self, DataType};
use crate::stage::Declared;

/// What each input string becomes for the route's first stage.
pub enum Input {
    /// A msgpack string: the workers declare no inputs.
    Plain,
    /// A row of the lone declared `BYTES` input: `{name: tensor of one element}`, of shape `[]`
    /// or `[1]` as declared.
    Row { name: String, shape: Vec<u64> },
}

impl Input {
    /// What the first stage's workers take, from their declarations; 500 `unsupported_model`
    /// where no string can be one of their rows (a client can do nothing about it).
    pub fn of(declared: Option<&Declared>) -> Result<Input, ApiError> {
        let inputs = declared.map_or(&[][..], |declared| &declared.inputs[..]);
        match inputs {
            [] => Ok(Input::Plain),
            [spec] if spec.datatype == DataType::Bytes.name() && spec.shape.len() <= 1 => {
                let one_element = spec.shape.first().is_none_or(|&dim| dim == 1 || dim < 0);
                if one_element {
                    let shape = if spec.shape.is_empty() { vec![] } else { vec![1] };
                    return Ok(Input::Row { name: spec.name.clone(), shape });
                }
                Err(unsupported(inputs))
            }
            _ => Err(unsupported(inputs)),
        }
    }

    /// Input `index`, `text`, as its job's payload; 413 for a string no `BYTES` element holds
    /// (4 GiB, past any job's frame anyway).
    pub fn payload(&self, index: usize, text: &str) -> Result<Bytes, ApiError> {
        let write = "writing to a Vec cannot fail";
        match self {
            Input::Plain => {
                let mut out = Vec::with_capacity(text.len() + 5);
                rmp::encode::write_str(&mut out, text).expect(write);
                Ok(Bytes::from(out))
            }
            Input::Row { name, shape } => {
                // Written once, into the payload: the tensor's head from the element's length,
                // then the element (no second buffer of the string to copy over).
                let too_long = || {
                    let message =
                        format!("input {index} is 4 GiB or more: no BYTES element holds it");
                    ApiError { message, ..ApiError::body_too_large(u32::MAX as usize) }
                };
                let length = 4 + text.len();
                let mut out = Vec::with_capacity(name.len() + length + 32);
                rmp::encode::write_map_len(&mut out, 1).expect(write);
                rmp::encode::write_str(&mut out, name).expect(write);
                u32::try_from(length).map_err(|_| too_long())?;
                tensor::write_tensor_head(&mut out, DataType::Bytes, shape, length);
                tensor::push_bytes(&mut out, text.as_bytes()).map_err(|_| too_long())?;
                Ok(Bytes::from(out))
            }
        }
    }
}

fn unsupported(inputs: &[TensorSpec]) -> ApiError {
    let shown: Vec<String> =
        inputs.iter().map(|s| format!("{} {} {:?}", s.name, s.datatype, s.shape)).collect();
    let message = format!(
        "the model's workers declare the inputs {}: OpenAI embeddings need one BYTES input of \
         one element (shape [1], [-1] or []) to send each string as",
        shown.join(", ")
    );
    ApiError::internal("unsupported_model", message)
}

/// The declared output each embedding is read from, held to its datatype and shape as a v2
/// answer is: None where the last stage's workers declare none (their result is the embedding
/// itself).
pub fn output(declared: Option<&Declared>) -> Option<TensorSpec> {
    let outputs = declared.map_or(&[][..], |declared| &declared.outputs[..]);
    let float = |spec: &&TensorSpec| {
        matches!(DataType::parse(&spec.datatype), Ok(DataType::F16 | DataType::F32 | DataType::F64))
    };
    let numeric = |spec: &&TensorSpec| {
        DataType::parse(&spec.datatype)
            .is_ok_and(|t| !matches!(t, DataType::Bool | DataType::Bytes))
    };
    let chosen = outputs.iter().find(float).or_else(|| outputs.iter().find(numeric));
    chosen.or(outputs.first()).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(inputs: &[(&str, &str, &[i64])], outputs: &[(&str, &str)]) -> Declared {
        let spec = |(name, datatype, shape): (&str, &str, &[i64])| TensorSpec {
            name: name.into(),
            datatype: datatype.into(),
            shape: shape.to_vec(),
        };
        Declared {
            inputs: inputs.iter().copied().map(spec).collect(),
            outputs: outputs.iter().map(|&(n, t)| spec((n, t, &[-1]))).collect(),
            ..Declared::default()
        }
    }

    #[test]
    fn a_string_goes_as_the_lone_bytes_input_or_the_model_is_unsupported() {
        assert!(matches!(Input::of(None), Ok(Input::Plain)));
        for (shape, expected) in [(&[1][..], vec![1]), (&[-1], vec![1]), (&[], vec![])] {
            let model = declared(&[("TEXT", "BYTES", shape)], &[]);
            let Ok(Input::Row { name, shape }) = Input::of(Some(&model)) else {
                panic!("{shape:?} takes a string");
            };
            assert_eq!((name.as_str(), shape), ("TEXT", expected));
        }
        let payload = Input::Row { name: "TEXT".into(), shape: vec![1] }.payload(0, "hé").unwrap();
        let mut value = &payload[..];
        assert_eq!(rmp::decode::read_map_len(&mut value).unwrap(), 1);
        let (name, rest) = rmp::decode::read_str_from_slice(value).unwrap();
        assert_eq!(name, "TEXT");
        let row = tensor::row(rest, Some(DataType::Bytes)).unwrap();
        assert_eq!((row.shape, &row.data[..]), (vec![1], &b"\x03\0\0\0h\xc3\xa9"[..]));
        for inputs in [
            &[("X", "FP32", &[3][..])][..],
            &[("TEXT", "BYTES", &[2])],
            &[("TEXT", "BYTES", &[1, 1])],
            &[("A", "BYTES", &[1]), ("B", "BYTES", &[1])],
        ] {
            let error = Input::of(Some(&declared(inputs, &[]))).err().expect("unsupported");
            assert_eq!(error.code, "unsupported_model", "{inputs:?}");
        }
    }

    #[test]
    fn the_embedding_is_the_first_float_output_else_the_first_numeric_one() {
        assert_eq!(output(None), None);
        let name = |spec: Option<TensorSpec>| spec.map(|spec| spec.name);
        assert_eq!(name(output(Some(&declared(&[], &[("E", "FP16")])))), Some("E".into()));
        let several =
            declared(&[], &[("TEXT", "BYTES"), ("N", "INT64"), ("E", "FP32"), ("F", "FP64")]);
        assert_eq!(name(output(Some(&several))), Some("E".into()));
        let counts = declared(&[], &[("TEXT", "BYTES"), ("N", "INT64")]);
        assert_eq!(name(output(Some(&counts))), Some("N".into()));
        let none_numeric = declared(&[], &[("A", "BYTES"), ("B", "BOOL")]);
        assert_eq!(name(output(Some(&none_numeric))), Some("A".into()));
    }
}
