//! Arbitrary bytes from a worker (or a proxy) into the frame and message decoders: never a panic,
//! never an allocation over the frame limit, and what decodes re-encodes to the same message.
#![no_main]

use corral_protocol::fuzzing::{frames, FrameBoundedAlloc};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: FrameBoundedAlloc = FrameBoundedAlloc;

fuzz_target!(|data: &[u8]| frames(data));
