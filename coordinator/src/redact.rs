//! A stored run as a `viewer` sees it (DESIGN §12: results without keys or values).
//! The result document (docs/results.md) is rebuilt from an allow-list, so a field added
//! later stays hidden until someone decides it is safe: kept are the verdict, totals,
//! levels and counts; removed are leaf checksums (a one-row leaf of an unsealed run is
//! that row's hash),  `differences` (keys, and at detailed the
//! values), each leaf's `bounds` (key values, a period label taken from a row's time,
//! or a hash range), `sql` (investigation SQL spells the bounds out) and `key_sql`
//! (it spells the differing keys out).

use serde_json::{Map, Value};

/// Top-level result fields that never carry a key or a row value.
const RESULT_FIELDS: &[&str] = &[
    "name",
    "verdict",
    "hash_method",
    "strategy",
    "level",
    "xor_compared",
    "false_match_probability",
    "false_match_bound",
    "source",
    "target",
    "levels",
    "difference_counts",
    "duplicate_keys",
    "truncated",
    "withheld",
    "warnings",
    "advice",
    "error",
    "elapsed_ms",
];

/// Leaf fields kept: the level and whether the leaf is inconsistent. Its per-side
/// counts are rebuilt below; checksums are not kept (a one-row leaf of an unsealed run
/// would be that row's hash), nor the reason, which quotes them.
const LEAF_FIELDS: &[&str] = &["level", "inconsistent"];

/// What the viewer is told was taken out.
pub const REDACTED: &str =
    "viewer: differences (keys and values), leaf bounds, checksums and investigation SQL are removed";

fn pick(v: &Value, fields: &[&str]) -> Value {
    let mut out = Map::new();
    if let Some(o) = v.as_object() {
        for f in fields {
            if let Some(x) = o.get(*f) {
                out.insert((*f).to_string(), x.clone());
            }
        }
    }
    Value::Object(out)
}

/// A run result (docs/results.md) without anything that can carry a key or a value.
pub fn result_for_viewer(result: &Value) -> Value {
    let mut out = pick(result, RESULT_FIELDS);
    let leaves: Vec<Value> = result["leaves"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|leaf| {
                    let mut out = pick(leaf, LEAF_FIELDS);
                    for side in ["source", "target"] {
                        out[side] = pick(&leaf[side], &["count"]);
                    }
                    out
                })
                .collect()
        })
        .unwrap_or_default();
    if let Some(o) = out.as_object_mut() {
        o.insert("leaves".into(), Value::Array(leaves));
        o.insert("redacted".into(), Value::String(REDACTED.into()));
    }
    out
}

/// A stored run document `{id, started, finished, spec, result}` for a viewer. The spec
/// names datasets and columns, never values.
pub fn document_for_viewer(doc: &Value) -> Value {
    let mut out = pick(doc, &["id", "state", "started", "finished", "spec"]);
    if let (Some(o), Some(r)) = (out.as_object_mut(), doc.get("result")) {
        o.insert("result".into(), result_for_viewer(r));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_viewer_sees_no_key_value_or_sql_anywhere() {
        let doc = json!({
            "id": "r1", "started": "t0", "finished": "t1",
            "spec": { "name": "orders" },
            "result": {
                "name": "orders", "verdict": "differ", "level": "detailed",
                "source": { "agent": "dc1", "dataset": "orders", "count": 10 },
                "target": { "agent": "vpc2", "dataset": "orders", "count": 11 },
                "levels": [{ "level": 1, "segments": 4, "differing": 1, "elapsed_ms": 3 }],
                "leaves": [{
                    "level": 1, "bounds": { "lower": [4242], "upper": [4343] },
                    "source": { "count": 1, "checksum": "00" }, "target": { "count": 2, "checksum": "01" },
                    "sql": { "source": "SELECT … WHERE id >= 4242", "target": "…4242…" },
                    "key_sql": [{ "kind": "changed", "keys": 1, "source": "SELECT … WHERE id IN (4242)", "target": "…4242…" }]
                }, {
                    "level": 2, "bounds": { "period": { "column": "born", "granularity": "day", "label": "1984-02-29" } },
                    "source": { "count": 1, "checksum": "02" }, "target": { "count": 1, "checksum": "03" }
                }],
                "differences": [{ "kind": "changed", "key": [4242], "columns": ["salary"],
                                  "values": { "salary": { "source": "91000", "target": "92000" } } }],
                "difference_counts": { "missing_in_target": 0, "extra_in_target": 1, "changed": 1 },
                "some_future_field": [4242],
                "elapsed_ms": 9
            }
        });
        let v = document_for_viewer(&doc);
        let text = v.to_string();
        for secret in ["4242", "4343", "1984-02-29", "91000", "92000", "SELECT"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(v["result"].get("differences").is_none());
        for leaf in v["result"]["leaves"].as_array().unwrap() {
            assert!(
                leaf.get("bounds").is_none() && leaf.get("sql").is_none() && leaf.get("key_sql").is_none(),
                "{leaf}"
            );
        }
        assert_eq!(v["result"]["verdict"], "differ");
        assert_eq!(v["result"]["difference_counts"]["changed"], 1);
        assert_eq!(v["result"]["leaves"][0]["source"]["count"], 1);
        // no checksum: a one-row leaf of an unsealed run would be that row's hash
        for leaf in v["result"]["leaves"].as_array().unwrap() {
            for side in ["source", "target"] {
                assert_eq!(leaf[side].as_object().unwrap().len(), 1, "{leaf}");
            }
            assert!(leaf.get("reason").is_none(), "{leaf}");
        }
        assert_eq!(v["result"]["leaves"].as_array().unwrap().len(), 2);
        assert_eq!(v["spec"]["name"], "orders");
        assert_eq!(v["result"]["redacted"], REDACTED);
    }
}
