//! The checks behind the fuzz targets, one module per target. `tests/fuzz_corpus.rs` in the root
//! package includes the same files by path and replays the committed corpus through them, so a
//! plain `cargo test` runs every check without libFuzzer.

pub mod envelope;
pub mod meter;
pub mod sequence;
pub mod structured;
pub mod websocket;
