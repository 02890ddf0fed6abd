//! A chunk-size header, then a stream of replies fed to the parser in those chunks:
//! `decode_resume` must answer as `decode`, and no split may change the answer; see
//! `check_split` for the input layout and the properties.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| quorumlock_fuzz::check_split(data));
