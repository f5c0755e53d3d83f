//! Arbitrary bytes as an Open Inference Protocol v2 request (JSON header, binary tensors): never a
//! panic, never an allocation over the frame limit, one payload per accepted row.
#![no_main]

use corral::http::fuzzing::v2_request;
use corral_protocol::fuzzing::FrameBoundedAlloc;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: FrameBoundedAlloc = FrameBoundedAlloc;

fuzz_target!(|data: &[u8]| v2_request(data));
