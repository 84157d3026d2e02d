//! The checks of what the statement and the result claim, against the record and the
//! agents' signed answers: the result's fields, the level-1 totals and the window, the
//! verdict, and the fidelity.

use std::collections::{BTreeMap, HashSet};

use serde_json::{Value, json};
use tally_common::evidence::hex64;
use tally_common::wire::measures::{Labels, MeasureGroup, MeasuresResponse};
use time::format_description::well_known::Rfc3339;

use super::super::CLOCK_SKEW;
use super::super::statement::{Predicate, level_one};
use super::agent_results::SignedBucketTotals;
use tally_engine::Event;
use tally_engine::drill::window_upper;
use tally_engine::fidelity::Fidelity;
use tally_engine::measures::{compare_group, resolve_spec};
use tally_engine::resolve::{Resolved, resolve};
use tally_engine::spec::{MAX_LAG_SECS, Mode, Spec, WindowSpec, parse_duration};

/// The result's fields that name what was compared, checked against the record (the
/// started spec, whose sides' datasets the agents signed) and the agents' signed
/// buckets (issue 32 E15): its `name`; each side's `agent` and `dataset`; and each
/// leaf's `source` / `target` aggregates (`count`, `checksum`, `xor`), each a bucket
/// that side's agent signed, or empty (count 0, checksum 0, no xor or xor 0). The
/// result's `verdict`, `hash_method`, `level`, `fidelity`, `false_match_bound`,
/// `difference_counts`, number of `leaves`, `window` and sides' `count` are checked
/// by the checks named for them.
pub(super) fn result_fields(
    result: &Value,
    spec: &Value,
    signed: &BTreeMap<String, HashSet<SignedBucketTotals>>,
) -> Result<String, String> {
    if result["name"] != spec["name"] {
        return Err(format!(
            "the result's name is {}, the started spec's {}",
            result["name"], spec["name"]
        ));
    }
    for side in ["source", "target"] {
        for k in ["agent", "dataset"] {
            if result[side][k] != spec[side][k] {
                return Err(format!(
                    "the result's {side}.{k} is {}, the started spec's {}",
                    result[side][k], spec[side][k]
                ));
            }
        }
    }
    let leaves = result["leaves"].as_array().map(Vec::as_slice).unwrap_or_default();
    let none = HashSet::new();
    for (i, leaf) in leaves.iter().enumerate() {
        for side in ["source", "target"] {
            let a = &leaf[side];
            let count = a["count"].as_u64();
            let sum = a["checksum"].as_str();
            let xor = match &a["xor"] {
                Value::Null => Some(None),
                Value::String(x) => Some(Some(x.clone())),
                _ => None,
            };
            let (Some(count), Some(sum), Some(xor)) = (count, sum, xor) else {
                return Err(format!(
                    "the result's leaves[{i}].{side} is not {{count, checksum, xor}}: {a}"
                ));
            };
            let empty = count == 0 && sum == hex64(0) && xor.as_deref().is_none_or(|x| x == hex64(0));
            let bucket = (count, sum.to_string(), xor);
            if !empty && !signed.get(side).unwrap_or(&none).contains(&bucket) {
                return Err(format!(
                    "the result's leaves[{i}].{side} ({count} rows, checksum {sum}) is no bucket the {side} agent signed"
                ));
            }
        }
    }
    Ok(format!(
        "name, sides and {} leaves' aggregates are the record's and the agents'",
        leaves.len()
    ))
}

/// "level-1 totals": the totals the statement states are the sums of the agents'
/// signed level-1 buckets, the result's window and counts are theirs, and the window
/// they read is the one the spec asked for.
pub(super) fn level_one_totals(
    events: &[Value],
    p: &Predicate,
    result_json: &Value,
) -> Result<String, String> {
    let [s, t] = &level_one(events)?;
    for (side, signed, stated) in [("source", s, &p.source), ("target", t, &p.target)] {
        if signed != stated {
            return Err(format!(
                "the {side} totals stated ({}) are not the sums of its agent-signed level-1 buckets ({})",
                serde_json::to_string(stated).unwrap_or_default(),
                serde_json::to_string(signed).unwrap_or_default()
            ));
        }
    }
    for (side, stated) in [("source", &p.source), ("target", &p.target)] {
        // the window the result reports is the one both agents signed they read
        let reported = result_json
            .get("window")
            .map(|w| (w["column"].clone(), w["upper"].clone()));
        if let Some(t) = stated
            && reported != t.window.as_ref().map(|w| (json!(w.column), json!(w.upper)))
        {
            return Err(format!(
                "the result's window ({}) is not the one the {side} agent signed it read ({})",
                result_json
                    .get("window")
                    .map(|w| w.to_string())
                    .unwrap_or_else(|| "none".into()),
                t.window
                    .as_ref()
                    .map(|w| format!("{} <= {}", w.column, w.upper))
                    .unwrap_or_else(|| "none".into())
            ));
        }
        if let Some(t) = stated
            && result_json[side]["count"] != json!(t.count)
        {
            return Err(format!(
                "the result's {side} count is {}, the agent-signed level-1 count {}",
                result_json[side]["count"], t.count
            ));
        }
    }
    // and the window they read is the one the spec asked for
    let signed_window = p
        .source
        .as_ref()
        .or(p.target.as_ref())
        .and_then(|t| t.window.as_ref());
    window_claim(events, signed_window, &p.started)?;
    Ok("each side's equals the sum of its agent-signed level-1 buckets".to_string())
}

/// "verdict": the statement's verdict follows from the signed totals and the number of
/// differing leaves.
pub(super) fn verdict(
    events: &[Value],
    spec: &Value,
    p: &Predicate,
    coordinator: &str,
) -> Result<String, String> {
    let equal = match (&p.source, &p.target) {
        (Some(s), Some(t)) => {
            s.count == t.count
                && s.sum == t.sum
                && match (&s.xor, &t.xor) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                }
        }
        _ => false,
    };
    let counts_only = spec["mode"] == "count";
    let equal = if counts_only {
        matches!((&p.source, &p.target), (Some(s), Some(t)) if s.count == t.count)
    } else if spec["mode"] == "measures" {
        // equal fingerprints are equal groups; else the groups may agree within
        // the spec's tolerances, judged from the signed level-1 answers
        equal || measures_agree(events, spec)?
    } else {
        equal
    };
    if p.verdict == "match" && events.iter().any(|e| e["event"] == "failed") {
        return Err("a match of a run whose record holds a failure".into());
    }
    let follows = match p.verdict.as_str() {
        "match" => equal && p.leaves == 0,
        "differ" => !(equal && p.leaves == 0),
        "error" => true,
        v => return Err(format!("verdict {v:?} is none of match, differ, error")),
    };
    if follows {
        Ok(format!(
            "{}{} (totals {}, {} differing leaves), signed by {coordinator:?}",
            p.verdict,
            match &p.fidelity {
                Some(f) if f.is_reduced() => format!(" at reduced fidelity ({})", f.summary()),
                _ => String::new(),
            },
            if equal { "equal" } else { "differ" },
            p.leaves
        ))
    } else {
        Err(format!(
            "verdict {} does not follow from totals that {} and {} differing leaves",
            p.verdict,
            if equal { "are equal" } else { "differ" },
            p.leaves
        ))
    }
}

/// Mode measures: whether both sides' level-1 groups agree, by the run's comparison
/// (counts exactly; measures by digest, or in clear within the spec's tolerance).
fn measures_agree(events: &[Value], spec: &Value) -> Result<bool, String> {
    let spec: Spec =
        serde_json::from_value(spec.clone()).map_err(|e| format!("the run's spec does not load: {e}"))?;
    let mut sides: [Option<MeasuresResponse>; 2] = [None, None];
    for v in events
        .iter()
        .filter(|v| v["event"] == "measured" && v["level"] == 1)
    {
        if let Ok(Event::Measured { side, response, .. }) = serde_json::from_value::<Event>(v.clone()) {
            sides[side as usize] = Some(response);
        }
    }
    let [Some(s), Some(t)] = sides else {
        return Ok(false);
    };
    let tolerances: Vec<_> = spec.measures.iter().map(|m| spec.tolerance_of(m)).collect();
    fn index(r: &MeasuresResponse) -> BTreeMap<&Labels, &MeasureGroup> {
        r.groups.iter().map(|g| (&g.labels, g)).collect()
    }
    let (a, b) = (index(&s), index(&t));
    if a.len() != s.groups.len() || b.len() != t.groups.len() || a.keys().ne(b.keys()) {
        return Ok(false);
    }
    let n = tolerances.len();
    Ok(a.iter().all(|(labels, x)| {
        let y = b[*labels];
        x.count == y.count
            && x.measures.len() == n
            && y.measures.len() == n
            && compare_group(x, y, &tolerances).0.is_empty()
    }))
}

/// The fidelity the run's record gives: its `started` spec resolved against its
/// `described` answers, as `tally run` resolves them; `None` for a record without a
/// description (a run that ended before it).
fn recorded_fidelity(events: &[Value], spec: &Value) -> Result<Option<Fidelity>, String> {
    Ok(recorded_resolution(events, spec)?.and_then(|r| r.fidelity))
}

/// The record's `started` spec resolved against its first `described` event, as `tally
/// run` resolved it: `None` without a description, or with one that does not resolve
/// (the run then ended in an error before asking anything).
fn recorded_resolution(events: &[Value], spec: &Value) -> Result<Option<Resolved>, String> {
    let Some(described) = events.iter().find(|e| e["event"] == "described") else {
        return Ok(None);
    };
    let spec: Spec =
        serde_json::from_value(spec.clone()).map_err(|e| format!("the run's spec does not load: {e}"))?;
    let side = |k: &str| {
        serde_json::from_value::<tally_common::wire::Describe>(described[k].clone())
            .map_err(|e| format!("the described event's {k}: {e}"))
    };
    let (s, t) = (side("source")?, side("target")?);
    let spec = if spec.mode == Mode::Measures {
        resolve_spec(&spec)
    } else {
        spec
    };
    // a description that does not resolve (drift) ended the run with an error
    Ok(resolve(&spec, &s, &t).ok())
}

/// Each side's compared columns as a request writes them (name, class, scale, exact,
/// fixed: docs/evidence.md, "The requests"), from the record's resolution.
pub(super) fn recorded_columns(events: &[Value], spec: &Value) -> Result<Option<[Value; 2]>, String> {
    let as_json = |cols: Vec<tally_common::segment::ColumnSpec>| {
        let refs: Vec<tally_proto::v1::ColumnRef> =
            cols.iter().map(tally_proto::v1::ColumnRef::from).collect();
        tally_common::request_json::columns(&refs)
    };
    Ok(
        recorded_resolution(events, spec)?
            .map(|r| [as_json(r.source_columns()), as_json(r.target_columns())]),
    )
}

/// Whether the statement's fidelity is the one the record gives. A statement signed
/// before fidelity was stated has none; it verifies, and the check says what the
/// record gives instead, so such a pass is not read as a plain one.
pub(super) fn fidelity_claim(
    events: &[Value],
    spec: &Value,
    stated: Option<&Fidelity>,
) -> Result<String, String> {
    let recorded = recorded_fidelity(events, spec)?;
    let describe = |f: Option<&Fidelity>| match f {
        None => "none".to_string(),
        Some(f) if f.is_reduced() => format!("reduced: {}", f.summary()),
        Some(_) => "full".to_string(),
    };
    match (stated, &recorded) {
        (None, _) => Ok(format!(
            "not stated (a statement from before fidelity); the record resolves to {}",
            describe(recorded.as_ref())
        )),
        (Some(s), Some(r)) if s == r => Ok(describe(Some(s))),
        (Some(s), r) => Err(format!(
            "the statement says {}, the recorded spec and descriptions resolve to {}",
            describe(Some(s)),
            describe(r.as_ref())
        )),
    }
}

/// Whether the window both agents signed is the one the run's `started` spec asks for:
/// none for a spec without one; for `as_of`, the bound normalised in some class the
/// column can compare as; for `lag`, the recorded `clock_read` (within [`CLOCK_SKEW`]
/// of the run's start) minus the lag. Otherwise a coordinator could have the agents
/// read an empty window and claim a match of the whole table.
fn window_claim(
    events: &[Value],
    signed: Option<&tally_common::segment::Window>,
    started_at: &str,
) -> Result<(), String> {
    use tally_common::TypeClass;
    let started = events.iter().find(|e| e["event"] == "started");
    let spec: Option<WindowSpec> = started
        .and_then(|e| e["spec"].get("window"))
        .filter(|w| !w.is_null())
        .map(|w| serde_json::from_value(w.clone()).map_err(|e| format!("the spec's window: {e}")))
        .transpose()?;
    // a window that only waits for a watermark bounds no column
    let spec = spec.and_then(|w| w.column.clone().map(|c| (c, w)));
    let ((column, spec), signed) = match (spec, signed) {
        (None, None) => return Ok(()),
        (None, Some(w)) => {
            return Err(format!(
                "the agents read a window ({} <= {}) the run's spec does not have",
                w.column, w.upper
            ));
        }
        (Some((column, _)), None) => {
            return Err(format!("the spec has a window on {column}, the agents read none"));
        }
        (Some(s), Some(w)) => (s, w),
    };
    if !column.eq_ignore_ascii_case(&signed.column) {
        return Err(format!(
            "the agents read a window on {}, the spec asks for {column}",
            signed.column
        ));
    }
    // the spec is the coordinator's: checked here as tally run checks it, never trusted
    match (&spec.as_of, &spec.lag) {
        (Some(_), None) => {}
        (None, Some(l)) if parse_duration(l).is_some_and(|d| d <= MAX_LAG_SECS) => {}
        _ => return Err("the spec's window sets neither a valid as_of nor a valid lag".into()),
    }
    let now = match &spec.lag {
        None => None,
        Some(_) => {
            let clock = events
                .iter()
                .find(|e| e["event"] == "clock_read")
                .and_then(|e| e["unix_ms"].as_i64())
                .ok_or("the spec's window has a lag and the record has no clock_read")?;
            let start = time::OffsetDateTime::parse(started_at, &Rfc3339)
                .map_err(|e| format!("the statement's started {started_at:?}: {e}"))?;
            let read = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(clock) * 1_000_000)
                .map_err(|e| format!("clock_read {clock}: {e}"))?;
            let (lo, hi) = (start.checked_sub(CLOCK_SKEW), start.checked_add(CLOCK_SKEW * 12));
            if lo.is_none_or(|lo| read < lo) || hi.is_none_or(|hi| read > hi) {
                return Err(format!(
                    "the window's clock was read at {}, not at the run's start ({started_at})",
                    read.format(&Rfc3339).unwrap_or_default()
                ));
            }
            Some(clock)
        }
    };
    let zone = events
        .iter()
        .find(|e| e["event"] == "described")
        .and_then(|e| e["source"]["time_zone"].as_str())
        .unwrap_or("UTC")
        .to_string();
    let fits = [
        TypeClass::Integer,
        TypeClass::Date,
        TypeClass::Timestamp,
        TypeClass::TimestampTz,
    ]
    .into_iter()
    .any(|class| window_upper(&spec, class, now, &zone).is_ok_and(|u| u == signed.upper));
    if fits {
        Ok(())
    } else {
        Err(format!(
            "the agents read the window {} <= {}, which is not the spec's ({})",
            signed.column,
            signed.upper,
            spec.as_of
                .as_ref()
                .map(|a| format!("as_of {}", a.text()))
                .or(spec.lag.as_ref().map(|l| format!("lag {l}")))
                .unwrap_or_default()
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use tally_common::TypeClass;
    use tally_common::checksum::HashMethod;
    use tally_common::wire::{Column, Describe};

    use super::*;

    fn describe(class: TypeClass, declared: &str) -> Describe {
        let col = |name: &str, class, declared: &str| Column {
            name: name.into(),
            class,
            declared_type: declared.into(),
            nullable: true,
            scale: None,
            fixed_char: false,
            masked: false,
        };
        Describe {
            dataset: "d".into(),
            columns: vec![col("id", TypeClass::Integer, "bigint"), col("v", class, declared)],
            key: vec!["id".into()],
            hash_methods: vec![HashMethod::Sha256_64],
            ..Default::default()
        }
    }

    /// A run's record as the verifier reads it: `started` with its spec, then `described`.
    fn record(target: TypeClass, declared: &str) -> (Vec<Value>, Value) {
        let spec: Spec = tally_common::config_file::parse_yaml(
            Path::new("s.yaml"),
            "name: t\nsource: { agent: a, dataset: d }\ntarget: { agent: b, dataset: d }\n",
        )
        .unwrap();
        let spec = serde_json::to_value(&spec).unwrap();
        let described = serde_json::to_value(Event::Described {
            source: Box::new(describe(TypeClass::Float, "double precision")),
            target: Box::new(describe(target, declared)),
        })
        .unwrap();
        (vec![json!({"event": "started", "spec": spec}), described], spec)
    }

    #[test]
    fn the_stated_fidelity_must_be_the_one_the_record_resolves_to() {
        let (events, spec) = record(TypeClass::Float, "double");
        let recorded = recorded_fidelity(&events, &spec).unwrap().unwrap();
        assert!(recorded.is_reduced());
        assert_eq!(
            fidelity_claim(&events, &spec, Some(&recorded)),
            Ok("reduced: v float at scale 6".to_string())
        );
        // a coordinator that states a plain pass where the record says otherwise
        let full = Fidelity::of(Vec::new());
        assert_eq!(
            fidelity_claim(&events, &spec, Some(&full)),
            Err(
                "the statement says full, the recorded spec and descriptions resolve to reduced: v float at \
                 scale 6"
                    .to_string()
            )
        );
        // a statement from before fidelity verifies, and says what the record gives
        assert_eq!(
            fidelity_claim(&events, &spec, None),
            Ok(
                "not stated (a statement from before fidelity); the record resolves to reduced: v float at \
                scale 6"
                    .to_string()
            )
        );
        // a run that ended before its description states none, and may not claim one
        let started = &events[..1];
        assert!(fidelity_claim(started, &spec, None).is_ok());
        assert!(fidelity_claim(started, &spec, Some(&full)).is_err());
        // drift: the run ended with an error, no fidelity
        let (events, spec) = record(TypeClass::Date, "date");
        assert_eq!(recorded_fidelity(&events, &spec), Ok(None));
    }
}
