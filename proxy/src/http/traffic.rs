//! What a request's headers say about its jobs' [`Traffic`]: its priority class
//! (`x-corral-priority`: `high`, `normal` or `low`; the route's `priority` when absent), its
//! tenant (`x-corral-tenant`, or the header `--tenant-header` names), and each item's weight
//! (`x-corral-weight`, a positive integer; values above [`MAX_WEIGHT`] count as it). Every
//! protocol's requests carry them the same way. A value that does not parse is a 400 naming the
//! header, like the deadline headers ([`super::deadline`]).
//!
//! The tenant's value is hashed at once ([`Tenant::of`]) and never logged: it may be an API key.

use http::{HeaderMap, HeaderName, HeaderValue};

use super::deadline::folded;
use super::error::ApiError;
use super::head::agreed;
use crate::traffic::{Class, Tenant, Traffic, MAX_WEIGHT};

/// Header that names a request's priority class.
pub const PRIORITY_HEADER: &str = "x-corral-priority";
/// Header that names a request's tenant, unless `--tenant-header` names another.
pub const TENANT_HEADER: &str = "x-corral-tenant";
/// Header that gives each of a request's items its weight.
pub const WEIGHT_HEADER: &str = "x-corral-weight";

// The names above as looked up: a `&str` is parsed into a name at every lookup.
static PRIORITY: HeaderName = HeaderName::from_static(PRIORITY_HEADER);
static WEIGHT: HeaderName = HeaderName::from_static(WEIGHT_HEADER);

/// The request's traffic, from its headers and its route's default class.
pub fn requested(
    headers: &HeaderMap,
    default: Class,
    tenant_header: &HeaderName,
) -> Result<Traffic, ApiError> {
    let class = agreed(headers, &PRIORITY, PRIORITY_HEADER, |value| {
        each_folded(value, PRIORITY_HEADER, Class::parse).ok_or_else(|| {
            ApiError::bad_request(format!("{PRIORITY_HEADER} must be high, normal or low"))
        })?
    })?
    .unwrap_or(default);
    // An empty value names nobody: the request is nobody's, as without the header. Fields
    // that differ are a 400 ([`agreed`]): a client's tenant field put first had escaped its
    // tenant's quota. A tenant folded into one field (`a, b`) is a tenant of that name: a
    // gateway must replace the client's field, not add its own beside it.
    let tenant = agreed(headers, tenant_header, tenant_header.as_str(), |value| {
        Ok(Some(value.as_bytes().trim_ascii()).filter(|value| !value.is_empty()).map(Tenant::of))
    })?
    .flatten();
    let weight = agreed(headers, &WEIGHT, WEIGHT_HEADER, |value| {
        each_folded(value, WEIGHT_HEADER, |v| {
            // Past u64 is past the cap too: it counts as the cap, as any value above it.
            match v.parse::<u64>() {
                Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => Some(u64::MAX),
                parsed => parsed.ok(),
            }
            .filter(|&w| w > 0)
            .map(|w| w.min(u64::from(MAX_WEIGHT)) as u32)
        })
        .ok_or_else(|| {
            ApiError::bad_request(format!("{WEIGHT_HEADER} must be a positive integer"))
        })?
    })?;
    Ok(Traffic { class, tenant, weight, ..Traffic::default() })
}

/// One field's value read as the list a proxy may have folded it into (`high, high`: RFC 9110
/// allows fields to be joined so), each piece by `read`, empty ones ignored as RFC 9110 says
/// (as the deadline headers' are). None: a piece does not parse, or none is left; Some(Err):
/// pieces that parse but read differently, the same 400 as two fields that differ ([`agreed`]).
/// Fields given apart were read alike while the same fields folded had been a 400.
fn each_folded<T: PartialEq>(
    value: &HeaderValue,
    said: &str,
    read: impl Fn(&str) -> Option<T>,
) -> Option<Result<T, ApiError>> {
    let pieces = folded(value.to_str().ok()?, true).map(str::trim).filter(|p| !p.is_empty());
    let mut pieces = pieces.map(read);
    let first = pieces.next()??;
    for piece in pieces {
        if piece? != first {
            let message = format!("{said} is given more than once, with different values");
            return Some(Err(ApiError::bad_request(message)));
        }
    }
    Some(Ok(first))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap())).collect()
    }

    fn read(pairs: &[(&'static str, &'static str)]) -> Result<Traffic, ApiError> {
        requested(&headers(pairs), Class::Normal, &HeaderName::from_static(TENANT_HEADER))
    }

    #[test]
    fn headers_name_class_tenant_and_weight() {
        let traffic =
            read(&[(PRIORITY_HEADER, "High"), (TENANT_HEADER, "acme"), (WEIGHT_HEADER, "12")])
                .unwrap();
        assert_eq!(traffic.class, Class::High);
        assert_eq!(traffic.tenant, Some(Tenant::of(b"acme")));
        assert_eq!(traffic.weight, Some(12));
    }

    #[test]
    fn without_headers_the_route_decides_and_nobody_is_named() {
        let none = requested(&HeaderMap::new(), Class::Low, &HeaderName::from_static("x-api-key"));
        let nobody = Traffic { class: Class::Low, ..Traffic::default() };
        assert_eq!(none.unwrap(), nobody);
        assert_eq!(read(&[(TENANT_HEADER, " ")]).unwrap().tenant, None);
    }

    #[test]
    fn the_tenant_header_is_configurable() {
        let key = HeaderName::from_static("x-api-key");
        let traffic = requested(&headers(&[("x-api-key", "k1")]), Class::Normal, &key).unwrap();
        assert_eq!(traffic.tenant, Some(Tenant::of(b"k1")));
    }

    #[test]
    fn heavy_weights_are_capped() {
        assert_eq!(read(&[(WEIGHT_HEADER, "99999999999")]).unwrap().weight, Some(MAX_WEIGHT));
        let past_u64 = [(WEIGHT_HEADER, "99999999999999999999999")];
        assert_eq!(read(&past_u64).unwrap().weight, Some(MAX_WEIGHT));
    }

    #[test]
    fn bad_values_name_their_header() {
        for (name, value) in [
            (PRIORITY_HEADER, "urgent"),
            (PRIORITY_HEADER, ""),
            (WEIGHT_HEADER, "0"),
            (WEIGHT_HEADER, "-3"),
            (WEIGHT_HEADER, "1.5"),
            (WEIGHT_HEADER, "heavy"),
        ] {
            let error = read(&[(name, value)]).unwrap_err();
            assert_eq!(error.status, http::StatusCode::BAD_REQUEST);
            assert!(error.message.starts_with(name), "{}", error.message);
        }
    }

    #[test]
    fn a_header_given_twice_counts_only_when_both_say_the_same() {
        for (name, first, second) in [
            (PRIORITY_HEADER, "high", "low"),
            (PRIORITY_HEADER, "low", "bogus"),
            (TENANT_HEADER, "u", "t"),
            (WEIGHT_HEADER, "1", "-7"),
        ] {
            let mut headers = headers(&[(name, first)]);
            headers.append(name, second.parse().unwrap());
            let tenant = HeaderName::from_static(TENANT_HEADER);
            let error = requested(&headers, Class::Normal, &tenant).unwrap_err();
            assert_eq!(error.status, http::StatusCode::BAD_REQUEST);
            assert!(error.message.starts_with(name), "{}", error.message);
        }
        let mut alike = headers(&[(PRIORITY_HEADER, "high"), (WEIGHT_HEADER, "2")]);
        alike.append(PRIORITY_HEADER, " High".parse().unwrap());
        alike.append(WEIGHT_HEADER, "02".parse().unwrap());
        let traffic = read_map(&alike).unwrap();
        assert_eq!((traffic.class, traffic.weight), (Class::High, Some(2)), "read alike");
    }

    #[test]
    fn a_field_a_proxy_folded_counts_as_the_fields_it_joined() {
        let traffic = read(&[(PRIORITY_HEADER, "high, High"), (WEIGHT_HEADER, "2,02")]).unwrap();
        assert_eq!((traffic.class, traffic.weight), (Class::High, Some(2)), "read alike");
        // Empty pieces are no value (RFC 9110 §5.6.1).
        let traffic = read(&[(PRIORITY_HEADER, "high, ,"), (WEIGHT_HEADER, ",,3")]).unwrap();
        assert_eq!((traffic.class, traffic.weight), (Class::High, Some(3)));
        for (name, value, words) in [
            (PRIORITY_HEADER, "high, low", "given more than once, with different values"),
            (WEIGHT_HEADER, "2, 3", "given more than once, with different values"),
            (PRIORITY_HEADER, " , ", "must be high, normal or low"),
            (WEIGHT_HEADER, "2, x", "must be a positive integer"),
        ] {
            let error = read(&[(name, value)]).unwrap_err();
            assert_eq!(error.status, http::StatusCode::BAD_REQUEST);
            assert!(error.message.starts_with(name) && error.message.contains(words), "{value}");
        }
    }

    fn read_map(headers: &HeaderMap) -> Result<Traffic, ApiError> {
        requested(headers, Class::Normal, &HeaderName::from_static(TENANT_HEADER))
    }
}
