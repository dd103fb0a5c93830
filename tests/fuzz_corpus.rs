//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) and every crash kept as a
//! regression (`fuzz/regressions/<target>/<name>`) through the same checks the cargo-fuzz targets
//! run, so plain `cargo test` guards them without libFuzzer or a nightly toolchain.
//!
//! The checks live in `fuzz/src/*.rs` and are included here by path; see `fuzz/README.md` for
//! what each target checks.

use std::panic::{self, AssertUnwindSafe};
use std::path::Path;

#[allow(dead_code)]
#[path = "../fuzz/src/envelope.rs"]
mod envelope;
#[allow(dead_code)]
#[path = "../fuzz/src/sequence.rs"]
mod sequence;
#[allow(dead_code)]
#[path = "../fuzz/src/structured.rs"]
mod structured;
#[allow(dead_code)]
#[path = "../fuzz/src/websocket.rs"]
mod websocket;

/// Runs `check` over every file of `target` in the corpus and the regressions; returns how many.
/// A failing file is named before its panic is passed on.
fn replay(target: &str, check: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("corpus entry").path();
            if path.is_file() {
                files.push(path);
            }
        }
    }
    files.sort();
    for path in &files {
        let data = std::fs::read(path).expect("corpus file");
        if let Err(panic) = panic::catch_unwind(AssertUnwindSafe(|| check(&data))) {
            eprintln!("fuzz input failed its check: {}", path.display());
            panic::resume_unwind(panic);
        }
    }
    files.len()
}

#[test]
fn envelope_corpus() {
    assert!(replay("envelope", envelope::check) > 0, "empty corpus");
}

#[test]
fn envelope_structured_corpus() {
    assert!(
        replay("envelope_structured", structured::check) > 0,
        "empty corpus"
    );
}

#[test]
fn websocket_corpus() {
    assert!(replay("websocket", websocket::check) > 0, "empty corpus");
}

#[test]
fn host_sequence_corpus() {
    assert!(replay("host_sequence", sequence::check) > 0, "empty corpus");
}
