//! A v2 inference answer from the rows' results: each row's result is a map from output name to
//! that row (a tensor value or a plain value, [`tensor::row`]); the rows of each output are
//! stacked into one tensor of shape `[rows, ...row shape]` and written as JSON `data` or, where
//! the client asked for it, as binary data after the JSON header
//! (`Inference-Header-Content-Length` says where the header ends).
//!
//! A result that is not such a map, lacks an output, or whose rows disagree in datatype or shape
//! is the worker's fault: 500 `bad_output`, naming the row and the output.

use corral_protocol::TensorSpec;
use rmpv::ValueRef;
use serde_json::{json, Map, Value};

use super::request::{Request, Requested};
use super::tensor::{self, DataType};
use crate::http::error::ApiError;

/// The answer's body, and the length of its JSON header when binary data follows it.
pub struct Answer {
    pub body: Vec<u8>,
    pub header_length: Option<usize>,
}

fn bad_output(message: String) -> ApiError {
    ApiError::internal("bad_output", message)
}

/// Stacks the rows' results (each one msgpack value, in row order) into the answer.
pub fn build(
    model: &str,
    request: &Request,
    declared: &[TensorSpec],
    results: &[&[u8]],
) -> Result<Answer, ApiError> {
    let rows = results
        .iter()
        .enumerate()
        .map(|(index, data)| match tensor::read_value(data) {
            Ok(ValueRef::Map(entries)) => Ok(entries),
            _ => Err(bad_output(format!(
                "row {index}: a v2 result must be a map from output name to its row"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let wanted: Vec<Requested> = if !request.outputs.is_empty() {
        request.outputs.clone()
    } else if !declared.is_empty() {
        declared.iter().map(|s| requested(&s.name, request)).collect()
    } else {
        let first = rows.first().map(Vec::as_slice).unwrap_or_default();
        first.iter().filter_map(|(k, _)| key(k)).map(|name| requested(name, request)).collect()
    };

    // With no outputs declared, a name the client asked for that the results lack is its
    // mistake (400), not the worker's (the 500 below).
    if declared.is_empty() {
        let first = rows.first().map(Vec::as_slice).unwrap_or_default();
        check_requested(request, first.iter().filter_map(|(k, _)| key(k)))?;
    }
    let mut outputs = Vec::with_capacity(wanted.len());
    let mut tail = Vec::new();
    for output in &wanted {
        let spec = declared.iter().find(|s| s.name == output.name);
        let (datatype, shape, data) = stack(&output.name, spec, &rows)?;
        let mut entry = Map::new();
        entry.insert("name".into(), json!(output.name));
        entry.insert("datatype".into(), json!(datatype.name()));
        entry.insert("shape".into(), json!(shape));
        if output.binary {
            entry.insert("parameters".into(), json!({"binary_data_size": data.len()}));
            tail.extend_from_slice(&data);
        } else {
            let values = tensor::unpack_json(datatype, &shape, &data).map_err(|e| {
                ApiError::internal(
                    "unrepresentable_output",
                    format!("output {:?}: {e}", output.name),
                )
            })?;
            entry.insert("data".into(), values);
        }
        outputs.push(Value::Object(entry));
    }
    let mut header = Map::new();
    header.insert("model_name".into(), json!(model));
    header.insert("model_version".into(), json!("1"));
    if let Some(id) = &request.id {
        header.insert("id".into(), json!(id));
    }
    header.insert("outputs".into(), Value::Array(outputs));
    let mut body = serde_json::to_vec(&header).expect("JSON values always serialize");
    let binary = wanted.iter().any(|o| o.binary);
    let header_length = binary.then_some(body.len());
    body.extend_from_slice(&tail);
    Ok(Answer { body, header_length })
}

/// 400 if the request asks for an output the model does not give (`names`).
pub fn check_requested<'a>(
    request: &Request,
    names: impl Iterator<Item = &'a str> + Clone,
) -> Result<(), ApiError> {
    let Some(unknown) = request.outputs.iter().find(|o| !names.clone().any(|n| n == o.name)) else {
        return Ok(());
    };
    let names: Vec<&str> = names.collect();
    Err(ApiError::bad_request(format!(
        "unknown output {:?}; the model gives {}",
        unknown.name,
        names.join(", ")
    )))
}

fn requested(name: &str, request: &Request) -> Requested {
    Requested { name: name.to_string(), binary: request.binary_by_default }
}

/// One output's rows, checked against each other and the declaration, end to end.
fn stack(
    name: &str,
    spec: Option<&TensorSpec>,
    rows: &[Vec<(ValueRef, ValueRef)>],
) -> Result<(DataType, Vec<u64>, Vec<u8>), ApiError> {
    let declared =
        match spec {
            Some(spec) => Some(DataType::parse(&spec.datatype).map_err(|e| {
                bad_output(format!("the worker declared output {name:?} with an {e}"))
            })?),
            None => None,
        };
    let mut stacked: Option<(DataType, Vec<u64>)> = None;
    let mut data = Vec::new();
    for (index, entries) in rows.iter().enumerate() {
        let at = |e: String| bad_output(format!("row {index}, output {name:?}: {e}"));
        let value = entries
            .iter()
            .find(|(k, _)| key(k) == Some(name))
            .map(|(_, v)| v)
            .ok_or_else(|| at("missing from the worker's result".into()))?;
        let row = tensor::row(value, declared).map_err(at)?;
        match &stacked {
            None => {
                if let Some(spec) = spec {
                    if !tensor::fits(&row.shape, &spec.shape) {
                        return Err(at(format!(
                            "shape {:?} where {:?} is declared",
                            row.shape, spec.shape
                        )));
                    }
                }
                data.reserve(row.data.len() * rows.len());
                stacked = Some((row.datatype, row.shape.clone()));
            }
            Some((datatype, shape)) if (*datatype, shape) != (row.datatype, &row.shape) => {
                return Err(at(format!(
                    "{} {:?}, where row 0 has {} {shape:?}: rows must agree to stack",
                    row.datatype.name(),
                    row.shape,
                    datatype.name()
                )));
            }
            Some(_) => {}
        }
        data.extend_from_slice(&row.data);
    }
    let (datatype, row_shape) = stacked.unwrap_or((declared.unwrap_or(DataType::F64), vec![]));
    let mut shape = Vec::with_capacity(row_shape.len() + 1);
    shape.push(rows.len() as u64);
    shape.extend(row_shape);
    Ok((datatype, shape, data))
}

/// A map key that is a string.
fn key<'a>(value: &'a ValueRef<'a>) -> Option<&'a str> {
    match value {
        ValueRef::String(s) => s.as_str(),
        _ => None,
    }
}
