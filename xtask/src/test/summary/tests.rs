//! The parser against output cargo really printed: `crashes.txt` is `cargo test --no-fail-fast`
//! (stdout and stderr together) of a small crate whose test binaries pass, fail, abort, exit
//! and are SIGKILLed, with a doc test; `build-failure.txt` is the same crate with a test file
//! that does not compile. Only the crate's directory was replaced (by `/build/demo`).

use super::*;

const CRASHES: &str = include_str!("crashes.txt");
const BUILD_FAILURE: &str = include_str!("build-failure.txt");

#[test]
fn crashed_binaries_are_failures_with_cargos_reason() {
    let s = Summary::read(CRASHES.lines(), false);
    // lib 1 + fails 1 + killed's 0 + doc 1; `before` passed inside the aborted binary, but
    // with no result line nothing of that binary counts.
    assert_eq!((s.passed, s.failed, s.ignored), (3, 1, 1));
    assert_eq!(
        s.crashed,
        vec![
            Crash {
                binary: "tests/aborts.rs (target/debug/deps/aborts-17498daa054bccd0)".into(),
                reason: Some("signal: 6, SIGABRT: process abort signal".into()),
            },
            Crash {
                binary: "tests/exits.rs (target/debug/deps/exits-4feebf4e3b48f589)".into(),
                reason: Some("exit status: 3".into()),
            },
            Crash {
                binary: "tests/killed.rs (target/debug/deps/killed-5e7a20176004f43c)".into(),
                reason: Some("signal: 9, SIGKILL: kill".into()),
            },
        ]
    );
    assert!(s.build_failures.is_empty());
    assert_eq!(s.unexplained, None);
    assert_eq!(
        s.failures(),
        4,
        "one failed test and three crashed binaries"
    );
    assert_eq!(
        s.failure_lines()[0],
        "crashed (no test result): tests/aborts.rs (target/debug/deps/aborts-17498daa054bccd0) (signal: 6, SIGABRT: process abort signal)"
    );
}

#[test]
fn a_build_failure_is_a_failure_that_names_the_target() {
    let s = Summary::read(BUILD_FAILURE.lines(), false);
    assert_eq!((s.passed, s.failed), (0, 0));
    assert_eq!(
        s.build_failures,
        ["could not compile `scratch` (test \"broken\") due to 1 previous error"]
    );
    assert_eq!(s.failures(), 1);
    assert_eq!(
        s.failure_lines(),
        ["build failed: could not compile `scratch` (test \"broken\") due to 1 previous error"]
    );
}

#[test]
fn a_failed_run_with_no_trace_still_fails_and_a_clean_one_does_not() {
    let s = Summary::read(["error: no such command: `tset`"], false);
    assert_eq!(s.failures(), 1);
    assert!(s.unexplained.is_some());
    let ok = Summary::read(
        [
            "     Running unittests src/lib.rs (target/debug/deps/x-0123456789abcdef)",
            "test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.3s",
            "   Doc-tests x",
            "test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s",
        ],
        true,
    );
    assert_eq!(
        (ok.passed, ok.failed, ok.ignored, ok.failures()),
        (15, 0, 1, 0)
    );
    assert!(ok.failure_lines().is_empty());
}

#[test]
fn a_binary_cut_off_at_the_end_of_the_output_crashed() {
    let s = Summary::read(
        [
            "     Running tests/it/main.rs (target/debug/deps/it-0123456789abcdef)",
            "running 90 tests",
            "test routing::a ... ok",
        ],
        false,
    );
    assert_eq!(s.crashed.len(), 1);
    assert_eq!(s.crashed[0].reason, None);
    assert_eq!(s.failures(), 1);
}
