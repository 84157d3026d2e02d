//! The workspace's binaries, built once per test process with the same cargo and
//! target directory as the tests themselves.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The directory holding `tally` and `tally-agent`.
pub fn bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // tests run from <target>/<profile>/deps/<test-binary>, tools from <target>/<profile>/
        let exe = std::env::current_exe().expect("current exe");
        let mut dir = exe.parent().expect("exe dir").to_path_buf();
        if dir.file_name().is_some_and(|n| n == "deps") {
            dir.pop();
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
        // the same package selection and features as the test run (.ci/run exports
        // TALLY_FEATURES), so cargo finds everything fresh instead of relinking variants
        let mut cmd = std::process::Command::new(cargo);
        // without the variables cargo sets for the test process: build scripts that
        // track one (ring's reads CARGO_MANIFEST_DIR) would otherwise be dirty here and
        // again in the next plain `cargo test`, rebuilding rustls and all above it twice
        // per test run
        for (var, _) in std::env::vars_os() {
            let name = var.to_string_lossy();
            if [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
            ]
            .contains(&name.as_ref())
                || name.starts_with("CARGO_PKG_")
                || name.starts_with("CARGO_BIN_")
            {
                cmd.env_remove(&var);
            }
        }
        cmd.args([
            "build",
            "--quiet",
            "--manifest-path",
            manifest,
            "--workspace",
            "--bins",
        ]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        if let Ok(features) = std::env::var("TALLY_FEATURES")
            && !features.is_empty()
        {
            cmd.args(["--features", &features]);
        }
        let status = cmd.status().expect("running cargo build for the binaries");
        assert!(status.success(), "building tally and tally-agent failed");
        assert!(
            dir.join("tally").exists(),
            "{} has no tally binary",
            dir.display()
        );
        dir
    })
    .clone()
}

pub fn tally() -> PathBuf {
    bin_dir().join("tally")
}

pub fn tally_agent() -> PathBuf {
    bin_dir().join("tally-agent")
}
