//! Every input in `fuzz/seeds/body_transcoding` and `fuzz/regressions/body_transcoding` (inputs
//! the fuzzer once crashed on) through the body-transcoding fuzz property, on a stable toolchain,
//! with the same allocation limit as the fuzz target.

use std::path::Path;

use corral::http::fuzzing::body;
use corral_protocol::fuzzing::FrameBoundedAlloc;

#[global_allocator]
static ALLOC: FrameBoundedAlloc = FrameBoundedAlloc;

#[test]
fn seeds_and_past_crashes_hold_the_property() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut count = 0;
    for kind in ["seeds", "regressions"] {
        let dir = fuzz.join(kind).join("body_transcoding");
        let mut paths: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.file_name().is_some_and(|n| n != ".gitkeep"))
            .collect();
        paths.sort();
        for path in paths {
            eprintln!("{}", path.display());
            body(&std::fs::read(&path).unwrap());
            count += 1;
        }
    }
    assert!(count > 0, "there are seeds");
}
