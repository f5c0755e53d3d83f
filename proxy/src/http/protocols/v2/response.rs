//! A v2 inference answer from the rows' results: each row's result is a map from output name to
//! that row (a tensor value or a plain value, [`tensor::row`]); the rows of each output are
//! stacked into one tensor of shape `[rows, ...row shape]` and written as JSON `data` or, where
//! the client asked for it, as binary data after the JSON header
//! (`Inference-Header-Content-Length` says where the header ends).
//!
//! A result that is not such a map, lacks an output, names one twice, or whose rows disagree in
//! datatype or shape is the worker's fault: 500 `bad_output`, naming the row and the output. So
//! is, from a worker that declares no outputs (its results' keys are then the outputs), a result
//! that names none, and, where the answer lists every output, a key that is no name (a string)
//! or a row naming an output row 0 does not: an answer of no outputs, or of one output listed
//! twice (msgpack maps may repeat a key, and are read as they come), is no v2 answer.

use std::borrow::Cow;

use corral_protocol::TensorSpec;
use serde::Serialize;
use serde_json::{json, Value};

use super::request::{Request, Requested};
use super::result_row::{Found, ResultRow};
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
        .map(|(index, data)| {
            super::result_row::entries(data).ok_or_else(|| {
                // An array is what a streaming worker's one-shot answer is (its chunks): say
                // so, as the worker's maps came one per chunk.
                let array = matches!(data.first(), Some(0x90..=0x9f | 0xdc | 0xdd));
                let why = if array {
                    ", not an array (a streaming worker answers with its chunks: serve v2 from \
                     one that returns one map per row)"
                } else {
                    ""
                };
                bad_output(format!(
                    "row {index}: a v2 result must be a map from output name to its row{why}"
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let rows: Vec<ResultRow> = rows.iter().map(|entries| ResultRow::new(entries)).collect();
    // With no outputs declared, the results' keys are the outputs.
    let given = if declared.is_empty() {
        given_names(&rows, request.outputs.is_empty())?
    } else {
        Vec::new()
    };
    let wanted: Vec<Requested> = if !request.outputs.is_empty() {
        request.outputs.clone()
    } else if !declared.is_empty() {
        declared.iter().map(|s| requested(&s.name, request)).collect()
    } else {
        given.iter().map(|name| requested(name, request)).collect()
    };

    // With no outputs declared, a name the client asked for that the results lack is its
    // mistake (400), not the worker's (the 500 below). Unless the results are the mistake: a
    // row 0 that names no output (the 400 listed none), or a later row that gives the name
    // (rows that disagree, a 500 or a 400 as their order fell).
    if let (true, Some(first)) = (declared.is_empty(), rows.first()) {
        if !request.outputs.is_empty() && first.keys().flatten().next().is_none() {
            return Err(bad_output(
                "row 0: the worker's result names no output: a v2 answer needs one".into(),
            ));
        }
        // Looked up in row 0, not in the list of its names: both may be long.
        let missing = |o: &&Requested| matches!(first.get(&o.name), Found::Missing);
        if let Some(unknown) = request.outputs.iter().find(missing) {
            let given = |row: &ResultRow| !matches!(row.get(&unknown.name), Found::Missing);
            if let Some(index) = rows.iter().position(given) {
                return Err(bad_output(format!(
                    "row {index}, output {:?}: not in row 0's result: rows must give the same \
                     outputs to stack",
                    unknown.name
                )));
            }
            return Err(unknown_output(&unknown.name, first.keys().flatten()));
        }
    }
    let stacked = wanted
        .iter()
        .map(|output| {
            let spec = declared.iter().find(|s| s.name == output.name);
            stack(&output.name, spec, &rows)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let outputs = wanted
        .iter()
        .zip(&stacked)
        .map(|(output, (datatype, shape, data))| {
            let (parameters, data) = if output.binary {
                (Some(json!({"binary_data_size": data.len()})), None)
            } else {
                let name = &output.name;
                (None, Some(tensor::JsonData { output: name, datatype: *datatype, shape, data }))
            };
            Output { name: &output.name, datatype: datatype.name(), shape, parameters, data }
        })
        .collect();
    let header =
        Header { model_name: model, model_version: "1", id: request.id.as_deref(), outputs };
    // Only an element JSON cannot carry fails this (`JsonData`), with a message naming it.
    let mut body = serde_json::to_vec(&header)
        .map_err(|e| ApiError::internal("unrepresentable_output", e.to_string()))?;
    let binary = wanted.iter().any(|o| o.binary);
    let header_length = binary.then_some(body.len());
    // The binary outputs' data after the header, in order, copied once (not into a tail first).
    let binaries = wanted.iter().zip(&stacked).filter(|(output, _)| output.binary);
    body.reserve(binaries.clone().map(|(_, (_, _, data))| data.len()).sum());
    for (_, (_, _, data)) in binaries {
        body.extend_from_slice(data);
    }
    Ok(Answer { body, header_length })
}

/// The answer's JSON header, written straight into the body: an output's JSON `data` is written
/// element by element as it is read ([`tensor::JsonData`]).
#[derive(Serialize)]
struct Header<'a> {
    model_name: &'a str,
    model_version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    outputs: Vec<Output<'a>>,
}

#[derive(Serialize)]
struct Output<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: &'a [u64],
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<tensor::JsonData<'a>>,
}

/// One row's result held to the `declared` outputs, for a protocol that passes results on as
/// they are (KServe v1): a map giving each once, of its datatype and a shape its declaration
/// takes. The message names the output.
pub fn check_row(declared: &[TensorSpec], data: &[u8]) -> Result<(), String> {
    let entries = super::result_row::entries(data).ok_or_else(|| {
        // A streaming worker's one-shot answer is an array of its chunks: said, as v2 says it.
        let array = matches!(data.first(), Some(0x90..=0x9f | 0xdc | 0xdd));
        let why = if array {
            ", not an array (a streaming worker answers with its chunks: serve KServe v1 from \
             one that returns one map per instance)"
        } else {
            ""
        };
        format!("the worker's result is not a map from output name to its value{why}")
    })?;
    let row = ResultRow::new(&entries);
    for spec in declared {
        let at = |e: String| format!("output {:?}: {e}", spec.name);
        let value = match row.get(&spec.name) {
            Found::Once(value) => value,
            Found::Missing => return Err(at("missing from the worker's result".into())),
            Found::Twice => return Err(at("named twice in the worker's result".into())),
        };
        let datatype = DataType::parse(&spec.datatype).map_err(at)?;
        let value = tensor::row(value, Some(datatype)).map_err(at)?;
        if !tensor::fits(&value.shape, &spec.shape) {
            let shape = tensor::shown(&value.shape);
            return Err(at(format!("shape {shape} where {:?} is declared", spec.shape)));
        }
    }
    Ok(())
}

/// 400 if the request asks for an output the model does not give (`names`).
pub fn check_requested<'a>(
    request: &Request,
    names: impl Iterator<Item = &'a str> + Clone,
) -> Result<(), ApiError> {
    let Some(unknown) = request.outputs.iter().find(|o| !names.clone().any(|n| n == o.name)) else {
        return Ok(());
    };
    Err(unknown_output(&unknown.name, names))
}

/// 400: the client asked for an output the model does not give. The message names the first
/// [`LISTED`] the model gives: a worker that declares none may give a hundred thousand.
fn unknown_output<'a>(unknown: &str, names: impl Iterator<Item = &'a str>) -> ApiError {
    let mut names = names.peekable();
    let listed: Vec<&str> = names.by_ref().take(LISTED).collect();
    let more = if names.peek().is_some() { ", …" } else { "" };
    ApiError::bad_request(format!(
        "unknown output {unknown:?}; the model gives {}{more}",
        listed.join(", ")
    ))
}

/// How many of the model's outputs an unknown output's 400 lists.
const LISTED: usize = 20;

/// The outputs a worker that declares none gives, where the answer lists every output (`all`):
/// the keys of row 0's result, in order (a name given twice is refused where it is stacked).
/// Then every key of every row must be a name (a string), and no later row may name one that row
/// 0 does not, which the answer would drop unseen. A client that named its outputs is given
/// those, and other keys are not its concern: nothing is listed for it (a name it asks for that
/// row 0 lacks is its mistake, a 400, below).
fn given_names<'a>(rows: &[ResultRow<'a>], all: bool) -> Result<Vec<&'a str>, ApiError> {
    let Some(first) = rows.first() else { return Ok(Vec::new()) };
    let no_name = |index: usize| {
        bad_output(format!(
            "row {index}: the worker's result has a key that is no output name: v2 outputs are \
             named by strings, and this worker declares none"
        ))
    };
    if !all {
        return Ok(Vec::new());
    }
    let names: Vec<&str> =
        first.keys().map(|key| key.ok_or_else(|| no_name(0))).collect::<Result<_, _>>()?;
    if names.is_empty() {
        return Err(bad_output(
            "row 0: the worker's result names no output: a v2 answer needs one".into(),
        ));
    }
    for (index, row) in rows.iter().enumerate().skip(1) {
        for key in row.keys() {
            let name = key.ok_or_else(|| no_name(index))?;
            if matches!(first.get(name), Found::Missing) {
                return Err(bad_output(format!(
                    "row {index}, output {name:?}: not in row 0's result: rows must give the \
                     same outputs to stack"
                )));
            }
        }
    }
    Ok(names)
}

fn requested(name: &str, request: &Request) -> Requested {
    Requested { name: name.to_string(), binary: request.binary_by_default }
}

/// An output's datatype, shape and data, all its rows stacked.
type Stacked<'a> = (DataType, Vec<u64>, Cow<'a, [u8]>);

/// One output's rows, checked against each other and the declaration, end to end. One row's
/// tensor value is its stack as it is in the result, not copied.
fn stack<'a>(
    name: &str,
    spec: Option<&TensorSpec>,
    rows: &'a [ResultRow],
) -> Result<Stacked<'a>, ApiError> {
    let declared =
        match spec {
            Some(spec) => Some(DataType::parse(&spec.datatype).map_err(|e| {
                bad_output(format!("the worker declared output {name:?} with an {e}"))
            })?),
            None => None,
        };
    stack_as(name, spec, declared, rows)
}

/// [`stack`] with every row read as `datatype` (None: as its values suggest). Undeclared rows
/// whose values suggest different numeric datatypes are read again as the one that holds them
/// all (row 0 `[1]`, row 1 `[2^64 - 1]`: UINT64; integers and floats: FP64), as one row's
/// elements are: each row on its own made them a 500, "rows must agree".
fn stack_as<'a>(
    name: &str,
    spec: Option<&TensorSpec>,
    declared: Option<DataType>,
    rows: &'a [ResultRow],
) -> Result<Stacked<'a>, ApiError> {
    let mut stacked: Option<(DataType, Vec<u64>)> = None;
    let mut data = Cow::Borrowed(&[][..]);
    for (index, row) in rows.iter().enumerate() {
        let at = |e: String| bad_output(format!("row {index}, output {name:?}: {e}"));
        let value = match row.get(name) {
            Found::Once(value) => value,
            Found::Missing => return Err(at("missing from the worker's result".into())),
            Found::Twice => return Err(at("named twice in the worker's result".into())),
        };
        let row = tensor::row(value, declared).map_err(at)?;
        match &stacked {
            None => {
                if let Some(spec) = spec {
                    if !tensor::fits(&row.shape, &spec.shape) {
                        return Err(at(format!(
                            "shape {} where {:?} is declared",
                            tensor::shown(&row.shape),
                            spec.shape
                        )));
                    }
                }
                stacked = Some((row.datatype, row.shape.clone()));
                if rows.len() == 1 {
                    data = row.data; // one row: its data is the stack, not copied
                    continue;
                }
                data.to_mut().reserve(row.data.len() * rows.len());
            }
            Some((datatype, shape)) if (*datatype, shape) != (row.datatype, &row.shape) => {
                let disagree = at(format!(
                    "{} {}, where row 0 has {} {}: rows must agree to stack",
                    row.datatype.name(),
                    tensor::shown(&row.shape),
                    datatype.name(),
                    tensor::shown(shape)
                ));
                // Over every row, not this one and row 0 alone: rows of INT64, UINT64 and FP64
                // in that order are FP64, as in any other order.
                let undeclared_alike = declared.is_none() && *shape == row.shape;
                let joint = undeclared_alike.then(|| joint_datatype(name, rows, shape)).flatten();
                return match joint {
                    // Read again as the joint datatype; if a row still does not fit (a tensor
                    // value of its own datatype, a negative among UINT64s), the rows disagree.
                    Some(joint) => stack_as(name, spec, Some(joint), rows).map_err(|_| disagree),
                    None => Err(disagree),
                };
            }
            Some(_) => {}
        }
        data.to_mut().extend_from_slice(&row.data);
    }
    let (datatype, row_shape) = stacked.unwrap_or((declared.unwrap_or(DataType::F64), vec![]));
    let mut shape = Vec::with_capacity(row_shape.len() + 1);
    shape.push(rows.len() as u64);
    shape.extend(row_shape);
    Ok((datatype, shape, data))
}

/// The datatype that holds every row's values of output `name` as their values suggest, where
/// all rows have `shape`; None where no one datatype does (or a row cannot be read).
fn joint_datatype(name: &str, rows: &[ResultRow], shape: &[u64]) -> Option<DataType> {
    let mut joint: Option<DataType> = None;
    for row in rows {
        let Found::Once(value) = row.get(name) else { return None };
        let row = tensor::row(value, None).ok()?;
        if row.shape != shape {
            return None;
        }
        joint = Some(match joint {
            None => row.datatype,
            Some(joint) => tensor::widened(joint, row.datatype)?,
        });
    }
    joint
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::http::protocols::v2::request;

    /// A JSON request of one row per result, asking for `outputs` (all, if empty).
    fn answer(
        outputs: &[&str],
        declared: &[TensorSpec],
        results: &[&[u8]],
    ) -> Result<Value, ApiError> {
        let outputs: Vec<Value> = outputs.iter().map(|name| json!({"name": name})).collect();
        let rows = results.len();
        let body = json!({"inputs": [{"name": "X", "shape": [rows], "datatype": "FP32",
            "data": vec![0.0; rows]}], "outputs": outputs});
        let body = Bytes::from(serde_json::to_vec(&body).unwrap());
        let request = request::parse(&body, None, 0, &[]).unwrap();
        let answer = build("m", &request, declared, results)?;
        Ok(serde_json::from_slice(&answer.body).unwrap())
    }

    fn bad_output_message(error: ApiError) -> String {
        assert_eq!((error.status.as_u16(), error.code), (500, "bad_output"), "{}", error.message);
        error.message
    }

    // Results by hand: msgpack maps may hold what no Python dict can (a repeated key).
    const Y_1_Z_TRUE: &[u8] = b"\x82\xa1y\x01\xa1z\xc3"; // {"y": 1, "z": true}
    const Y_1_Y_2: &[u8] = b"\x82\xa1y\x01\xa1y\x02"; // {"y": 1, "y": 2}
    const ONE_2: &[u8] = b"\x81\x01\x02"; // {1: 2}
    const Y_3: &[u8] = b"\x81\xa1y\x03"; // {"y": 3}

    #[test]
    fn an_undeclared_workers_keys_are_its_outputs_each_once() {
        let answer = answer(&[], &[], &[Y_1_Z_TRUE, Y_1_Z_TRUE]).unwrap();
        let names: Vec<&str> = answer["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["y", "z"]);
        assert_eq!(answer["outputs"][0]["data"], json!([1, 1]));
    }

    #[test]
    fn undeclared_rows_of_numbers_stack_as_the_datatype_that_holds_them_all() {
        // Row 0 suggested INT64 and row 1 UINT64 (or FP64): "rows must agree", a 500 for a
        // worker echoing a valid request.
        let pack = |y: serde_json::Value| rmp_serde::to_vec_named(&json!({ "y": y })).unwrap();
        let (small, big, half) = (pack(json!([1])), pack(json!([u64::MAX])), pack(json!([0.5])));
        let ints = answer(&[], &[], &[&small, &big]).unwrap();
        assert_eq!(ints["outputs"][0]["datatype"], "UINT64");
        assert_eq!(ints["outputs"][0]["data"], json!([1, u64::MAX]));
        let floats = answer(&[], &[], &[&small, &half]).unwrap();
        assert_eq!(floats["outputs"][0]["datatype"], "FP64");
        assert_eq!(floats["outputs"][0]["data"], json!([1.0, 0.5]));
        // Whatever the rows' order: widened over all of them, not row 0 and the first to differ
        // (INT64, UINT64, FP64 in this order had been a 500 naming row 1).
        for rows in [[&small, &big, &half], [&small, &half, &big], [&big, &small, &half]] {
            let rows: Vec<&[u8]> = rows.iter().map(|row| row.as_slice()).collect();
            let answer = answer(&[], &[], &rows).unwrap();
            assert_eq!(answer["outputs"][0]["datatype"], "FP64");
        }
        // What no datatype holds, the rows still disagree on.
        let negative = pack(json!([-1]));
        let message = bad_output_message(answer(&[], &[], &[&negative, &big]).unwrap_err());
        assert!(message.contains("rows must agree to stack"), "{message}");
    }

    #[test]
    fn an_output_named_twice_in_a_result_is_the_workers_fault() {
        let message = bad_output_message(answer(&[], &[], &[Y_1_Y_2]).unwrap_err());
        assert!(message.contains(r#"row 0, output "y": named twice"#), "{message}");
        // In a later row, and from a worker that declares the output, too.
        let declared = [TensorSpec { name: "y".into(), datatype: "INT64".into(), shape: vec![] }];
        let message = bad_output_message(answer(&[], &declared, &[Y_3, Y_1_Y_2]).unwrap_err());
        assert!(message.contains(r#"row 1, output "y": named twice"#), "{message}");
    }

    #[test]
    fn an_undeclared_result_that_names_no_output_is_the_workers_fault() {
        for result in [ONE_2, b"\x80".as_slice()] {
            let message = bad_output_message(answer(&[], &[], &[result]).unwrap_err());
            assert!(message.starts_with("row 0: "), "{message}");
        }
        // A key that is no name, beside names, is dropped no more than a name would be.
        let message =
            bad_output_message(answer(&[], &[], &[Y_3, b"\x82\xa1y\x01\x01\x02"]).unwrap_err());
        assert!(message.starts_with("row 1: "), "{message}");
    }

    #[test]
    fn a_later_row_with_an_output_row_0_lacks_is_the_workers_fault_unless_left_out() {
        let message = bad_output_message(answer(&[], &[], &[Y_3, Y_1_Z_TRUE]).unwrap_err());
        assert!(message.contains(r#"row 1, output "z": not in row 0's result"#), "{message}");
        // Asked for `z`, which one row gives and the other lacks: the rows disagree, a 500
        // whichever comes first (a 400 listing row 0's names, when row 0 lacked it).
        let message = bad_output_message(answer(&["z"], &[], &[Y_3, Y_1_Z_TRUE]).unwrap_err());
        assert!(message.contains(r#"row 1, output "z": not in row 0's result"#), "{message}");
        let message = bad_output_message(answer(&["z"], &[], &[Y_1_Z_TRUE, Y_3]).unwrap_err());
        assert!(message.contains(r#"row 1, output "z": missing"#), "{message}");
        // Asked for `y` of a row 0 naming nothing: the worker's fault, not the client's (a 400
        // whose list of the model's outputs was empty).
        for nothing in [ONE_2, b"\x80".as_slice()] {
            let message = bad_output_message(answer(&["y"], &[], &[nothing, Y_3]).unwrap_err());
            assert!(message.contains("row 0: the worker's result names no output"), "{message}");
        }
        // Asked for `w`, which no row gives: the client's mistake, the model's outputs listed.
        let error = answer(&["w"], &[], &[Y_1_Z_TRUE]).unwrap_err();
        assert_eq!(error.status.as_u16(), 400, "{}", error.message);
        assert!(error.message.ends_with("the model gives y, z"), "{}", error.message);
        // Asked only for `y`, the client gets it: `z` was not asked for, nor a key that is no
        // name (it could not be).
        let y_1_one_2: &[u8] = b"\x82\xa1y\x01\x01\x02"; // {"y": 1, 1: 2}
        for rows in [[Y_3, Y_1_Z_TRUE], [Y_3, y_1_one_2]] {
            let answer = answer(&["y"], &[], &rows).unwrap();
            assert_eq!(
                answer["outputs"],
                json!([{"name": "y", "datatype": "INT64", "shape": [2], "data": [3, 1]}])
            );
        }
    }
}
