//! Every input in `fuzz/seeds/TARGET` and `fuzz/regressions/TARGET` (inputs the fuzzer once
//! crashed on) through that target's property, on a stable toolchain, with the same allocation
//! limit as the fuzz targets.

use std::path::Path;

use corral::http::fuzzing::{body, v2_request, worker_results};
use corral_protocol::fuzzing::FrameBoundedAlloc;

#[global_allocator]
static ALLOC: FrameBoundedAlloc = FrameBoundedAlloc;

fn replay(target: &str, property: fn(&[u8])) {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut count = 0;
    for kind in ["seeds", "regressions"] {
        let dir = fuzz.join(kind).join(target);
        let mut paths: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.file_name().is_some_and(|n| n != ".gitkeep"))
            .collect();
        paths.sort();
        for path in paths {
            eprintln!("{}", path.display());
            property(&std::fs::read(&path).unwrap());
            count += 1;
        }
    }
    assert!(count > 0, "there are seeds");
}

#[test]
fn body_transcoding_seeds_and_past_crashes_hold_the_property() {
    replay("body_transcoding", body);
}

#[test]
fn v2_request_seeds_and_past_crashes_hold_the_property() {
    replay("v2_request", v2_request);
}

#[test]
fn worker_results_seeds_and_past_crashes_hold_the_property() {
    replay("worker_results", worker_results);
}
