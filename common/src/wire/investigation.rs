//! `InvestigationSql`: ready-to-run SQL for a segment or for named keys.

use serde::{Deserialize, Serialize};
use tally_proto::v1 as pb;

use super::{columns_from, columns_to, key_len, segment_from};
use crate::segment::{ColumnSpec, KeyTuple, Segment, WireError, tuple_from_pb, tuple_to_pb, wire_err};

/// Ready-to-run SQL for a segment, in the agent's dialect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvestigationSqlRequest {
    pub dataset: String,
    pub columns: Vec<ColumnSpec>,
    pub key_len: usize,
    pub segment: Segment,
    /// The run is sealed: the SQL covers the key range only.
    pub sealed: bool,
    /// When not empty: SQL of exactly these keys' rows (at most
    /// [`MAX_KEY_SQL_KEYS`], each of `key_len` values) instead of the segment's range.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<KeyTuple>,
    /// When not empty (and `keys` empty): the per-key SQL of each item, answered in
    /// [`InvestigationSqlResponse::sqls`] in order (at most [`MAX_KEY_SQL_ITEMS`] items
    /// and [`MAX_KEY_SQL_BATCH_KEYS`] keys in all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<KeySqlItem>,
}

/// One leaf's keys of one kind of difference: per-key SQL of exactly these keys within
/// `segment`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySqlItem {
    pub segment: Segment,
    pub keys: Vec<KeyTuple>,
}

/// The most keys one per-key investigation SQL names.
pub const MAX_KEY_SQL_KEYS: usize = 1000;
/// The most items, and keys in all, of one batched per-key SQL request.
pub const MAX_KEY_SQL_ITEMS: usize = 256;
pub const MAX_KEY_SQL_BATCH_KEYS: usize = 20_000;

/// Key tuples from the wire, each of `len` values (`field` names them in an error).
fn tuples_from(keys: Vec<pb::KeyTuple>, len: usize, field: &str) -> Result<Vec<KeyTuple>, WireError> {
    if keys.len() > MAX_KEY_SQL_KEYS {
        return Err(wire_err(
            field,
            format!("{} key tuples; at most {MAX_KEY_SQL_KEYS}", keys.len()),
        ));
    }
    keys.into_iter()
        .enumerate()
        .map(|(i, t)| {
            let field = format!("{field}[{i}]");
            let t = tuple_from_pb(t, &field)?;
            if t.len() != len {
                return Err(wire_err(
                    field,
                    format!("{} value(s); the key has {len}", t.len()),
                ));
            }
            Ok(t)
        })
        .collect()
}

impl TryFrom<pb::InvestigationSqlRequest> for InvestigationSqlRequest {
    type Error = WireError;
    fn try_from(r: pb::InvestigationSqlRequest) -> Result<InvestigationSqlRequest, WireError> {
        let len = key_len(r.key_len);
        let keys = tuples_from(r.keys, len, "keys")?;
        if !r.items.is_empty() && !keys.is_empty() {
            return Err(wire_err("items", "a request has keys or items, not both"));
        }
        if r.items.len() > MAX_KEY_SQL_ITEMS {
            return Err(wire_err(
                "items",
                format!("{} items; at most {MAX_KEY_SQL_ITEMS}", r.items.len()),
            ));
        }
        let total: usize = r.items.iter().map(|i| i.keys.len()).sum();
        if total > MAX_KEY_SQL_BATCH_KEYS {
            return Err(wire_err(
                "items",
                format!("{total} key tuples in all; at most {MAX_KEY_SQL_BATCH_KEYS}"),
            ));
        }
        let items = r
            .items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                if item.keys.is_empty() {
                    return Err(wire_err(format!("items[{i}].keys"), "no key tuple"));
                }
                Ok(KeySqlItem {
                    segment: segment_from(item.segment, &format!("items[{i}].segment"))?,
                    keys: tuples_from(item.keys, len, &format!("items[{i}].keys"))?,
                })
            })
            .collect::<Result<Vec<_>, WireError>>()?;
        Ok(InvestigationSqlRequest {
            segment: segment_from(r.segment, "segment")?,
            columns: columns_from(r.columns)?,
            key_len: len,
            sealed: r.sealed,
            dataset: r.dataset,
            keys,
            items,
        })
    }
}

impl From<InvestigationSqlRequest> for pb::InvestigationSqlRequest {
    fn from(r: InvestigationSqlRequest) -> Self {
        pb::InvestigationSqlRequest {
            dataset: r.dataset,
            columns: columns_to(&r.columns),
            key_len: r.key_len as u32,
            segment: Some(pb::Segment::from(&r.segment)),
            sealed: r.sealed,
            keys: r.keys.iter().map(tuple_to_pb).collect(),
            items: r
                .items
                .iter()
                .map(|i| pb::KeySqlItem {
                    segment: Some(pb::Segment::from(&i.segment)),
                    keys: i.keys.iter().map(tuple_to_pb).collect(),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct InvestigationSqlResponse {
    pub sql: String,
    pub release_log_head: String,
    /// The SQL of each of the request's `items`, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sqls: Vec<String>,
}

impl From<pb::InvestigationSqlResponse> for InvestigationSqlResponse {
    fn from(r: pb::InvestigationSqlResponse) -> Self {
        InvestigationSqlResponse {
            sql: r.sql,
            release_log_head: r.release_log_head,
            sqls: r.sqls,
        }
    }
}

impl From<InvestigationSqlResponse> for pb::InvestigationSqlResponse {
    fn from(r: InvestigationSqlResponse) -> Self {
        pb::InvestigationSqlResponse {
            sql: r.sql,
            release_log_head: r.release_log_head,
            sqls: r.sqls,
        }
    }
}
