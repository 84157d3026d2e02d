//! The reconciliation spec (DESIGN §7): what to compare, how to bisect, what may be
//! reported, and the gates that stop a run. Typed, `deny_unknown_fields`, defaults
//! defined once here, validated with errors that name the key and the file.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tally_common::PrivacyLevel;
use tally_common::config_file::{ConfigError, load_yaml};
use tally_common::period::Granularity;

pub const DEFAULT_FACTOR: u32 = 32;
pub const MAX_FACTOR: u32 = 1024;
pub const DEFAULT_THRESHOLD: u64 = 16_384;
pub const DEFAULT_DEPTH: u32 = 16;
pub const DEFAULT_SAMPLE_LIMIT: u32 = 100;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub name: String,
    pub source: Side,
    pub target: Side,
    /// Key columns; default: the source agent's configured key.
    #[serde(default)]
    pub key: Vec<String>,
    /// Compared columns; default: every column both sides have.
    #[serde(default)]
    pub columns: Vec<String>,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default)]
    pub hash: HashChoice,
    #[serde(default)]
    pub bisection: Bisection,
    #[serde(default)]
    pub reporting: Reporting,
    #[serde(default)]
    pub gates: Gates,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Side {
    pub agent: String,
    pub dataset: String,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Checksum,
    Count,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum HashChoice {
    #[default]
    Auto,
    #[serde(rename = "md5_48")]
    Md5_48,
    #[serde(rename = "sha256_64")]
    Sha256_64,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    #[default]
    Auto,
    Quantile,
    Hash,
    /// Calendar periods of `time_column`, then quantile inside a differing period.
    Time,
}

impl Strategy {
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Auto | Strategy::Quantile => "quantile",
            Strategy::Hash => "hash",
            Strategy::Time => "time",
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Bisection {
    #[serde(default)]
    pub strategy: Strategy,
    #[serde(default = "default_factor")]
    pub factor: u32,
    #[serde(default = "default_threshold")]
    pub threshold: u64,
    #[serde(default = "default_depth")]
    pub depth: u32,
    /// `strategy: time`: the date or timestamp column whose periods form level 1.
    #[serde(default)]
    pub time_column: Option<String>,
    /// `strategy: time`: hour, day (default), week (ISO, from Monday), month, quarter, year.
    #[serde(default)]
    pub time_granularity: Option<Granularity>,
}

fn default_factor() -> u32 {
    DEFAULT_FACTOR
}
fn default_threshold() -> u64 {
    DEFAULT_THRESHOLD
}
fn default_depth() -> u32 {
    DEFAULT_DEPTH
}
fn default_sample_limit() -> u32 {
    DEFAULT_SAMPLE_LIMIT
}

impl Default for Bisection {
    fn default() -> Self {
        Bisection {
            strategy: Strategy::Auto,
            factor: DEFAULT_FACTOR,
            threshold: DEFAULT_THRESHOLD,
            depth: DEFAULT_DEPTH,
            time_column: None,
            time_granularity: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Reporting {
    #[serde(default)]
    pub level: PrivacyLevel,
    #[serde(default = "default_sample_limit")]
    pub sample_limit: u32,
    #[serde(default)]
    pub consent_acknowledged: bool,
}

impl Default for Reporting {
    fn default() -> Self {
        Reporting {
            level: PrivacyLevel::CountOnly,
            sample_limit: DEFAULT_SAMPLE_LIMIT,
            consent_acknowledged: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Gates {
    /// Aggregate queries per side.
    #[serde(default)]
    pub max_queries: Option<u64>,
    /// Rows read, both sides together.
    #[serde(default)]
    pub max_rows_scanned: Option<u64>,
    #[serde(default)]
    pub max_leaves: Option<u64>,
    #[serde(default)]
    pub max_seconds: Option<u64>,
}

impl Spec {
    pub fn load(path: &Path) -> Result<Spec, ConfigError> {
        let spec: Spec = load_yaml(path)?;
        spec.validate(path)?;
        Ok(spec)
    }

    pub fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        let bad = |k: &str, m: &str| Err(ConfigError::invalid(file, k, m));
        if self.name.trim().is_empty() {
            return bad("name", "must not be empty");
        }
        for (k, s) in [("source", &self.source), ("target", &self.target)] {
            if s.agent.is_empty() {
                return bad(
                    &format!("{k}.agent"),
                    "must name an agent of the coordinator config",
                );
            }
            if s.dataset.is_empty() {
                return bad(&format!("{k}.dataset"), "must name a dataset of that agent");
            }
        }
        let b = &self.bisection;
        if !(2..=MAX_FACTOR).contains(&b.factor) {
            return bad("bisection.factor", "must be between 2 and 1024");
        }
        if b.threshold == 0 {
            return bad("bisection.threshold", "must be at least 1");
        }
        if b.depth == 0 || b.depth > 64 {
            return bad("bisection.depth", "must be between 1 and 64");
        }
        match (b.strategy, &b.time_column) {
            (Strategy::Time, None) => {
                return bad(
                    "bisection.time_column",
                    "strategy time needs the date or timestamp column to split by",
                );
            }
            (Strategy::Time, Some(c)) if c.is_empty() => {
                return bad("bisection.time_column", "empty column name");
            }
            (Strategy::Time, _) => {}
            (_, Some(_)) => return bad("bisection.time_column", "only used with strategy: time"),
            (_, None) if b.time_granularity.is_some() => {
                return bad("bisection.time_granularity", "only used with strategy: time");
            }
            _ => {}
        }
        let r = &self.reporting;
        if r.sample_limit == 0 || r.sample_limit > 100_000 {
            return bad("reporting.sample_limit", "must be between 1 and 100000");
        }
        if r.level == PrivacyLevel::Detailed && !r.consent_acknowledged {
            return bad(
                "reporting.consent_acknowledged",
                "level detailed puts row values into the run record: set consent_acknowledged: true to confirm",
            );
        }
        if self.mode == Mode::Count && r.level != PrivacyLevel::CountOnly {
            return bad(
                "reporting.level",
                "mode count compares counts only; keys need mode checksum",
            );
        }
        for (k, v) in [
            ("gates.max_queries", self.gates.max_queries),
            ("gates.max_rows_scanned", self.gates.max_rows_scanned),
            ("gates.max_leaves", self.gates.max_leaves),
            ("gates.max_seconds", self.gates.max_seconds),
        ] {
            if v == Some(0) {
                return bad(k, "0 would stop every run; remove the gate instead");
            }
        }
        let mut seen = std::collections::HashSet::new();
        for c in self.key.iter().chain(&self.columns) {
            if c.is_empty() {
                return bad("columns", "empty column name");
            }
            if self.columns.contains(c) && !seen.insert(c.to_ascii_lowercase()) {
                return bad("columns", &format!("column {c} named twice"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_common::config_file::parse_yaml;

    fn parse(text: &str) -> Result<Spec, ConfigError> {
        let p = Path::new("spec.yaml");
        let s: Spec = parse_yaml(p, text)?;
        s.validate(p)?;
        Ok(s)
    }

    const BASE: &str =
        "name: orders\nsource: { agent: dc1, dataset: orders }\ntarget: { agent: vpc2, dataset: orders }\n";

    #[test]
    fn defaults() {
        let s = parse(BASE).unwrap();
        assert_eq!(s.bisection.factor, 32);
        assert_eq!(s.bisection.threshold, 16384);
        assert_eq!(s.reporting.level, PrivacyLevel::CountOnly);
        assert_eq!(s.reporting.sample_limit, 100);
        assert_eq!(s.hash, HashChoice::Auto);
    }

    #[test]
    fn the_shipped_examples_parse() {
        for f in ["spec.yaml", "spec-hash.yaml", "spec-time.yaml"] {
            let p = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../docs/examples")
                .join(f);
            Spec::load(&p).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn errors_name_file_and_key() {
        let cases = [
            ("bisection: { factor: 2000 }\n", "bisection.factor"),
            (
                "reporting: { level: detailed }\n",
                "reporting.consent_acknowledged",
            ),
            ("gates: { max_queries: 0 }\n", "gates.max_queries"),
            ("bisection: { strategy: random }\n", "strategy"),
            ("url: postgres://x\n", "url"),
            ("bisection: { strategy: time }\n", "bisection.time_column"),
            (
                "bisection: { strategy: time, time_column: at, time_granularity: fortnight }\n",
                "time_granularity",
            ),
            ("bisection: { time_column: at }\n", "bisection.time_column"),
        ];
        for (extra, key) in cases {
            let e = parse(&format!("{BASE}{extra}")).unwrap_err().to_string();
            assert!(e.starts_with("spec.yaml") && e.contains(key), "{extra:?}: {e}");
        }
    }
}
