//! Every input in `fuzz/seeds/frame_decoder` and `fuzz/regressions/frame_decoder` (inputs the
//! fuzzer once crashed on) through the frame decoder's fuzz property, on a stable toolchain, with
//! the same allocation limit as the fuzz target.

use std::path::Path;

use corral_protocol::fuzzing::{frames, FrameBoundedAlloc};
use corral_protocol::MAX_FRAME_BYTES;

#[global_allocator]
static ALLOC: FrameBoundedAlloc = FrameBoundedAlloc;

fn inputs(kind: &str) -> Vec<(String, Vec<u8>)> {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz").join(kind).join("frame_decoder");
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file() && path.file_name().is_some_and(|n| n != ".gitkeep"))
        .map(|path| (path.display().to_string(), std::fs::read(&path).unwrap()))
        .collect();
    inputs.sort();
    inputs
}

#[test]
fn seeds_and_past_crashes_hold_the_property() {
    let all: Vec<_> = [inputs("seeds"), inputs("regressions")].concat();
    assert!(!all.is_empty(), "the golden vectors at least are seeds");
    for (name, data) in all {
        eprintln!("{name}");
        frames(&data);
    }
}

#[test]
fn a_length_prefix_over_the_limit_allocates_nothing_big() {
    let mut data = ((MAX_FRAME_BYTES + 1) as u32).to_be_bytes().to_vec();
    data.extend_from_slice(b"\x81\xa4type\xa5hello");
    frames(&data);
    frames(&u32::MAX.to_be_bytes());
}
