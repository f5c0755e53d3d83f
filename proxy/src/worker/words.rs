//! A worker's own words (its tensors' names, the stage it claims, a decoder's quote of what it
//! could not read) as a log line, a refusal or a client's 500 shows them: cut to a bound, said so
//! when cut, control characters escaped. As they came, a name with a line break forged a log
//! line, and one of megabytes wrote a line as long on every reconnect.

use corral_protocol::codec::NOT_A_MESSAGE;

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

/// Why a worker failed, as each client of its batch is told it: a decoder's words past
/// [`NOT_A_MESSAGE`] are left to the log. They quote the value it could not read (`string
/// "…"`, ``integer `7` ``), and a value of the wrong type in a frame may be one client's output
/// (a result's `data` written as `str`, or as a number), which reached every other client of
/// the batch. The log keeps it (within [`logged`]'s bound), for the operator.
pub(super) fn told_clients(why: &str) -> String {
    match why.find(NOT_A_MESSAGE) {
        Some(at) => format!("{} (the proxy's log says why)", &why[..at + NOT_A_MESSAGE.len()]),
        None => why.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_told_that_a_frame_was_not_a_message_not_what_was_in_it() {
        for quoted in [r#"string "alice: s3cr3t""#, "integer `7`", "floating point `0.93`"] {
            let why = format!("protocol error: {NOT_A_MESSAGE}: invalid type: {quoted}, expected");
            assert_eq!(
                told_clients(&why),
                format!("protocol error: {NOT_A_MESSAGE} (the proxy's log says why)")
            );
        }
        let index = "protocol error: the result at index 1 of the frame is ok without data";
        assert_eq!(told_clients(index), index);
    }
}
