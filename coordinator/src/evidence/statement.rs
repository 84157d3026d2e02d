//! The coordinator's in-toto Statement over a run's result, and what it states that a
//! verifier recomputes from the record: each side's signing agent and its level-1
//! totals, the sums of the agent-signed level-1 answers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tally_common::dsse::Envelope;
use tally_common::evidence::{AgentResult, SignedBucket, hex64, parse_hex64};

use super::bundle::envelope_of;
use tally_engine::fidelity::Fidelity;
use tally_engine::result::DiffCounts;
use tally_engine::spec::Spec;
use tally_engine::{Event, Side};

/// One side's level-1 totals as the statement states them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Totals {
    pub agent: String,
    pub dataset: String,
    pub count: u64,
    pub sum: String,
    #[serde(deserialize_with = "nullable")]
    pub xor: Option<String>,
    /// The window the agent signed it read (absent for a run without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<tally_common::segment::Window>,
}

/// The agent that signed a side's answers, and the dataset it answered for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SideAgent {
    /// Its certificate's DNS name it signs as (its envelopes' keyid).
    pub agent: String,
    pub dataset: String,
}

/// Each side's signing agent (`null` for a side that never answered).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SideAgents {
    #[serde(deserialize_with = "nullable")]
    pub source: Option<SideAgent>,
    #[serde(deserialize_with = "nullable")]
    pub target: Option<SideAgent>,
}

impl SideAgents {
    pub(super) fn get(&self, side: Side) -> Option<&SideAgent> {
        match side {
            Side::Source => self.source.as_ref(),
            Side::Target => self.target.as_ref(),
        }
    }
}

/// Each side's signing agent from a run's events: the agent and dataset of the first
/// answer the event records for that side.
pub(super) fn side_agents(events: &[Value]) -> SideAgents {
    let mut out = SideAgents {
        source: None,
        target: None,
    };
    for v in events {
        let Some(env) = envelope_of(v) else { continue };
        let Ok(p) = serde_json::from_value::<Envelope>(env)
            .map_err(|e| e.to_string())
            .and_then(|e| AgentResult::open(&e))
        else {
            continue;
        };
        let slot = match v["side"].as_str() {
            Some("source") => &mut out.source,
            Some("target") => &mut out.target,
            _ => continue,
        };
        slot.get_or_insert(SideAgent {
            agent: p.agent,
            dataset: p.dataset,
        });
    }
    out
}

/// A member that must be present and may be `null` (serde reads a missing `Option`
/// as `None`; a statement that leaves out a side's totals is refused, not read as a
/// run that ended before them).
fn nullable<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)
}

/// The Statement's predicate (`predicateType` [`super::PREDICATE_TYPE`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Predicate {
    pub run_id: String,
    pub spec_sha256: String,
    pub verdict: String,
    /// The result's `fidelity`: `full`, or `reduced` naming each column compared below
    /// what a side stores. Absent in statements signed before it (and for a run that
    /// ended before its columns were resolved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fidelity: Option<Fidelity>,
    pub hash_method: String,
    pub canonical_form_version: u32,
    /// The privacy level the run reported at.
    pub level: String,
    /// Each side's signing agent and dataset: every answer of a side is signed by it.
    /// Absent only in statements signed before it, which no longer verify.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<SideAgents>,
    /// `null` when the run ended before that side's level-1 answer (never absent).
    #[serde(deserialize_with = "nullable")]
    pub source: Option<Totals>,
    #[serde(deserialize_with = "nullable")]
    pub target: Option<Totals>,
    /// The number of differing leaf segments.
    pub leaves: u64,
    #[serde(deserialize_with = "nullable")]
    pub difference_counts: Option<DiffCounts>,
    pub false_match_bound: f64,
    pub started: String,
    pub finished: String,
    pub events_head: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subject {
    pub name: String,
    pub digest: BTreeMap<String, String>,
}

/// An in-toto Statement v1 over the run's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub type_: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: Predicate,
}

pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The SHA-256 of a spec's RFC 8785 canonical JSON.
pub fn spec_sha256(spec: &Value) -> Result<String, String> {
    let text = tally_common::jcs::canonical_json(&spec.to_string()).map_err(|e| format!("the spec: {e}"))?;
    Ok(sha256_hex(text.as_bytes()))
}

/// The sum of buckets: count, SUM mod 2^64, XOR (when every bucket has one).
fn total(buckets: &[SignedBucket]) -> Result<(u64, u64, Option<u64>), String> {
    let (mut count, mut sum, mut xor) = (0u64, 0u64, Some(0u64));
    for b in buckets {
        count = count.checked_add(b.count).ok_or("the bucket counts overflow")?;
        sum = sum.wrapping_add(
            parse_hex64(&b.sum).ok_or_else(|| format!("sum {:?} is not 16 hex digits", b.sum))?,
        );
        xor = match (xor, &b.xor) {
            (Some(x), Some(t)) => {
                Some(x ^ parse_hex64(t).ok_or_else(|| format!("xor {t:?} is not 16 hex digits"))?)
            }
            _ => None,
        };
    }
    Ok((count, sum, xor))
}

/// Mode measures: a fingerprint of one side's level-1 groups, equal on both sides
/// exactly when every group's labels, count and measure digests are: the first 8 bytes
/// of the SHA-256 of each group's row string (labels, count, then each digest as 16 hex
/// digits), in order (docs/evidence.md).
pub fn groups_fingerprint(groups: &[tally_common::wire::measures::MeasureGroup]) -> u64 {
    let mut h = Sha256::new();
    for g in groups {
        let count = g.count.to_string();
        let digests: Vec<String> = g.measures.iter().map(|m| hex64(m.digest)).collect();
        let row = tally_common::canonical::row_string(
            g.labels
                .iter()
                .map(Option::as_deref)
                .chain(std::iter::once(Some(count.as_str())))
                .chain(digests.iter().map(|d| Some(d.as_str()))),
        );
        h.update(row.as_bytes());
    }
    let d = h.finalize();
    u64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
}

/// Whether a level-1 Measures answer was asked for the spec's first group_by level and
/// its measures, in order (names compared as the run matches columns: ignoring case).
fn scope_is_specs(scope: &tally_common::evidence::Scope, spec: &Value) -> Result<(), String> {
    let spec: Spec =
        serde_json::from_value(spec.clone()).map_err(|e| format!("the run's spec does not load: {e}"))?;
    let first: Vec<String> = spec
        .group_by
        .iter()
        .take(1)
        .map(|g| match g.granularity() {
            Some(gr) => format!("{}:{}", g.column(), gr.name()),
            None => g.column().to_string(),
        })
        .collect();
    let same = |a: &[String], b: &[String]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.eq_ignore_ascii_case(y))
    };
    match (&scope.group_by, &scope.measures) {
        (Some(g), Some(m)) if same(g, &first) && same(m, &spec.measures) => Ok(()),
        (g, m) => Err(format!(
            "the agent signed groups by {g:?} of measures {m:?}; the spec's first level is {first:?} of {:?}",
            spec.measures
        )),
    }
}

/// Each side's level-1 totals from the run's events: the signed buckets of its one
/// level-1 aggregate answer (in mode measures: the count and fingerprint of its
/// level-1 groups), which must cover the whole dataset.
pub(super) fn level_one(events: &[Value]) -> Result<[Option<Totals>; 2], String> {
    let spec = events
        .iter()
        .find(|e| e["event"] == "started")
        .map(|e| e["spec"].clone())
        .unwrap_or_default();
    // a run's level-1 answers are of its mode's kind: Measures answers never stand
    // for a checksum run's totals, nor Aggregate answers for a measures run's
    let measures_mode = spec["mode"] == "measures";
    let wanted = if measures_mode { "measured" } else { "aggregated" };
    type Answer = (
        String,
        String,
        Vec<SignedBucket>,
        Option<tally_common::segment::Window>,
    );
    let mut out: [Option<Answer>; 2] = [None, None];
    let mut scopes: [Option<tally_common::evidence::Scope>; 2] = [None, None];
    for v in events {
        if (v["event"] == "aggregated" || v["event"] == "measured") && v["event"] != wanted {
            return Err(format!(
                "event {} is a {} answer in a run of mode {}",
                v["seq"],
                v["event"],
                if measures_mode {
                    "measures"
                } else {
                    "checksum or count"
                }
            ));
        }
        if v["event"] != wanted || v["level"] != 1 {
            continue;
        }
        let (side, envelope, groups) = match serde_json::from_value::<Event>(v.clone()) {
            Ok(Event::Aggregated { side, response, .. }) => (side, response.envelope, None),
            Ok(Event::Measured { side, response, .. }) => (side, response.envelope, Some(response.groups)),
            _ => return Err(format!("event {} does not load", v["seq"])),
        };
        let env = envelope.as_ref().ok_or("a level-1 answer is unsigned")?;
        let p = AgentResult::open(env)?;
        let slot = &mut out[side as usize];
        if slot.is_some() {
            return Err(format!("the {} side has two level-1 answers", side.name()));
        }
        if !p.scope.whole {
            return Err(format!(
                "the {} side's level-1 answer (event {}) was not asked of the whole dataset",
                side.name(),
                v["seq"]
            ));
        }
        // a measures answer's groups stand for one bucket: their count and fingerprint,
        // of the spec's first group_by level and its measures, as the agent signed
        let buckets = match &groups {
            Some(g) => {
                scope_is_specs(&p.scope, &spec).map_err(|m| format!("event {}: {m}", v["seq"]))?;
                if p.groups_sha256.as_deref() != Some(tally_common::evidence::groups_sha256(g).as_str()) {
                    return Err(format!(
                        "event {}: the groups are not the ones the agent signed",
                        v["seq"]
                    ));
                }
                vec![SignedBucket::new(
                    0,
                    0,
                    g.iter().map(|g| g.count).sum(),
                    groups_fingerprint(g),
                    None,
                )]
            }
            None => p.buckets.unwrap_or_default(),
        };
        *slot = Some((p.agent, p.dataset, buckets, p.scope.window.clone()));
        scopes[side as usize] = Some(p.scope);
    }
    if let [Some(s), Some(t)] = &scopes
        && s.window != t.window
    {
        return Err(format!(
            "the sides' level-1 answers read different windows: source {:?}, target {:?}",
            s.window, t.window
        ));
    }
    if let [Some(s), Some(t)] = &scopes
        && (s.method != t.method || s.columns.len() != t.columns.len() || s.key_len != t.key_len)
    {
        return Err(format!(
            "the sides' level-1 answers hash differently: source {} over {} columns ({} key), target {} over {} ({} key)",
            s.method,
            s.columns.len(),
            s.key_len,
            t.method,
            t.columns.len(),
            t.key_len
        ));
    }
    let mut totals = [None, None];
    for (i, s) in out.into_iter().enumerate() {
        if let Some((agent, dataset, buckets, window)) = s {
            let (count, sum, xor) = total(&buckets)?;
            totals[i] = Some(Totals {
                agent,
                dataset,
                count,
                sum: hex64(sum),
                xor: xor.map(hex64),
                window,
            });
        }
    }
    Ok(totals)
}
