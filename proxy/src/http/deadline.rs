//! A job's deadline from its request's headers. A request may say how long its caller will wait
//! in any of the ways the callers in front of Corral say it; the job's deadline is the earliest
//! of them and the route's own timeout (`--timeout-ms` or the route's `timeout_ms`):
//!
//! | header | unit | set by |
//! | --- | --- | --- |
//! | `x-corral-timeout-ms` | whole milliseconds | Corral's own clients |
//! | `x-envoy-expected-rq-timeout-ms` | whole milliseconds | Envoy and Istio, from the route's timeout |
//! | `grpc-timeout` | 1–8 digits and a unit: `H`, `M`, `S`, `m`, `u`, `n` | gRPC clients and gateways |
//! | `request-timeout` | seconds, a positive number (`2`, `0.25`, `1e3`) | other gateways |
//!
//! A value that does not parse, or is not positive, is a 400 naming the header: a deadline the
//! caller meant but Corral misread would be worse than none. A header sent more than once
//! counts each time (the earliest wins, and each must parse), and so does each value of one
//! field holding several separated by commas: the same header folded into one line, as HTTP
//! lets a proxy on the way do (RFC 9110 §5.3). `request-timeout`'s only at a comma followed by a
//! space or tab, as folding writes it: its seconds are decimals, and `2,5` read as two values
//! would be a deadline of 2 s where 2.5 was meant (a 400 says it is no number).

use std::time::Duration;

use http::{HeaderMap, HeaderName};

use super::error::ApiError;

/// Header with which a client shortens its job's deadline.
pub const TIMEOUT_HEADER: &str = "x-corral-timeout-ms";
/// Envoy's (and Istio's) statement of the time the caller will wait.
pub const ENVOY_HEADER: &str = "x-envoy-expected-rq-timeout-ms";
/// gRPC's deadline header, in its own syntax.
pub const GRPC_HEADER: &str = "grpc-timeout";
/// A plain deadline in seconds.
pub const REQUEST_TIMEOUT_HEADER: &str = "request-timeout";

// The names above as looked up: a `&str` is parsed into a name at every lookup.
static TIMEOUT: HeaderName = HeaderName::from_static(TIMEOUT_HEADER);
static ENVOY: HeaderName = HeaderName::from_static(ENVOY_HEADER);
static GRPC: HeaderName = HeaderName::from_static(GRPC_HEADER);
static REQUEST_TIMEOUT: HeaderName = HeaderName::from_static(REQUEST_TIMEOUT_HEADER);

/// A header's name, its parser, what its value must be (for the 400), and whether its values
/// are split at any comma (else only at one followed by a space or tab).
type Reader = (&'static HeaderName, fn(&str) -> Option<Duration>, &'static str, bool);

/// The shortest time any of the headers allows, if one is present.
pub fn requested(headers: &HeaderMap) -> Result<Option<Duration>, ApiError> {
    let parsers: [Reader; 4] = [
        (&TIMEOUT, milliseconds, "a positive whole number of milliseconds", true),
        (&ENVOY, milliseconds, "a positive whole number of milliseconds", true),
        (&GRPC, grpc, "1 to 8 digits and a unit (H, M, S, m, u or n), above zero", true),
        (&REQUEST_TIMEOUT, seconds, "a positive number of seconds", false),
    ];
    let mut earliest: Option<Duration> = None;
    for (name, parse, expected, folds) in parsers {
        // Every field of a repeated header: a gateway that adds its own shorter deadline
        // after the client's was ignored (only the first field was read).
        for value in headers.get_all(name) {
            let bad = || ApiError::bad_request(format!("{name} must be {expected}"));
            let value = value.to_str().map_err(|_| bad())?;
            // Empty list elements are no value (RFC 9110 §5.6.1); a field of none is a 400.
            let values = folded(value, folds).map(str::trim).filter(|v| !v.is_empty());
            let mut values = values.peekable();
            if values.peek().is_none() {
                return Err(bad());
            }
            for value in values {
                let timeout = parse(value).filter(|t| !t.is_zero()).ok_or_else(bad)?;
                earliest = Some(earliest.map_or(timeout, |e| e.min(timeout)));
            }
        }
    }
    Ok(earliest)
}

/// A field's values: split at every comma (`any_comma`), or only at one a space or tab follows.
pub(super) fn folded(value: &str, any_comma: bool) -> impl Iterator<Item = &str> {
    let bytes = value.as_bytes();
    let mut start = 0;
    let mut cuts = value.match_indices(',').filter_map(move |(at, _)| {
        (any_comma || matches!(bytes.get(at + 1), Some(b' ' | b'\t'))).then_some(at)
    });
    std::iter::from_fn(move || {
        if start > value.len() {
            return None;
        }
        let end = cuts.next().unwrap_or(value.len());
        let piece = &value[start..end];
        start = end + 1;
        Some(piece)
    })
}

/// Any whole number, however long: one past what 64 bits hold is a deadline as long as the
/// longest (the route's timeout caps it), as one of 2^64 - 1 was and as `request-timeout`'s
/// seconds are; it had been a 400 saying it was no whole number.
fn milliseconds(value: &str) -> Option<Duration> {
    let digits = value.strip_prefix('+').unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Duration::from_millis(digits.parse::<u64>().unwrap_or(u64::MAX)))
}

/// gRPC's `TimeoutValue TimeoutUnit`: at most 8 ASCII digits, then one unit letter.
fn grpc(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn seconds(value: &str) -> Option<Duration> {
    let parsed: f64 = value.parse().ok()?;
    // `inf`, `infinity` and `nan` parse too, and are no number of seconds.
    let named = value.trim_start_matches(['+', '-']).starts_with(|c: char| c.is_ascii_alphabetic());
    if named || parsed.is_sign_negative() {
        return None;
    }
    // Any positive number is a deadline, as any whole number of milliseconds is: one past a
    // century is one (the route's timeout caps it anyway), one past f64 (`1e309`) as well, and
    // one below a nanosecond is the shortest there is, down to one f64 reads as 0 (`1e-330`);
    // none is a 400 saying it is not positive.
    let seconds = if parsed == 0.0 {
        let mantissa = value.split(['e', 'E']).next().unwrap_or_default();
        mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b)).then_some(0.0)?
    } else {
        parsed.min(3.2e9)
    };
    Duration::try_from_secs_f64(seconds).ok().map(|d| d.max(Duration::from_nanos(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap())).collect()
    }

    #[test]
    fn the_earliest_header_wins() {
        let all = headers(&[
            (TIMEOUT_HEADER, "900"),
            (ENVOY_HEADER, "800"),
            (GRPC_HEADER, "700m"),
            (REQUEST_TIMEOUT_HEADER, "0.6"),
        ]);
        assert_eq!(requested(&all).unwrap(), Some(Duration::from_millis(600)));
        let some = headers(&[(TIMEOUT_HEADER, "900"), (GRPC_HEADER, "1S")]);
        assert_eq!(requested(&some).unwrap(), Some(Duration::from_millis(900)));
        assert_eq!(requested(&HeaderMap::new()).unwrap(), None);
    }

    #[test]
    fn every_field_of_a_repeated_header_counts() {
        // Only the first field was read: a later, shorter deadline (a gateway's) was ignored,
        // and a later bad value never checked.
        let repeated = headers(&[(TIMEOUT_HEADER, "5000"), (TIMEOUT_HEADER, "100")]);
        assert_eq!(requested(&repeated).unwrap(), Some(Duration::from_millis(100)));
        let grpc = headers(&[(GRPC_HEADER, "5S"), (GRPC_HEADER, "100m")]);
        assert_eq!(requested(&grpc).unwrap(), Some(Duration::from_millis(100)));
        let bad = headers(&[(TIMEOUT_HEADER, "100"), (TIMEOUT_HEADER, "abc")]);
        assert!(requested(&bad).unwrap_err().message.contains(TIMEOUT_HEADER));
    }

    #[test]
    fn a_header_folded_into_one_field_counts_each_value() {
        // The two fields above as a proxy may fold them: it had been a 400.
        let folded = headers(&[(TIMEOUT_HEADER, "5000, 100")]);
        assert_eq!(requested(&folded).unwrap(), Some(Duration::from_millis(100)));
        let envoy = headers(&[(ENVOY_HEADER, "100,50 ,")]);
        assert_eq!(requested(&envoy).unwrap(), Some(Duration::from_millis(50)), "empty: none");
        let grpc = headers(&[(GRPC_HEADER, "5S,100m")]);
        assert_eq!(requested(&grpc).unwrap(), Some(Duration::from_millis(100)));
        for bad in ["100, abc", ",", " , ", "100, 0"] {
            let error = requested(&headers(&[(TIMEOUT_HEADER, bad)])).unwrap_err();
            assert!(error.message.starts_with(TIMEOUT_HEADER), "{bad:?}: {}", error.message);
        }
        // Seconds are decimals: `2,5` is no number, not 2 s and 5 s; `2.5, 3` is folded.
        let comma = requested(&headers(&[(REQUEST_TIMEOUT_HEADER, "2,5")])).unwrap_err();
        assert!(comma.message.starts_with(REQUEST_TIMEOUT_HEADER), "{}", comma.message);
        let folded = headers(&[(REQUEST_TIMEOUT_HEADER, "2.5, 3")]);
        assert_eq!(requested(&folded).unwrap(), Some(Duration::from_millis(2500)));
        let tabbed = headers(&[(REQUEST_TIMEOUT_HEADER, "3,\t0.5")]);
        assert_eq!(requested(&tabbed).unwrap(), Some(Duration::from_millis(500)));
    }

    #[test]
    fn grpc_units() {
        for (value, expected) in [
            ("2H", Duration::from_secs(7200)),
            ("3M", Duration::from_secs(180)),
            ("4S", Duration::from_secs(4)),
            ("5m", Duration::from_millis(5)),
            ("6u", Duration::from_micros(6)),
            ("99999999n", Duration::from_nanos(99_999_999)),
        ] {
            assert_eq!(grpc(value), Some(expected), "{value}");
        }
        for bad in ["", "S", "123456789S", "1s", "1.5S", "-1S", "1 S"] {
            assert_eq!(grpc(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn any_finite_positive_number_of_seconds_is_a_deadline() {
        // As any whole number of milliseconds is: the route's timeout caps a long one.
        assert_eq!(seconds("1e300"), Some(Duration::from_secs_f64(3.2e9)));
        assert_eq!(seconds("1e10"), Some(Duration::from_secs_f64(3.2e9)));
        assert_eq!(seconds("1e-10"), Some(Duration::from_nanos(1)), "positive, however small");
        assert_eq!(seconds("0.25"), Some(Duration::from_millis(250)));
        // Past what f64 holds, either way: still positive numbers of seconds.
        assert_eq!(seconds("1e309"), Some(Duration::from_secs_f64(3.2e9)));
        assert_eq!(seconds("1e-330"), Some(Duration::from_nanos(1)));
        assert_eq!(seconds("0.000e-400"), None, "zero however written");
        for named in ["inf", "+infinity", "NaN", "-0", "-1e-330"] {
            assert_eq!(seconds(named), None, "{named}");
        }
    }

    #[test]
    fn any_whole_number_of_milliseconds_is_a_deadline() {
        assert_eq!(milliseconds("1500"), Some(Duration::from_millis(1500)));
        assert_eq!(milliseconds("+1500"), Some(Duration::from_millis(1500)));
        let longest = Some(Duration::from_millis(u64::MAX));
        assert_eq!(milliseconds("18446744073709551615"), longest);
        assert_eq!(milliseconds("99999999999999999999999"), longest, "past 64 bits");
        for bad in ["", "+", "1.5", "-1", "1e3", "++1", " 1"] {
            assert_eq!(milliseconds(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn bad_values_name_their_header() {
        for (name, value) in [
            (TIMEOUT_HEADER, "0"),
            (TIMEOUT_HEADER, "soon"),
            (ENVOY_HEADER, "-5"),
            (GRPC_HEADER, "10x"),
            (GRPC_HEADER, "0m"),
            (REQUEST_TIMEOUT_HEADER, "NaN"),
            (REQUEST_TIMEOUT_HEADER, "-1"),
            (REQUEST_TIMEOUT_HEADER, "0.0"),
            (REQUEST_TIMEOUT_HEADER, "inf"),
        ] {
            let error = requested(&headers(&[(name, value)])).unwrap_err();
            assert_eq!(error.status, http::StatusCode::BAD_REQUEST);
            assert!(error.message.starts_with(name), "{}", error.message);
        }
    }
}
