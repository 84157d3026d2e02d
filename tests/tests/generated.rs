//! The correctness generator's fixed seed set (tests/src/generator): every ordered pair of
//! live engines (Spark with the `spark` feature, one case a pair), both hashing paths, both dataset forms, and the strategies drawn per
//! case, against ground truth known by construction. A failure is shrunk and printed
//! as SQL, datasets and spec. `tally-gen --long 1h` hunts with fresh seeds.

use std::io::Write;

use tally_e2e::generator::{Hunt, hunt};

#[test]
fn generated_cases_report_exactly_their_truth() {
    let h = Hunt {
        seed: std::env::var("TALLY_GEN_SEED")
            .ok()
            .map_or(2026, |s| s.parse().expect("TALLY_GEN_SEED")),
        cases_per_pair: 4,
        // a Spark statement takes a second or more: one case a pair with a Spark side
        spark_cases_per_pair: 1,
        ..Hunt::default()
    };
    let f = hunt(&h);
    // straight to the process's stderr (eprintln! of a passing test is captured): the
    // coverage shows in every CI log
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "generator coverage (seed {}):\n{}",
        h.seed,
        f.coverage.report()
    );
    for r in &f.reproductions {
        let _ = writeln!(err, "{r}");
    }
    drop(err);
    assert!(
        f.failures.is_empty(),
        "{} generated runs disagree with their truth (reproductions above)",
        f.failures.len()
    );
    // the seed set must reach every pair, path, form and strategy family
    let dims = &f.coverage.dims;
    let n = tally_e2e::generator::values::Engine::live().len();
    assert_eq!(dims["pair"].len(), n * n, "pairs: {:?}", dims["pair"]);
    for (dim, want) in [("path", 2), ("form", 2)] {
        assert_eq!(dims[dim].len(), want, "{dim}: {:?}", dims[dim]);
    }
    for s in ["quantile", "hash", "time/"] {
        assert!(
            dims["strategy"].keys().any(|k| k.starts_with(s)),
            "no {s} run: {:?}",
            dims["strategy"]
        );
    }
}
