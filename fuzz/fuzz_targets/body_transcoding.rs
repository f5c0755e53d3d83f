//! Arbitrary bytes as a request body, read as msgpack and as JSON: never a panic, never an
//! allocation over the frame limit, msgpack passed on unchanged, JSON back as the same value.
#![no_main]

use corral::http::fuzzing::body;
use corral_protocol::fuzzing::FrameBoundedAlloc;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: FrameBoundedAlloc = FrameBoundedAlloc;

fuzz_target!(|data: &[u8]| body(data));
