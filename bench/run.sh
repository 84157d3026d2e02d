#!/usr/bin/env bash
# The benchmark of issue 6 / docs/performance.md, one command:
#   bash bench/run.sh                      # 1M rows, dense and gapped keys, K = 0, 10, 1000,
#                                          # median of 3, and the degenerate drill
#   bash bench/run.sh --rows 10000000      # or any --rows/--k/--repeat
# It builds release binaries (without DuckDB: no C++ to compile), starts its own
# PostgreSQL and MariaDB, installs reladiff from PyPI into ~/.cache/tally-bench/venv, and
# writes the result table to bench/out/latest.md.
#   bash bench/run.sh --target spark --rows 1000000 --rows 10000000
#                                          # PostgreSQL against Spark (issue 35): builds with
#                                          # the spark feature, starts the tests' local Spark
#                                          # Connect server (pyspark venv of .ci/run) and
#                                          # writes bench/out/spark.md
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tally-target}"
target=mariadb
prev=
for a in "$@"; do
  [ "$prev" = --target ] && target="$a"
  prev="$a"
done
if [ "$target" = spark ]; then
  # the binaries the bench starts (tests/src/bins.rs) are built with the same features
  export TALLY_FEATURES="tally-agent/spark,tally-e2e/spark"
  cargo build --release --locked --workspace --bins --features "$TALLY_FEATURES"
  mkdir -p bench/out
  exec "$CARGO_TARGET_DIR/release/tally-bench" "$@" --markdown bench/out/spark.md
fi
VENV="$HOME/.cache/tally-bench/venv"
if [ ! -x "$VENV/bin/reladiff" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "reladiff[postgresql,mysql]==0.6.0"
fi
cargo build --release --locked --workspace --bins
# each side's level alone, through the agent's own code
cargo build --release --locked -p tally-agent --example scanbench
mkdir -p bench/out
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--rows 1000000)
"$CARGO_TARGET_DIR/release/tally-bench" "${args[@]}" --reladiff "$VENV/bin/reladiff" --scanbench "$CARGO_TARGET_DIR/release/examples/scanbench" --markdown bench/out/latest.md
