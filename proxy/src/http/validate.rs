//! What a JSON body must be, beyond what its parser checks, before it becomes a job: the edge
//! answers 400 for it rather than let a worker find out (422) or a value change on the way. Its
//! integers must fit in 64 bits (`i64` or `u64`), the widest integers msgpack has: serde_json
//! would read a longer one as the nearest `f64`, and the worker would get another number than
//! the client sent. (A msgpack body's check is [`crate::msgpack::check`].)

/// Checks that every integer in a JSON text (one that serde_json accepted) fits in `i64` or
/// `u64`. Numbers with a fraction or an exponent are floats, and stay so.
pub fn json_integers(json: &[u8]) -> Result<(), String> {
    let mut at = 0;
    while let Some(&byte) = json.get(at) {
        match byte {
            b'"' => at = string_end(json, at + 1),
            b'-' | b'0'..=b'9' => {
                let start = at;
                while json.get(at).is_some_and(|b| b"0123456789+-.eE".contains(b)) {
                    at += 1;
                }
                check_integer(&json[start..at])?;
            }
            // Outside strings, the letters of true, false and null are the only other tokens
            // with an `e`; none starts a number.
            _ => at += 1,
        }
    }
    Ok(())
}

/// The index just past the closing quote of the string whose text starts at `at`.
fn string_end(json: &[u8], mut at: usize) -> usize {
    while let Some(offset) =
        json[at.min(json.len())..].iter().position(|&b| b == b'"' || b == b'\\')
    {
        at += offset;
        if json[at] == b'"' {
            return at + 1;
        }
        at += 2; // a backslash and the character it escapes (in \uXXXX, the `u`)
    }
    json.len()
}

fn check_integer(number: &[u8]) -> Result<(), String> {
    let digits = number.strip_prefix(b"-").unwrap_or(number);
    // 18 digits always fit; only longer integers need parsing.
    if digits.len() <= 18 || number.iter().any(|b| b".eE".contains(b)) {
        return Ok(());
    }
    let text = std::str::from_utf8(number).expect("the bytes of a JSON number are ASCII");
    let fits =
        if number[0] == b'-' { text.parse::<i64>().is_ok() } else { text.parse::<u64>().is_ok() };
    if fits {
        return Ok(());
    }
    let shown = if text.len() > 40 { format!("{}…", &text[..40]) } else { text.to_string() };
    Err(format!(
        "the integer {shown} does not fit in 64 bits, the widest integer msgpack (what workers \
         receive) has; send it as a string, or as a float (with a fraction or an exponent) if \
         rounding is acceptable"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_within_64_bits_pass() {
        let body = br#"[0, -0, 18446744073709551615, -9223372036854775808, 1e400, 1.5,
            123456789012345678901234567890.0, 1E+30, true, false, null, {"e": -1}]"#;
        assert_eq!(json_integers(body), Ok(()));
    }

    #[test]
    fn integers_beyond_64_bits_are_refused() {
        for body in [
            &b"12345678901234567890123"[..],
            b"18446744073709551616",
            b"[1, {\"a\": -9223372036854775809}]",
        ] {
            let error = json_integers(body).unwrap_err();
            assert!(error.contains("does not fit in 64 bits"), "{error}");
        }
    }

    #[test]
    fn digits_inside_strings_are_text() {
        let body = br#"["12345678901234567890123", "a \" 99999999999999999999999", "\\"]"#;
        assert_eq!(json_integers(body), Ok(()));
        assert!(json_integers(br#"["\\", 99999999999999999999999]"#).is_err());
    }
}
