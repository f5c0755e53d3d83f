//! A `batch` frame as segments: the few bytes the frame adds around its payloads (length prefix,
//! map and array headers, keys, ids, timeouts, `bin` headers, content types) encoded into one
//! small buffer, interleaved with each job's payload `Bytes` themselves.
//!
//! Why: encoding a batch with `rmp_serde` into a `Vec`, then framing that into a `BytesMut`,
//! copies every payload twice on its way to the socket. Here no payload byte is copied: the
//! segments are handed to the socket in one vectored write (`writev`), so the kernel reads each
//! payload from the memory the request body was read into. [`BatchFrame`] is a [`Buf`] whose
//! [`Buf::chunks_vectored`] fills the `IoSlice`s for that write.
//!
//! The bytes are exactly those of [`crate::encode`] of the same [`ProxyMessage::Batch`] behind
//! [`crate::frame_codec`]'s length prefix (tests check it against the golden frames and random
//! batches); other messages are small and keep the codec.
//!
//! [`ProxyMessage::Batch`]: crate::ProxyMessage::Batch

use std::collections::VecDeque;
use std::io::{self, IoSlice};

use bytes::{Buf, Bytes};

use crate::{Batch, BatchJob, MAX_FRAME_BYTES};

/// One whole `batch` frame, length prefix included, as a sequence of byte segments.
#[derive(Debug, Default)]
pub struct BatchFrame {
    /// Never holds an empty segment: [`Buf::chunk`] must not be empty while bytes remain.
    parts: VecDeque<Bytes>,
    remaining: usize,
}

/// The bytes a job's optional strings take in its frame, keys and headers included.
fn optional_bytes(job: &BatchJob) -> usize {
    let string =
        |key: &str, value: &Option<String>| value.as_ref().map_or(0, |v| key.len() + v.len() + 10);
    string("content_type", &job.content_type)
        + string("traceparent", &job.traceparent)
        + string("tracestate", &job.tracestate)
        + job.payload_at.map_or(0, |_| 32)
}

/// Writes msgpack into a `Vec`, which cannot fail.
const INFALLIBLE: &str = "writing msgpack to a Vec cannot fail";

impl BatchFrame {
    /// Encodes `batch`; the payloads are shared, not copied. A frame over [`MAX_FRAME_BYTES`] is
    /// refused (`InvalidInput`, as the length-delimited codec refuses one) rather than sent to a
    /// worker that would refuse it.
    pub fn new(batch: &Batch) -> io::Result<Self> {
        let jobs = &batch.jobs;
        // Keys, ids, timeouts and headers are under 80 bytes a job, plus its optional strings
        // (content type, trace context) and their keys.
        let per_job: usize = jobs.iter().map(|job| 80 + optional_bytes(job)).sum();
        let mut head = Vec::with_capacity(32 + per_job);
        head.extend_from_slice(&[0; 4]); // the length prefix, filled in below
        rmp::encode::write_map_len(&mut head, 2).expect(INFALLIBLE);
        rmp::encode::write_str(&mut head, "type").expect(INFALLIBLE);
        rmp::encode::write_str(&mut head, "batch").expect(INFALLIBLE);
        rmp::encode::write_str(&mut head, "jobs").expect(INFALLIBLE);
        rmp::encode::write_array_len(&mut head, len_u32(jobs.len())?).expect(INFALLIBLE);
        // Where in `head` each payload goes.
        let mut cuts: Vec<(usize, &[Bytes])> = Vec::with_capacity(jobs.len());
        let mut payload_bytes = 0usize;
        for job in jobs {
            let keys = 3
                + u32::from(job.content_type.is_some())
                + u32::from(job.traceparent.is_some())
                + u32::from(job.tracestate.is_some())
                + u32::from(job.payload_at.is_some());
            rmp::encode::write_map_len(&mut head, keys).expect(INFALLIBLE);
            rmp::encode::write_str(&mut head, "id").expect(INFALLIBLE);
            rmp::encode::write_bin(&mut head, job.id.as_uuid().as_bytes()).expect(INFALLIBLE);
            rmp::encode::write_str(&mut head, "timeout_ms").expect(INFALLIBLE);
            rmp::encode::write_uint(&mut head, job.timeout_ms).expect(INFALLIBLE);
            rmp::encode::write_str(&mut head, "payload").expect(INFALLIBLE);
            rmp::encode::write_bin_len(&mut head, len_u32(job.payload.len())?).expect(INFALLIBLE);
            cuts.push((head.len(), job.payload.segments()));
            payload_bytes += job.payload.len();
            // In the struct's field order, as the codec writes them.
            let optional = [
                ("content_type", &job.content_type),
                ("traceparent", &job.traceparent),
                ("tracestate", &job.tracestate),
            ];
            for (key, value) in optional {
                if let Some(value) = value {
                    rmp::encode::write_str(&mut head, key).expect(INFALLIBLE);
                    rmp::encode::write_str(&mut head, value).expect(INFALLIBLE);
                }
            }
            if let Some(at) = job.payload_at {
                rmp::encode::write_str(&mut head, "payload_at").expect(INFALLIBLE);
                rmp::encode::write_array_len(&mut head, 2).expect(INFALLIBLE);
                at.iter().for_each(|n| {
                    rmp::encode::write_uint(&mut head, *n).expect(INFALLIBLE);
                });
            }
        }
        let body = head.len() - 4 + payload_bytes;
        if body > MAX_FRAME_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a batch frame of {body} bytes is over the {MAX_FRAME_BYTES} limit"),
            ));
        }
        head[..4].copy_from_slice(&len_u32(body)?.to_be_bytes());
        let head = Bytes::from(head);

        let mut frame = Self::default();
        let mut start = 0;
        for (at, segments) in cuts {
            frame.push(head.slice(start..at));
            segments.iter().for_each(|segment| frame.push(segment.clone()));
            start = at;
        }
        frame.push(head.slice(start..));
        Ok(frame)
    }

    /// A frame already encoded in one piece (the simple path for small messages).
    pub fn whole(frame: Bytes) -> Self {
        let mut whole = Self::default();
        whole.push(frame);
        whole
    }

    fn push(&mut self, part: Bytes) {
        if !part.is_empty() {
            self.remaining += part.len();
            self.parts.push_back(part);
        }
    }

    /// The segments left to write, in order.
    pub fn segments(&self) -> impl Iterator<Item = &Bytes> {
        self.parts.iter()
    }
}

fn len_u32(len: usize) -> io::Result<u32> {
    u32::try_from(len).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, "a length does not fit in 32 bits")
    })
}

impl Buf for BatchFrame {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.parts.front().map_or(&[], |part| &part[..])
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut filled = 0;
        for (slot, part) in dst.iter_mut().zip(&self.parts) {
            *slot = IoSlice::new(part);
            filled += 1;
        }
        filled
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(cnt <= self.remaining, "advanced {cnt} bytes past the {} left", self.remaining);
        self.remaining -= cnt;
        while cnt > 0 {
            let front = self.parts.front_mut().expect("bytes remain, so a segment does");
            if cnt < front.len() {
                front.advance(cnt);
                return;
            }
            cnt -= front.len();
            self.parts.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use tokio_util::codec::Encoder;

    use super::*;
    use crate::{encode, frame_codec, BatchJob, JobId, ProxyMessage};

    /// The frame as the codec writes it: `encode`, then the length prefix.
    fn codec_frame(batch: &Batch) -> Vec<u8> {
        let mut out = BytesMut::new();
        let body = encode(&ProxyMessage::Batch(batch.clone()));
        frame_codec().encode(Bytes::from(body), &mut out).unwrap();
        out.to_vec()
    }

    fn collect(mut frame: BatchFrame) -> Vec<u8> {
        let mut out = Vec::with_capacity(frame.remaining());
        while frame.has_remaining() {
            let chunk = frame.chunk();
            assert!(!chunk.is_empty(), "an empty chunk while bytes remain");
            out.extend_from_slice(chunk);
            let n = chunk.len();
            frame.advance(n);
        }
        out
    }

    /// Every segment of every payload is one of the frame's segments, at its own address: not
    /// a copy.
    fn assert_payloads_shared(batch: &Batch, frame: &BatchFrame) {
        for job in batch.jobs.iter().filter(|job| !job.payload.is_empty()) {
            for part in job.payload.segments() {
                let shared = frame.segments().any(|segment| {
                    segment.as_ptr() == part.as_ptr() && segment.len() == part.len()
                });
                assert!(shared, "job {}'s payload was copied", job.id);
            }
        }
    }

    fn golden(name: &str) -> Vec<u8> {
        let path = format!("{}/vectors/{name}.bin", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn id(byte: u8) -> JobId {
        JobId::from_bytes([byte; 16])
    }

    /// The golden batches (worker-protocol/vectors), decoded by the codec and encoded again as
    /// segments, come out byte for byte.
    #[test]
    fn golden_batches_come_out_byte_for_byte() {
        for name in ["batch", "batch_raw", "batch_traced"] {
            let golden = golden(name);
            let Ok(crate::ProxyMessage::Batch(batch)) = crate::decode(&golden[4..]) else {
                panic!("{name} is a batch frame");
            };
            let frame = BatchFrame::new(&batch).unwrap();
            assert_payloads_shared(&batch, &frame);
            assert_eq!(collect(frame), golden, "{name}");
        }
    }

    /// A small deterministic generator (xorshift): random batches without a dependency.
    struct Random(u64);

    impl Random {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        /// A length near one of msgpack's encoding boundaries (fixstr 31, 8-bit 255, 16-bit
        /// 65535), or small.
        fn length(&mut self) -> usize {
            let edges = [0usize, 1, 31, 32, 255, 256, 65_535, 65_536, 70_000];
            if self.below(3) == 0 {
                self.below(200) as usize
            } else {
                edges[self.below(edges.len() as u64) as usize]
            }
        }
    }

    fn random_batch(random: &mut Random) -> Batch {
        let timeouts = [0u64, 127, 128, 255, 256, 65_535, 65_536, u32::MAX as u64 + 1, u64::MAX];
        let jobs = (0..1 + random.below(40))
            .map(|_| {
                let mut id = [0u8; 16];
                id.iter_mut().for_each(|byte| *byte = random.next() as u8);
                let length = random.length();
                let payload =
                    Bytes::from((0..length).map(|i| (i as u8) ^ 0x5a).collect::<Vec<_>>());
                // Half the payloads held as segments (cut at random places), as a large v2 row
                // is: the frame's bytes must not change.
                let payload = if random.below(2) == 0 || payload.len() < 2 {
                    crate::Payload::from(payload)
                } else {
                    let mut cuts: Vec<usize> = (0..1 + random.below(4))
                        .map(|_| random.below(payload.len() as u64) as usize)
                        .collect();
                    cuts.sort_unstable();
                    let mut start = 0;
                    let mut parts = Vec::new();
                    for cut in cuts.into_iter().chain([payload.len()]) {
                        parts.push(payload.slice(start..cut));
                        start = cut;
                    }
                    crate::Payload::from_segments(parts)
                };
                let content_type = match random.below(3) {
                    0 => None,
                    _ => Some("x".repeat(random.length().min(300))),
                };
                let timeout_ms = if random.below(2) == 0 {
                    timeouts[random.below(timeouts.len() as u64) as usize]
                } else {
                    random.next()
                };
                BatchJob {
                    id: JobId::from_bytes(id),
                    timeout_ms,
                    payload,
                    content_type,
                    traceparent: None,
                    tracestate: None,
                    // Some jobs point into shared memory, with offsets and lengths across
                    // msgpack's integer widths.
                    payload_at: (random.below(4) == 0)
                        .then(|| [timeouts[random.below(9) as usize], random.next()]),
                }
            })
            .collect();
        Batch { jobs }
    }

    #[test]
    fn random_batches_match_the_codec_and_share_their_payloads() {
        let mut random = Random(0x9e37_79b9_7f4a_7c15);
        for _ in 0..200 {
            let batch = random_batch(&mut random);
            let frame = BatchFrame::new(&batch).unwrap();
            assert_payloads_shared(&batch, &frame);
            assert_eq!(collect(frame), codec_frame(&batch));
        }
    }

    #[test]
    fn vectored_chunks_follow_partial_writes() {
        let mut random = Random(7);
        let batch = random_batch(&mut random);
        let expected = codec_frame(&batch);
        let mut frame = BatchFrame::new(&batch).unwrap();
        let mut written = Vec::new();
        // Writes that end anywhere, mid-segment included, as a socket's writes do.
        while frame.has_remaining() {
            let mut slices = [IoSlice::new(&[]); 8];
            let filled = frame.chunks_vectored(&mut slices);
            assert!(filled > 0);
            let offered: Vec<u8> =
                slices[..filled].iter().flat_map(|s| s.iter().copied()).collect();
            let n = (1 + random.below(100_000) as usize).min(offered.len());
            written.extend_from_slice(&offered[..n]);
            frame.advance(n);
        }
        assert_eq!(written, expected);
    }

    #[test]
    fn a_frame_over_the_limit_is_refused() {
        let payload = Bytes::from(vec![0u8; MAX_FRAME_BYTES / 2]).into();
        let job = BatchJob {
            id: id(1),
            timeout_ms: 1,
            payload,
            content_type: None,
            traceparent: None,
            tracestate: None,
            payload_at: None,
        };
        let batch = Batch { jobs: vec![job.clone(), job.clone()] };
        let error = BatchFrame::new(&batch).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        assert!(BatchFrame::new(&Batch { jobs: vec![job] }).is_ok());
    }
}
