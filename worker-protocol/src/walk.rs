//! A msgpack value walked marker by marker, with no recursion and no allocation beyond one
//! counter per open container: where it ends, what it holds ([`Found`]), and, when asked, that
//! its strings are UTF-8. Both sides use it: the proxy checks every value it reads with it (its
//! `msgpack` module), and [`crate::codec`] finds where a frame's message ends, reading it with
//! serde straight from the frame's bytes (serde's reading from a `Read` copied every `bin` into
//! a buffer of its own, growing it as it went: a tenth of the proxy's time on 1 MiB answers).

/// What a well-formed msgpack value holds that a JSON answer must treat apart (all false for a
/// malformed one).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Found {
    /// An ext value (a worker's tensor value, which native answers write out plainly).
    pub ext: bool,
    /// A float that is NaN or infinite, which JSON cannot carry.
    pub non_finite: bool,
    /// A `bin` (bytes, which a KServe v1 answer writes as TensorFlow Serving's `{"b64": …}`).
    pub bin: bool,
    /// The most containers open at once: at the bound the value cannot go inside another.
    pub deepest: usize,
}

/// Whether a walk checks that strings are UTF-8, or only moves past them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Strings {
    /// Every `str` must be valid UTF-8 (else the walk fails, naming where).
    Check,
    /// A `str`'s bytes are moved past unread (its value was checked already).
    Skip,
}

/// Walks the one value at the start of `body`, its containers nested at most `max_depth` deep:
/// what it found, and where the value ends.
pub fn walk_one(body: &[u8], strings: Strings, max_depth: usize) -> Result<(Found, usize), String> {
    let mut found = Found::default();
    let mut reader = Reader { body, at: 0, strings };
    // Values still to read in each open container; the body itself is a container of one.
    let mut pending: Vec<u64> = vec![1];
    while let Some(left) = pending.last_mut() {
        if *left == 0 {
            pending.pop();
            continue;
        }
        *left -= 1;
        let at = reader.at;
        let opened = match reader.byte()? {
            0x00..=0x7f | 0xc0 | 0xc2 | 0xc3 | 0xe0..=0xff => None,
            marker @ 0x80..=0x8f => Some(2 * u64::from(marker & 0x0f)),
            marker @ 0x90..=0x9f => Some(u64::from(marker & 0x0f)),
            marker @ 0xa0..=0xbf => {
                reader.string(usize::from(marker & 0x1f), at)?;
                None
            }
            0xc1 => return Err(format!("byte {at}: 0xc1 is never used in msgpack")),
            // bin 8, 16, 32
            marker @ 0xc4..=0xc6 => {
                found.bin = true;
                reader.skip_sized(1usize << (marker - 0xc4), 0)?
            }
            // ext 8, 16, 32: a length, a type byte, the data
            marker @ (0xc7..=0xc9 | 0xd4..=0xd8) => {
                found.ext = true;
                match marker {
                    0xc7 => reader.skip_sized(1, 1)?,
                    0xc8 => reader.skip_sized(2, 1)?,
                    0xc9 => reader.skip_sized(4, 1)?,
                    // fixext 1, 2, 4, 8, 16: a type byte, the data
                    0xd4 => reader.skip(2)?,
                    0xd5 => reader.skip(3)?,
                    0xd6 => reader.skip(5)?,
                    0xd7 => reader.skip(9)?,
                    _ => reader.skip(17)?,
                }
            }
            // float 32, 64
            0xca => {
                let bits = reader.take(4)?.try_into().expect("4 bytes taken");
                found.non_finite |= !f32::from_be_bytes(bits).is_finite();
                None
            }
            0xcb => {
                let bits = reader.take(8)?.try_into().expect("8 bytes taken");
                found.non_finite |= !f64::from_be_bytes(bits).is_finite();
                None
            }
            // uint 8..64; int 8..64
            0xce | 0xd2 => reader.skip(4)?,
            0xcf | 0xd3 => reader.skip(8)?,
            0xcc | 0xd0 => reader.skip(1)?,
            0xcd | 0xd1 => reader.skip(2)?,
            // str 8, 16, 32
            0xd9 => reader.sized_string(1, at)?,
            0xda => reader.sized_string(2, at)?,
            0xdb => reader.sized_string(4, at)?,
            // array 16, 32; map 16, 32
            0xdc => Some(reader.length(2)?),
            0xdd => Some(reader.length(4)?),
            0xde => Some(2 * reader.length(2)?),
            0xdf => Some(2 * reader.length(4)?),
        };
        if let Some(values) = opened {
            // `pending` holds the body's own level besides the containers.
            if pending.len() > max_depth {
                return Err(format!("byte {at}: nested deeper than {max_depth} levels"));
            }
            pending.push(values);
            found.deepest = found.deepest.max(pending.len() - 1);
        }
    }
    Ok((found, reader.at))
}

/// A cursor over a msgpack body; every read says where the body ended too early.
struct Reader<'a> {
    body: &'a [u8],
    at: usize,
    strings: Strings,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.body.len());
        let Some(end) = end else {
            return Err(format!("truncated: {n} more bytes expected at byte {}", self.at));
        };
        let taken = &self.body[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn byte(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn skip(&mut self, n: usize) -> Result<Option<u64>, String> {
        self.take(n)?;
        Ok(None)
    }

    /// A big-endian length of `width` bytes.
    fn length(&mut self, width: usize) -> Result<u64, String> {
        Ok(self.take(width)?.iter().fold(0, |n, &b| n << 8 | u64::from(b)))
    }

    /// Skips a length-prefixed value (`extra` bytes sit between the length and the data).
    fn skip_sized(&mut self, width: usize, extra: usize) -> Result<Option<u64>, String> {
        let length = usize::try_from(self.length(width)?).unwrap_or(usize::MAX);
        self.skip(length.saturating_add(extra))
    }

    fn string(&mut self, length: usize, at: usize) -> Result<(), String> {
        let text = self.take(length)?;
        if self.strings == Strings::Skip {
            return Ok(());
        }
        std::str::from_utf8(text).map(drop).map_err(|e| {
            format!(
                "the string at byte {at} is not valid UTF-8 ({e}); send raw bytes as bin, not str"
            )
        })
    }

    fn sized_string(&mut self, width: usize, at: usize) -> Result<Option<u64>, String> {
        let length = usize::try_from(self.length(width)?).unwrap_or(usize::MAX);
        self.string(length, at)?;
        Ok(None)
    }
}
