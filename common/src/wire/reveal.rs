//! `RevealKeys` and `RevealRows`: the key (and column) values of rows named by key hash.

use serde::{Deserialize, Serialize};
use tally_proto::v1 as pb;

use super::{Seal, columns_from, columns_to, key_len, level_from, level_to, seal_from, segment_from};
use crate::segment::{ColumnSpec, KeyTuple, Segment, WireError, tuple_from_pb, tuple_to_pb, wire_err};
use crate::types::PrivacyLevel;

/// Key (and at detailed, column) values of rows named by key hash: the request of
/// both RevealKeys and RevealRows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevealRequest {
    pub dataset: String,
    pub columns: Vec<ColumnSpec>,
    pub key_len: usize,
    pub segment: Segment,
    pub key_hashes: Vec<u64>,
    pub limit: u32,
    pub level: PrivacyLevel,
    pub consent_acknowledged: bool,
    pub seal: Option<Seal>,
}

impl TryFrom<pb::RevealRequest> for RevealRequest {
    type Error = WireError;
    fn try_from(r: pb::RevealRequest) -> Result<RevealRequest, WireError> {
        Ok(RevealRequest {
            seal: seal_from(r.seal)?,
            segment: segment_from(r.segment, "segment")?,
            level: level_from(r.level, "level")?,
            columns: columns_from(r.columns)?,
            key_len: key_len(r.key_len),
            key_hashes: r.key_hashes,
            limit: r.limit,
            consent_acknowledged: r.consent_acknowledged,
            dataset: r.dataset,
        })
    }
}

impl From<RevealRequest> for pb::RevealRequest {
    fn from(r: RevealRequest) -> Self {
        pb::RevealRequest {
            dataset: r.dataset,
            columns: columns_to(&r.columns),
            key_len: r.key_len as u32,
            segment: Some(pb::Segment::from(&r.segment)),
            key_hashes: r.key_hashes,
            limit: r.limit,
            level: level_to(r.level),
            consent_acknowledged: r.consent_acknowledged,
            seal: r.seal.map(pb::Seal::from),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevealedRow {
    pub key_hash: u64,
    pub key: KeyTuple,
    /// detailed only: canonical text per compared column (`None` = NULL or masked).
    pub values: Vec<Option<String>>,
}

/// The most rows one reveal call releases, whatever its limit: a coordinator asks for
/// more in pages of at most this many key hashes.
pub const MAX_REVEAL_ROWS_PER_CALL: usize = 1000;

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RevealResponse {
    pub rows: Vec<RevealedRow>,
    pub truncated: bool,
    pub release_log_head: String,
    /// The reveal budget (its policy key, `max_reveal_rows` or
    /// `max_reveal_rows_per_hour`) that let fewer rows out than asked: said by the
    /// agent when it cut an answer short, and recorded by the coordinator when the
    /// agent refused a call because that budget was spent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withheld_by: Option<String>,
}

impl TryFrom<pb::RevealResponse> for RevealResponse {
    type Error = WireError;
    fn try_from(r: pb::RevealResponse) -> Result<RevealResponse, WireError> {
        let rows = r
            .rows
            .into_iter()
            .enumerate()
            .map(|(i, row)| {
                let f = format!("rows[{i}].key");
                let key = row.key.ok_or_else(|| wire_err(&f, "missing"))?;
                Ok(RevealedRow {
                    key_hash: row.key_hash,
                    key: tuple_from_pb(key, &f)?,
                    values: row.values.into_iter().map(|v| v.text).collect(),
                })
            })
            .collect::<Result<Vec<_>, WireError>>()?;
        Ok(RevealResponse {
            rows,
            truncated: r.truncated,
            release_log_head: r.release_log_head,
            withheld_by: Some(r.withheld_by).filter(|b| !b.is_empty()),
        })
    }
}

impl From<RevealResponse> for pb::RevealResponse {
    fn from(r: RevealResponse) -> Self {
        pb::RevealResponse {
            rows: r
                .rows
                .into_iter()
                .map(|row| pb::RevealedRow {
                    key_hash: row.key_hash,
                    key: Some(tuple_to_pb(&row.key)),
                    values: row
                        .values
                        .into_iter()
                        .map(|text| pb::OptionalText { text })
                        .collect(),
                })
                .collect(),
            truncated: r.truncated,
            release_log_head: r.release_log_head,
            withheld_by: r.withheld_by.unwrap_or_default(),
        }
    }
}
