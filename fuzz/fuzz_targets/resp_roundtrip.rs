//! Structured reply trees, built from the raw bytes with `arbitrary::Unstructured`,
//! encoded and parsed back; see `check_roundtrip` for the properties.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| quorumlock_fuzz::check_roundtrip(data));
