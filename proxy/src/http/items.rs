//! Requests that carry several items (`x-corral-items: many`): the body's array is split into one
//! payload per element (slices of the same buffer, no copies), and the elements' answers are put
//! back together in order.
//!
//! If every element succeeds the answer is the array of results. Otherwise the request answers
//! the status of its first failed element (by index), with a body listing every failed index:
//! `{"error", "message", "items": [{"index", "status", "error", "message"}]}`.

use bytes::{BufMut, Bytes, BytesMut};

use super::error::ApiError;
use crate::job::Outcome;
use crate::msgpack;

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
/// the value is not a map, or a key or value up to the one found is malformed.
pub fn field(map: &Bytes, name: &str) -> Result<Option<Bytes>, String> {
    if rmp::decode::read_map_len(&mut &map[..]).is_err() {
        return Err("the body must be an object".into());
    }
    let Some(value) = msgpack::after_key(map, name)? else { return Ok(None) };
    let mut rest = value;
    msgpack::skip(&mut rest)?;
    Ok(Some(map.slice(map.len() - value.len()..map.len() - rest.len())))
}

/// The msgpack array of results, or the error answer described above.
pub fn assemble(outcomes: Vec<Outcome>) -> Result<Bytes, ApiError> {
    let failed: Vec<(usize, ApiError)> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, outcome)| !matches!(outcome, Outcome::Done(..)))
        .map(|(index, outcome)| (index, ApiError::from_outcome(outcome.clone())))
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
        let message = format!("{} of {} items failed", failed.len(), outcomes.len());
        return Err(ApiError { message, items: Some(listed), ..first.clone() });
    }
    let size: usize =
        outcomes.iter().map(|o| if let Outcome::Done(d, _) = o { d.len() } else { 0 }).sum();
    let mut out = BytesMut::with_capacity(size + 5);
    let mut header = Vec::with_capacity(5);
    rmp::encode::write_array_len(&mut header, outcomes.len() as u32)
        .expect("writing to a Vec cannot fail");
    out.put_slice(&header);
    for outcome in outcomes {
        if let Outcome::Done(data, _) = outcome {
            out.put_slice(&data);
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
    fn assembles_results_in_order() {
        let data = assemble(vec![
            Outcome::Done(mp(serde_json::json!("a")), None),
            Outcome::Done(mp(serde_json::json!(2)), None),
        ]);
        assert_eq!(data.unwrap(), mp(serde_json::json!(["a", 2])));
    }

    #[test]
    fn answers_the_first_failure_and_lists_them_all() {
        let error = assemble(vec![
            Outcome::Done(mp(serde_json::json!(1)), None),
            Outcome::Invalid("bad pixel".into()),
            Outcome::Expired,
        ])
        .unwrap_err();
        assert_eq!((error.status.as_u16(), error.code), (422, "invalid_input"));
        let body: serde_json::Value = serde_json::from_slice(&error.body()).unwrap();
        assert_eq!(body["message"], "2 of 3 items failed");
        assert_eq!(body["items"][0]["index"], 1);
        assert_eq!(body["items"][0]["message"], "bad pixel");
        assert_eq!(body["items"][1]["status"], 408);
    }
}
