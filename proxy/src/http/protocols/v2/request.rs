//! A v2 inference request, read and checked, then cut into rows: the JSON header (the whole body,
//! or its first `Inference-Header-Content-Length` bytes with the binary tensor extension, whose
//! tensors follow it in the order of `inputs`), each input's data packed (JSON `data`) or sliced
//! (binary), checked against what the worker declared, and one payload per row of the first
//! dimension: a msgpack map from each input's name to its row as a tensor value.
//!
//! Every check here runs before any job exists: a bad request is a 400 that costs no worker
//! anything.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use corral_protocol::Payload;
use corral_protocol::TensorSpec;
use serde::Deserialize;

use super::result_row::SCANNED;
use super::tensor::{self, DataType};

/// The JSON header of an inference request; unknown keys are ignored, as v2 allows extensions.
/// Its inputs are read as [`InputHeader`]s, or first as [`EagerInput`]s (see there).
#[derive(Debug, Deserialize)]
#[serde(bound(deserialize = "I: Deserialize<'de>"))]
struct Header<I> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: Parameters,
    inputs: Vec<I>,
    #[serde(default)]
    outputs: Vec<OutputHeader>,
}

#[derive(Debug, Deserialize)]
struct InputHeader<'a> {
    name: String,
    shape: Vec<u64>,
    datatype: String,
    #[serde(default)]
    parameters: Parameters,
    /// Its text, packed as it is read ([`tensor::pack_json`]).
    #[serde(default, borrow)]
    data: Option<&'a serde_json::value::RawValue>,
}

/// An input read in one pass: where `datatype` and `shape` come before `data` (as tritonclient
/// writes them), `data` is packed as the header is read ([`tensor::Leaves`]) rather than kept as
/// text and read again (reading the JSON twice was 15% of the proxy's time on v2 JSON requests);
/// else it is kept as text. Whatever this reading cannot settle (data it cannot pack, a field
/// given twice) fails it, and the header is read again as [`InputHeader`]s, whose errors are the
/// ones a client gets: the same as before this reading existed.
#[derive(Debug)]
struct EagerInput<'a> {
    name: String,
    shape: Vec<u64>,
    datatype: String,
    parameters: Parameters,
    data: Option<Data<'a>>,
}

/// An input's JSON `data`: its text, or already packed.
#[derive(Debug)]
enum Data<'a> {
    Text(&'a serde_json::value::RawValue),
    Packed(Vec<u8>),
}

impl<'a> From<InputHeader<'a>> for EagerInput<'a> {
    fn from(input: InputHeader<'a>) -> Self {
        let InputHeader { name, shape, datatype, parameters, data } = input;
        EagerInput { name, shape, datatype, parameters, data: data.map(Data::Text) }
    }
}

/// The keys of an input, read without allocating.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Field {
    Name,
    Shape,
    Datatype,
    Parameters,
    Data,
    #[serde(other)]
    Other,
}

thread_local! {
    /// The length of the JSON header being read by [`EagerInput`]s (set by `parse_reading`, on
    /// this thread, for that one synchronous read): what bounds the room they make for data, as
    /// [`tensor::pack_json`] bounds it by its text. Sized by the shape alone (the client's word)
    /// it would be unbounded; grown by doubling, the packed data kept up to twice its bytes for
    /// as long as its jobs were queued (a review's find).
    static HEADER_LENGTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl<'de: 'a, 'a> Deserialize<'de> for EagerInput<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(reader: D) -> Result<Self, D::Error> {
        reader.deserialize_map(EagerVisitor(std::marker::PhantomData))
    }
}

struct EagerVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> serde::de::Visitor<'de> for EagerVisitor<'a> {
    type Value = EagerInput<'a>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an input tensor")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        let (mut name, mut shape, mut datatype, mut parameters, mut data) =
            (None, None, None, None, None);
        fn once<T, E: Error>(slot: &mut Option<T>, value: T, key: &str) -> Result<(), E> {
            match slot.replace(value) {
                Some(_) => Err(E::custom(format!("duplicate field `{key}`"))),
                None => Ok(()),
            }
        }
        while let Some(key) = map.next_key::<Field>()? {
            match key {
                Field::Name => once(&mut name, map.next_value::<String>()?, "name")?,
                Field::Shape => once(&mut shape, map.next_value::<Vec<u64>>()?, "shape")?,
                Field::Datatype => once(&mut datatype, map.next_value::<String>()?, "datatype")?,
                Field::Parameters => {
                    once(&mut parameters, map.next_value::<Parameters>()?, "parameters")?
                }
                Field::Data => {
                    let known = datatype.as_deref().and_then(|d| DataType::parse(d).ok());
                    let count = shape.as_deref().and_then(tensor::elements);
                    let value = match known.zip(count) {
                        Some((datatype, count)) => {
                            // Each element takes two characters at least (a digit and a comma).
                            let most = HEADER_LENGTH.with(std::cell::Cell::get) / 2 + 1;
                            let room = usize::try_from(count).unwrap_or(usize::MAX).min(most);
                            let mut leaves = tensor::Leaves::new(datatype, count, room);
                            map.next_value_seed(&mut leaves)?;
                            Data::Packed(leaves.finish(Ok(())).map_err(A::Error::custom)?)
                        }
                        // `null` is no data to the derived reading (`None`): left to it.
                        None => match map.next_value::<Option<&serde_json::value::RawValue>>()? {
                            Some(text) => Data::Text(text),
                            None => return Err(A::Error::custom("data is null")),
                        },
                    };
                    once(&mut data, value, "data")?
                }
                Field::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(EagerInput {
            name: name.ok_or_else(|| A::Error::missing_field("name"))?,
            shape: shape.ok_or_else(|| A::Error::missing_field("shape"))?,
            datatype: datatype.ok_or_else(|| A::Error::missing_field("datatype"))?,
            parameters: parameters.unwrap_or_default(),
            data,
        })
    }
}

#[derive(Debug, Deserialize)]
struct OutputHeader {
    name: String,
    #[serde(default)]
    parameters: Parameters,
}

/// The parameters Corral reads; others are ignored.
#[derive(Debug, Default, Deserialize)]
struct Parameters {
    #[serde(default)]
    binary_data_size: Option<u64>,
    #[serde(default)]
    binary_data: Option<bool>,
    #[serde(default)]
    binary_data_output: Option<bool>,
    /// Triton's classification extension (an output's top classes as `"value:index"`), which
    /// Corral does not serve: refused rather than ignored, since the client would get the raw
    /// tensor where it expects classes. `GET /v2` lists the extensions served.
    #[serde(default)]
    classification: Option<serde::de::IgnoredAny>,
    /// Triton's request timeout, in microseconds (what tritonclient's `timeout=` sends; 0: none).
    /// It tightens the job's deadline as a deadline header does; on an input or output it means
    /// nothing and is ignored.
    #[serde(default)]
    timeout: Option<u64>,
    /// Triton's shared-memory extension (`shared_memory_region` on an input or output), which
    /// Corral does not serve: refused, since an input would arrive without its data and an
    /// output's client would read its region, which nothing wrote.
    #[serde(default)]
    shared_memory_region: Option<serde::de::IgnoredAny>,
    /// Triton's sequence batching (`sequence_id`, what tritonclient's `sequence_id=` sends with
    /// `sequence_start`/`sequence_end`): a stateful model's requests kept together, in order, on
    /// one model instance. Corral batches each request on its own with any worker: refused, as
    /// the client's sequence would be spread over workers unseen. 0 or `""` is Triton's "no
    /// sequence", and passes.
    #[serde(default)]
    sequence_id: Option<serde_json::Value>,
}

impl Parameters {
    /// Whether the request names a sequence (see `sequence_id`).
    fn names_a_sequence(&self) -> bool {
        match &self.sequence_id {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::Number(id)) => id.as_u64() != Some(0),
            Some(serde_json::Value::String(id)) => !id.is_empty(),
            Some(_) => true,
        }
    }
}

/// An output the client asked for, and whether it wants it as binary data.
#[derive(Debug, Clone, PartialEq)]
pub struct Requested {
    pub name: String,
    pub binary: bool,
}

/// Why a `shared_memory_region` parameter is refused.
const SHARED_MEMORY: &str = "names a shared-memory region, Triton's shared-memory extension, \
     which Corral does not serve: send the tensor's data in the body (binary_data)";

/// The smallest slice of a row's data that its payload shares with the body rather than copies.
pub const SHARED_SLICE: usize = 4096;

/// Bytes a binary request's body keeps free between its JSON header and its binary data: room
/// for the msgpack head of a one-row payload (its map, the input's name and tensor header), so
/// that the row — head and data — lies in one piece of the body, and a worker that maps shared
/// memory reads it there (`payload_at`) without the proxy gathering it first.
pub const HEAD_ROOM: usize = 256;

/// One input tensor of the request, its data packed.
#[derive(Debug)]
struct Input {
    name: String,
    datatype: DataType,
    shape: Vec<u64>,
    data: Bytes,
}

/// The msgpack head of the one payload of a request of one binary input and one row, read
/// from its JSON header (`json`): what [`Request::payloads`] writes in front of the row's data.
/// None for any other request, or a header that does not parse (the parse that counts, with
/// its error, comes after).
pub fn single_row_head(json: &[u8]) -> Option<Vec<u8>> {
    let header: Header<InputHeader<'_>> = serde_json::from_slice(json).ok()?;
    let [input] = &header.inputs[..] else { return None };
    let size = usize::try_from(input.parameters.binary_data_size?).ok()?;
    if input.data.is_some() || input.shape.first() != Some(&1) || size < SHARED_SLICE {
        return None;
    }
    let datatype = DataType::parse(&input.datatype).ok()?;
    let mut head = Vec::with_capacity(64);
    rmp::encode::write_map_len(&mut head, 1).expect("writing to a Vec cannot fail");
    rmp::encode::write_str(&mut head, &input.name).expect("writing to a Vec cannot fail");
    tensor::write_tensor_head(&mut head, datatype, &input.shape[1..], size);
    Some(head)
}

/// A payload of a head and a slice of `body`, as one slice of the body, where the head's bytes
/// lie right before the slice already (written into the room after the JSON header,
/// [`single_row_head`]): checked byte for byte, so a room left empty or filled otherwise is never
/// taken for the head.
fn in_one_piece(body: &Bytes, payload: &Payload) -> Option<Bytes> {
    let [head, data] = payload.segments() else { return None };
    // Where the slice starts in the body; the slice is the body's own memory (`Bytes::slice`).
    let start = (data.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let from = start.checked_sub(head.len())?;
    (start + data.len() <= body.len() && body[from..start] == head[..])
        .then(|| body.slice(from..start + data.len()))
}

/// A request, read and checked.
#[derive(Debug)]
pub struct Request {
    pub id: Option<String>,
    /// The outputs asked for by name; empty means all.
    pub outputs: Vec<Requested>,
    /// Whether outputs not named get binary data (`binary_data_output`).
    pub binary_by_default: bool,
    inputs: Vec<Input>,
    /// The first dimension every input shares.
    pub rows: usize,
    /// The request's own `timeout` parameter, if it set one other than 0.
    pub timeout: Option<Duration>,
    /// The body the binary inputs' data are slices of, until [`Request::payloads`] takes it.
    body: Bytes,
}

/// Why serde could not read the request's JSON, in the client's terms: serde's words alone
/// ("expected value at line 1 column 64", "key must be a string") named neither a NaN sent as
/// JSON, nor binary data whose header length was not given, nor a body in another encoding.
fn unreadable(json: &[u8], what: &str, e: &serde_json::Error) -> String {
    let said = e.to_string();
    let hint = if bare_non_finite(json, e) {
        // tritonclient's `set_data_from_numpy(..., binary_data=False)` writes them bare.
        " (JSON has no NaN or Infinity: send such a tensor as binary data, binary_data=True in \
         tritonclient)"
    } else if what == "the inference request" && said.starts_with("trailing characters") {
        // Binary tensor data after the JSON, its length not said: "trailing characters" said
        // nothing of the header that was missing.
        " (a body with binary tensor data after its JSON gives the JSON's length in \
         Inference-Header-Content-Length)"
    } else {
        ""
    };
    format!("{what} is not valid: {said}{hint}")
}

/// Whether serde stopped at a bare NaN or infinity where a value was expected (`NaN`, `nan`,
/// `-Infinity`, `inf`, in any case): the word around serde's `line` and `column` (from 1, in
/// bytes), which for `nan` points past its `n` (read as the start of `null`) and for
/// `-Infinity` past its `-` (an invalid number). Not for an error
/// inside a string (an escape), nor a word of another kind.
fn bare_non_finite(json: &[u8], e: &serde_json::Error) -> bool {
    let said = e.to_string();
    let at_a_value = ["expected value", "expected ident", "invalid number"];
    if !at_a_value.iter().any(|start| said.starts_with(start)) {
        return false;
    }
    let line_start: usize = json
        .split(|&byte| byte == b'\n')
        .take(e.line().saturating_sub(1))
        .map(|l| l.len() + 1)
        .sum();
    let at = (line_start + e.column()).saturating_sub(1).min(json.len());
    let word = |byte: &u8| byte.is_ascii_alphabetic() || matches!(byte, b'-' | b'+');
    let start = json[..at].iter().rposition(|byte| !word(byte)).map_or(0, |i| i + 1);
    let end = json[at..].iter().position(|byte| !word(byte)).map_or(json.len(), |i| at + i);
    let token = String::from_utf8_lossy(&json[start..end]).to_ascii_lowercase();
    let bare = token.trim_start_matches(['-', '+']);
    matches!(bare, "nan" | "inf" | "infinity")
}

/// Reads a body: `header_length` is the `Inference-Header-Content-Length` (None: all JSON), and
/// `room` the bytes left free after the header ([`HEAD_ROOM`], or 0) when the body has them.
/// `declared` are the inputs the route's first stage declared (empty: take what comes).
pub fn parse(
    body: &Bytes,
    header_length: Option<usize>,
    room: usize,
    declared: &[TensorSpec],
) -> Result<Request, String> {
    parse_reading(body, header_length, room, declared, true)
}

/// [`parse`] without the one-pass reading of `data` ([`EagerInput`]): every input's data kept as
/// text and packed after. For the fuzz property that both read every body alike.
#[doc(hidden)]
pub fn parse_by_text(
    body: &Bytes,
    header_length: Option<usize>,
    room: usize,
    declared: &[TensorSpec],
) -> Result<Request, String> {
    parse_reading(body, header_length, room, declared, false)
}

fn parse_reading(
    body: &Bytes,
    header_length: Option<usize>,
    room: usize,
    declared: &[TensorSpec],
    eager: bool,
) -> Result<Request, String> {
    let json_end = header_length.unwrap_or(body.len());
    if json_end > body.len() {
        return Err(format!(
            "Inference-Header-Content-Length is {json_end} but the body has {} bytes",
            body.len()
        ));
    }
    let json = &body[..json_end];
    let what = match header_length {
        Some(_) => "the inference request header",
        None => "the inference request",
    };
    // Every byte, not only those of the fields serde reads (it skips `parameters` and unknown
    // keys unchecked); UTF-16 too, which had been "must be a JSON object". Read as the text,
    // serde does not check its strings again.
    let json = crate::http::format::utf8_text(json).map_err(|detail| {
        let words = crate::http::format::not_utf8_words(&detail);
        format!("{what} is not valid JSON: {words}")
    })?;
    // serde takes a struct from an array of its fields too: `[null, {}, [...], []]` had been
    // served, and `[]` told "expected struct Header with 4 elements".
    if json.bytes().find(|byte| !byte.is_ascii_whitespace()) != Some(b'{') {
        if crate::http::format::begins_with_bom(json.as_bytes()) {
            return Err(format!(
                "{what} begins with a byte order mark, and JSON is UTF-8 without one (RFC 8259)"
            ));
        }
        return Err(format!("{what} must be a JSON object"));
    }
    let first = eager.then(|| {
        HEADER_LENGTH.with(|length| length.set(json.len()));
        serde_json::from_str(json).ok()
    });
    let first = first.flatten();
    let header: Header<EagerInput<'_>> = match first {
        Some(header) => header,
        // The reading whose errors clients get, and what the one-pass reading could not settle.
        None => {
            let header: Header<InputHeader<'_>> =
                serde_json::from_str(json).map_err(|e| unreadable(json.as_bytes(), what, &e))?;
            let Header { id, parameters, inputs, outputs } = header;
            Header { id, parameters, inputs: inputs.into_iter().map(Into::into).collect(), outputs }
        }
    };
    if let Some(name) = repeated(header.inputs.iter().map(|i| i.name.as_str())) {
        return Err(format!("input {name:?} appears twice"));
    }
    // An output asked for twice would come back twice in the answer.
    if let Some(name) = repeated(header.outputs.iter().map(|o| o.name.as_str())) {
        return Err(format!("output {name:?} is asked for twice"));
    }
    let mut binary = body.slice((json_end + room).min(body.len())..);
    let mut inputs = Vec::with_capacity(header.inputs.len());
    for input in header.inputs {
        let at = |e: String| format!("input {:?}: {e}", input.name);
        if input.parameters.shared_memory_region.is_some() {
            return Err(at(SHARED_MEMORY.into()));
        }
        let datatype = DataType::parse(&input.datatype).map_err(at)?;
        let count = tensor::elements(&input.shape).ok_or_else(|| at("shape overflows".into()))?;
        let data = match (input.parameters.binary_data_size, input.data) {
            (Some(_), Some(_)) => return Err(at("has both data and binary_data_size".into())),
            (None, None) => return Err(at("has neither data nor binary_data_size".into())),
            (None, Some(Data::Packed(packed))) => Bytes::from(packed),
            (None, Some(Data::Text(json))) => {
                Bytes::from(tensor::pack_json(datatype, json, count).map_err(at)?)
            }
            (Some(size), None) => {
                if size > binary.len() as u64 {
                    return Err(at(format!(
                        "binary_data_size {size} runs past the body ({} bytes left)",
                        binary.len()
                    )));
                }
                let data = binary.split_to(size as usize);
                tensor::check_length(datatype, &input.shape, &data).map_err(at)?;
                data
            }
        };
        inputs.push(Input { name: input.name, datatype, shape: input.shape, data });
    }
    if !binary.is_empty() {
        return Err(format!("{} bytes of binary data that no input claims", binary.len()));
    }
    let rows = check(&inputs, declared)?;
    if header.parameters.names_a_sequence() {
        return Err("the request names a sequence (sequence_id), Triton's sequence batching, \
                    which Corral does not serve: each request is batched on its own, with no \
                    state kept between requests"
            .into());
    }
    let binary_by_default = header.parameters.binary_data_output.unwrap_or(false);
    let outputs = header
        .outputs
        .into_iter()
        .map(|o| match (&o.parameters.classification, &o.parameters.shared_memory_region) {
            (Some(_), _) => Err(format!(
                "output {:?} asks for classification, an extension Corral does not serve",
                o.name
            )),
            (None, Some(_)) => Err(format!("output {:?}: {SHARED_MEMORY}", o.name)),
            (None, None) => Ok(Requested {
                binary: o.parameters.binary_data.unwrap_or(binary_by_default),
                name: o.name,
            }),
        })
        .collect::<Result<_, _>>()?;
    let timeout = header.parameters.timeout.filter(|&us| us > 0).map(Duration::from_micros);
    Ok(Request {
        id: header.id,
        outputs,
        binary_by_default,
        inputs,
        rows,
        timeout,
        body: body.clone(),
    })
}

/// The first name in `names` that an earlier one has already, if any. A few names (the usual
/// one to three) are compared with those before them; more go through a set: a body of a few
/// MiB holds a hundred thousand names, and scanning took 25 s of a runtime thread for 160,000
/// inputs (11 MB).
fn repeated<'a>(mut names: impl ExactSizeIterator<Item = &'a str> + Clone) -> Option<&'a str> {
    if names.len() <= SCANNED {
        return names.clone().enumerate().find_map(|(at, name)| {
            names.clone().take(at).any(|before| before == name).then_some(name)
        });
    }
    let mut seen = HashSet::with_capacity(names.len());
    names.find(|name| !seen.insert(*name))
}

/// Checks the inputs against each other and the declarations; the number of rows.
fn check(inputs: &[Input], declared: &[TensorSpec]) -> Result<usize, String> {
    let Some(first) = inputs.first() else {
        return Err("the request has no inputs".into());
    };
    for input in inputs {
        let rows = input.shape.first().copied().unwrap_or(0);
        if input.shape.is_empty() || rows == 0 {
            return Err(format!(
                "input {:?}: shape {} has no rows; its first dimension is the batch",
                input.name,
                tensor::shown(&input.shape)
            ));
        }
        if rows != first.shape[0] {
            return Err(format!(
                "inputs {:?} and {:?} have {} and {rows} rows; every input needs the same",
                first.name, input.name, first.shape[0]
            ));
        }
        if declared.is_empty() {
            continue;
        }
        let Some(spec) = declared.iter().find(|spec| spec.name == input.name) else {
            let names: Vec<&str> = declared.iter().map(|s| s.name.as_str()).collect();
            return Err(format!(
                "unknown input {:?}; the model takes {}",
                input.name,
                names.join(", ")
            ));
        };
        if spec.datatype != input.datatype.name() {
            return Err(format!(
                "input {:?} is {}; the model takes {}",
                input.name,
                input.datatype.name(),
                spec.datatype
            ));
        }
        if !tensor::fits(&input.shape[1..], &spec.shape) {
            return Err(format!(
                "input {:?} has shape {}; the model takes [-1{}] (the first dimension is the batch)",
                input.name,
                tensor::shown(&input.shape),
                spec.shape.iter().map(|d| format!(", {d}")).collect::<String>()
            ));
        }
    }
    if let Some(missing) = declared.iter().find(|s| !inputs.iter().any(|i| i.name == s.name)) {
        return Err(format!("missing input {:?}", missing.name));
    }
    usize::try_from(first.shape[0]).map_err(|_| "too many rows".into())
}

impl Request {
    /// One payload per row: `{name: tensor value of the row}` for every input. A row's data of
    /// at least [`SHARED_SLICE`] bytes is not copied: the payload is its few bytes of msgpack
    /// (the map, names and tensor headers) between slices of the inputs' data, where the data
    /// lies (for binary tensors, the request's body, which the rows keep alive until they are
    /// done with). Smaller slices are copied into the msgpack around them: a segment of its own
    /// costs more than copying a few hundred bytes (measured: 32,768 rows of 4 bytes took twice
    /// as long as segments).
    pub fn payloads(&mut self) -> Vec<Payload> {
        let inputs = std::mem::take(&mut self.inputs);
        // Taken, not kept: once the rows are built, only they hold the body (as long as they
        // are in flight, or not at all where they were copied).
        let body = std::mem::take(&mut self.body);
        let cuts: Vec<Vec<(usize, usize)>> = inputs.iter().map(|i| self.cuts(i)).collect();
        (0..self.rows)
            .map(|row| {
                let mut segments = Vec::new();
                let mut head = Vec::with_capacity(64);
                rmp::encode::write_map_len(&mut head, inputs.len() as u32)
                    .expect("writing to a Vec cannot fail");
                for (input, cuts) in inputs.iter().zip(&cuts) {
                    rmp::encode::write_str(&mut head, &input.name)
                        .expect("writing to a Vec cannot fail");
                    let (start, end) = cuts[row];
                    let shape = &input.shape[1..];
                    if end - start < SHARED_SLICE {
                        tensor::write_tensor(
                            &mut head,
                            input.datatype,
                            shape,
                            &input.data[start..end],
                        );
                        continue;
                    }
                    tensor::write_tensor_head(&mut head, input.datatype, shape, end - start);
                    segments.push(Bytes::from(std::mem::take(&mut head)));
                    segments.push(input.data.slice(start..end));
                }
                segments.push(Bytes::from(head));
                let payload = Payload::from_segments(segments);
                in_one_piece(&body, &payload).map_or(payload, Payload::from)
            })
            .collect()
    }

    /// The bytes [`Request::payloads`] would build, reckoned without building them: per row,
    /// the map's head and each input's name and tensor head, as written; and all the data once.
    /// A row's head is written here once per input, for the rows' own shape (without the batch
    /// dimension) and length, exact where each row's data is the same length; a BYTES row's
    /// varies, and is reckoned at the whole input's (the widest its lengths' encodings can be).
    /// Charged at their widest (9 bytes a dimension, 24 a head), 30 scalar inputs of 1,024
    /// rows, a 126 KB body, were reckoned 1.7 MB and refused; they take 0.85 MB.
    pub fn payload_bytes(&self) -> u128 {
        let write = "writing to a Vec cannot fail";
        let mut head = Vec::with_capacity(64);
        rmp::encode::write_map_len(&mut head, self.inputs.len() as u32).expect(write);
        for input in &self.inputs {
            rmp::encode::write_str_len(&mut head, input.name.len() as u32).expect(write);
            let length = match input.datatype.size() {
                Some(_) if self.rows > 0 => input.data.len() / self.rows,
                _ => input.data.len(),
            };
            tensor::write_tensor_head(&mut head, input.datatype, &input.shape[1..], length);
        }
        let names: u128 = self.inputs.iter().map(|i| i.name.len() as u128).sum();
        let data: u128 = self.inputs.iter().map(|i| i.data.len() as u128).sum();
        (head.len() as u128 + names) * self.rows as u128 + data
    }

    /// Where each row's data lies in an input's packed data.
    fn cuts(&self, input: &Input) -> Vec<(usize, usize)> {
        let per_row = tensor::elements(&input.shape[1..]).expect("checked when read");
        match input.datatype.size() {
            Some(size) => {
                let step = per_row as usize * size;
                (0..self.rows).map(|row| (row * step, (row + 1) * step)).collect()
            }
            None => {
                let total = per_row * self.rows as u64;
                let (spans, _) =
                    tensor::bytes_elements(&input.data, total).expect("checked when read");
                (0..self.rows)
                    .map(|row| {
                        let first = row * per_row as usize;
                        let start = spans.get(first).map_or(input.data.len(), |s| s.0 - 4);
                        let next = spans.get(first + per_row as usize);
                        (start.min(input.data.len()), next.map_or(input.data.len(), |s| s.0 - 4))
                    })
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, datatype: &str, shape: &[i64]) -> TensorSpec {
        TensorSpec { name: name.into(), datatype: datatype.into(), shape: shape.to_vec() }
    }

    #[test]
    fn data_after_its_datatype_and_shape_is_packed_as_the_header_is_read() {
        fn read(text: &str) -> serde_json::Result<Header<EagerInput<'_>>> {
            serde_json::from_str(text)
        }
        let header = read(
            r#"{"inputs": [{"name": "a", "datatype": "INT16", "shape": [1, 2], "data": [[1, -2]]},
                           {"data": [3], "name": "b", "shape": [1], "datatype": "INT8"}]}"#,
        )
        .unwrap();
        let [a, b] = &header.inputs[..] else { panic!("two inputs") };
        assert!(matches!(&a.data, Some(Data::Packed(p)) if p[..] == [1, 0, 0xfe, 0xff]));
        assert!(matches!(&b.data, Some(Data::Text(t)) if t.get() == "[3]"), "data came first");
        // What it cannot settle fails it, for the reading whose errors clients get.
        for unsettled in [
            r#"{"inputs": [{"name": "a", "datatype": "INT8", "shape": [2], "data": [1]}]}"#,
            r#"{"inputs": [{"name": "a", "datatype": "INT8", "shape": [1], "data": [300]}]}"#,
            r#"{"inputs": [{"name": "a", "datatype": "INT8", "shape": [1], "data": [null]}]}"#,
            r#"{"inputs": [{"name": "a", "name": "b", "datatype": "INT8", "shape": [1], "data": [1]}]}"#,
        ] {
            assert!(read(unsettled).is_err(), "{unsettled}");
        }
        // `null` is no data to the derived reading, wherever it comes: left to it.
        let null_first =
            r#"{"inputs": [{"data": null, "name": "a", "datatype": "INT8", "shape": [1]}]}"#;
        assert!(read(null_first).is_err());
        // Room for the data as the header's length bounds it: none to spare once packed.
        let text = format!(
            r#"{{"inputs": [{{"name": "a", "datatype": "FP32", "shape": [70000], "data": {:?}}}]}}"#,
            vec![0.5f32; 70_000]
        );
        HEADER_LENGTH.with(|length| length.set(text.len()));
        let header = read(&text).unwrap();
        let Some(Data::Packed(packed)) = &header.inputs[0].data else { panic!("not packed") };
        assert_eq!((packed.len(), packed.capacity()), (280_000, 280_000));
        // And the request reads as before, errors included.
        let parse = |text: &str| parse(&Bytes::from(text.to_string()), None, 0, &[]).map(drop);
        let short = r#"{"inputs": [{"name": "a", "datatype": "INT8", "shape": [2], "data": [1]}]}"#;
        assert_eq!(parse(short).unwrap_err(), "input \"a\": 1 elements of data for a shape of 2");
        let twice = r#"{"inputs": [{"name": "a", "name": "b", "datatype": "INT8", "shape": [1]}]}"#;
        assert!(parse(twice).unwrap_err().contains("duplicate field `name`"));
        assert_eq!(
            parse(null_first).unwrap_err(),
            "input \"a\": has neither data nor binary_data_size"
        );
        let (body, length) = binary(
            serde_json::json!({"inputs": [{"data": null, "datatype": "INT8", "name": "a",
                "parameters": {"binary_data_size": 1}, "shape": [1]}]}),
            &[7],
        );
        assert!(super::parse(&body, Some(length), 0, &[]).is_ok(), "a null data is none");
    }

    #[test]
    fn tritons_timeout_is_read_and_its_shared_memory_refused() {
        let parse = |text: &str| parse(&Bytes::from(text.to_string()), None, 0, &[]);
        let input = r#"{"name": "a", "datatype": "INT8", "shape": [1], "data": [1]}"#;
        let with = |parameters: &str| {
            parse(&format!(r#"{{"parameters": {parameters}, "inputs": [{input}]}}"#))
        };
        assert_eq!(
            with(r#"{"timeout": 250000}"#).unwrap().timeout,
            Some(Duration::from_millis(250))
        );
        assert_eq!(with(r#"{"timeout": 0}"#).unwrap().timeout, None, "0 is none, as in Triton");
        assert_eq!(with("{}").unwrap().timeout, None);
        assert!(with(r#"{"timeout": -1}"#).unwrap_err().contains("not valid"));
        assert!(with(r#"{"timeout": "1s"}"#).unwrap_err().contains("not valid"));
        let region = r#"{"name": "a", "datatype": "INT8", "shape": [1],
            "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 1}}"#;
        let refused = parse(&format!(r#"{{"inputs": [{region}]}}"#)).unwrap_err();
        assert!(refused.starts_with("input \"a\": names a shared-memory region"), "{refused}");
        let output = r#"{"name": "y", "parameters": {"shared_memory_region": "r"}}"#;
        let refused = parse(&format!(r#"{{"inputs": [{input}], "outputs": [{output}]}}"#));
        assert!(refused.unwrap_err().starts_with("output \"y\": names a shared-memory region"));
    }

    fn binary(header: serde_json::Value, data: &[u8]) -> (Bytes, usize) {
        let json = serde_json::to_vec(&header).unwrap();
        let length = json.len();
        (Bytes::from([json, data.to_vec()].concat()), length)
    }

    #[test]
    fn a_json_request_becomes_one_payload_per_row() {
        let body = Bytes::from(
            serde_json::to_vec(&serde_json::json!({"inputs": [
                {"name": "X", "shape": [2, 3], "datatype": "INT32", "data": [1, 2, 3, 4, 5, 6]}
            ], "outputs": [{"name": "Y", "parameters": {"binary_data": true}}]}))
            .unwrap(),
        );
        let mut request = parse(&body, None, 0, &[spec("X", "INT32", &[3])]).unwrap();
        assert_eq!(request.rows, 2);
        assert_eq!(request.outputs, [Requested { name: "Y".into(), binary: true }]);
        let payloads = request.payloads();
        let row = payloads[1].contiguous();
        let value = tensor::read_value(&row).unwrap();
        let rmpv::ValueRef::Map(entries) = value else { panic!("a map") };
        let rmpv::ValueRef::Ext(1, ext) = entries[0].1 else { panic!("a tensor") };
        let t = tensor::read_tensor(ext).unwrap();
        assert_eq!(t.shape, [3]);
        assert_eq!(t.data, [4, 0, 0, 0, 5, 0, 0, 0, 6, 0, 0, 0]);
    }

    /// A binary body as the v2 route reads it: the header, [`HEAD_ROOM`] bytes filled from the
    /// end with what `single_row_head` makes of the header (if anything), the data.
    fn with_room(header: serde_json::Value, data: &[u8]) -> (Bytes, usize) {
        let json = serde_json::to_vec(&header).unwrap();
        let mut room = vec![0u8; HEAD_ROOM];
        if let Some(head) = single_row_head(&json) {
            room[HEAD_ROOM - head.len()..].copy_from_slice(&head);
        }
        let length = json.len();
        (Bytes::from([json, room, data.to_vec()].concat()), length)
    }

    #[test]
    fn a_one_row_binary_request_is_one_piece_of_the_body() {
        let data = vec![3u8; 2 * SHARED_SLICE];
        let header = |rows: usize| {
            serde_json::json!({"inputs": [{"name": "IMAGE", "shape": [rows, data.len() / rows],
                "datatype": "UINT8", "parameters": {"binary_data_size": data.len()}}]})
        };
        let (body, length) = with_room(header(1), &data);
        let (plain, plain_length) = binary(header(1), &data);
        let pieces = parse(&plain, Some(plain_length), 0, &[]).unwrap().payloads();
        let one = parse(&body, Some(length), HEAD_ROOM, &[]).unwrap().payloads();
        assert_eq!(pieces[0].segments().len(), 2, "a head and a slice of the body");
        assert_eq!(one[0].segments().len(), 1, "one slice of the body");
        assert_eq!(one, pieces, "the same bytes");
        let segment = &one[0].segments()[0];
        let start = segment.as_ptr() as usize - body.as_ptr() as usize;
        assert_eq!(start + segment.len(), body.len(), "ending with the data, where it lies");

        // Two rows: no head is made, and a room left as zeros is never taken for one.
        let (body, length) = with_room(header(2), &data);
        let rows = parse(&body, Some(length), HEAD_ROOM, &[]).unwrap().payloads();
        assert!(rows.iter().all(|row| row.segments().len() == 2));
        assert_eq!(single_row_head(b"{not json"), None);
    }

    #[test]
    fn binary_bytes_tensors_split_by_row() {
        let data = [1, 0, 0, 0, b'a', 2, 0, 0, 0, b'b', b'c'];
        let (body, length) = binary(
            serde_json::json!({"inputs": [{"name": "T", "shape": [2, 1], "datatype": "BYTES",
                "parameters": {"binary_data_size": data.len()}}]}),
            &data,
        );
        let mut request = parse(&body, Some(length), 0, &[]).unwrap();
        let payloads = request.payloads();
        let row = payloads[1].contiguous();
        let rmpv::ValueRef::Map(entries) = tensor::read_value(&row).unwrap() else { panic!() };
        let rmpv::ValueRef::Ext(1, ext) = entries[0].1 else { panic!() };
        assert_eq!(tensor::read_tensor(ext).unwrap().data, [2, 0, 0, 0, b'b', b'c']);
        assert_eq!(payloads[1].segments().len(), 1, "a small row is copied into one buffer");
    }

    #[test]
    fn the_bytes_reckoned_are_the_rows_built() {
        // 30 scalar FP32 inputs of 1,024 rows (a wide tritonclient request): charged 9 bytes a
        // dimension and 24 a head, it was reckoned twice its rows, and past its bound refused.
        let (rows, width) = (1024usize, 30);
        let inputs: Vec<_> = (0..width)
            .map(|i| {
                serde_json::json!({"name": format!("feature_{i}"), "shape": [rows, 1],
                    "datatype": "FP32", "parameters": {"binary_data_size": rows * 4}})
            })
            .collect();
        let data = vec![0u8; rows * 4 * width];
        let (body, length) = binary(serde_json::json!({ "inputs": inputs }), &data);
        let mut request = parse(&body, Some(length), 0, &[]).unwrap();
        let reckoned = request.payload_bytes();
        let built: usize = request.payloads().iter().map(Payload::len).sum();
        assert_eq!(reckoned, built as u128);
        assert!(reckoned < 4 * body.len() as u128 + 1024 * 1024);
        // BYTES rows of different lengths: reckoned at the widest, never below what is built.
        let strings = [&[3, 0, 0, 0][..], b"abc", &[1, 0, 0, 0], b"d"].concat();
        let (body, length) = binary(
            serde_json::json!({"inputs": [{"name": "T", "shape": [2], "datatype": "BYTES",
                "parameters": {"binary_data_size": strings.len()}}]}),
            &strings,
        );
        let mut request = parse(&body, Some(length), 0, &[]).unwrap();
        let reckoned = request.payload_bytes();
        let built: usize = request.payloads().iter().map(Payload::len).sum();
        assert!(reckoned >= built as u128 && reckoned < built as u128 + 16, "{reckoned} {built}");
    }

    #[test]
    fn a_large_rows_data_stays_in_the_body() {
        let data = vec![7u8; 2 * SHARED_SLICE];
        let (body, length) = binary(
            serde_json::json!({"inputs": [{"name": "X", "shape": [2, SHARED_SLICE], "datatype":
                "UINT8", "parameters": {"binary_data_size": data.len()}}]}),
            &data,
        );
        let payloads = parse(&body, Some(length), 0, &[]).unwrap().payloads();
        let within = |p: *const u8| body.as_ptr_range().contains(&p);
        for row in &payloads {
            let shared = row.segments().iter().filter(|s| within(s.as_ptr())).count();
            assert_eq!(shared, 1, "the row's data is a slice of the body, not a copy");
            let whole = row.contiguous();
            let rmpv::ValueRef::Map(entries) = tensor::read_value(&whole).unwrap() else {
                panic!()
            };
            let rmpv::ValueRef::Ext(1, ext) = entries[0].1 else { panic!() };
            assert_eq!(tensor::read_tensor(ext).unwrap().data, &data[..SHARED_SLICE]);
        }
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let declared = [spec("X", "FP32", &[2])];
        let cases = [
            (
                serde_json::json!({"inputs": [{"name": "X", "shape": [1, 2], "datatype": "FP64",
                "data": [1, 2]}]}),
                "the model takes FP32",
            ),
            (
                serde_json::json!({"inputs": [{"name": "X", "shape": [1, 3], "datatype": "FP32",
                "data": [1, 2, 3]}]}),
                "the model takes [-1, 2]",
            ),
            (
                serde_json::json!({"inputs": [{"name": "Z", "shape": [1, 2], "datatype": "FP32",
                "data": [1, 2]}]}),
                "unknown input",
            ),
            (serde_json::json!({"inputs": []}), "no inputs"),
            (
                serde_json::json!({"inputs": [{"name": "X", "shape": [1, 2], "datatype": "FP32",
                "data": [1]}]}),
                "1 elements",
            ),
            (
                serde_json::json!({"inputs": [{"name": "X", "shape": [0, 2], "datatype": "FP32",
                "data": []}]}),
                "no rows",
            ),
        ];
        for (header, expected) in cases {
            let body = Bytes::from(serde_json::to_vec(&header).unwrap());
            let error = parse(&body, None, 0, &declared).unwrap_err();
            assert!(error.contains(expected), "{error} (wanted {expected})");
        }
        let missing = Bytes::from(
            &br#"{"inputs": [{"name": "Y", "shape": [1], "datatype": "FP32", "data": [1]}]}"#[..],
        );
        assert!(parse(&missing, None, 0, &[spec("Y", "FP32", &[]), spec("X", "FP32", &[])])
            .unwrap_err()
            .contains("missing input \"X\""));
    }

    #[test]
    fn json_serde_cannot_read_is_said_in_the_client_s_terms() {
        let refused = |json: &[u8]| parse(&Bytes::copy_from_slice(json), None, 0, &[]).unwrap_err();
        // tritonclient's binary_data=False writes a NaN bare; on a later line too; C's `nan`,
        // which serde reads as the start of `null`.
        for json in [
            &br#"{"inputs": [{"name": "X", "shape": [2], "datatype": "FP32", "data": [1, NaN]}]}"#[..],
            b"{\n\"inputs\": [{\"name\": \"X\", \"shape\": [1],\n \"datatype\": \"FP32\", \"data\": [-Infinity]}]}",
            br#"{"inputs": [{"name": "X", "shape": [2], "datatype": "FP32", "data": [1.0, nan]}]}"#,
        ] {
            let error = refused(json);
            assert!(error.starts_with("the inference request is not valid: "), "{error}");
            assert!(error.contains("JSON has no NaN or Infinity"), "{error}");
        }
        // Not where the error is of another kind: an escape in a string, a misplaced word.
        for json in
            [&br#"{"id": "\NaN", "inputs": []}"#[..], br#"{"id": "x" NaN, "inputs": []}"#, b"{nope"]
        {
            assert!(!refused(json).contains("NaN or Infinity"), "{}", refused(json));
        }
        // Every byte is UTF-8, those of fields serde skips too; UTF-16 is not "no JSON object".
        let utf16: Vec<u8> = "{\"inputs\": []}".encode_utf16().flat_map(u16::to_be_bytes).collect();
        let latin1 = b"{\"parameters\": {\"note\": \"caf\xe9\"}, \"inputs\": []}";
        for json in [&utf16[..], latin1] {
            let error = refused(json);
            assert!(error.contains("is not valid JSON: it is not UTF-8, which JSON is"), "{error}");
        }
        // UTF-8 with a NUL in a string is no JSON, not another encoding.
        let nul = refused(b"{\"id\": \"a\x00b\", \"inputs\": []}");
        assert!(!nul.contains("UTF-8") && nul.contains("control character"), "{nul}");
    }

    #[test]
    fn a_name_given_twice_is_refused_for_outputs_as_for_inputs() {
        let x = serde_json::json!({"name": "X", "shape": [1], "datatype": "FP32", "data": [1]});
        let refused = |header: serde_json::Value| {
            parse(&Bytes::from(serde_json::to_vec(&header).unwrap()), None, 0, &[]).unwrap_err()
        };
        let y = serde_json::json!({"name": "Y"});
        let z = serde_json::json!({"name": "Z", "parameters": {"binary_data": true}});
        // Asked for twice, an output came back twice in the answer.
        let twice = serde_json::json!({"inputs": [x], "outputs": [y, z, {"name": "Y"}]});
        assert_eq!(refused(twice), r#"output "Y" is asked for twice"#);
        assert_eq!(refused(serde_json::json!({"inputs": [x, x]})), r#"input "X" appears twice"#);
        let once = serde_json::json!({"inputs": [x], "outputs": [y, z]});
        let body = Bytes::from(serde_json::to_vec(&once).unwrap());
        let names: Vec<String> =
            parse(&body, None, 0, &[]).unwrap().outputs.into_iter().map(|o| o.name).collect();
        assert_eq!(names, ["Y", "Z"]);
    }

    #[test]
    fn a_header_that_is_no_object_is_refused_as_such() {
        // serde reads a struct from an array of its fields: this one had been served.
        let x = serde_json::json!(["X", [1], "FP32", {}, [1.0]]);
        for header in [serde_json::json!([null, {}, [x], []]), serde_json::json!([])] {
            let body = Bytes::from(serde_json::to_vec(&header).unwrap());
            let refused = parse(&body, None, 0, &[]).unwrap_err();
            assert_eq!(refused, "the inference request must be a JSON object");
            let binary = parse(&body, Some(body.len()), 0, &[]).unwrap_err();
            assert_eq!(binary, "the inference request header must be a JSON object");
        }
    }

    #[test]
    fn binary_data_without_its_header_length_is_said_to_need_it() {
        let header = serde_json::json!({"inputs": [{"name": "X", "shape": [1, 2],
            "datatype": "FP32", "parameters": {"binary_data_size": 8}}]});
        let (body, _) = binary(header, &[0; 8]);
        let refused = parse(&body, None, 0, &[]).unwrap_err();
        assert!(refused.contains("trailing characters"), "{refused}");
        assert!(refused.contains("in Inference-Header-Content-Length"), "{refused}");
    }

    #[test]
    fn binary_lengths_are_checked_against_the_body() {
        let header = serde_json::json!({"inputs": [{"name": "X", "shape": [1, 2],
            "datatype": "FP32", "parameters": {"binary_data_size": 8}}]});
        let (body, length) = binary(header.clone(), &[0; 4]);
        assert!(parse(&body, Some(length), 0, &[]).unwrap_err().contains("runs past the body"));
        let (body, length) = binary(header.clone(), &[0; 12]);
        assert!(parse(&body, Some(length), 0, &[]).unwrap_err().contains("no input claims"));
        let (body, _) = binary(header, &[0; 8]);
        assert!(parse(&body, Some(body.len() + 1), 0, &[]).unwrap_err().contains("Header-Content"));
    }
}
