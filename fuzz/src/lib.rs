//! Check functions for the RESP2 fuzz targets.
//!
//! The checks themselves live in `checks.rs`, which depends only on `quorumlock` and
//! `arbitrary`, so `tests/fuzz_corpus.rs` in the main crate includes the very same file
//! by path and replays the committed corpus on the stable toolchain.

mod checks;

pub use checks::{
    RoundtripInput, check_parse, check_parse_with, check_roundtrip, check_split, check_split_with,
};
