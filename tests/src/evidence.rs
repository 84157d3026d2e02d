//! `tally verify` on a bundle, as every whole-system test of evidence calls it, and
//! beside it a second verifier written from docs/evidence.md alone (no Rust read:
//! tests/verifier/tally_verify.py): both must say valid or invalid alike, and name the
//! same first failing check. A bundle the two read differently is a gap in the docs or
//! a bug in one of them, and fails the test that made it.
//!
//! With `TALLY_EVIDENCE_DUMP=DIR` each bundle checked is also copied to `DIR` with its
//! CA and `tally verify`'s exit code and report (`NNNN.json`, `NNNN.ca.pem`,
//! `NNNN.tally`), a corpus for a verifier written elsewhere to be compared against.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::bins;

static DUMPED: AtomicUsize = AtomicUsize::new(0);

/// `tally verify BUNDLE --ca CA`: exit code and stdout.
pub fn verify(bundle: &Path, ca: &Path) -> (i32, String) {
    let o = Command::new(bins::tally())
        .arg("verify")
        .arg(bundle)
        .arg("--ca")
        .arg(ca)
        .output()
        .unwrap();
    let code = o.status.code().unwrap_or(-1);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    second_verifier_agrees(bundle, ca, code, &out);
    if let Some(dir) = std::env::var_os("TALLY_EVIDENCE_DUMP")
        && bundle.is_file()
        && ca.is_file()
    {
        let dir = Path::new(&dir);
        std::fs::create_dir_all(dir).unwrap();
        let n = DUMPED.fetch_add(1, Ordering::SeqCst);
        let stem = format!("{}-{n:04}", std::process::id());
        std::fs::copy(bundle, dir.join(format!("{stem}.json"))).unwrap();
        std::fs::copy(ca, dir.join(format!("{stem}.ca.pem"))).unwrap();
        std::fs::write(dir.join(format!("{stem}.tally")), format!("{code}\n{out}")).unwrap();
    }
    (code, out)
}

/// The first failing check's name, with any index as `[n]` (`agent_results[3] (event
/// …)` and `agent_results[n]` are one check).
fn first_failure(report: &str) -> Option<String> {
    let line = report.lines().find(|l| l.starts_with("FAIL"))?;
    let name = line["FAIL".len()..].trim_start();
    let end = name.find([':', '(']).unwrap_or(name.len());
    let name = name[..end].trim();
    Some(match name.find('[') {
        Some(i) => format!("{}[n]", &name[..i]),
        None => name.to_string(),
    })
}

/// Runs the docs-only verifier on the same bundle (`TALLY_PYTHON`, else `python3`,
/// with the `cryptography` package) and panics unless it agrees with `tally verify`.
fn second_verifier_agrees(bundle: &Path, ca: &Path, code: i32, report: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/verifier/tally_verify.py");
    let python = std::env::var("TALLY_PYTHON").unwrap_or_else(|_| "python3".into());
    let o = Command::new(&python)
        .arg(script)
        .arg(bundle)
        .arg("--ca")
        .arg(ca)
        .output()
        .unwrap_or_else(|e| panic!("running {python} {script}: {e}"));
    let theirs = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    let their_code = o.status.code().unwrap_or(-1);
    assert!(
        their_code == code && (code != 1 || first_failure(&theirs) == first_failure(report)),
        "the docs-only verifier disagrees with tally verify on {}:\n\
         tally verify (exit {code}):\n{report}\n\
         tests/verifier/tally_verify.py (exit {their_code}):\n{theirs}",
        bundle.display()
    );
}
