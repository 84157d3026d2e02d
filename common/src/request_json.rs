//! The JSON form of a request an agent signs an answer to (docs/evidence.md, "The
//! requests"): `request_sha256` in the agent's signed answer and release log is the
//! SHA-256 of this value's RFC 8785 canonical JSON. The agent builds it from the wire
//! message it received; the coordinator builds it from the message it sent and records
//! it beside the answer, so a verifier checks from the bundle alone what each signed
//! answer was asked.
//!
//! Every integer that can exceed 2^53 (key values, hash bounds) is a decimal string:
//! RFC 8785 numbers are doubles. The other numbers (`key_len`, `scale`, `level`, a
//! split's part count) are small JSON integers.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tally_proto::v1 as pb;

/// The SHA-256 (hex) of a value's RFC 8785 canonical JSON.
pub fn digest(v: &Value) -> String {
    let text = crate::jcs::canonical_json(&v.to_string()).expect("request JSON has no floats");
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// A type class's name: `integer`, `decimal`, … (`unknown:N` for a number this build
/// does not know).
pub fn class_name(c: i32) -> String {
    pb::TypeClass::try_from(c)
        .map(|t| {
            t.as_str_name()
                .trim_start_matches("TYPE_CLASS_")
                .to_ascii_lowercase()
        })
        .unwrap_or_else(|_| format!("unknown:{c}"))
}

/// A hash method's name: `sha256_64`, `sealed_sha256_64`, … (`unknown:N`).
pub fn method_name(m: i32) -> String {
    crate::HashMethod::from_pb(m).map_or_else(|| format!("unknown:{m}"), |m| m.name().to_string())
}

/// A request's seal: the run nonce and the peer's zone key, or `null`.
pub fn seal(s: Option<&pb::Seal>) -> Value {
    let Some(s) = s else { return Value::Null };
    json!({"nonce": hex::encode(&s.nonce),
           "peer": s.peer.as_ref().map(|p| p.agent.clone()),
           "peer_dataset": s.peer_dataset,
           "peer_key": s.peer.as_ref().map(|p| hex::encode(&p.public_key))})
}

/// Columns with what decides their canonical form: class, scale, exact, fixed.
pub fn columns(cols: &[pb::ColumnRef]) -> Value {
    cols.iter()
        .map(|c| {
            json!({"name": c.name, "class": class_name(c.type_class), "scale": c.scale,
                   "exact": c.exact, "fixed": c.fixed_char})
        })
        .collect()
}

/// A key tuple: each part `{"int": "<decimal>"}`, `{"text": "…"}` or `null`.
pub fn tuple(t: &pb::KeyTuple) -> Value {
    t.parts
        .iter()
        .map(|p| match &p.value {
            Some(pb::key_value::Value::Int(i)) => json!({"int": i.to_string()}),
            Some(pb::key_value::Value::Text(s)) => json!({"text": s}),
            None => Value::Null,
        })
        .collect()
}

/// A segment: key bounds, hash range, period and (only where present) window.
pub fn segment(s: Option<&pb::Segment>) -> Value {
    let Some(s) = s else { return Value::Null };
    let mut v = json!({
        "lower": s.lower.as_ref().map(tuple),
        "upper": s.upper.as_ref().map(tuple),
        "hash_lo": s.hash_lo.map(|h| h.to_string()),
        "hash_hi": s.hash_hi.map(|h| h.to_string()),
        "period": s.period.as_ref().map(|p| json!({"column": p.column, "granularity": p.granularity, "label": p.label})),
    });
    // only where present: a request without a window keeps the digest it always had
    if let Some(w) = &s.window {
        v["window"] = json!({"column": w.column, "upper": w.upper});
    }
    v
}

/// How a segment is split into buckets.
pub fn split(s: Option<&pb::segment_split::Split>) -> Value {
    use pb::segment_split::Split as S;
    match s {
        None => Value::Null,
        Some(S::Whole(_)) => json!("whole"),
        Some(S::Quantile(n)) => json!({"quantile": n}),
        Some(S::Hash(n)) => json!({"hash": n}),
        Some(S::Cuts(c)) => json!({"cuts": c.cuts.iter().map(tuple).collect::<Vec<_>>()}),
        Some(S::Period(p)) => json!({"period": {"column": p.column, "granularity": p.granularity}}),
    }
}

/// A request's `side`, in its digest when the coordinator named one (so the digest of
/// a request from a coordinator before sides is unchanged).
fn with_side(mut full: Value, side: &str) -> Value {
    if !side.is_empty() {
        full["side"] = json!(side);
    }
    full
}

/// An Aggregate request.
pub fn aggregate(r: &pb::AggregateRequest) -> Value {
    let segments: Vec<Value> = r
        .segments
        .iter()
        .map(|s| json!({"segment": segment(s.segment.as_ref()), "split": split(s.split.as_ref())}))
        .collect();
    let full = json!({"rpc": "Aggregate", "run_id": r.run_id, "dataset": r.dataset, "columns": columns(&r.columns),
                      "key_len": r.key_len, "method": method_name(r.method), "segments": segments,
                      "in_process": r.in_process, "seal": seal(r.seal.as_ref())});
    with_side(full, &r.side)
}

/// A RowDigests request.
pub fn row_digests(r: &pb::RowDigestsRequest) -> Value {
    let full = json!({"rpc": "RowDigests", "run_id": r.run_id, "dataset": r.dataset, "columns": columns(&r.columns),
                      "key_len": r.key_len, "method": method_name(r.method),
                      "segment": segment(r.segment.as_ref()), "level": r.level,
                      "seal": seal(r.seal.as_ref())});
    with_side(full, &r.side)
}

/// A Measures request.
pub fn measures(r: &pb::MeasuresRequest) -> Value {
    let group_by: Vec<Value> = r
        .group_by
        .iter()
        .map(|g| json!({"column": g.column, "granularity": g.granularity}))
        .collect();
    let parents: Vec<Value> = r
        .parents
        .iter()
        .map(|p| json!(p.labels.iter().map(|l| l.text.clone()).collect::<Vec<_>>()))
        .collect();
    let window = r
        .window
        .as_ref()
        .map(|w| json!({"column": w.column, "upper": w.upper}));
    let full = json!({"rpc": "Measures", "run_id": r.run_id, "dataset": r.dataset,
                      "columns": columns(&r.columns), "key_len": r.key_len, "group_by": group_by,
                      "measures": r.measures, "parents": parents, "window": window,
                      "method": method_name(r.method), "seal": seal(r.seal.as_ref())});
    with_side(full, &r.side)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::{EvenCuts, Segment, Split};

    /// An even split's first cut, width and count restate its cut list: the signed
    /// request is the list's, the same JSON an agent built before the even form digests.
    #[test]
    fn an_even_split_is_digested_as_its_cut_list() {
        let ask = |split: Split| pb::AggregateRequest {
            dataset: "orders".into(),
            key_len: 1,
            method: pb::HashMethod::Sha25664 as i32,
            segments: vec![pb::SegmentSplit {
                segment: Some(pb::Segment::from(&Segment::whole())),
                split: Some(split.to_pb()),
            }],
            run_id: "r1".into(),
            side: "source".into(),
            ..Default::default()
        };
        let e = EvenCuts::new(100, 25, 4).unwrap();
        let even = aggregate(&ask(Split::Even(e)));
        assert_eq!(even, aggregate(&ask(Split::Cuts(e.cuts()))));
        assert_eq!(
            even["segments"][0]["split"],
            json!({"cuts": [[{"int": "100"}], [{"int": "125"}], [{"int": "150"}], [{"int": "175"}]]})
        );
        let other = EvenCuts::new(100, 26, 4).unwrap();
        assert_ne!(digest(&even), digest(&aggregate(&ask(Split::Even(other)))));
    }
}
