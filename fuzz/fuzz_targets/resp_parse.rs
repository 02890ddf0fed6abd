//! Arbitrary bytes into the RESP2 reply parser; see `check_parse` for the properties.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| quorumlock_fuzz::check_parse(data));
