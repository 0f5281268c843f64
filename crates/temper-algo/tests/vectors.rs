//! Runs every JSON case in `$TEMPER_VECTORS` (default: this crate's `tests/vectors`), as
//! `VECTORS.md` specifies: one line per case, then `N passed, M failed`.

use std::path::PathBuf;

#[test]
fn vectors() {
    let dir = std::env::var_os("TEMPER_VECTORS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors"));
    let report = temper_algo::run_vectors(&dir).unwrap_or_else(|e| panic!("{e:#}"));
    println!("{report}");
    assert!(
        !report.cases.is_empty(),
        "no *.json case in {}",
        dir.display()
    );
    assert_eq!(
        report.failed(),
        0,
        "{} of {} vector cases failed",
        report.failed(),
        report.cases.len()
    );
}
