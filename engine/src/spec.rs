//! The reconciliation spec (DESIGN §7): what to compare, how to bisect, what may be
//! reported, and the gates that stop a run. Typed, `deny_unknown_fields`, defaults
//! defined once here, validated with errors that name the key and the file.

use std::collections::BTreeMap;
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
    /// Columns left out of the default column list (case-insensitive); never a key column.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Per compared column: the scale (decimal, float) or precision (timestamp, time)
    /// to render it at, instead of the one resolved from the declarations.
    #[serde(default)]
    pub overrides: BTreeMap<String, Override>,
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
    /// Live data: compare only rows up to a bound of one column (DESIGN §5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowSpec>,
    /// Live data: re-check the differing rows after a delay (DESIGN §5 step 6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm: Option<ConfirmSpec>,
    /// Mode measures: the group hierarchy, top level first (DESIGN §5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group_by: Vec<GroupBySpec>,
    /// Mode measures: numeric columns whose SUM, MIN and MAX are compared per group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measures: Vec<String>,
    /// Mode measures: per measure, how far the sides' values may differ and still
    /// agree: `0.01` (absolute) or `0.1%` (relative to the larger magnitude).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tolerance: BTreeMap<String, ToleranceSpec>,
}

/// A `group_by` level: a column's values, or `{column, granularity}`, the calendar
/// periods of a date or timestamp column.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum GroupBySpec {
    Column(String),
    Period { column: String, granularity: String },
}

impl GroupBySpec {
    pub fn column(&self) -> &str {
        match self {
            GroupBySpec::Column(c) | GroupBySpec::Period { column: c, .. } => c,
        }
    }

    pub fn granularity(&self) -> Option<Granularity> {
        match self {
            GroupBySpec::Column(_) => None,
            GroupBySpec::Period { granularity, .. } => Granularity::parse(granularity),
        }
    }
}

/// A tolerance as written: a YAML number or a string (`0.1%`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum ToleranceSpec {
    Int(i64),
    Float(f64),
    Text(String),
}

impl ToleranceSpec {
    /// The tolerance, exactly as written (a float by its shortest decimal text).
    pub fn parse(&self) -> Option<tally_common::measures::Tolerance> {
        let text = match self {
            ToleranceSpec::Int(i) => i.to_string(),
            ToleranceSpec::Float(f) if f.is_finite() => format!("{f}"),
            ToleranceSpec::Float(_) => return None,
            ToleranceSpec::Text(t) => t.clone(),
        };
        tally_common::measures::Tolerance::parse(&text)
    }
}

/// At most this many group_by levels and measures.
pub const MAX_GROUP_LEVELS: usize = 6;
pub const MAX_MEASURES: usize = 32;

/// `confirm: {after, rounds}`: once the rows phase has classified the differing rows,
/// wait `after` and read only those rows' ranges again, `rounds` times; a difference
/// that is gone in any round was in flight (reported as `in_flight`, its key never
/// revealed), one that persists through every round is a difference.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ConfirmSpec {
    pub after: String,
    #[serde(default = "default_rounds")]
    pub rounds: u32,
}

fn default_rounds() -> u32 {
    1
}

/// At most this many confirm rounds, each waiting at most a day.
pub const MAX_CONFIRM_ROUNDS: u32 = 10;
pub const MAX_CONFIRM_AFTER_SECS: u64 = 86_400;
/// A window's lag is at most a hundred years (the bound stays a date).
pub const MAX_LAG_SECS: u64 = 36_500 * 86_400;
/// How long a watermark wait lasts unless the spec says (`window.timeout`), and at most
/// (an agent caps one wait at an hour too).
pub const DEFAULT_WATERMARK_TIMEOUT: &str = "10m";
pub const MAX_WATERMARK_TIMEOUT_SECS: u64 = 3600;

/// `window: {column, as_of | lag}`: only rows whose `column` is at most the bound, on
/// both sides. `as_of` is the bound itself (an integer, a date, or a timestamp: with
/// an offset or `Z` where the column compares as a timestamp with time zone); `lag`
/// (`30s`, `5m`, `2h`, `1d`, or combined: `1h30m`) makes it the coordinator's clock
/// at the start of the run minus the lag. Either way the bound is fixed for the run
/// and recorded with it, so a resumed run reads the same window.
///
/// `watermark: wait` (with `timeout`, default 10m) aligns the sides' moments instead
/// of, or besides, bounding a column: before the drill, and before each confirm round's
/// reads, the source agent reads its replication position and the target agent waits
/// until it has applied it (DESIGN §5).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WindowSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of: Option<AsOf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<WatermarkMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// `window.watermark`: what to do with the replication positions.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WatermarkMode {
    /// Wait until the target has applied the source's position, then read.
    Wait,
}

impl Spec {
    /// The window's column bound, when the window has one (`column` with `as_of` or `lag`).
    pub fn column_window(&self) -> Option<(&str, &WindowSpec)> {
        let w = self.window.as_ref()?;
        w.column.as_deref().map(|c| (c, w))
    }

    /// How long a watermark wait may take, in milliseconds, when the window waits for one.
    pub fn watermark_timeout_ms(&self) -> Option<u64> {
        let w = self.window.as_ref()?;
        w.watermark?;
        let t = w.timeout.as_deref().unwrap_or(DEFAULT_WATERMARK_TIMEOUT);
        Some(parse_duration(t).expect("validated") * 1000)
    }
}

/// A window's bound as written: a YAML integer or a string.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum AsOf {
    Int(i64),
    Text(String),
}

impl AsOf {
    pub fn text(&self) -> String {
        match self {
            AsOf::Int(i) => i.to_string(),
            AsOf::Text(t) => t.clone(),
        }
    }
}

impl Spec {
    fn validate_measures(&self) -> Result<(), (String, String)> {
        let bad = |k: &str, m: String| Err((k.to_string(), m));
        if self.mode != Mode::Measures {
            for (key, set) in [
                ("group_by", !self.group_by.is_empty()),
                ("measures", !self.measures.is_empty()),
                ("tolerance", !self.tolerance.is_empty()),
            ] {
                if set {
                    return bad(key, "applies to mode: measures only".into());
                }
            }
            return Ok(());
        }
        if self.group_by.is_empty() || self.group_by.len() > MAX_GROUP_LEVELS {
            return bad(
                "group_by",
                format!(
                    "mode measures needs 1 to {MAX_GROUP_LEVELS} levels, e.g. [region, {{column: created_at, granularity: day}}]"
                ),
            );
        }
        let mut seen = std::collections::HashSet::new();
        for (i, g) in self.group_by.iter().enumerate() {
            let key = format!("group_by[{i}]");
            if g.column().trim().is_empty() {
                return bad(&key, "empty column name".into());
            }
            if let GroupBySpec::Period { granularity, .. } = g
                && g.granularity().is_none()
            {
                return bad(
                    &format!("{key}.granularity"),
                    format!("{granularity:?} is none of hour, day, week, month, quarter, year"),
                );
            }
            if !seen.insert((g.column().to_ascii_lowercase(), g.granularity())) {
                return bad(&key, format!("{} is grouped by twice", g.column()));
            }
        }
        if self.measures.len() > MAX_MEASURES {
            return bad("measures", format!("at most {MAX_MEASURES}"));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, m) in self.measures.iter().enumerate() {
            if m.trim().is_empty() {
                return bad(&format!("measures[{i}]"), "empty column name".into());
            }
            if !seen.insert(m.to_ascii_lowercase()) {
                return bad(&format!("measures[{i}]"), format!("{m} named twice"));
            }
        }
        let mut tolerated = std::collections::HashSet::new();
        for (m, t) in &self.tolerance {
            let key = format!("tolerance.{m}");
            if !tolerated.insert(m.to_ascii_lowercase()) {
                return bad(
                    &key,
                    format!("{m} is given a tolerance twice (names ignore case)"),
                );
            }
            if !self.measures.iter().any(|x| x.eq_ignore_ascii_case(m)) {
                return bad(&key, format!("{m} is not among the measures"));
            }
            if t.parse().is_none() {
                return bad(
                    &key,
                    "expected a non-negative number (absolute, e.g. 0.01) or a percentage (relative, e.g. 0.1%)".into(),
                );
            }
        }
        if self.confirm.is_some() {
            return bad(
                "confirm",
                "confirm rounds re-check rows; mode measures compares groups".into(),
            );
        }
        Ok(())
    }

    /// The tolerance of measure `m`, if the spec sets one.
    pub fn tolerance_of(&self, m: &str) -> Option<tally_common::measures::Tolerance> {
        self.tolerance
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(m))
            .and_then(|(_, t)| t.parse())
    }
}

/// Seconds of a duration written `30s`, `5m`, `2h`, `1d` or combined (`1h30m`).
pub fn parse_duration(v: &str) -> Option<u64> {
    let mut total: u64 = 0;
    let mut digits = String::new();
    let mut any = false;
    for ch in v.trim().chars() {
        if ch.is_ascii_digit() {
            digits.push(ch);
            continue;
        }
        let unit = match ch {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return None,
        };
        let n: u64 = digits.parse().ok()?;
        total = total.checked_add(n.checked_mul(unit)?)?;
        digits.clear();
        any = true;
    }
    (any && digits.is_empty()).then_some(total)
}

/// `overrides: {col: {scale: n}}` or `{col: {precision: n}}`.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct Override {
    /// Decimal and float columns: fractional digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<u32>,
    /// Timestamp and time columns: fractional-second digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<u32>,
}

/// The largest decimal or float scale an override may set (the wire's limit).
pub const MAX_SCALE: u32 = 38;

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
    /// Per-group COUNT and SUM/MIN/MAX along a group_by hierarchy.
    Measures,
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
    #[serde(rename = "sealed_md5_48")]
    SealedMd5_48,
    #[serde(rename = "sealed_sha256_64")]
    SealedSha256_64,
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
    /// Wall-clock seconds from the run's start; a resumed run counts from its first
    /// start (the `started` event), not from the resume.
    #[serde(default)]
    pub max_seconds: Option<u64>,
}

impl Spec {
    /// The override of `column` (names compare case-insensitively), with the key it is under.
    pub fn override_of(&self, column: &str) -> Option<(&str, &Override)> {
        self.overrides
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(column))
            .map(|(k, v)| (k.as_str(), v))
    }

    pub fn excludes(&self, column: &str) -> bool {
        self.exclude.iter().any(|c| c.eq_ignore_ascii_case(column))
    }

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
        if let Err((k, m)) = self.validate_measures() {
            return Err(ConfigError::invalid(file, k, m));
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
        let mut excluded = std::collections::HashSet::new();
        for c in &self.exclude {
            if c.is_empty() {
                return bad("exclude", "empty column name");
            }
            if !excluded.insert(c.to_ascii_lowercase()) {
                return bad("exclude", &format!("column {c} named twice"));
            }
            if self.key.iter().any(|k| k.eq_ignore_ascii_case(c)) {
                return bad("exclude", &format!("{c} is a key column and cannot be excluded"));
            }
            if self.columns.iter().any(|k| k.eq_ignore_ascii_case(c)) {
                return bad(
                    "exclude",
                    &format!("column {c} is named in both columns and exclude"),
                );
            }
        }
        if let Some(w) = &self.window {
            if w.column.as_ref().is_some_and(|c| c.trim().is_empty()) {
                return bad(
                    "window.column",
                    "must name the column to bound (a date, timestamp or integer)",
                );
            }
            if let Some(t) = &w.timeout {
                if w.watermark.is_none() {
                    return bad(
                        "window.timeout",
                        "bounds a watermark wait: set watermark: wait, or drop it",
                    );
                }
                if parse_duration(t).is_none_or(|d| d == 0 || d > MAX_WATERMARK_TIMEOUT_SECS) {
                    return bad(
                        "window.timeout",
                        &format!("{t:?} is not a duration such as 30s, 5m or 1h, of 1s to 1h"),
                    );
                }
            }
            if w.column.is_none() && (w.as_of.is_some() || w.lag.is_some()) {
                return bad(
                    "window.column",
                    "missing: as_of and lag bound a column; name it (a date, timestamp or integer)",
                );
            }
            match (&w.column, &w.as_of, &w.lag) {
                (None, _, _) if w.watermark.is_some() => {}
                (None, _, _) => {
                    return bad(
                        "window",
                        "set column with as_of or lag, or watermark: wait (or both)",
                    );
                }
                (Some(_), None, None) => {
                    return bad(
                        "window",
                        "set as_of (a fixed bound) or lag (the clock minus a delay)",
                    );
                }
                (Some(_), Some(_), Some(_)) => {
                    return bad("window", "as_of and lag are two ways to set the bound: set one");
                }
                (Some(_), Some(AsOf::Text(t)), None) if t.trim().is_empty() => {
                    return bad("window.as_of", "empty bound");
                }
                (Some(_), None, Some(l)) if parse_duration(l).is_none_or(|d| d > MAX_LAG_SECS) => {
                    return bad(
                        "window.lag",
                        &format!(
                            "{l:?} is not a duration such as 30s, 5m, 2h, 1d or 1h30m, of at most 36500d"
                        ),
                    );
                }
                _ => {}
            }
        }
        if let Some(c) = &self.confirm {
            if parse_duration(&c.after).is_none_or(|d| d > MAX_CONFIRM_AFTER_SECS) {
                return bad(
                    "confirm.after",
                    &format!(
                        "{:?} is not a duration such as 30s, 5m or 1h, of at most 1d",
                        c.after
                    ),
                );
            }
            if c.rounds == 0 || c.rounds > MAX_CONFIRM_ROUNDS {
                return bad(
                    "confirm.rounds",
                    &format!("must be between 1 and {MAX_CONFIRM_ROUNDS}"),
                );
            }
        }
        let mut overridden = std::collections::HashSet::new();
        for (c, o) in &self.overrides {
            let key = format!("overrides.{c}");
            if c.is_empty() {
                return bad("overrides", "empty column name");
            }
            if !overridden.insert(c.to_ascii_lowercase()) {
                return bad(&key, &format!("column {c} overridden twice"));
            }
            if self.excludes(c) {
                return bad(&key, &format!("column {c} is excluded, so it is not compared"));
            }
            match (o.scale, o.precision) {
                (None, None) => {
                    return bad(&key, "set scale (decimal, float) or precision (timestamp, time)");
                }
                (Some(_), Some(_)) => {
                    return bad(
                        &key,
                        "scale (decimal, float) and precision (timestamp, time) never apply to the same column",
                    );
                }
                (Some(n), _) if n > MAX_SCALE => {
                    return bad(&format!("{key}.scale"), &format!("must be at most {MAX_SCALE}"));
                }
                (_, Some(n)) if n > tally_common::canonical::MAX_TIME_PRECISION => {
                    return bad(
                        &format!("{key}.precision"),
                        &format!("must be at most {}", tally_common::canonical::MAX_TIME_PRECISION),
                    );
                }
                _ => {}
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
        for f in [
            "spec.yaml",
            "spec-hash.yaml",
            "spec-time.yaml",
            "spec-measures.yaml",
        ] {
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
            ("excludes: [tags]\n", "excludes"),
            ("overrides: { amount: { digits: 2 } }\n", "digits"),
        ];
        for (extra, key) in cases {
            let e = parse(&format!("{BASE}{extra}")).unwrap_err().to_string();
            assert!(e.starts_with("spec.yaml") && e.contains(key), "{extra:?}: {e}");
        }
    }

    fn parse_extra(extra: &str) -> Result<Spec, String> {
        let p = Path::new("spec.yaml");
        let s: Spec = parse_yaml(p, &format!("{BASE}{extra}")).map_err(|e| e.to_string())?;
        s.validate(p).map_err(|e| e.to_string())?;
        Ok(s)
    }

    #[test]
    fn exclude_and_overrides_parse() {
        let s = parse_extra(
            "exclude: [tags, Geom]\noverrides: { amount: { scale: 2 }, Created_At: { precision: 3 } }\n",
        )
        .unwrap();
        assert_eq!(s.exclude, vec!["tags", "Geom"]);
        assert!(s.excludes("GEOM") && s.excludes("tags") && !s.excludes("amount"));
        assert_eq!(
            s.override_of("AMOUNT"),
            Some((
                "amount",
                &Override {
                    scale: Some(2),
                    precision: None
                }
            ))
        );
        assert_eq!(s.override_of("created_at").unwrap().1.precision, Some(3));
        assert_eq!(s.override_of("other"), None);
        let d = parse_extra("").unwrap();
        assert!(d.exclude.is_empty() && d.overrides.is_empty());
    }

    #[test]
    fn exclude_and_override_errors_name_the_key_and_the_column() {
        let cases = [
            (
                "key: [id]\nexclude: [ID]\n",
                "exclude",
                "ID is a key column and cannot be excluded",
            ),
            (
                "columns: [amount, tags]\nexclude: [Tags]\n",
                "exclude",
                "column Tags is named in both columns and exclude",
            ),
            ("exclude: [tags, TAGS]\n", "exclude", "column TAGS named twice"),
            ("exclude: ['']\n", "exclude", "empty column name"),
            ("overrides: { amount: {} }\n", "overrides.amount", "set scale"),
            (
                "overrides: { amount: { scale: 2, precision: 3 } }\n",
                "overrides.amount",
                "never apply to the same column",
            ),
            (
                "overrides: { amount: { scale: 39 } }\n",
                "overrides.amount.scale",
                "at most 38",
            ),
            (
                "overrides: { at: { precision: 10 } }\n",
                "overrides.at.precision",
                "at most 9",
            ),
            (
                "exclude: [tags]\noverrides: { TAGS: { scale: 1 } }\n",
                "overrides.TAGS",
                "column TAGS is excluded",
            ),
            (
                "overrides: { amount: { scale: 1 }, AMOUNT: { scale: 2 } }\n",
                "overrides.",
                "overridden twice",
            ),
            ("overrides: { amount: { scale: -1 } }\n", "scale", ""),
        ];
        for (extra, key, message) in cases {
            let e = parse_extra(extra).unwrap_err();
            assert!(
                e.starts_with("spec.yaml") && e.contains(key) && e.contains(message),
                "{extra:?}: {e}"
            );
        }
    }

    #[test]
    fn windows_parse_and_bad_ones_name_the_key() {
        let s = parse_extra("window: { column: updated_at, lag: 1h30m }").unwrap();
        let w = s.window.clone().unwrap();
        assert_eq!(
            (w.column.as_deref(), w.lag.as_deref()),
            (Some("updated_at"), Some("1h30m"))
        );
        assert_eq!(s.watermark_timeout_ms(), None);
        // a watermark alone, or with a column bound; its timeout defaults to 10 minutes
        let s = parse_extra("window: { watermark: wait }").unwrap();
        assert_eq!(s.watermark_timeout_ms(), Some(600_000));
        assert!(s.column_window().is_none());
        let s = parse_extra("window: { column: at, lag: 5s, watermark: wait, timeout: 90s }").unwrap();
        assert_eq!(s.watermark_timeout_ms(), Some(90_000));
        assert_eq!(s.column_window().map(|(c, _)| c), Some("at"));
        let s = parse_extra("window: { column: seq, as_of: 918273645 }").unwrap();
        assert_eq!(s.window.unwrap().as_of, Some(AsOf::Int(918_273_645)));
        let s = parse_extra("window: { column: at, as_of: 2026-12-01T00:00:00Z }").unwrap();
        assert_eq!(
            s.window.unwrap().as_of,
            Some(AsOf::Text("2026-12-01T00:00:00Z".into()))
        );
        assert_eq!(parse_duration("90s"), Some(90));
        assert_eq!(parse_duration("1d2h"), Some(93_600));
        for bad in ["", "5", "m", "5 m", "5x", "-5m"] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
        for (extra, key) in [
            ("window: { column: at }", "window"),
            ("window: { column: at, as_of: x, lag: 5m }", "window"),
            ("window: { column: at, lag: soon }", "window.lag"),
            ("window: { column: at, lag: 99999999999999d }", "window.lag"),
            ("window: { column: at, lag: 36501d }", "window.lag"),
            ("window: { column: '', lag: 5m }", "window.column"),
            ("window: { column: at, lag: 5m, watermark: soon }", "watermark"),
            ("window: { lag: 5m, watermark: wait }", "window.column"),
            ("window: { as_of: 3 }", "window.column"),
            ("window: { }", "window"),
            ("window: { watermark: wait, timeout: 2h }", "window.timeout"),
            ("window: { watermark: wait, timeout: 0s }", "window.timeout"),
            ("window: { watermark: wait, timeout: soon }", "window.timeout"),
            ("window: { column: at, lag: 5m, timeout: 5m }", "window.timeout"),
        ] {
            let e = parse_extra(extra).unwrap_err();
            assert!(e.contains(key), "{extra}: {e}");
        }
    }

    #[test]
    fn measures_specs_parse_and_bad_ones_name_the_key() {
        let s = parse_extra(
            "mode: measures\ngroup_by: [region, { column: at, granularity: day }]\nmeasures: [amount, qty]\n\
             tolerance: { amount: 0.01, qty: 0.1%, AMOUNT2: 1 }",
        )
        .unwrap_err();
        assert!(s.contains("tolerance.AMOUNT2"), "{s}");
        let s = parse_extra(
            "mode: measures\ngroup_by: [region, { column: at, granularity: day }]\nmeasures: [amount, qty]\n\
             tolerance: { amount: 0.01, Qty: 0.1% }",
        )
        .unwrap();
        assert_eq!(s.group_by[1].granularity(), Some(Granularity::Day));
        assert_eq!(s.tolerance_of("AMOUNT").unwrap().to_string(), "0.01");
        assert_eq!(s.tolerance_of("qty").unwrap().to_string(), "0.1%");
        assert_eq!(s.tolerance_of("region"), None);
        for (extra, key) in [
            ("mode: measures\nmeasures: [amount]", "group_by"),
            ("mode: measures\ngroup_by: [region, region]", "group_by[1]"),
            (
                "mode: measures\ngroup_by: [{ column: at, granularity: fortnight }]",
                "group_by[0].granularity",
            ),
            ("mode: measures\ngroup_by: ['']", "group_by[0]"),
            ("mode: measures\ngroup_by: [r]\nmeasures: [a, A]", "measures[1]"),
            (
                "mode: measures\ngroup_by: [r]\nmeasures: [a]\ntolerance: { a: -1 }",
                "tolerance.a",
            ),
            (
                "mode: measures\ngroup_by: [r]\nmeasures: [a]\ntolerance: { a: 5%% }",
                "tolerance.a",
            ),
            (
                "mode: measures\ngroup_by: [r]\nmeasures: [a]\ntolerance: { b: 1 }",
                "tolerance.b",
            ),
            (
                "mode: measures\ngroup_by: [r]\nmeasures: [a]\ntolerance: { a: 1, A: 5 }",
                "twice",
            ),
            ("mode: measures\ngroup_by: [r]\nconfirm: { after: 1s }", "confirm"),
            ("group_by: [r]", "group_by"),
            ("measures: [a]", "measures"),
            ("mode: count\ntolerance: { a: 1 }", "tolerance"),
        ] {
            let e = parse_extra(extra).unwrap_err();
            assert!(e.contains(key), "{extra}: {e}");
        }
    }
}
