//! The properties the fuzz targets in `fuzz/` check, kept in the crate so that every input the
//! fuzzer ever crashed on is re-run by `cargo test` (`tests/fuzz_regressions.rs`) on a stable
//! toolchain. Not part of the protocol's API.

use bytes::BytesMut;
use tokio_util::codec::Decoder;

use crate::{decode, encode, ProxyCodec, ProxyMessage, WorkerCodec, WorkerMessage};

/// Arbitrary bytes from a peer: as one frame body, and as a stream fed to both ends' decoders in
/// chunks (sized by the first byte, so the fuzzer explores splits too). Decoding may fail; it must
/// not panic, and what decodes must re-encode to a frame that decodes to the same message.
pub fn frames(data: &[u8]) {
    // The `type`-first reading takes and refuses what serde's reading of the tagged enum does.
    let by_serde = crate::codec::decode_by_serde::<WorkerMessage>(data).ok();
    assert_eq!(decode::<WorkerMessage>(data).ok(), by_serde);
    if let Ok(message) = decode::<WorkerMessage>(data) {
        assert_eq!(decode::<WorkerMessage>(&encode(&message)).ok(), Some(message));
    }
    if let Ok(message) = decode::<ProxyMessage>(data) {
        assert_eq!(decode::<ProxyMessage>(&encode(&message)).ok(), Some(message));
    }
    let chunk = usize::from(data.first().copied().unwrap_or(1)).max(1);
    let trusted = stream(&mut ProxyCodec::default(), data, chunk, false);
    stream(&mut WorkerCodec::default(), data, chunk, false);
    // A peer not yet trusted (the proxy's end before a hello), trusted after its first frame:
    // the same messages, and the same first error, as the trusted reading.
    let untrusted = stream(&mut ProxyCodec::untrusted(), data, chunk, true);
    assert_eq!(untrusted, trusted);
}

/// The messages decoded from `data` fed in chunks, and the error that ended them, if any.
/// `trust` trusts an untrusted codec once it has read a frame.
fn stream<D: Decoder<Error = std::io::Error> + Trust>(
    codec: &mut D,
    data: &[u8],
    chunk: usize,
    trust: bool,
) -> (Vec<D::Item>, Option<String>) {
    let mut buf = BytesMut::new();
    let mut read = Vec::new();
    for piece in data.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(message)) => {
                    if trust {
                        codec.trust();
                    }
                    read.push(message);
                }
                Ok(None) => break,
                // The proxy closes the connection at the first bad frame: nothing after it counts.
                Err(e) => return (read, Some(e.to_string())),
            }
        }
    }
    (read, None)
}

/// What [`stream`] may trust.
trait Trust {
    fn trust(&mut self);
}

impl<In, Out> Trust for crate::codec::MessageCodec<In, Out> {
    fn trust(&mut self) {
        crate::codec::MessageCodec::trust(self);
    }
}

/// A global allocator for the fuzz targets and their regression tests: it panics on any single
/// allocation over the frame limit (plus slack for the length prefix and buffer rounding), so
/// "a hostile length never makes us allocate more than a frame" is checked on every input.
pub struct FrameBoundedAlloc;

/// Largest single allocation [`FrameBoundedAlloc`] allows.
pub const ALLOCATION_LIMIT: usize = crate::MAX_FRAME_BYTES + 64 * 1024;

// SAFETY: every call is forwarded unchanged to the system allocator; the only addition is a
// panic (before allocating) when the request is over the limit.
unsafe impl std::alloc::GlobalAlloc for FrameBoundedAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        check(layout.size());
        std::alloc::System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        std::alloc::System.dealloc(ptr, layout)
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        check(layout.size());
        std::alloc::System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        check(new);
        std::alloc::System.realloc(ptr, layout, new)
    }
}

fn check(size: usize) {
    assert!(size <= ALLOCATION_LIMIT, "an allocation of {size} bytes, over the frame limit");
}
