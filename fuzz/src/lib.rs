//! Check functions for the fuzz targets.
//!
//! The checks themselves live in `checks.rs` (the RESP2 codec), `session.rs` (one
//! node's protocol state machine) and `notice.rs` (one subscriber connection), which depend only on `quorumlock` and `arbitrary`, so
//! `tests/fuzz_corpus.rs` in the main crate includes the very same files by path and
//! replays the committed corpus on the stable toolchain.

mod checks;
mod notice;
mod session;

pub use checks::{
    RoundtripInput, check_parse, check_parse_with, check_roundtrip, check_split, check_split_with,
};
pub use notice::check_notice;
pub use session::check_session;
