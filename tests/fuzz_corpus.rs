//! Replays the committed fuzz corpus (`fuzz/corpus/resp_parse/`, `fuzz/corpus/resp_split/`,
//! `fuzz/corpus/resp_roundtrip/`, `fuzz/corpus/session/` and `fuzz/corpus/notice/`)
//! through the same check functions the fuzz targets run (`fuzz/src/checks.rs`,
//! `fuzz/src/session.rs` and `fuzz/src/notice.rs`), on the stable toolchain and without
//! libFuzzer. Every directory under `fuzz/corpus/` must belong
//! to a target replayed here.
//!
//! `cargo test --test fuzz_corpus -- --nocapture` shows how many files were replayed.

#[path = "../fuzz/src/checks.rs"]
mod checks;
#[path = "../fuzz/src/notice.rs"]
mod notice;
#[path = "../fuzz/src/session.rs"]
mod session;

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// Runs `check` on every file of `fuzz/corpus/<target>/`; fails if the directory is
/// missing or empty, or if any file fails (listing every failing file).
fn replay(target: &str, check: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let entries = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus directory {} is missing: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("read corpus directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "corpus directory {} is empty",
        dir.display()
    );

    let mut failures = Vec::new();
    for file in &files {
        let data = fs::read(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        if let Err(cause) = panic::catch_unwind(AssertUnwindSafe(|| check(&data))) {
            let msg = cause
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| cause.downcast_ref::<&str>().copied())
                .unwrap_or("(non-string panic)");
            failures.push(format!("{}: {msg}", file.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} {target} corpus files failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
    println!(
        "replayed {} {target} corpus files from {}",
        files.len(),
        dir.display()
    );
    files.len()
}

#[test]
fn resp_parse_corpus() {
    replay("resp_parse", checks::check_parse);
}

#[test]
fn resp_split_corpus() {
    replay("resp_split", checks::check_split);
}

/// A corpus directory without a replay here would be committed and never checked.
#[test]
fn every_corpus_directory_is_replayed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut names: Vec<String> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus directory {} is missing: {e}", dir.display()))
        .map(|e| e.expect("read corpus directory entry").path())
        .filter(|p| p.is_dir())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "notice",
            "resp_parse",
            "resp_roundtrip",
            "resp_split",
            "session"
        ]
    );
}

#[test]
fn resp_roundtrip_corpus() {
    replay("resp_roundtrip", checks::check_roundtrip);
}

#[test]
fn session_corpus() {
    replay("session", session::check_session);
}

#[test]
fn notice_corpus() {
    replay("notice", notice::check_notice);
}

/// Found by `resp_parse`: a lone `\n` inside a simple-string line. The whole reply
/// `+\n\r\n` used to be accepted while its prefix `+\n` was refused, so the answer
/// depended on how the bytes arrived. Now a lone LF is refused wherever it is.
#[test]
fn a_lone_lf_in_a_line_is_refused_at_every_split() {
    use quorumlock::__private::resp::{Limits, ProtocolError, decode};
    let limits = Limits::default();
    for input in [&b"+\n\r\n"[..], b"+\n\r", b"+\n", b"-x\ny\r\n"] {
        assert_eq!(
            decode(input, &limits),
            Err(ProtocolError::BadLineEnding),
            "{input:?}"
        );
    }
}
