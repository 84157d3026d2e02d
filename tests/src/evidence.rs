//! `tally verify` on a bundle, as every whole-system test of evidence calls it.
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
