//! Requests that carry several items (`x-corral-items: many`): the body's array is split into one
//! payload per element (slices of the same buffer, no copies), and the elements' answers are put
//! back together in order.
//!
//! If every element succeeds the answer is the array of results. Otherwise the request answers
//! the status of its first failed element (by index), with a body listing every failed index:
//! `{"error", "message", "items": [{"index", "status", "error", "message"}]}`.

use bytes::{BufMut, Bytes, BytesMut};

use super::error::ApiError;
use super::format::{self, Format};
use crate::job::Outcome;
use crate::msgpack;

/// How many elements a msgpack array says it holds, from its header alone: a request of more
/// items than its route's queue holds is refused before a payload is made for each (a 16 MiB
/// array of 16M zeros took 1.2 GiB, split, before its 413).
pub fn declared_len(array: &[u8]) -> Option<usize> {
    rmp::decode::read_array_len(&mut &array[..]).ok().map(|len| len as usize)
}

/// One msgpack value per element of a msgpack array.
pub fn split(array: &Bytes) -> Result<Vec<Bytes>, String> {
    let not_an_array = || "with x-corral-items: many the body must be an array".to_string();
    let mut rest: &[u8] = array;
    let len = rmp::decode::read_array_len(&mut rest).map_err(|_| not_an_array())?;
    let mut elements = Vec::with_capacity((len as usize).min(rest.len()));
    for _ in 0..len {
        let start = array.len() - rest.len();
        msgpack::skip(&mut rest)
            .map_err(|e| format!("array element {} is malformed: {e}", elements.len()))?;
        elements.push(array.slice(start..array.len() - rest.len()));
    }
    Ok(elements)
}

/// The value under the string key `name` of a msgpack map (a slice of the same buffer, no copy):
/// how an envelope finds its rows in a body. `Ok(None)` when the map has no such key; `Err` when
/// the value is not a map, a key or value is malformed, or the key is given twice.
pub fn field(map: &Bytes, name: &str) -> Result<Option<Bytes>, String> {
    if rmp::decode::read_map_len(&mut &map[..]).is_err() {
        return Err("the body must be an object".into());
    }
    let Some(value) = msgpack::after_only_key(map, name)? else { return Ok(None) };
    let mut rest = value;
    msgpack::skip(&mut rest)?;
    Ok(Some(map.slice(map.len() - value.len()..map.len() - rest.len())))
}

/// The array of results in `format` for a native client, or the error answer described above.
/// Each result is written out here, as a single item's is: its tensor values as plain arrays (in
/// msgpack they had gone out as the worker's ext values, a malformed one with 200), and for JSON
/// its whole form, so that one with no JSON form (NaN, a map key that is not a string) is a
/// failed element of its own (500 `unrepresentable_output`, listed with the others), not the
/// whole request's 500 with its other results dropped.
pub fn assemble(outcomes: Vec<Outcome>, format: Format) -> Result<Bytes, ApiError> {
    gather(outcomes, format, |data| {
        let (data, found) =
            format::from_msgpack_found(format, data).map_err(format::unrepresentable_for_native)?;
        // JSON too: one format took what the other refused, and JSON readers keep the same
        // bound (serde_json's 128).
        within_depth(data, found.deepest, 1)
    })
}

/// The results as their workers sent them, in one msgpack array, or the error answer described
/// above: for an envelope that writes its answer out itself, once for the whole array (KServe
/// v1's predictions), with `around` levels of its answer around each result (the array's
/// included).
pub fn as_sent(outcomes: Vec<Outcome>, around: usize) -> Result<Bytes, ApiError> {
    gather(outcomes, Format::Msgpack, |data| {
        let deepest = msgpack::scan(&data).deepest;
        within_depth(data, deepest, around)
    })
}

/// A result (nested `deepest` levels) that may be an item of an answer with `around` levels
/// around it (the array's one, and an envelope's): a result that would pass the depth Corral
/// reads anything at would make an answer it would not read itself (the fuzzer found it), and
/// refused only once the whole answer was, it was not named.
fn within_depth(data: Bytes, deepest: usize, around: usize) -> Result<Bytes, ApiError> {
    if deepest + around > msgpack::MAX_DEPTH {
        let message = format!(
            "the worker's output is nested {deepest} levels deep: it cannot be an item of the \
             answer, {around} more around it, within the {} Corral reads",
            msgpack::MAX_DEPTH
        );
        return Err(ApiError::internal("unrepresentable_output", message));
    }
    Ok(data)
}

/// The array of the results, each written by `write`, in `format`; or the first failure's
/// answer, listing every one.
fn gather(
    outcomes: Vec<Outcome>,
    format: Format,
    write: impl Fn(Bytes) -> Result<Bytes, ApiError>,
) -> Result<Bytes, ApiError> {
    let written: Vec<Result<Bytes, ApiError>> = outcomes
        .into_iter()
        .map(|outcome| match outcome {
            Outcome::Done(data, _) => write(data),
            other => Err(ApiError::from_outcome(other)),
        })
        .collect();
    let failed: Vec<(usize, &ApiError)> = written
        .iter()
        .enumerate()
        .filter_map(|(index, result)| Some((index, result.as_ref().err()?)))
        .collect();
    if let Some((_, first)) = failed.first() {
        let listed = failed
            .iter()
            .map(|(index, error)| {
                serde_json::json!({
                    "index": index,
                    "status": error.status.as_u16(),
                    "error": error.code,
                    "message": error.message,
                })
            })
            .collect();
        let message = format!("{} of {} items failed", failed.len(), written.len());
        return Err(ApiError { message, items: Some(listed), ..(*first).clone() });
    }
    // None failed: every result is written, with no second list of them.
    let results = || written.iter().flatten();
    let count = written.len();
    let size: usize = results().map(Bytes::len).sum::<usize>() + count + 5;
    let mut out = BytesMut::with_capacity(size);
    match format {
        Format::Msgpack => {
            let mut header = Vec::with_capacity(5);
            rmp::encode::write_array_len(&mut header, count as u32)
                .expect("writing to a Vec cannot fail");
            out.put_slice(&header);
            results().for_each(|result| out.put_slice(result));
        }
        Format::Json => {
            out.put_u8(b'[');
            for (at, result) in results().enumerate() {
                if at > 0 {
                    out.put_u8(b',');
                }
                out.put_slice(result);
            }
            out.put_u8(b']');
        }
    }
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mp(value: serde_json::Value) -> Bytes {
        Bytes::from(rmp_serde::to_vec(&value).unwrap())
    }

    #[test]
    fn splits_an_array_into_its_elements() {
        let elements = split(&mp(serde_json::json!([1, "two", [3, {"four": 4}], null]))).unwrap();
        let expected = [
            mp(serde_json::json!(1)),
            mp(serde_json::json!("two")),
            mp(serde_json::json!([3, {"four": 4}])),
            mp(serde_json::json!(null)),
        ];
        assert_eq!(elements, expected);
        assert!(split(&mp(serde_json::json!([]))).unwrap().is_empty());
    }

    #[test]
    fn refuses_what_is_not_an_array() {
        assert!(split(&mp(serde_json::json!({"a": 1}))).is_err());
        assert!(split(&Bytes::from_static(&[0x92, 0x01])).is_err(), "truncated");
    }

    #[test]
    fn finds_a_field_of_a_map() {
        let body = mp(serde_json::json!({"a": 1, "instances": [1, {"b": 2}]}));
        let found = field(&body, "instances").unwrap().unwrap();
        assert_eq!(found, mp(serde_json::json!([1, {"b": 2}])));
        assert_eq!(field(&body, "nope").unwrap(), None);
        assert!(field(&mp(serde_json::json!([1])), "instances").is_err());
    }

    #[test]
    fn a_field_given_twice_is_refused_not_taken_first() {
        // {"instances": ["reject"], "instances": ["ok"]}: a reader keeping the last key saw
        // other rows than the first-taken ran.
        let mut body = vec![0x82];
        for value in ["reject", "ok"] {
            rmp::encode::write_str(&mut body, "instances").unwrap();
            rmp::encode::write_array_len(&mut body, 1).unwrap();
            rmp::encode::write_str(&mut body, value).unwrap();
        }
        let why = field(&Bytes::from(body), "instances").unwrap_err();
        assert_eq!(why, r#""instances" appears twice"#);
    }

    #[test]
    fn assembles_results_in_order() {
        let outcomes = || {
            vec![
                Outcome::Done(mp(serde_json::json!("a")), None),
                Outcome::Done(mp(serde_json::json!(2)), None),
            ]
        };
        let data = assemble(outcomes(), Format::Msgpack);
        assert_eq!(data.unwrap(), mp(serde_json::json!(["a", 2])));
        assert_eq!(assemble(outcomes(), Format::Json).unwrap(), r#"["a",2]"#);
        assert_eq!(assemble(Vec::new(), Format::Json).unwrap(), "[]");
    }

    #[test]
    fn answers_the_first_failure_and_lists_them_all() {
        let error = assemble(
            vec![
                Outcome::Done(mp(serde_json::json!(1)), None),
                Outcome::Invalid("bad pixel".into()),
                Outcome::Expired,
            ],
            Format::Msgpack,
        )
        .unwrap_err();
        assert_eq!((error.status.as_u16(), error.code), (422, "invalid_input"));
        let body: serde_json::Value = serde_json::from_slice(&error.body()).unwrap();
        assert_eq!(body["message"], "2 of 3 items failed");
        assert_eq!(body["items"][0]["index"], 1);
        assert_eq!(body["items"][0]["message"], "bad pixel");
        assert_eq!(body["items"][1]["status"], 408);
    }

    #[test]
    fn a_native_client_s_items_have_their_tensors_written_out_and_kserve_s_are_as_sent() {
        use crate::http::protocols::v2::tensor::{write_tensor, DataType};
        let data: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|f| f.to_le_bytes()).collect();
        let mut tensor = Vec::new();
        write_tensor(&mut tensor, DataType::F32, &[2], &data);
        let mut result = vec![0x81, 0xa1, b'Y'];
        result.extend(&tensor);
        let outcomes = || vec![Outcome::Done(Bytes::from(result.clone()), None)];
        let plain = mp(serde_json::json!([{"Y": [1.5, -2.0]}]));
        let written = assemble(outcomes(), Format::Msgpack).unwrap();
        let written: serde_json::Value = rmp_serde::from_slice(&written).unwrap();
        assert_eq!(written, rmp_serde::from_slice::<serde_json::Value>(&plain).unwrap());
        assert_eq!(assemble(outcomes(), Format::Json).unwrap(), r#"[{"Y":[1.5,-2.0]}]"#);
        // KServe v1 writes its predictions out itself: the ext value is kept.
        let sent = as_sent(outcomes(), 1).unwrap();
        assert_eq!(&sent[1..], &result[..]);
        // A malformed tensor is a failed item of its own, in either format.
        let broken = || vec![Outcome::Done(Bytes::from_static(b"\x81\xa1Y\xd5\x01ab"), None)];
        for format in [Format::Msgpack, Format::Json] {
            let error = assemble(broken(), format).unwrap_err();
            assert_eq!((error.status.as_u16(), error.code), (500, "bad_output"));
        }
    }

    #[test]
    fn an_item_as_deep_as_the_bound_fails_in_either_format() {
        // One level more inside the answer's array: msgpack refused it, JSON sent 129 levels.
        let deep = Bytes::from([&vec![0x91; msgpack::MAX_DEPTH][..], &[0xc0]].concat());
        let shallower = Bytes::from([&vec![0x91; msgpack::MAX_DEPTH - 1][..], &[0xc0]].concat());
        for format in [Format::Json, Format::Msgpack] {
            let outcomes = vec![Outcome::Done(deep.clone(), None)];
            let error = assemble(outcomes, format).unwrap_err();
            assert_eq!((error.status.as_u16(), error.code), (500, "unrepresentable_output"));
            assert!(assemble(vec![Outcome::Done(shallower.clone(), None)], format).is_ok());
        }
    }

    #[test]
    fn an_item_with_no_json_form_is_a_failed_item_of_its_own() {
        // [ok, NaN, rejected]: the NaN once failed the whole request (500, no list) as JSON.
        let nan = Bytes::from(rmp_serde::to_vec(&f64::NAN).unwrap());
        let outcomes = || {
            vec![
                Outcome::Done(mp(serde_json::json!(1)), None),
                Outcome::Done(nan.clone(), None),
                Outcome::Invalid("bad pixel".into()),
            ]
        };
        let error = assemble(outcomes(), Format::Json).unwrap_err();
        assert_eq!((error.status.as_u16(), error.code), (500, "unrepresentable_output"));
        let body: serde_json::Value = serde_json::from_slice(&error.body()).unwrap();
        assert_eq!(body["message"], "2 of 3 items failed");
        assert_eq!(body["items"][0]["index"], 1);
        assert_eq!(body["items"][1]["index"], 2);
        // msgpack carries NaN: only the rejected item failed.
        let error = assemble(outcomes(), Format::Msgpack).unwrap_err();
        assert_eq!((error.status.as_u16(), error.code), (422, "invalid_input"));
    }
}
