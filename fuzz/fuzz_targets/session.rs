//! One node's protocol state machine (`Session`) driven by a script of connection events,
//! lock commands, server bytes and reads, checked step by step against a model; see
//! `check_session` for the input layout and the properties.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| quorumlock_fuzz::check_session(data));
