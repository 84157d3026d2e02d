//! An S3-compatible object store on loopback for the file datasets' live tests: moto's
//! server (PyPI `moto[server]`, installed by `.ci/run` into `$TALLY_MOTO_VENV`), one
//! process per test that asks for it, killed when the test lets go.
//!
//! What moto does not emulate, and these tests therefore do not prove: it does not
//! check request signatures (a wrong secret reads too), enforces no bucket policy or
//! IAM, keeps everything in memory, and has none of S3's latency or listing limits. It
//! does speak S3's REST API (path-style requests, ranged GETs, ListObjectsV2), which is
//! what DuckDB's httpfs extension uses to read Parquet and CSV files and expand globs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::proc::{ChildGuard, free_port, wait_for_port};

/// The credentials the tests give DuckDB (moto accepts any).
pub const KEY_ID: &str = "tally-test-key";
pub const SECRET: &str = "tally-test-secret";

/// The venv that holds moto and boto3: `$TALLY_MOTO_VENV`, else `.ci/run`'s cache.
pub fn venv() -> PathBuf {
    let v = std::env::var_os("TALLY_MOTO_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/tally-moto/5.2.6")
        });
    assert!(
        v.join("bin/moto_server").exists(),
        "{}: no moto here; run `bash .ci/run` once (it installs moto into that venv) or set TALLY_MOTO_VENV",
        v.display()
    );
    v
}

/// The directory DuckDB's httpfs extension is in (`$TALLY_DUCKDB_EXTENSIONS`, set by
/// `.ci/run`), which an agent reading `s3://` needs here (nothing is downloaded).
pub fn duckdb_extensions() -> PathBuf {
    let dir = std::env::var_os("TALLY_DUCKDB_EXTENSIONS")
        .map(PathBuf::from)
        .expect("TALLY_DUCKDB_EXTENSIONS is not set: run the tests through `bash .ci/run`, which fetches DuckDB's httpfs extension and sets it");
    assert!(
        dir.is_dir(),
        "TALLY_DUCKDB_EXTENSIONS={}: no such directory",
        dir.display()
    );
    dir
}

pub struct S3Server {
    _guard: ChildGuard,
    /// `127.0.0.1:PORT`.
    pub endpoint: String,
    venv: PathBuf,
}

/// Starts moto's server on a free loopback port.
pub fn start() -> S3Server {
    let venv = venv();
    let port = free_port();
    let guard = ChildGuard::spawn(
        "moto",
        Command::new(venv.join("bin/moto_server"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    )
    .expect("starting moto_server");
    assert!(
        wait_for_port(port, Duration::from_secs(60)),
        "moto_server did not listen on 127.0.0.1:{port}"
    );
    S3Server {
        _guard: guard,
        endpoint: format!("127.0.0.1:{port}"),
        venv,
    }
}

impl S3Server {
    /// Creates `bucket` and puts every file under `prefix/` by its file name.
    pub fn upload(&self, bucket: &str, prefix: &str, files: &[&Path]) {
        let script = r#"
import sys, boto3
endpoint, bucket, prefix, key_id, secret = sys.argv[1:6]
s3 = boto3.client("s3", endpoint_url="http://" + endpoint, region_name="us-east-1",
                  aws_access_key_id=key_id, aws_secret_access_key=secret)
if bucket not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
    s3.create_bucket(Bucket=bucket)
for path in sys.argv[6:]:
    s3.upload_file(path, bucket, prefix + "/" + path.rsplit("/", 1)[-1])
"#;
        let out = Command::new(self.venv.join("bin/python"))
            .args(["-c", script, &self.endpoint, bucket, prefix, KEY_ID, SECRET])
            .args(files)
            .output()
            .expect("python (boto3)");
        assert!(
            out.status.success(),
            "uploading to moto failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
