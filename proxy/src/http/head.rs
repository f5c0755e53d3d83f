//! What a request's head must be before anything reads its body: within the size and field
//! bounds (`--max-header-bytes`, `--max-headers`, counted as [`head_size`] counts), one `Host` on
//! HTTP/1.1, and no field its envelope reads once given twice with values that differ. Each
//! refusal is answered unread, under the request's route label and in its protocol's error
//! shape, and closes the connection: the body may still be on its way.

use http::header::{CONTENT_TYPE, COOKIE, HOST};
use http::{HeaderMap, HeaderName, HeaderValue, Request};

use super::error::ApiError;
use super::{body, format, App};

/// Why the head of `request` is refused before its body is read, if it is; `single` are the
/// fields its envelope reads once (a native route's `Content-Type` and `x-corral-items`, v2's
/// `Inference-Header-Content-Length`).
pub fn refusal<B>(app: &App, request: &Request<B>, single: &[HeaderName]) -> Option<ApiError> {
    let head = head_size(request);
    // The count too: hyper bounds an HTTP/1.1 head's, but not an HTTP/2 one's (14 headers past
    // a bound of 10 had been served). An HTTP/2 client may split its `cookie` into crumbs, one
    // field each (RFC 9113 8.2.3): they count as the one field HTTP/1.1 sends.
    let crumbs = request.headers().get_all(COOKIE).iter().count();
    let fields = request.headers().len() - crumbs.saturating_sub(1);
    if head > app.max_header_bytes {
        return Some(ApiError::head_too_large(head, app.max_header_bytes));
    }
    if fields > app.max_headers {
        return Some(ApiError::too_many_headers(fields, app.max_headers));
    }
    let misaddressed = without_one_host(request);
    misaddressed.or_else(|| conflicting(request.headers(), single)).map(body::before_body)
}

/// An HTTP/1.1 request without exactly one `Host` field: a 400, as RFC 9112 3.2 says a server
/// must answer (it had been served; a request smuggled past a gateway often lacks one, or has
/// two). HTTP/1.0 may leave it out; HTTP/2 names the authority otherwise.
fn without_one_host<B>(request: &Request<B>) -> Option<ApiError> {
    if request.version() != http::Version::HTTP_11 {
        return None;
    }
    let hosts = request.headers().get_all(HOST).iter().count();
    (hosts != 1).then(|| {
        let message = format!("an HTTP/1.1 request has one Host field; this one has {hosts}");
        ApiError::bad_request(message)
    })
}

/// A field of `single` (those the request's envelope reads once) given more than once with
/// values that differ: a 400. Only the first had been read: behind a gateway that adds its own
/// field beside the client's, the body was read as the other form, or as one item where the
/// client sent many. Values that read alike are one value: letter case and spaces aside, and for
/// `Content-Type` its media type without parameters (`application/json` beside
/// `application/json; charset=utf-8`, as gateways add it).
fn conflicting(headers: &HeaderMap, single: &[HeaderName]) -> Option<ApiError> {
    single.iter().find_map(|name| {
        // One field, the usual case: nothing to compare, nothing read.
        headers.get_all(name).iter().nth(1)?;
        let read = |value: &HeaderValue| {
            let text = String::from_utf8_lossy(value.as_bytes());
            let text = if *name == CONTENT_TYPE { format::essence(&text) } else { text.trim() };
            Ok(text.to_ascii_lowercase())
        };
        agreed(headers, name, name.as_str(), read).err()
    })
}

/// What a field says, read from every field line it is given in: lines that read differently
/// (by `read`) are a 400, "`said` is given more than once, with different values". Only the
/// first had been read, so a gateway appending its own value after the client's (Envoy's
/// default) was ignored. Shared by the fields an envelope reads once ([`refusal`]) and the
/// traffic headers (`traffic::requested`).
pub(super) fn agreed<T: PartialEq>(
    headers: &HeaderMap,
    name: &HeaderName,
    said: &str,
    read: impl Fn(&HeaderValue) -> Result<T, ApiError>,
) -> Result<Option<T>, ApiError> {
    let mut fields = headers.get_all(name).iter();
    let Some(first) = fields.next() else { return Ok(None) };
    let value = read(first)?;
    for other in fields {
        if read(other)? != value {
            let message = format!("{said} is given more than once, with different values");
            return Err(ApiError::bad_request(message));
        }
    }
    Ok(Some(value))
}

/// A request's head in bytes, in the shortest form HTTP/1.1 writes it: the request line (its
/// target as sent: a path, or an absolute URL), each header as `name:value` and its line end,
/// and the empty line. hyper bounds the head only by its read buffer, which grows in powers of
/// two from 8 KiB (`--max-header-bytes 20000` took 32 KB heads): this holds the bound to the
/// byte for a client that writes no optional space, and never refuses a head the client kept
/// within it. An HTTP/2 request counts its path and headers the same way (hyper's own h2 list
/// limit, which adds 32 bytes a header, is the stricter there).
pub fn head_size<B>(request: &Request<B>) -> usize {
    let uri = request.uri();
    let path = uri.path_and_query().map_or(1, |p| p.as_str().len());
    let target = match (request.version(), uri.scheme_str(), uri.authority()) {
        (http::Version::HTTP_2, ..) | (_, None, _) | (_, _, None) => path,
        // `http://host` comes back with the path `/` it did not send: count none then.
        (_, Some(scheme), Some(authority)) => {
            let path = if uri.path() == "/" && uri.query().is_none() { 0 } else { path };
            scheme.len() + 3 + authority.as_str().len() + path
        }
    };
    let line = request.method().as_str().len() + 1 + target + " HTTP/1.1\r\n".len();
    let headers: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + 1 + value.len() + 2)
        .sum();
    line + headers + 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_counted_as_its_shortest_http1_form() {
        let request = Request::get("/healthz").header("host", "x").header("x-pad", "aaa");
        let request = request.body(()).unwrap();
        let wire = "GET /healthz HTTP/1.1\r\nhost:x\r\nx-pad:aaa\r\n\r\n";
        assert_eq!(head_size(&request), wire.len());
        let absolute = Request::get("http://example.com:8000/infer?a=1").body(()).unwrap();
        let wire = "GET http://example.com:8000/infer?a=1 HTTP/1.1\r\n\r\n";
        assert_eq!(head_size(&absolute), wire.len());
        let bare = Request::get("http://example.com").body(()).unwrap();
        assert_eq!(head_size(&bare), "GET http://example.com HTTP/1.1\r\n\r\n".len());
        let mut h2 = Request::get("http://example.com/infer").body(()).unwrap();
        *h2.version_mut() = http::Version::HTTP_2;
        assert_eq!(head_size(&h2), "GET /infer HTTP/1.1\r\n\r\n".len(), "h2: its :path");
    }
}
