//! The result of a run: the stable `--json` document of DESIGN §11 and the human
//! summary with its segment tree.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use tally_common::segment::{KeyTuple, Segment};

use crate::fidelity::Fidelity;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Match,
    Differ,
    Error,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct SideStats {
    pub agent: String,
    pub dataset: String,
    /// Rows on this side (from the first level); absent if no level completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Aggregate queries sent to this side.
    pub queries: u64,
    pub rows_scanned: u64,
    /// How the agent computed its aggregates: pushdown or in_process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LevelOut {
    pub level: u32,
    pub segments: usize,
    pub differing: usize,
    /// Parents of this level whose children did not account for them.
    #[serde(skip_serializing_if = "is_zero", default)]
    pub inconsistent: usize,
    pub elapsed_ms: u64,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AggOut {
    pub count: u64,
    /// SUM of row checksums mod 2^64, 16 hex digits.
    pub checksum: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xor: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SqlPair {
    pub source: String,
    pub target: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LeafOut {
    pub level: u32,
    pub bounds: Segment,
    pub source: AggOut,
    pub target: AggOut,
    /// The segment differed but the drill could not go on below it: its children did
    /// not add up to it on a side, or none of them differed (data changed between
    /// levels, or a predicate lost rows). DESIGN §5 step 3.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub inconsistent: bool,
    /// Why it is inconsistent (only when it is).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sql: Option<SqlPair>,
    /// with_keys and detailed: for each kind of difference found in the leaf, each
    /// side's SQL of exactly those keys' rows (leaves with `sql` only).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub key_sql: Vec<KeySqlOut>,
}

/// Both sides' SQL of the keys of one leaf that differ as `kind`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KeySqlOut {
    pub kind: DiffKind,
    /// How many keys the SQL names.
    pub keys: usize,
    pub source: String,
    pub target: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum DiffKind {
    MissingInTarget,
    ExtraInTarget,
    Changed,
}

impl DiffKind {
    pub fn name(self) -> &'static str {
        match self {
            DiffKind::MissingInTarget => "missing_in_target",
            DiffKind::ExtraInTarget => "extra_in_target",
            DiffKind::Changed => "changed",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ValuePair {
    pub source: Option<String>,
    pub target: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Difference {
    pub kind: DiffKind,
    pub key: KeyTuple,
    /// detailed only: the columns whose values differ.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub columns: Option<Vec<String>>,
    /// detailed only: the differing values (masked columns are never revealed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub values: Option<std::collections::BTreeMap<String, ValuePair>>,
    /// Present when either side holds the key more than once: how many rows each side
    /// holds of it. Such a key is listed whenever the two sides' rows of it are not the
    /// same rows (a copy more, or one copy that differs), never folded into one row.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub duplicates: Option<KeyCopies>,
}

/// How many rows each side holds of one key.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyCopies {
    pub source: u32,
    pub target: u32,
}

impl KeyCopies {
    /// The copies of a key held `source` and `target` times, when either is more than once.
    pub fn of(source: usize, target: usize) -> Option<KeyCopies> {
        (source > 1 || target > 1).then(|| KeyCopies {
            source: u32::try_from(source).unwrap_or(u32::MAX),
            target: u32::try_from(target).unwrap_or(u32::MAX),
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DiffCounts {
    pub missing_in_target: u64,
    pub extra_in_target: u64,
    pub changed: u64,
}

/// A budget that left keys out of `differences`: `reporting.sample_limit`, or an
/// agent's reveal budget (`max_reveal_rows`, `max_reveal_rows_per_hour`) with the
/// agent and its side.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Withheld {
    pub budget: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub side: Option<String>,
    /// Keys not listed because of it (for an agent: of the keys asked of it).
    pub keys: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DuplicateKeys {
    pub source: u64,
    pub target: u64,
}

/// A run's window as fixed at its start (DESIGN §5).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WindowOut {
    pub column: String,
    /// The bound: rows whose column is at most this value (by canonical text at the
    /// column's precision; integers by value).
    pub upper: String,
    /// The lag the bound was computed with (the clock at the start minus it).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lag: Option<String>,
}

/// Mode measures: one group, its labels from the top of the hierarchy down to its level.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GroupOut {
    pub level: u32,
    pub group: Vec<GroupLabel>,
    pub source: GroupSide,
    pub target: GroupSide,
    /// What differs beyond any tolerance: `count`, or a measure's name.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub differing: Vec<String>,
    /// Measures that differ within their tolerance.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub tolerated: Vec<String>,
    /// A parent that differed whose children agree, or do not add up to it (rows
    /// changed between levels): the group is reported, never dropped.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub inconsistent: bool,
    /// Why an inconsistent group is one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GroupLabel {
    pub column: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub granularity: Option<String>,
    /// `null`: the group of rows where the column is NULL.
    pub value: Option<String>,
}

/// One side of a group: its row count and each measure, in clear where both agents'
/// policies release it, `"sealed"` otherwise (compared by sealed digest).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct GroupSide {
    pub count: u64,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub measures: Vec<MeasureShown>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MeasureShown {
    pub name: String,
    /// `sum`, `min`, `max` (each absent without a non-NULL value); `None`: compared by
    /// sealed digest only (`sealed: true`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub values: Option<tally_common::measures::MeasureValues>,
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub sealed: bool,
}

/// The replication positions of one watermark wait (DESIGN §5): the source's, read
/// first, and the target's once it had applied it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PositionsOut {
    /// 0: before the drill; n: before confirm round n's reads.
    pub round: u32,
    pub source: tally_common::position::Position,
    /// Absent while (or when) the target has not reached the source's position.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub target: Option<tally_common::position::Position>,
    /// How long the target agent waited, in milliseconds.
    pub waited_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorOut {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    pub name: String,
    pub verdict: Verdict,
    /// How faithfully the columns were compared: `full`, or `reduced` naming each
    /// column below what a side stores and why. Absent when the run ended before its
    /// columns were resolved (and in results stored before this field).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub fidelity: Option<Fidelity>,
    pub hash_method: String,
    pub strategy: String,
    pub level: String,
    /// Whether XOR was compared besides SUM (both sides have it).
    pub xor_compared: bool,
    /// Chance that one differing segment compares equal.
    pub false_match_probability: f64,
    /// Union bound over every segment compared in this run.
    pub false_match_bound: f64,
    pub source: SideStats,
    pub target: SideStats,
    /// The run's window: only rows with `column <= upper` were compared, on both sides.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub window: Option<WindowOut>,
    /// With `window.watermark`: the positions each wait aligned, in order.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub positions: Vec<PositionsOut>,
    /// Mode measures: the diverging groups at the deepest level reached (and any
    /// inconsistent parent), with both sides' counts and measures.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub groups: Option<Vec<GroupOut>>,
    /// Mode measures: groups whose measures differed only within their tolerance.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tolerated_groups: Option<u64>,
    pub levels: Vec<LevelOut>,
    pub leaves: Vec<LeafOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub differences: Option<Vec<Difference>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub difference_counts: Option<DiffCounts>,
    /// With confirm rounds: rows that differed and agreed again in a round (in flight),
    /// per kind as first found; they are not in `differences` or `difference_counts`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub in_flight: Option<DiffCounts>,
    /// With confirm rounds at count_only: how many differing segments (leaves) agreed
    /// again in a round; they are not in `leaves`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub in_flight_leaves: Option<u64>,
    /// Keys found more than once in the differing segments (rows phase only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duplicate_keys: Option<DuplicateKeys>,
    /// `differences` lists fewer than `difference_counts` counts: `withheld` says
    /// which budgets left keys out.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub truncated: bool,
    /// Each budget that withheld keys from `differences`, and how many.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub withheld: Vec<Withheld>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub warnings: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorOut>,
    pub elapsed_ms: u64,
}

impl RunResult {
    /// `diff(1)` exit codes: 0 match, 1 differ, 2 error.
    pub fn exit_code(&self) -> u8 {
        match self.verdict {
            Verdict::Match => 0,
            Verdict::Differ => 1,
            Verdict::Error => 2,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("results serialize")
    }

    /// The human summary: verdict, the segment tree of leaves, differences.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let verdict = match self.verdict {
            Verdict::Match => "MATCH",
            Verdict::Differ => "DIFFER",
            Verdict::Error => "ERROR",
        };
        // a pass below what the sides store is never shown as a plain one
        let reduced = match &self.fidelity {
            Some(f) if f.is_reduced() && self.verdict != Verdict::Error => {
                format!(" (fidelity reduced: {})", f.summary())
            }
            _ => String::new(),
        };
        let _ = writeln!(o, "{}: {verdict}{reduced}", self.name);
        let count = |s: &SideStats| s.count.map(|c| c.to_string()).unwrap_or_else(|| "?".into());
        let _ = writeln!(
            o,
            "  source {}/{}: {} rows, {} queries{}",
            self.source.agent,
            self.source.dataset,
            count(&self.source),
            self.source.queries,
            self.source
                .path
                .as_ref()
                .map(|p| format!(" ({p})"))
                .unwrap_or_default()
        );
        let _ = writeln!(
            o,
            "  target {}/{}: {} rows, {} queries{}",
            self.target.agent,
            self.target.dataset,
            count(&self.target),
            self.target.queries,
            self.target
                .path
                .as_ref()
                .map(|p| format!(" ({p})"))
                .unwrap_or_default()
        );
        if let Some(w) = &self.window {
            let _ = writeln!(
                o,
                "  window: {} <= {}{}",
                w.column,
                w.upper,
                w.lag
                    .as_ref()
                    .map(|l| format!(" (the clock at the start minus {l})"))
                    .unwrap_or_default()
            );
        }
        let _ = writeln!(
            o,
            "  {} checksums{}, strategy {}, false-match probability {:.1e} per segment",
            self.hash_method,
            if self.xor_compared {
                " (SUM and XOR)"
            } else {
                " (SUM only)"
            },
            self.strategy,
            self.false_match_probability
        );
        for l in &self.levels {
            let _ = writeln!(
                o,
                "  level {}: {} segments, {} differing{} ({} ms)",
                l.level,
                l.segments,
                l.differing,
                if l.inconsistent > 0 {
                    format!(", {} inconsistent parents", l.inconsistent)
                } else {
                    String::new()
                },
                l.elapsed_ms
            );
        }
        if !self.leaves.is_empty() {
            let _ = writeln!(o, "  differing segments:");
            for (i, l) in self.leaves.iter().enumerate() {
                let branch = if i + 1 == self.leaves.len() {
                    "└─"
                } else {
                    "├─"
                };
                let _ = writeln!(
                    o,
                    "  {branch} {}  source {} rows / target {} rows",
                    l.bounds.describe(),
                    l.source.count,
                    l.target.count
                );
                let cont = if i + 1 == self.leaves.len() { " " } else { "│" };
                if let Some(reason) = &l.reason {
                    let _ = writeln!(o, "  {cont}    INCONSISTENT: {reason}");
                }
                // the SQL of exactly the differing keys, each side in its dialect
                for k in &l.key_sql {
                    let plural = if k.keys == 1 { "" } else { "s" };
                    let _ = writeln!(o, "  {cont}    {} ({} key{plural}):", k.kind.name(), k.keys);
                    // a note is a `--` comment line: the lines stay lines
                    for (side, sql) in [("source", &k.source), ("target", &k.target)] {
                        let _ = writeln!(o, "  {cont}      {side}:");
                        for line in sql.lines() {
                            let _ = writeln!(o, "  {cont}        {line}");
                        }
                    }
                }
            }
        }
        if let (Some(diffs), Some(c)) = (&self.differences, &self.difference_counts) {
            let _ = writeln!(
                o,
                "  differences: {} missing in target, {} extra in target, {} changed{}",
                c.missing_in_target,
                c.extra_in_target,
                c.changed,
                if self.truncated { " (sample shown)" } else { "" }
            );
            for d in diffs {
                let key = tally_common::segment::format_tuple(&d.key);
                let cols = d
                    .columns
                    .as_ref()
                    .map(|c| format!("  [{}]", c.join(", ")))
                    .unwrap_or_default();
                let copies = d
                    .duplicates
                    .map(|c| {
                        format!(
                            "  (rows of this key: {} on the source, {} on the target)",
                            c.source, c.target
                        )
                    })
                    .unwrap_or_default();
                let _ = writeln!(o, "    {:<18} {key}{cols}{copies}", d.kind.name());
            }
            for w in &self.withheld {
                let by = match (&w.agent, &w.side) {
                    (Some(a), Some(s)) => format!("agent {a} ({s}) reveal budget {}", w.budget),
                    _ => w.budget.clone(),
                };
                let _ = writeln!(o, "    keys withheld: {} by {by}", w.keys);
            }
        }
        for g in self.groups.iter().flatten() {
            let labels: Vec<String> = g
                .group
                .iter()
                .map(|l| format!("{}={}", l.column, l.value.as_deref().unwrap_or("NULL")))
                .collect();
            let what = if g.inconsistent {
                "inconsistent (its children do not account for it)".to_string()
            } else if g.differing.is_empty() {
                format!("within tolerance: {}", g.tolerated.join(", "))
            } else {
                format!("differs: {}", g.differing.join(", "))
            };
            let _ = writeln!(o, "  group {}: {what}", labels.join(" "));
            let _ = writeln!(
                o,
                "    count: source {}, target {}",
                g.source.count, g.target.count
            );
            for (a, b) in g.source.measures.iter().zip(&g.target.measures) {
                let show = |m: &MeasureShown| match &m.values {
                    None => "sealed".to_string(),
                    Some(v) => format!(
                        "sum {} min {} max {}",
                        v.sum.as_deref().unwrap_or("NULL"),
                        v.min.as_deref().unwrap_or("NULL"),
                        v.max.as_deref().unwrap_or("NULL")
                    ),
                };
                let _ = writeln!(o, "    {}: source {}; target {}", a.name, show(a), show(b));
            }
        }
        for p in &self.positions {
            let at = match p.round {
                0 => "before the drill".to_string(),
                n => format!("before confirm round {n}"),
            };
            let _ = writeln!(
                o,
                "  positions {at}: source {}, target {} (waited {} ms)",
                p.source,
                p.target
                    .as_ref()
                    .map_or("not reached".to_string(), |t| t.to_string()),
                p.waited_ms
            );
        }
        if let Some(n) = self.in_flight_leaves {
            let _ = writeln!(
                o,
                "  in flight (segments that differed, then agreed in a confirm round): {n}"
            );
        }
        if let Some(f) = &self.in_flight {
            let _ = writeln!(
                o,
                "  in flight (differed, then agreed in a confirm round): {} missing in target, {} extra in target, {} changed",
                f.missing_in_target, f.extra_in_target, f.changed
            );
        }
        for w in &self.warnings {
            let _ = writeln!(o, "  warning: {w}");
        }
        if let Some(a) = &self.advice {
            let _ = writeln!(o, "  advice: {a}");
        }
        if let Some(e) = &self.error {
            let _ = writeln!(o, "  error ({}): {}", e.code, e.message);
        }
        let _ = writeln!(o, "  elapsed: {} ms", self.elapsed_ms);
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(leaves: Vec<LeafOut>) -> RunResult {
        RunResult {
            name: "t".into(),
            verdict: Verdict::Differ,
            fidelity: None,
            hash_method: "sha256_64".into(),
            strategy: "quantile".into(),
            level: "count_only".into(),
            xor_compared: true,
            false_match_probability: 0.0,
            false_match_bound: 0.0,
            source: SideStats::default(),
            target: SideStats::default(),
            window: None,
            positions: Vec::new(),
            groups: None,
            tolerated_groups: None,
            levels: Vec::new(),
            leaves,
            differences: None,
            difference_counts: None,
            in_flight: None,
            in_flight_leaves: None,
            duplicate_keys: None,
            truncated: false,
            withheld: Vec::new(),
            warnings: Vec::new(),
            advice: None,
            error: None,
            elapsed_ms: 0,
        }
    }

    fn leaf(reason: Option<&str>) -> LeafOut {
        let agg = |count| AggOut {
            count,
            checksum: "0000000000000001".into(),
            xor: None,
        };
        LeafOut {
            level: 1,
            bounds: Segment::whole(),
            source: agg(10),
            target: agg(11),
            inconsistent: reason.is_some(),
            reason: reason.map(String::from),
            sql: None,
            key_sql: Vec::new(),
        }
    }

    #[test]
    fn an_inconsistent_leaf_says_so_and_why_and_a_plain_one_carries_neither_field() {
        let r = result(vec![
            leaf(None),
            leaf(Some("no child differs although the parent did")),
        ]);
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        let leaves = v["leaves"].as_array().unwrap();
        assert!(leaves[0].get("inconsistent").is_none() && leaves[0].get("reason").is_none());
        assert_eq!(leaves[1]["inconsistent"], true);
        assert_eq!(leaves[1]["reason"], "no child differs although the parent did");
        let text = r.render();
        assert!(
            text.contains("INCONSISTENT: no child differs although the parent did"),
            "{text}"
        );
    }

    #[test]
    fn a_match_at_reduced_fidelity_is_never_shown_as_a_plain_one() {
        use crate::fidelity::{Code, ColumnFidelity, Reason};
        let mut r = result(Vec::new());
        r.verdict = Verdict::Match;
        r.fidelity = Some(Fidelity::of(Vec::new()));
        assert!(r.render().starts_with("t: MATCH\n"), "{}", r.render());
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["fidelity"], serde_json::json!({"level": "full"}));
        let reason = |code, text: &str| Reason {
            code,
            text: text.into(),
        };
        r.fidelity = Some(Fidelity::of(vec![
            ColumnFidelity {
                column: "amount".into(),
                reasons: vec![reason(Code::FloatScale, "float at scale 6")],
            },
            ColumnFidelity {
                column: "id".into(),
                reasons: Vec::new(),
            },
            ColumnFidelity {
                column: "created_at".into(),
                reasons: vec![reason(
                    Code::TimePrecision,
                    "cut to precision 3 (timestamp(6) / datetime(6))",
                )],
            },
        ]));
        let text = r.render();
        assert!(
            text.starts_with(
                "t: MATCH (fidelity reduced: amount float at scale 6, created_at cut to precision 3 \
                 (timestamp(6) / datetime(6)))\n"
            ),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["fidelity"]["level"], "reduced");
        assert_eq!(v["fidelity"]["columns"][0]["column"], "amount");
        assert_eq!(v["fidelity"]["columns"][0]["reasons"][0]["code"], "float_scale");
        assert_eq!(v["fidelity"]["columns"][1]["column"], "created_at");
        // a differ carries it too; an error does not claim anything about columns
        r.verdict = Verdict::Differ;
        assert!(r.render().starts_with("t: DIFFER (fidelity reduced: amount"));
        r.verdict = Verdict::Error;
        assert!(r.render().starts_with("t: ERROR\n"));
        // read back (a stored result), the same; one stored before the field has none
        let back: RunResult = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(back.fidelity, r.fidelity);
        let mut old = v.clone();
        old.as_object_mut().unwrap().remove("fidelity");
        let back: RunResult = serde_json::from_value(old).unwrap();
        assert_eq!(back.fidelity, None);
    }

    #[test]
    fn a_result_read_back_from_its_json_prints_the_same_text_and_json() {
        // `tally run --server` prints the service's stored result through these
        let mut r = result(vec![leaf(None), leaf(Some("children do not add up"))]);
        r.false_match_probability = 5.421010862427522e-20;
        r.false_match_bound = 1.0842021724855044e-17;
        r.levels = vec![LevelOut {
            level: 1,
            segments: 16,
            differing: 2,
            inconsistent: 1,
            elapsed_ms: 7,
        }];
        r.differences = Some(vec![Difference {
            kind: DiffKind::Changed,
            key: vec![tally_common::segment::KeyPart::Int(42)],
            columns: Some(vec!["amount".into()]),
            values: None,
            duplicates: KeyCopies::of(1, 2),
        }]);
        r.difference_counts = Some(DiffCounts {
            changed: 1,
            ..DiffCounts::default()
        });
        r.warnings = vec!["w".into()];
        r.leaves[0].key_sql = vec![KeySqlOut {
            kind: DiffKind::Changed,
            keys: 1,
            source: "SELECT \"id\" FROM \"t\" WHERE \"id\" IN (42);".into(),
            target: "-- a note\nSELECT `id` FROM `t` WHERE `id` IN (42);".into(),
        }];
        let text = r.render();
        assert!(
            text.contains(
                "│    changed (1 key):\n  │      source:\n  │        SELECT \"id\" FROM \"t\" WHERE \"id\" IN (42);\n"
            ) && text.contains("  │      target:\n  │        -- a note\n  │        SELECT `id`"),
            "{text}"
        );
        let back: RunResult = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(back.to_json(), r.to_json());
        assert_eq!(back.render(), r.render());
        assert_eq!(back.exit_code(), 1);
    }
}
