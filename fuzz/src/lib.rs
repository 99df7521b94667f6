//! Fuzzing flagpost's parsers and evaluators. Each target in `fuzz_targets/` feeds its
//! input to one function of [`checks`], which asserts properties of the result, not just
//! the absence of a panic. `checks` and `lzstring` are shared with the main test suite,
//! which replays the inputs kept in `tests/fixtures/fuzz/<target>/`.

pub mod checks;
pub mod lzstring;
