//! A worker's own words (its tensors' names, the stage it claims, a decoder's quote of what it
//! could not read) as a log line, a refusal or a client's 500 shows them: cut to a bound, said so
//! when cut, control characters escaped. As they came, a name with a line break forged a log
//! line, and one of megabytes wrote a line as long on every reconnect.

/// A worker's own words (its tensors' names, the stage it claims) as a refusal shows them: at
/// most 200 bytes, quoted with `{:?}` there, so that a name with a line break cannot forge a log
/// line, and one of megabytes does not write one on every reconnect.
pub(super) fn clipped(text: &str) -> &str {
    clip(text, 200)
}

/// A reason or error that may carry a worker's words (a decoder's message quotes what it could
/// not read: an unknown `type` or `status`) as a log line or a client's 500 shows it: at most
/// 300 bytes, said so when cut, its control characters shown escaped (`\u{a}`). As it came, a
/// `type` with a line break wrote a line of the worker's choosing into Corral's text log, and
/// one of megabytes a line as long.
pub(super) fn logged(reason: &impl std::fmt::Display) -> String {
    logged_within(reason, 300)
}

/// [`logged`], at most `max` bytes: a refusal names the connected workers' tensors, of the
/// other worker's choosing.
pub(super) fn logged_within(reason: &impl std::fmt::Display, max: usize) -> String {
    let text = reason.to_string();
    let cut = clip(&text, max);
    let mut shown = String::with_capacity(cut.len());
    cut.chars().for_each(|c| crate::supervisor::output::push_shown(&mut shown, c));
    if cut.len() < text.len() {
        shown.push_str(&format!("… ({} bytes in all)", text.len()));
    }
    shown
}

/// `text`'s first `max` bytes at most, ending on a character's boundary.
fn clip(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Why a worker failed, as each client of its batch is told it: the strings a decoder quoted
/// (`string "…"`) cut to their quotes. A value of the wrong type in a frame may be one client's
/// output (a result's `data` written as `str`), and its quote reached every other client of the
/// batch. The log keeps it whole (within [`logged`]'s bound), for the operator.
pub(super) fn told_clients(why: &str) -> String {
    let mut out = String::with_capacity(why.len());
    let mut chars = why.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '"' {
            // Up to the closing quote (Rust's escapes inside); a reason cut inside ends with it.
            while let Some(c) = chars.next() {
                match c {
                    '\\' => {
                        chars.next();
                    }
                    '"' => break,
                    _ => {}
                }
            }
            out.push_str("…\"");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_told_a_quoted_value_s_type_not_the_value() {
        let why = r#"frame is not a valid message: invalid type: string "alice: \"x\" s3cr3t", expected a byte array"#;
        let told = told_clients(why);
        assert_eq!(
            told,
            r#"frame is not a valid message: invalid type: string "…", expected a byte array"#
        );
        assert_eq!(told_clients(r#"cut "inside"#), r#"cut "…""#);
        assert_eq!(told_clients("unknown status `oops`"), "unknown status `oops`");
    }
}
