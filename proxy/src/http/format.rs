//! Body formats: content negotiation, JSON ↔ msgpack transcoding, and raw bytes.
//!
//! Workers always see msgpack: a JSON body is transcoded once at the edge (streamed through
//! serde-transcode, no intermediate tree) and dropped, a msgpack body is checked
//! ([`super::validate`]) and passed on as the same buffer, so that a queued request holds one
//! copy of its body. A body of any other media type is raw bytes: it is read into a buffer that
//! starts with room for a msgpack `bin32` header ([`BIN32_HEADER`]), so that the body becomes one
//! msgpack value without a copy. Results travel back the same way; an output that is one msgpack
//! `bin` goes to a client that accepts it as the bytes themselves ([`Negotiation`]).

use bytes::Bytes;
use http::header::ACCEPT;
use http::{HeaderMap, HeaderValue};

use super::error::ApiError;
use super::protocols::v2::tensor;
use super::validate;

/// A body format Corral speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Msgpack,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Msgpack => "application/msgpack",
        }
    }

    /// The format a `Content-Type` names (parameters such as `charset` are ignored).
    pub fn from_media_type(media_type: &str) -> Option<Format> {
        let essence = media_type.split(';').next().unwrap_or("").trim();
        if essence.eq_ignore_ascii_case("application/json") {
            Some(Format::Json)
        } else if essence.eq_ignore_ascii_case("application/msgpack")
            || essence.eq_ignore_ascii_case("application/x-msgpack")
            || essence.eq_ignore_ascii_case("application/vnd.msgpack")
        {
            Some(Format::Msgpack)
        } else {
            None
        }
    }

    /// The format of a request body of this `Content-Type`: also JSON for a structured-syntax
    /// `+json` type (RFC 6839: `application/cloudevents+json`, `application/vnd.api+json`),
    /// which is JSON text whatever it names; taken for raw bytes, such a body reached a
    /// worker as bytes instead of its value. Only bodies: an answer is labelled with the
    /// formats Corral names, so `Accept` is read by [`Format::from_media_type`].
    pub fn of_body(media_type: &str) -> Option<Format> {
        let essence = essence(media_type).to_ascii_lowercase();
        let subtype = essence.strip_prefix("application/").and_then(|s| s.strip_suffix("+json"));
        if subtype.is_some_and(|subtype| !subtype.is_empty()) {
            return Some(Format::Json);
        }
        Format::from_media_type(media_type)
    }
}

/// How a one-shot answer is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The output in a format (transcoded to JSON, or msgpack as it is).
    Format(Format),
    /// The bytes of an output that is one msgpack `bin`, as the body.
    Raw,
}

/// The request's `Accept`, its field lines joined into one list: several lines mean what one
/// comma-joined line means (RFC 9110 5.3), and reading the first alone answered JSON to a client
/// whose second line asked for a stream. None if it has none.
pub fn accept(headers: &HeaderMap) -> Option<HeaderValue> {
    let mut lines = headers.get_all(ACCEPT).iter();
    let first = lines.next()?;
    let mut joined: Option<Vec<u8>> = None;
    for line in lines {
        let joined = joined.get_or_insert_with(|| first.as_bytes().to_vec());
        joined.extend_from_slice(b", ");
        joined.extend_from_slice(line.as_bytes());
    }
    match joined {
        None => Some(first.clone()),
        Some(joined) => HeaderValue::from_bytes(&joined).ok(),
    }
}

/// A request's `Accept`, kept from before its job runs: the form of the answer depends on the
/// output too (raw bytes or not, and of which media type), so it is chosen once the output is
/// there.
///
/// An output that is one msgpack `bin` is answered raw when the client accepts raw bytes: its
/// `Accept` names `application/octet-stream`, the media type the worker named for the output
/// (or its `type/*`), or — for a client that sent raw bytes itself — `*/*` or nothing at all.
/// Otherwise the answer is JSON or msgpack as always (JSON for a raw request whose client did
/// not ask for msgpack). Each form takes the quality of the most specific range naming it
/// ([`Negotiation::choose_for`]); the highest wins, among equals the one listed first.
#[derive(Debug, Clone)]
pub struct Negotiation {
    accept: Option<HeaderValue>,
    /// The format of a non-raw answer when the client leaves it open.
    format: Format,
    /// The request was raw bytes.
    raw_request: bool,
}

impl Negotiation {
    pub fn new(accept: Option<&HeaderValue>, format: Format, raw_request: bool) -> Self {
        Self { accept: accept.cloned(), format, raw_request }
    }

    /// Whether some output could be answered at all; false (a 406 before the job runs) when
    /// neither JSON nor msgpack is acceptable and no range could take raw bytes (every range
    /// refused or unreadable, or `application/*;q=0, */*` from a client that sent no raw bytes).
    /// A range such as `text/html` keeps it open: the worker may name that type for raw bytes,
    /// and only its output tells.
    pub fn satisfiable(&self) -> bool {
        let Some(accept) = &self.accept else { return true };
        let Ok(accept) = accept.to_str() else { return false };
        // JSON or msgpack is acceptable; else some range may take raw bytes (not `*/*` from a
        // client that sent none, which means the structured forms: `application/*;q=0, */*`
        // refuses them all, and had been told so only after its job ran).
        self.structured().is_some()
            || ranges(accept).any(|(media, _)| {
                media.contains('/')
                    && Format::from_media_type(media).is_none()
                    && (media != "*/*" || self.raw_request)
            })
    }

    /// The answer's form for an output, and the worker's media type for it, if it named one;
    /// None means nothing acceptable (406).
    pub fn choose(&self, output: &Bytes, content_type: Option<&HeaderValue>) -> Option<Answer> {
        let raw = crate::msgpack::bin_contents(output).is_some();
        self.choose_for(raw, content_type)
    }

    /// The format of an answer that is never raw bytes (the array of a request of several
    /// items), known before any output is; None means neither JSON nor msgpack is acceptable
    /// (406).
    pub fn structured(&self) -> Option<Format> {
        self.choose_for(false, None).map(|answer| match answer {
            Answer::Format(format) => format,
            Answer::Raw => unreachable!("only an output that is raw bytes is answered raw"),
        })
    }

    /// [`Negotiation::choose`] for an output that is raw bytes (`raw`) or not. Each form the
    /// answer may take has the quality of the most specific range that names it (RFC 9110
    /// 12.5.1: its own type, then `type/*`, then `*/*`): `application/json;q=0.1, */*` gives
    /// JSON 0.1 and msgpack 1, and `image/png;q=0, image/*` refuses PNG bytes. (A wildcard had
    /// lifted whatever a more specific range said, but a refusal by name.) The highest quality
    /// wins; among equals, the form whose range is listed first, then the one the request
    /// suggests ([`Negotiation`]).
    fn choose_for(&self, raw: bool, content_type: Option<&HeaderValue>) -> Option<Answer> {
        let default =
            if raw && self.raw_request { Answer::Raw } else { Answer::Format(self.format) };
        let Some(accept) = &self.accept else {
            return Some(default);
        };
        let accept = accept.to_str().ok()?;
        let named = content_type.and_then(|value| value.to_str().ok()).map(essence);
        // The forms, in the order preferred among equals.
        // The forms, in the order preferred among equals (at most four; no allocation).
        let mut forms = [default; 4];
        let mut count = 0;
        let structured = [Format::Json, Format::Msgpack].map(Answer::Format);
        let raw_form = raw.then_some(Answer::Raw);
        for form in
            [default, Answer::Format(self.format)].into_iter().chain(structured).chain(raw_form)
        {
            if !forms[..count].contains(&form) {
                forms[count] = form;
                count += 1;
            }
        }
        let forms = &forms[..count];
        // How specifically a range names a form: 3 by the worker's own type for raw bytes, 2
        // by a form's type (`application/octet-stream` for raw bytes), 1 by `type/*`, 0 by `*/*`
        // (which takes raw bytes only from a client that sent raw bytes itself). The worker's
        // type outranks octet-stream: `image/png;q=0, application/octet-stream` refuses a PNG.
        let specificity = |form: Answer, media: &str| -> Option<u8> {
            if media == "*/*" {
                return (form != Answer::Raw || self.raw_request).then_some(0);
            }
            match form {
                Answer::Format(format) if Format::from_media_type(media) == Some(format) => Some(2),
                Answer::Format(_) => media.eq_ignore_ascii_case("application/*").then_some(1),
                Answer::Raw if named.is_some_and(|named| media.eq_ignore_ascii_case(named)) => {
                    Some(3)
                }
                Answer::Raw if !accepts_raw(media, named) => None,
                Answer::Raw => Some(if media.ends_with("/*") { 1 } else { 2 }),
            }
        };
        // The best form so far: (quality, where its deciding range is listed, how specific
        // that range is, its place among the forms). On equal quality and range the more
        // specific wins: `application/json` names the worker's own `application/json` bytes
        // more closely than the JSON form (its bytes raw, not re-encoded as numbers).
        // Each form's deciding range, (specificity, quality, where listed), found in one pass
        // over the header: it may be as long as a head (64 KiB by default), and was parsed once
        // per form.
        let mut decided: [Option<(u8, f32, usize)>; 4] = [None; 4];
        for (listed, (media, quality)) in quality_ranges(accept).enumerate() {
            for (place, &form) in forms.iter().enumerate() {
                let Some(specific) = specificity(form, media) else { continue };
                let wins = decided[place].is_none_or(|(was, was_quality, _)| {
                    specific > was || (specific == was && quality > was_quality)
                });
                if wins {
                    decided[place] = Some((specific, quality, listed));
                }
            }
        }
        let mut best: Option<(f32, usize, u8, usize, Answer)> = None;
        for (place, &form) in forms.iter().enumerate() {
            let Some((specific, quality, listed)) =
                decided[place].filter(|&(_, quality, _)| quality > 0.0)
            else {
                continue;
            };
            let better =
                best.is_none_or(|(best_quality, best_listed, best_specific, best_place, _)| {
                    let rank = (listed, std::cmp::Reverse(specific), place);
                    let best_rank = (best_listed, std::cmp::Reverse(best_specific), best_place);
                    quality > best_quality || (quality == best_quality && rank < best_rank)
                });
            if better {
                best = Some((quality, listed, specific, place, form));
            }
        }
        best.map(|(.., form)| form)
    }
}

/// Whether an `Accept` range takes raw bytes of the media type `named` (None: unnamed bytes,
/// `application/octet-stream`, which `application/*` takes too).
fn accepts_raw(media: &str, named: Option<&str>) -> bool {
    if media.eq_ignore_ascii_case(OCTET_STREAM) {
        return true;
    }
    let named = named.unwrap_or(OCTET_STREAM);
    match media.strip_suffix("/*") {
        Some(kind) => named.split('/').next().is_some_and(|k| k.eq_ignore_ascii_case(kind)),
        None => media.eq_ignore_ascii_case(named),
    }
}

/// The media ranges of an `Accept` value with their qualities; refused ones (`q=0`) left out.
pub fn ranges(accept: &str) -> impl Iterator<Item = (&str, f32)> {
    quality_ranges(accept).filter(|&(_, quality)| quality > 0.0)
}

/// Every media range of an `Accept` value with its quality (`q`, either case, 1 if absent or
/// unreadable), refused ones (`q=0`, `Q=0.000`, …) included. A quality is a number from 0 to 1
/// (RFC 9110); Rust's float parser also reads `nan` and `inf`, which are no quality: a NaN range
/// was neither accepted nor refused (406 for a client that accepted JSON), and `inf` outranked 1.
fn quality_ranges(accept: &str) -> impl Iterator<Item = (&str, f32)> {
    accept.split(',').filter_map(|range| {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim();
        let quality = parts
            .filter_map(|p| {
                let (name, value) = p.split_once('=')?;
                name.trim().eq_ignore_ascii_case("q").then_some(value)
            })
            .find_map(|q| q.trim().parse::<f32>().ok().filter(|q| (0.0..=1.0).contains(q)))
            .unwrap_or(1.0);
        (!media.is_empty()).then_some((media, quality))
    })
}

/// Whether a media type is a range (`*/*`, `image/*`): its type or subtype `*` alone (`*` is a
/// token character, `vnd.a*b` a subtype like any).
pub fn is_range(media_type: &str) -> bool {
    let (kind, subtype) = essence(media_type).split_once('/').unwrap_or_default();
    kind.trim() == "*" || subtype.trim() == "*"
}

/// A media type without its parameters: `image/png` of `image/png; q=1`.
pub fn essence(media_type: &str) -> &str {
    media_type.split(';').next().unwrap_or("").trim()
}

/// A media type's `charset` parameter, unquoted, if it has one.
fn charset(media_type: &str) -> Option<&str> {
    media_type.split(';').skip(1).find_map(|parameter| {
        let (name, value) = parameter.split_once('=')?;
        name.trim().eq_ignore_ascii_case("charset").then(|| value.trim().trim_matches('"').trim())
    })
}

/// The `charset` of a JSON body's media type where it names another than UTF-8 (JSON is UTF-8,
/// RFC 8259 8.1; ASCII is UTF-8 too): said when the body does not read as UTF-8 JSON, where
/// serde's "invalid unicode code point" or "expected value" left the client to guess why. (A
/// body that reads is served whatever it says: .NET's `Encoding.Default` names windows-1252
/// for ASCII JSON.)
pub fn charset_is_not_utf8(media_type: &str) -> Option<&str> {
    // An empty one names nothing: "says charset=, but" had been the 415's words.
    let charset = charset(media_type).filter(|charset| !charset.is_empty())?;
    let utf8 = ["utf-8", "utf8", "us-ascii", "ascii"];
    (!utf8.iter().any(|name| charset.eq_ignore_ascii_case(name))).then_some(charset)
}

/// The media type of raw bytes whose sender named none.
pub const OCTET_STREAM: &str = "application/octet-stream";

/// The bytes a raw body's buffer keeps free at its front for its msgpack header: `0xc6` and a
/// 4-byte big-endian length (`bin32`), so that the body becomes one msgpack value in place.
pub const BIN32_HEADER: usize = 5;

/// Writes the `bin32` header into the first [`BIN32_HEADER`] bytes of `buf`, for the body after
/// them.
pub fn write_bin32_header(buf: &mut [u8]) {
    let body = (buf.len() - BIN32_HEADER) as u32;
    buf[0] = 0xc6;
    buf[1..BIN32_HEADER].copy_from_slice(&body.to_be_bytes());
}

/// Longest media type Corral passes on (a request's or a worker's): type and subtype may have up
/// to 127 characters each (RFC 6838), parameters the rest.
pub const MAX_MEDIA_TYPE: usize = 1024;

/// `text` as a header value if it is a media type: `type/subtype`, both tokens (RFC 9110),
/// optionally followed by `;` and parameters, visible ASCII throughout, at most
/// [`MAX_MEDIA_TYPE`] bytes.
pub fn media_type(text: &str) -> Option<HeaderValue> {
    // A header value never starts or ends in whitespace (RFC 9110 5.5): a worker's `a/b\t` would
    // be written into the client's Content-Type as it is.
    if text.len() > MAX_MEDIA_TYPE || text.trim_matches([' ', '\t']) != text {
        return None;
    }
    let (kind, subtype) = essence(text).split_once('/')?;
    let token = |part: &str| {
        !part.is_empty()
            && part.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    if !token(kind) || !token(subtype) {
        return None;
    }
    HeaderValue::from_str(text).ok().filter(|value| value.to_str().is_ok())
}

/// [`Unreadable::Bom`]'s message, which the other protocols' readers give too.
pub const BOM: &str =
    "body is not valid JSON: it begins with a byte order mark, and JSON is UTF-8 without one \
     (RFC 8259)";

/// Whether a body begins with a UTF-8 byte order mark, which JSON must not have (RFC 8259 8.1):
/// each protocol's reader says so rather than "must be a JSON object" of a body that is one.
pub fn begins_with_bom(body: &[u8]) -> bool {
    body.starts_with(b"\xEF\xBB\xBF")
}

/// Why a request body could not be read as its format ([`to_msgpack`]), by kind: a caller that
/// answers some kinds apart (a native client's `charset`, a body sent with no `Content-Type`)
/// matches on them rather than on the message's words. Its text is the 400's message.
#[derive(Debug, Clone, PartialEq)]
pub enum Unreadable {
    /// JSON with a byte order mark in front.
    Bom,
    /// Read as JSON, bytes that are not UTF-8 text ([`is_utf8_text`]); serde's words.
    NotUtf8(String),
    /// Read as JSON, UTF-8 that is no JSON; serde's words.
    NotJson(String),
    /// Anything else: msgpack that is not, JSON holding an integer past 64 bits.
    Other(String),
}

/// Whether a JSON body is UTF-8 text: its bytes UTF-8, and not beginning as UTF-16's or
/// UTF-32's do (a NUL in its first two bytes: JSON's text begins with ASCII, which those write
/// with NULs beside it; .NET's `Encoding.Unicode` writes no byte order mark). A NUL further in is
/// UTF-8 all the same: JSON that is not (a control character in a string), not another encoding.
pub fn is_utf8_text(body: &[u8]) -> bool {
    utf8_text(body).is_ok()
}

/// A JSON body as UTF-8 text ([`is_utf8_text`]), or where it is not (the words for
/// [`Unreadable::NotUtf8`]), for a reader that would not say: serde checks only the strings it
/// reads, and a field it skips (v2's `parameters`, an unknown key) took any bytes. Checked
/// once: a reader given the `&str` (`serde_json::from_str`) does not check its strings again.
pub fn utf8_text(body: &[u8]) -> Result<&str, String> {
    if body.iter().take(2).any(|&byte| byte == 0) {
        return Err("a NUL in its first two bytes, as UTF-16's".into());
    }
    std::str::from_utf8(body)
        .map_err(|error| format!("invalid UTF-8 at byte {}", error.valid_up_to()))
}

/// [`Unreadable::NotUtf8`]'s words after "not valid JSON: ", for a reader that names its body
/// its own way (v2's "the inference request").
pub fn not_utf8_words(detail: &str) -> String {
    format!("it is not UTF-8, which JSON is (RFC 8259) ({detail})")
}

/// Why a JSON reader failed on `body` (`e`, its words), by kind; on the error path only. Each
/// protocol's reader says it so, whatever reader it is.
pub fn json_failure(body: &[u8], e: &dyn std::fmt::Display) -> Unreadable {
    if begins_with_bom(body) {
        Unreadable::Bom
    } else if !is_utf8_text(body) {
        Unreadable::NotUtf8(e.to_string())
    } else {
        Unreadable::NotJson(e.to_string())
    }
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unreadable::Bom => f.write_str(BOM),
            Unreadable::NotUtf8(e) => write!(f, "body is not valid JSON: {}", not_utf8_words(e)),
            Unreadable::NotJson(e) => write!(f, "body is not valid JSON: {e}"),
            Unreadable::Other(message) => f.write_str(message),
        }
    }
}

impl From<Unreadable> for String {
    fn from(problem: Unreadable) -> String {
        problem.to_string()
    }
}

/// Turns a request body into one msgpack value, or says why it is malformed. A msgpack body comes
/// back as itself (no copy); a JSON body is consumed, so that only its transcoding lives on.
pub fn to_msgpack(format: Format, body: Bytes) -> Result<Bytes, Unreadable> {
    to_msgpack_with(format, body, true)
}

/// [`to_msgpack`]; with `exact_integers` false, a JSON integer past 64 bits is the float JSON
/// reads it as rather than a 400: for values converted to a tensor's datatype after (KServe v1
/// instances for a worker that declares tensors), as v2's JSON `data` is. Refused there, the
/// 400 told the client to send it as a string, which a numeric tensor refuses too.
pub fn to_msgpack_with(
    format: Format,
    body: Bytes,
    exact_integers: bool,
) -> Result<Bytes, Unreadable> {
    match format {
        Format::Json => {
            let mut out = Vec::with_capacity(body.len());
            let mut de = serde_json::Deserializer::from_slice(&body);
            // On the error path only: what serde says ("expected value at line 1 column 1",
            // "invalid unicode code point") did not say what was there.
            let invalid = |e: &dyn std::fmt::Display| json_failure(&body, e);
            serde_transcode::transcode(&mut de, &mut rmp_serde::Serializer::new(&mut out))
                .map_err(|e| invalid(&e))?;
            de.end().map_err(|e| invalid(&e))?;
            if exact_integers {
                validate::json_integers(&body).map_err(Unreadable::Other)?;
            }
            // Numbers pack smaller than they are written, mostly, floats larger: the buffer
            // sized by the JSON is rarely the right size, and a queued job would keep its slack.
            out.shrink_to_fit();
            Ok(Bytes::from(out))
        }
        Format::Msgpack => {
            crate::msgpack::check(&body)
                .map_err(|e| Unreadable::Other(format!("body is not valid msgpack: {e}")))?;
            Ok(body)
        }
    }
}

/// Why a worker's output could not be written for its client ([`from_msgpack`]).
#[derive(Debug)]
pub struct Unwritable {
    pub message: String,
    pub kind: UnwritableKind,
}

/// What keeps an output from its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnwritableKind {
    /// The output breaks the protocol (a tensor value that does not fit its own header): the
    /// worker's fault whatever the client accepts, `bad_output`.
    Malformed,
    /// Sound, with no JSON form (NaN, an ext value): `unrepresentable_output`, which msgpack
    /// mends.
    NoJsonForm,
    /// Sound, but the answer made of it would nest past [`crate::msgpack::MAX_DEPTH`] (a
    /// stream's chunks gathered into an array are one level deeper than each): an answer
    /// Corral would not read itself, in either format, `unrepresentable_output`.
    TooDeep,
}

impl Unwritable {
    fn no_json_form(message: impl Into<String>) -> Self {
        Unwritable { message: message.into(), kind: UnwritableKind::NoJsonForm }
    }

    pub fn code(&self) -> &'static str {
        match self.kind {
            UnwritableKind::Malformed => "bad_output",
            UnwritableKind::NoJsonForm | UnwritableKind::TooDeep => "unrepresentable_output",
        }
    }

    /// The client's 500, with `message` as its message.
    pub fn into_error_saying(self, message: String) -> ApiError {
        ApiError::internal(self.code(), message)
    }
}

impl std::fmt::Display for Unwritable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A native client's 500 for an output it cannot be given (from [`from_msgpack`]): for one JSON
/// cannot carry, unlike a protocol's client, it may ask for msgpack instead, and is told so; a
/// malformed output is the worker's fault, which no format mends.
pub fn unrepresentable_for_native(why: Unwritable) -> ApiError {
    if why.kind != UnwritableKind::NoJsonForm {
        return ApiError::internal(why.code(), why.message);
    }
    let message = format!("{why}; msgpack can (Accept: application/msgpack)");
    ApiError::internal("unrepresentable_output", message)
}

/// Turns a worker's msgpack output into the answer format. Tensor values in it (from a worker
/// that also serves Open Inference Protocol v2 clients) are written out as nested arrays first:
/// a native client gets plain values in either format.
pub fn from_msgpack(format: Format, data: Bytes) -> Result<Bytes, Unwritable> {
    from_msgpack_between(format, data, b"", b"")
}

/// [`from_msgpack`], with JSON written between `prefix` and `suffix` into one buffer (a streamed
/// chunk's event framing: one allocation an event, not one for the JSON and one for the event).
/// A msgpack answer is the data as it is, without them.
pub fn from_msgpack_between(
    format: Format,
    data: Bytes,
    prefix: &[u8],
    suffix: &[u8],
) -> Result<Bytes, Unwritable> {
    written(format, data, prefix, suffix, false).map(|(written, _)| written)
}

/// [`from_msgpack`], and what a scan finds in the msgpack it was written from (the output's,
/// or once its tensors were written out, theirs): for a caller that needs it too (how deep it
/// nests), without a second walk of each item.
pub fn from_msgpack_found(
    format: Format,
    data: Bytes,
) -> Result<(Bytes, crate::msgpack::Found), Unwritable> {
    written(format, data, b"", b"", true)
}

/// An answer nested past the bound: sound values gathered into an array one level deeper.
fn too_deep() -> Unwritable {
    let message = format!(
        "the answer would be nested deeper than the {} levels Corral reads (an answer that \
         gathers values into one array, a request's items or a stream's chunks for a client that \
         asked for one answer, is one level deeper than each)",
        crate::msgpack::MAX_DEPTH
    );
    Unwritable { message, kind: UnwritableKind::TooDeep }
}

/// The output written in `format`, and what a scan found in it (where `want_found`, or for
/// JSON, of what was written out; else of the output as it came).
fn written(
    format: Format,
    data: Bytes,
    prefix: &[u8],
    suffix: &[u8],
    want_found: bool,
) -> Result<(Bytes, crate::msgpack::Found), Unwritable> {
    // Each value a worker sends is held to the bound; an answer that gathers a stream's chunks
    // into an array is one level more (it had gone out in msgpack, and JSON's writer refused it
    // saying msgpack could). Found before its tensors are written out, whose expansion would
    // blame the worker's tensor for the array's depth.
    let mut found = crate::msgpack::scan_answer(&data)
        .filter(|found| found.deepest <= crate::msgpack::MAX_DEPTH)
        .ok_or_else(too_deep)?;
    let data = if found.ext {
        let timestamps = match format {
            Format::Json => tensor::Timestamps::AsText,
            Format::Msgpack => tensor::Timestamps::Kept,
        };
        let plain = tensor::expand_with(&data, timestamps).map_err(|e| Unwritable {
            message: format!("the worker's output has a tensor value that is not well formed: {e}"),
            kind: UnwritableKind::Malformed,
        })?;
        // A tensor's floats are plain values only now, nested one level a dimension: found
        // again for JSON, or for a caller that asked (not to write msgpack, which needs none).
        if format == Format::Json || want_found {
            found = crate::msgpack::scan(&plain);
        }
        Bytes::from(plain)
    } else {
        data
    };
    match format {
        Format::Msgpack => Ok((data, found)),
        // serde_json would write `null`: the client would read another value, or none.
        Format::Json if found.non_finite => Err(Unwritable::no_json_form(
            "the worker's output holds NaN or infinity, which JSON cannot carry",
        )),
        // Found again after the tensors and timestamps were written out: an ext of another
        // type. serde would write it as `[type, [bytes]]`, another value than the worker's.
        Format::Json if found.ext => Err(Unwritable::no_json_form(
            "the worker's output holds a msgpack ext value that is neither a tensor nor a \
             timestamp of the years 0 to 9999, which JSON cannot carry",
        )),
        Format::Json => {
            let mut out =
                Vec::with_capacity(prefix.len() + data.len() + data.len() / 2 + suffix.len());
            out.extend_from_slice(prefix);
            let mut de = crate::msgpack::reader(&data[..]);
            serde_transcode::transcode(&mut de, &mut serde_json::Serializer::new(&mut out))
                .map_err(|e| {
                    // serde's words for a map key of bytes, nil, an array or a map: numbers and
                    // booleans are keys too (written as strings), which "must be a string" denied.
                    let why = e.to_string();
                    let why = match why.starts_with("key must be a string") {
                        true => "a map key that is not a string, a number or a boolean (bytes, \
                                 nil, an array or a map) has no JSON form"
                            .to_string(),
                        false => why,
                    };
                    Unwritable::no_json_form(format!(
                        "the worker's output cannot be written as JSON: {why}"
                    ))
                })?;
            out.extend_from_slice(suffix);
            Ok((Bytes::from(out), found))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(format: Format, body: &[u8]) -> Result<Bytes, String> {
        to_msgpack(format, Bytes::copy_from_slice(body)).map_err(String::from)
    }

    #[test]
    fn a_json_charset_other_than_utf8_is_named_quoted_or_not_in_any_case() {
        for (media_type, named) in [
            ("application/json; charset=utf-16", Some("utf-16")),
            ("application/json;charset=\"Windows-1252\"", Some("Windows-1252")),
            ("application/json; CHARSET=latin1; q=1", Some("latin1")),
            ("application/json; charset=UTF-8", None),
            ("application/json; charset=\"utf8\"", None),
            ("application/json; charset=us-ascii", None),
            ("application/json", None),
            // Empty, it names nothing (the 415 had said "charset=, but"); spaces inside quotes
            // are not its name.
            ("application/json; charset=", None),
            ("application/json; charset=\"utf-8 \"", None),
        ] {
            assert_eq!(charset_is_not_utf8(media_type), named, "{media_type}");
        }
    }

    #[test]
    fn json_numbers_reach_the_worker_correctly_rounded() {
        // Found by the body_transcoding fuzz target: serde_json's default float parser can be
        // one unit in the last place off; the worker must get the same f64 as any correct parser
        // (Python's float(), say) would give.
        for (text, bits) in
            [("4.4074073709595514e39", 0x4829e787910aa736_u64), ("0.1", 0x3fb999999999999a)]
        {
            let payload = pack(Format::Json, text.as_bytes()).unwrap();
            let value: f64 = rmp_serde::from_slice(&payload).unwrap();
            assert_eq!(value.to_bits(), bits, "{text}");
        }
    }

    /// The answer for a JSON request whose output is not raw bytes.
    fn accept(value: &'static str) -> Option<Answer> {
        Negotiation::new(Some(&HeaderValue::from_static(value)), Format::Json, false)
            .choose(&Bytes::from_static(&[0x01]), None)
    }

    #[test]
    fn negotiates_accept() {
        let json = Some(Answer::Format(Format::Json));
        let msgpack = Some(Answer::Format(Format::Msgpack));
        let one = Bytes::from_static(&[0x01]);
        assert_eq!(Negotiation::new(None, Format::Msgpack, false).choose(&one, None), msgpack);
        assert_eq!(accept("*/*"), json);
        assert_eq!(accept("application/msgpack"), msgpack);
        assert_eq!(accept("text/html, application/msgpack;q=0.5"), msgpack);
        assert_eq!(accept("application/msgpack;q=0.2, application/json"), json);
        assert_eq!(accept("text/html"), None);
        assert_eq!(accept("application/octet-stream"), None, "the output is not raw bytes");
        assert_eq!(accept("application/json;q=0"), None);
        // A form refused by name stays refused beside a wildcard (RFC 9110 12.5.1), in any
        // spelling of its quality; the wildcard then means the other forms.
        assert_eq!(accept("application/json;q=0, */*"), msgpack);
        assert_eq!(accept("application/json;Q=0.000, application/*"), msgpack);
        assert_eq!(accept("application/msgpack;q=0, */*"), json);
        assert_eq!(accept("application/json;q=0, application/msgpack;q=0, */*"), None);
        // So does a lower quality given by name: the wildcard does not lift it.
        assert_eq!(accept("application/json;q=0.1, */*"), msgpack);
        assert_eq!(accept("application/json;q=0.5, application/*;q=0.9"), msgpack);
        assert_eq!(accept("application/json, */*"), json);
        // `application/*` is more specific than `*/*`: refused, it refuses both forms.
        assert_eq!(accept("application/*;q=0, */*"), None);
        assert_eq!(accept("application/*;q=0.2, */*;q=0.5, application/msgpack;q=0.3"), msgpack);
        assert_eq!(accept("application/json;q=0.9, application/msgpack;q=0.1, */*"), json);
        // No number from 0 to 1 is no quality: read as 1, not as a NaN that is neither
        // accepted nor refused (406), nor an infinity that outranks 1.
        assert_eq!(accept("application/json;q=nan"), json);
        assert_eq!(accept("application/json;q=NaN"), json);
        assert_eq!(accept("application/json, application/msgpack;q=inf"), json);
        assert_eq!(accept("application/json, application/msgpack;q=2"), json);
        assert_eq!(accept("application/msgpack;q=-1"), msgpack);
    }

    #[test]
    fn an_answer_past_the_depth_bound_is_refused_alike_in_every_format() {
        // A stream's chunks of 128 levels, gathered into an array, make 129: msgpack had sent
        // it (an answer Corral would not read), JSON refused it saying msgpack could.
        let array = |levels: usize| Bytes::from([&vec![0x91; levels][..], &[0xc0]].concat());
        for format in [Format::Json, Format::Msgpack] {
            assert!(from_msgpack(format, array(crate::msgpack::MAX_DEPTH)).is_ok());
            // Two levels past, as a wrapping around a gathered array would be: the scan within
            // one level past fails, and that is no value let through either.
            let deeper = from_msgpack(format, array(crate::msgpack::MAX_DEPTH + 2)).unwrap_err();
            assert_eq!(deeper.kind, UnwritableKind::TooDeep, "{deeper}");
            // A tensor value inside is not blamed for the array's depth.
            let mut tensor = vec![0x91; crate::msgpack::MAX_DEPTH + 1];
            crate::http::protocols::v2::tensor::write_tensor(
                &mut tensor,
                crate::http::protocols::v2::tensor::DataType::F32,
                &[],
                &[0; 4],
            );
            let why = from_msgpack(format, Bytes::from(tensor)).unwrap_err();
            assert_eq!(why.kind, UnwritableKind::TooDeep, "{why}");
            let why = from_msgpack(format, array(crate::msgpack::MAX_DEPTH + 1)).unwrap_err();
            assert_eq!(why.kind, UnwritableKind::TooDeep, "{why}");
            let error = unrepresentable_for_native(why);
            assert_eq!(error.code, "unrepresentable_output");
            assert!(error.message.contains("deeper than the 128 levels"), "{}", error.message);
            assert!(!error.message.contains("msgpack can"), "{}", error.message);
        }
    }

    #[test]
    fn a_malformed_tensor_is_the_workers_fault_in_every_format() {
        // 7 bytes of FP32 data for shape [2]: it was `unrepresentable_output`, telling a client
        // that already asked for msgpack to ask for msgpack.
        let mut bad = Vec::new();
        crate::http::protocols::v2::tensor::write_tensor(
            &mut bad,
            crate::http::protocols::v2::tensor::DataType::F32,
            &[2],
            &[0; 7],
        );
        for format in [Format::Json, Format::Msgpack] {
            let why = from_msgpack(format, Bytes::from(bad.clone())).unwrap_err();
            assert!(
                why.kind == UnwritableKind::Malformed && why.message.contains("not well formed"),
                "{why}"
            );
            let error = unrepresentable_for_native(why);
            assert_eq!(error.code, "bad_output");
            assert!(!error.message.contains("msgpack can"), "{}", error.message);
        }
        let nan = Bytes::from(rmp_serde::to_vec(&f64::NAN).unwrap());
        let error = unrepresentable_for_native(from_msgpack(Format::Json, nan).unwrap_err());
        assert_eq!(error.code, "unrepresentable_output");
        assert!(error.message.contains("msgpack can"), "{}", error.message);
    }

    #[test]
    fn an_ext_value_that_is_not_a_tensor_has_no_json_form() {
        // fixext 1 of type 5: serde would write it as `[5,[1]]`, another value.
        let foreign = Bytes::from_static(&[0x91, 0xd4, 0x05, 0x01]);
        let error = from_msgpack(Format::Json, foreign.clone()).unwrap_err();
        assert!(error.message.contains("neither a tensor nor a timestamp"), "{error}");
        assert_eq!(from_msgpack(Format::Msgpack, foreign.clone()).unwrap(), foreign);
    }

    #[test]
    fn a_timestamp_is_rfc3339_text_for_json_and_kept_for_msgpack() {
        // {"at": timestamp 96 of 2026-11-27T23:22:46.5Z}, as msgspec writes an aware datetime.
        let seconds: u64 = 1795821766;
        let both = (500_000_000u64 << 34) | seconds;
        let packed = [&[0x81, 0xa2, b'a', b't', 0xd7, 0xff][..], &both.to_be_bytes()].concat();
        let packed = Bytes::from(packed);
        let json = from_msgpack(Format::Json, packed.clone()).unwrap();
        assert_eq!(&json[..], br#"{"at":"2026-11-27T23:22:46.5Z"}"#);
        assert_eq!(from_msgpack(Format::Msgpack, packed.clone()).unwrap(), packed);
        // Past the year 9999 (timestamp 96: nanoseconds, then 64-bit seconds) RFC 3339 has no
        // form: the answer is refused as for any other ext, not written as something else.
        let far = [&[0xc7, 0x0c, 0xff, 0, 0, 0, 0][..], &300_000_000_000i64.to_be_bytes()].concat();
        let error = from_msgpack(Format::Json, Bytes::from(far)).unwrap_err();
        assert_eq!(error.code(), "unrepresentable_output", "{error}");
    }

    #[test]
    fn an_answer_of_100000_timestamps_is_written_whole() {
        // 1.2 MB of timestamps (32-bit seconds), an answer far past a socket buffer: each one
        // written, none lost or doubled, as many strings as timestamps.
        let mut packed = vec![0xdd];
        packed.extend_from_slice(&100_000u32.to_be_bytes());
        for n in 0..100_000u32 {
            packed.extend_from_slice(&[0xd6, 0xff]);
            packed.extend_from_slice(&n.to_be_bytes());
        }
        let json = from_msgpack(Format::Json, Bytes::from(packed)).unwrap();
        let value: Vec<String> = serde_json::from_slice(&json).unwrap();
        assert_eq!(value.len(), 100_000);
        assert_eq!(value[0], "1970-01-01T00:00:00Z");
        assert_eq!(value[99_999], "1970-01-02T03:46:39Z");
    }

    /// The answer for an output of raw bytes (`b"PNG"`, the worker naming `named`).
    fn raw_answer(
        accept: Option<&'static str>,
        raw_request: bool,
        named: Option<&'static str>,
    ) -> Option<Answer> {
        let accept = accept.map(HeaderValue::from_static);
        let named = named.map(HeaderValue::from_static);
        Negotiation::new(accept.as_ref(), Format::Json, raw_request)
            .choose(&Bytes::from_static(b"\xc4\x03PNG"), named.as_ref())
    }

    #[test]
    fn raw_bytes_go_back_raw_to_a_client_that_accepts_them() {
        let (raw, json) = (Some(Answer::Raw), Some(Answer::Format(Format::Json)));
        let png = Some("image/png");
        // A client that sent raw bytes and left the answer open.
        assert_eq!(raw_answer(None, true, png), raw);
        assert_eq!(raw_answer(Some("*/*"), true, png), raw);
        assert_eq!(raw_answer(Some("*/*"), true, None), raw);
        // A JSON client that left it open gets JSON, as before.
        assert_eq!(raw_answer(None, false, png), json);
        assert_eq!(raw_answer(Some("*/*"), false, png), json);
        // Any client naming octet-stream, the worker's type or its type/*.
        for accept in ["application/octet-stream", "image/png", "IMAGE/PNG", "image/*"] {
            assert_eq!(raw_answer(Some(accept), false, png), raw, "{accept}");
        }
        assert_eq!(raw_answer(Some("application/octet-stream"), false, None), raw);
        // A type that is not the worker's; the worker named none; a refused range.
        assert_eq!(raw_answer(Some("image/jpeg"), true, png), None);
        assert_eq!(raw_answer(Some("image/png"), true, None), None);
        assert_eq!(raw_answer(Some("image/png;q=0"), true, png), None);
        // JSON asked for by name wins over raw bytes the client did not ask for.
        assert_eq!(raw_answer(Some("application/json"), true, png), json);
        // Qualities weigh; among equals the first listed wins.
        assert_eq!(raw_answer(Some("application/json;q=0.5, image/png"), false, png), raw);
        assert_eq!(raw_answer(Some("image/png;q=0.5, application/json"), true, png), json);
        assert_eq!(raw_answer(Some("application/json, image/png"), true, png), json);
        assert_eq!(raw_answer(Some("image/png, application/json"), true, png), raw);
        // The most specific range decides a form's quality: a type refused or given less by
        // name is not lifted by its `type/*`.
        assert_eq!(raw_answer(Some("image/png;q=0, image/*"), true, png), None);
        let weighed = "image/png;q=0.1, image/*;q=0.5, application/json;q=0.3";
        assert_eq!(raw_answer(Some(weighed), true, png), json);
        assert_eq!(raw_answer(Some("image/*"), false, png), raw);
        assert_eq!(raw_answer(Some("image/png;q=0, application/octet-stream"), true, png), None);
        // A worker's own JSON bytes, asked for by their type: raw, not re-encoded as numbers.
        let json_bytes = Some("application/json");
        assert_eq!(raw_answer(Some("application/json"), false, json_bytes), raw);
        // Unnamed bytes are application/octet-stream, which `application/*` takes.
        let only_raw = "application/*, application/json;q=0, application/msgpack;q=0";
        assert_eq!(raw_answer(Some(only_raw), false, None), raw);
        assert_eq!(raw_answer(Some("application/*"), true, None), raw);
    }

    #[test]
    fn an_answer_that_is_never_raw_is_json_or_msgpack_or_refused() {
        let structured = |accept: Option<&'static str>, format, raw_request| {
            let accept = accept.map(HeaderValue::from_static);
            Negotiation::new(accept.as_ref(), format, raw_request).structured()
        };
        let (json, msgpack) = (Some(Format::Json), Some(Format::Msgpack));
        // A raw request that left the answer open: raw bytes would go back raw, this is JSON.
        assert_eq!(structured(None, Format::Json, true), json);
        assert_eq!(structured(Some("*/*"), Format::Json, true), json);
        assert_eq!(structured(None, Format::Msgpack, false), msgpack);
        assert_eq!(structured(Some("application/msgpack"), Format::Json, false), msgpack);
        assert_eq!(structured(Some("application/json;q=0, */*"), Format::Json, false), msgpack);
        // Ranges only raw bytes could meet.
        assert_eq!(structured(Some("application/octet-stream"), Format::Json, true), None);
        assert_eq!(structured(Some("image/*"), Format::Json, true), None);
    }

    #[test]
    fn only_an_accept_that_refuses_everything_is_refused_before_the_job_runs() {
        let satisfiable = |accept: &'static str| {
            Negotiation::new(Some(&HeaderValue::from_static(accept)), Format::Json, false)
                .satisfiable()
        };
        assert!(Negotiation::new(None, Format::Json, false).satisfiable());
        assert!(satisfiable("text/html"), "a worker may name that type for raw bytes");
        assert!(satisfiable("application/json"));
        assert!(!satisfiable("application/json;q=0"));
        assert!(!satisfiable("nonsense"));
        // `application/*` refused is both forms refused, whatever `*/*` says: known before the
        // job runs (raw bytes from `*/*` go only to a client that sent raw bytes).
        assert!(!satisfiable("application/*;q=0, */*"));
        assert!(satisfiable("application/*;q=0, */*, image/*"));
        let raw = Negotiation::new(
            Some(&HeaderValue::from_static("application/*;q=0, */*")),
            Format::Json,
            true,
        );
        assert!(raw.satisfiable());
    }

    #[test]
    fn a_bin32_header_makes_the_body_one_msgpack_value() {
        let mut buf = vec![0u8; BIN32_HEADER];
        buf.extend_from_slice(b"\x89PNG");
        write_bin32_header(&mut buf);
        let mut rest = &buf[..];
        assert_eq!(rmp::decode::read_bin_len(&mut rest).unwrap(), 4);
        assert_eq!(rest, b"\x89PNG");
        assert!(crate::msgpack::check(&buf).is_ok());
        assert_eq!(
            crate::msgpack::bin_contents(&Bytes::from(buf)).as_deref(),
            Some(&b"\x89PNG"[..])
        );
    }

    #[test]
    fn media_types_are_type_slash_subtype_in_visible_ascii() {
        for good in ["image/png", "application/octet-stream", "text/plain; charset=utf-8", "a/b+c"]
        {
            assert!(media_type(good).is_some(), "{good}");
        }
        let long = format!("image/{}", "p".repeat(MAX_MEDIA_TYPE));
        for bad in [
            "",
            "png",
            "image/",
            "/png",
            "image png",
            "image/p ng",
            "imäge/png",
            "a/b\n",
            &long,
            "a/b\t",
            "a/b ",
            " a/b",
        ] {
            assert!(media_type(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn reads_content_types() {
        assert_eq!(Format::from_media_type("application/json; charset=utf-8"), Some(Format::Json));
        assert_eq!(Format::from_media_type("application/x-msgpack"), Some(Format::Msgpack));
        assert_eq!(Format::from_media_type("text/plain"), None);
        assert_eq!(Format::of_body("application/vnd.api+json"), Some(Format::Json));
        assert_eq!(
            Format::of_body("Application/CloudEvents+JSON; charset=utf-8"),
            Some(Format::Json)
        );
        assert_eq!(Format::of_body("application/msgpack"), Some(Format::Msgpack));
        assert_eq!(Format::of_body("image/svg+xml"), None);
        assert_eq!(Format::of_body("text/x+json"), None, "JSON text is an application type");
        assert_eq!(Format::of_body("application/+json"), None, "no subtype");
        assert_eq!(Format::from_media_type("application/vnd.api+json"), None, "not for Accept");
    }

    #[test]
    fn json_round_trips_through_msgpack() {
        let body = br#"{"a": [1, -2, 3.5, "x", null, true]}"#;
        let packed = pack(Format::Json, body).unwrap();
        let back = from_msgpack(Format::Json, packed).unwrap();
        assert_eq!(&back[..], br#"{"a":[1,-2,3.5,"x",null,true]}"#);
    }

    #[test]
    fn a_float_json_cannot_carry_is_refused_for_json_and_kept_for_msgpack() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let packed = Bytes::from(rmp_serde::to_vec(&(1.5f64, bad)).unwrap());
            let error = from_msgpack(Format::Json, packed.clone()).unwrap_err();
            assert!(error.message.contains("NaN or infinity"), "{error}");
            assert_eq!(from_msgpack(Format::Msgpack, packed.clone()).unwrap(), packed);
        }
        let packed = Bytes::from(rmp_serde::to_vec(&[f32::INFINITY]).unwrap());
        assert!(from_msgpack(Format::Json, packed).is_err(), "a float32");
        // A tensor value's floats count once it is written out plainly.
        let mut value = Vec::new();
        tensor::write_tensor(&mut value, tensor::DataType::F32, &[1], &f32::NAN.to_le_bytes());
        assert!(from_msgpack(Format::Json, Bytes::from(value)).is_err(), "in a tensor");
        let fine = Bytes::from(rmp_serde::to_vec(&(1.5f64, f64::MAX, f32::MIN)).unwrap());
        assert!(from_msgpack(Format::Json, fine).is_ok());
    }

    #[test]
    fn malformed_bodies_are_refused() {
        assert!(pack(Format::Json, b"{\"a\": ").is_err());
        assert!(pack(Format::Json, b"1 2").is_err());
        assert!(pack(Format::Json, b"").is_err());
        assert!(pack(Format::Msgpack, &[0x92, 0x01]).is_err(), "truncated array");
        assert!(pack(Format::Msgpack, &[0x01, 0x02]).is_err(), "trailing bytes");
        assert!(pack(Format::Msgpack, &[]).is_err());
        assert!(pack(Format::Msgpack, &[0xc1]).is_err(), "reserved byte");
        assert!(pack(Format::Msgpack, &[0x92, 0x01, 0x02]).is_ok());
    }

    #[test]
    fn deep_msgpack_is_refused_not_overflowed() {
        let mut deep = vec![0x91u8; 1_000_000];
        deep.push(0xc0);
        assert!(pack(Format::Msgpack, &deep).is_err());
        assert!(from_msgpack(Format::Json, Bytes::from(deep)).is_err());
        let mut fine = vec![0x91u8; 100];
        fine.push(0xc0);
        assert!(pack(Format::Msgpack, &fine).is_ok());
    }

    #[test]
    fn deep_json_is_refused_not_overflowed() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert!(pack(Format::Json, deep.as_bytes()).is_err());
    }

    #[test]
    fn integers_stay_exact_or_are_refused() {
        let body = b"[18446744073709551615, -9223372036854775808, 12345678901234567]";
        let values: (u64, i64, u64) =
            rmp_serde::from_slice(&pack(Format::Json, body).unwrap()).unwrap();
        assert_eq!(values, (u64::MAX, i64::MIN, 12_345_678_901_234_567));
        let error = pack(Format::Json, b"{\"id\": 12345678901234567890123}").unwrap_err();
        assert!(error.contains("does not fit in 64 bits"), "{error}");
        assert!(pack(Format::Json, b"1.2345678901234567890123e22").is_ok(), "a float stays one");
    }

    #[test]
    fn msgpack_strings_must_be_utf8() {
        let error = pack(Format::Msgpack, &[0xa2, 0xff, 0xfe]).unwrap_err();
        assert!(error.contains("not valid UTF-8"), "{error}");
        assert!(pack(Format::Msgpack, &[0xc4, 0x02, 0xff, 0xfe]).is_ok(), "bin is raw bytes");
    }

    #[test]
    fn a_msgpack_body_is_passed_on_without_a_copy() {
        let body = Bytes::from_static(&[0x92, 0x01, 0x02]);
        let payload = to_msgpack(Format::Msgpack, body.clone()).unwrap();
        assert_eq!(payload.as_ptr(), body.as_ptr());
    }
}
