//! What one release-log line says about a call: the request, as the SHA-256 of its
//! canonical JSON (RFC 8785, `request_sha256`) and as a summary without key values,
//! and a summary of what was released with the SHA-256 of the released numbers.
//!
//! The request is taken from the wire message, before it is validated, so a refused or
//! malformed request is recorded with the same digest the coordinator can compute from
//! what it sent. Every integer that can exceed 2^53 (key values, hash bounds, counts,
//! sums) is a decimal string in the digested JSON: RFC 8785 numbers are doubles.
//!
//! Key values and released sums are digested, not written out: the log lives in the
//! zone, but it is read by auditors and shipped to log stores that need not see key
//! values of the peer zone (a request's cut points can be the other side's keys). A zone
//! owner checks a line against the coordinator's evidence by recomputing the digests.

use serde_json::{Value, json};
use tally_proto::v1 as pb;

pub use tally_common::request_json::digest;
use tally_common::request_json::{self, columns, method_name, seal, segment, tuple};

/// Sealed or not, and with whom (in the summary).
fn sealed_summary(summary: &mut Value, s: Option<&pb::Seal>) {
    summary["sealed"] = json!(s.is_some());
    if let Some(p) = s.and_then(|s| s.peer.as_ref()) {
        summary["peer"] = json!(format!("{}/{}", p.agent, s.map_or("", |s| &s.peer_dataset)));
        summary["run"] = json!(hex::encode(&s.expect("peer of a seal").nonce));
    }
}

fn split_kind(s: Option<&pb::segment_split::Split>) -> &'static str {
    use pb::segment_split::Split as S;
    match s {
        None => "none",
        Some(S::Whole(_)) => "whole",
        Some(S::Quantile(_)) => "quantile",
        Some(S::Hash(_)) => "hash",
        Some(S::Cuts(_)) => "cuts",
        Some(S::Period(_)) => "period",
    }
}

/// What a segment constrains, without its values.
fn shape(segs: &mut dyn Iterator<Item = Option<&pb::Segment>>) -> Value {
    let (mut keys, mut hashes, mut periods, mut window) = (false, false, false, None);
    for s in segs.flatten() {
        keys |= s.lower.is_some() || s.upper.is_some();
        hashes |= s.hash_lo.is_some() || s.hash_hi.is_some();
        periods |= s.period.is_some();
        window = window.or(s.window.as_ref());
    }
    let mut v = json!({"key_bounds": keys, "hash_ranges": hashes, "periods": periods});
    // the window's column and bound are the coordinator's own values, not the zone's
    if let Some(w) = window {
        v["window"] = json!({"column": w.column, "upper": w.upper});
    }
    v
}

/// The request part of a release-log line: `request_sha256` over the full request,
/// `request` a summary of it without key values.
#[derive(Debug, Clone)]
pub struct Asked {
    pub sha256: String,
    pub summary: Value,
}

impl Asked {
    fn new(full: Value, summary: Value) -> Asked {
        Asked {
            sha256: digest(&full),
            summary,
        }
    }

    pub fn describe(r: &pb::DescribeRequest) -> Asked {
        Asked::new(json!({"rpc": "Describe", "dataset": r.dataset}), json!({}))
    }

    pub fn aggregate(r: &pb::AggregateRequest) -> Asked {
        let full = request_json::aggregate(r);
        let mut splits = serde_json::Map::new();
        for s in &r.segments {
            let n = splits.entry(split_kind(s.split.as_ref())).or_insert(json!(0));
            *n = json!(n.as_u64().unwrap_or(0) + 1);
        }
        let mut summary = json!({"columns": columns(&r.columns), "key_len": r.key_len,
                                 "method": method_name(r.method), "segments": r.segments.len(),
                                 "splits": splits});
        merge(
            &mut summary,
            shape(&mut r.segments.iter().map(|s| s.segment.as_ref())),
        );
        sealed_summary(&mut summary, r.seal.as_ref());
        Asked::new(full, summary)
    }

    pub fn row_digests(r: &pb::RowDigestsRequest) -> Asked {
        let full = request_json::row_digests(r);
        let mut summary = json!({"columns": columns(&r.columns), "key_len": r.key_len,
                                 "method": method_name(r.method)});
        merge(&mut summary, shape(&mut std::iter::once(r.segment.as_ref())));
        sealed_summary(&mut summary, r.seal.as_ref());
        Asked::new(full, summary)
    }

    pub fn reveal(rpc: &str, r: &pb::RevealRequest) -> Asked {
        let full = json!({"rpc": rpc, "dataset": r.dataset, "columns": columns(&r.columns),
                          "key_len": r.key_len, "segment": segment(r.segment.as_ref()),
                          "key_hashes": r.key_hashes.iter().map(|h| format!("{h:016x}")).collect::<Vec<_>>(),
                          "limit": r.limit, "level": r.level, "consent_acknowledged": r.consent_acknowledged,
                          "seal": seal(r.seal.as_ref())});
        let mut summary = json!({"columns": columns(&r.columns), "key_len": r.key_len,
                                 "key_hashes": r.key_hashes.len(), "limit": r.limit});
        merge(&mut summary, shape(&mut std::iter::once(r.segment.as_ref())));
        sealed_summary(&mut summary, r.seal.as_ref());
        Asked::new(full, summary)
    }

    pub fn measures(r: &pb::MeasuresRequest) -> Asked {
        let full = request_json::measures(r);
        let group_by = &full["group_by"];
        let window = &full["window"];
        // labels of parent groups are values of the peer's groups too: digested, counted
        let mut summary = json!({"columns": columns(&r.columns), "group_by": group_by, "measures": r.measures,
                                 "parents": r.parents.len(), "method": method_name(r.method), "window": window});
        sealed_summary(&mut summary, r.seal.as_ref());
        Asked::new(full, summary)
    }

    pub fn read_position(r: &pb::ReadPositionRequest) -> Asked {
        Asked::new(
            json!({"rpc": "ReadPosition", "run_id": r.run_id, "dataset": r.dataset}),
            json!({}),
        )
    }

    pub fn wait_position(r: &pb::WaitPositionRequest) -> Asked {
        let position = r
            .position
            .as_ref()
            .map(|p| json!({"kind": p.kind, "value": p.value}));
        let full = json!({"rpc": "WaitPosition", "run_id": r.run_id, "dataset": r.dataset,
                          "position": position, "timeout_ms": r.timeout_ms.to_string()});
        // the digest covers the request whole; the summary keeps at most 200 characters
        let shown = r.position.as_ref().map(|p| {
            json!({"kind": p.kind.chars().take(20).collect::<String>(),
                   "value": p.value.chars().take(200).collect::<String>()})
        });
        Asked::new(
            full,
            json!({"position": shown, "timeout_ms": r.timeout_ms.to_string()}),
        )
    }

    pub fn investigation_sql(r: &pb::InvestigationSqlRequest) -> Asked {
        let mut full = json!({"rpc": "InvestigationSql", "dataset": r.dataset, "columns": columns(&r.columns),
                          "key_len": r.key_len, "segment": segment(r.segment.as_ref()), "sealed": r.sealed});
        let mut summary = json!({"columns": columns(&r.columns), "key_len": r.key_len});
        // every segment the call names, the batched items' too
        merge(
            &mut summary,
            shape(&mut std::iter::once(r.segment.as_ref()).chain(r.items.iter().map(|i| i.segment.as_ref()))),
        );
        // per-key SQL: the digest covers the keys, the summary counts them (the log is
        // read outside the zone too)
        if !r.keys.is_empty() {
            let keys: Vec<Value> = r.keys.iter().map(tuple).collect();
            merge(&mut full, json!({"keys": keys}));
            merge(&mut summary, json!({"keys": r.keys.len()}));
        }
        // per-key SQL of many leaves: each item's segment and keys in the digest, the
        // items and their keys counted in the summary
        if !r.items.is_empty() {
            let items: Vec<Value> = r
                .items
                .iter()
                .map(|i| json!({"segment": segment(i.segment.as_ref()), "keys": i.keys.iter().map(tuple).collect::<Vec<_>>()}))
                .collect();
            merge(&mut full, json!({"items": items}));
            let keys: usize = r.items.iter().map(|i| i.keys.len()).sum();
            merge(&mut summary, json!({"items": r.items.len(), "keys": keys}));
        }
        Asked::new(full, summary)
    }
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

/// What a Measures answer released: how many groups and rows, which measures went out
/// in clear, and the SHA-256 of the groups as signed (labels and values digested, not
/// written: the log is read outside the zone too).
pub fn measures_released(r: &tally_common::wire::measures::MeasuresResponse, clear: &[bool]) -> Value {
    json!({"groups": r.groups.len(),
           "rows": r.groups.iter().map(|g| g.count).sum::<u64>().to_string(),
           "clear": clear,
           "groups_sha256": tally_common::evidence::groups_sha256(&r.groups)})
}

/// What an aggregate released: bucket count, total count, and the SHA-256 of the
/// canonical JSON list `[{"p", "b", "n", "s", "x"}]` (parent, child, count, sum as
/// unsigned 64-bit, xor or null; all decimal strings) in response order.
pub fn aggregate_released(buckets: &[pb::Bucket]) -> Value {
    let list: Vec<Value> = buckets
        .iter()
        .map(|b| {
            json!({"p": b.parent.to_string(), "b": b.child.to_string(), "n": b.count.to_string(),
                   "s": b.sum.to_string(), "x": b.xor.map(|x| x.to_string())})
        })
        .collect();
    let total: u64 = buckets.iter().map(|b| b.count).sum();
    json!({"buckets": buckets.len(), "total_count": total.to_string(), "buckets_sha256": digest(&Value::Array(list))})
}

/// The running digest of a RowDigests stream: SHA-256 over each sent digest's key hash
/// and row hash, 8 bytes big-endian each, in stream order.
#[derive(Debug, Clone, Default)]
pub struct DigestsSent {
    pub hash: tally_common::evidence::DigestsHash,
}

impl DigestsSent {
    pub fn add(&mut self, d: &pb::RowDigest) {
        self.hash.add(d.key_hash, d.row_hash);
    }

    pub fn count(&self) -> u64 {
        self.hash.count
    }

    pub fn released(&self) -> Value {
        json!({"digests": self.hash.count, "digests_sha256": self.hash.hex()})
    }
}

/// What a reveal released: the row count, whether values were included, the key
/// hashes of the released rows, and the SHA-256 of the canonical JSON of the rows as
/// sent (`[{"h", "key", "values"}]`).
pub fn reveal_released(rows: &[pb::RevealedRow], values: bool) -> Value {
    let list: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"h": format!("{:016x}", r.key_hash), "key": r.key.as_ref().map(tuple),
                   "values": r.values.iter().map(|v| v.text.clone()).collect::<Vec<_>>()})
        })
        .collect();
    json!({"rows": rows.len(), "values": values,
           "key_hashes": rows.iter().map(|r| format!("{:016x}", r.key_hash)).collect::<Vec<_>>(),
           "rows_sha256": digest(&Value::Array(list))})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_digest_covers_bounds_and_stays_exact_beyond_doubles() {
        let seg = |lo: u64| pb::SegmentSplit {
            segment: Some(pb::Segment {
                hash_lo: Some(lo),
                hash_hi: Some(1 << 60),
                ..Default::default()
            }),
            split: Some(pb::segment_split::Split::Hash(2)),
        };
        let req = |lo: u64| pb::AggregateRequest {
            dataset: "d".into(),
            segments: vec![seg(lo)],
            ..Default::default()
        };
        // 2^59 and 2^59 + 1 are the same double
        let (a, b) = (
            Asked::aggregate(&req(1 << 59)),
            Asked::aggregate(&req((1 << 59) + 1)),
        );
        assert_ne!(a.sha256, b.sha256);
        assert_eq!(a.sha256, Asked::aggregate(&req(1 << 59)).sha256);
        assert_eq!(a.summary["segments"], json!(1));
        assert_eq!(a.summary["splits"], json!({"hash": 1}));
        assert!(
            !a.summary.to_string().contains("576460752303423488"),
            "{}",
            a.summary
        );
    }

    #[test]
    fn released_digests_change_with_any_number() {
        let b = |sum: u64| pb::Bucket {
            count: 3,
            sum,
            ..Default::default()
        };
        let one = aggregate_released(&[b(1)]);
        assert_eq!(one["total_count"], json!("3"));
        assert_ne!(
            one["buckets_sha256"],
            aggregate_released(&[b(2)])["buckets_sha256"]
        );
        let mut s = DigestsSent::default();
        let before = s.released();
        s.add(&pb::RowDigest {
            key_hash: 1,
            row_hash: 2,
        });
        assert_eq!(s.released()["digests"], json!(1));
        assert_ne!(s.released()["digests_sha256"], before["digests_sha256"]);
    }
}
