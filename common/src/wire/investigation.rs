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
}

/// The most keys one per-key investigation SQL names.
pub const MAX_KEY_SQL_KEYS: usize = 1000;

impl TryFrom<pb::InvestigationSqlRequest> for InvestigationSqlRequest {
    type Error = WireError;
    fn try_from(r: pb::InvestigationSqlRequest) -> Result<InvestigationSqlRequest, WireError> {
        if r.keys.len() > MAX_KEY_SQL_KEYS {
            return Err(wire_err(
                "keys",
                format!("{} key tuples; at most {MAX_KEY_SQL_KEYS}", r.keys.len()),
            ));
        }
        let len = key_len(r.key_len);
        let keys = r
            .keys
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                let field = format!("keys[{i}]");
                let t = tuple_from_pb(t, &field)?;
                if t.len() != len {
                    return Err(wire_err(
                        field,
                        format!("{} value(s); the key has {len}", t.len()),
                    ));
                }
                Ok(t)
            })
            .collect::<Result<Vec<_>, WireError>>()?;
        Ok(InvestigationSqlRequest {
            segment: segment_from(r.segment, "segment")?,
            columns: columns_from(r.columns)?,
            key_len: len,
            sealed: r.sealed,
            dataset: r.dataset,
            keys,
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
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct InvestigationSqlResponse {
    pub sql: String,
    pub release_log_head: String,
}

impl From<pb::InvestigationSqlResponse> for InvestigationSqlResponse {
    fn from(r: pb::InvestigationSqlResponse) -> Self {
        InvestigationSqlResponse {
            sql: r.sql,
            release_log_head: r.release_log_head,
        }
    }
}

impl From<InvestigationSqlResponse> for pb::InvestigationSqlResponse {
    fn from(r: InvestigationSqlResponse) -> Self {
        pb::InvestigationSqlResponse {
            sql: r.sql,
            release_log_head: r.release_log_head,
        }
    }
}
