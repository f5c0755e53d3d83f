//! Arbitrary worker results written into every protocol's answer: never a panic, never an
//! allocation over the frame limit, every answer well-formed in its own protocol.
#![no_main]

use corral::http::fuzzing::worker_results;
use corral_protocol::fuzzing::FrameBoundedAlloc;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: FrameBoundedAlloc = FrameBoundedAlloc;

fuzz_target!(|data: &[u8]| worker_results(data));
