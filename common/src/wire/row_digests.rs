//! `RowDigests`: (key hash, row hash) of every row of a leaf segment.

use serde::{Deserialize, Serialize};
use tally_proto::v1 as pb;

use super::{
    Seal, Side, columns_from, columns_to, envelope_from, envelope_to, key_len, level_from, level_to,
    method_from, method_to, run_id_from, seal_from, segment_from, side_from, side_to,
};
use crate::checksum::HashMethod;
use crate::dsse::Envelope;
use crate::segment::{ColumnSpec, Segment, WireError};
use crate::types::PrivacyLevel;

/// (key hash, row hash) of every row of a leaf segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowDigestsRequest {
    pub dataset: String,
    pub columns: Vec<ColumnSpec>,
    pub key_len: usize,
    pub method: HashMethod,
    pub segment: Segment,
    pub level: PrivacyLevel,
    pub seal: Option<Seal>,
    pub run_id: String,
    /// As in [`AggregateRequest`](super::AggregateRequest).
    pub side: Option<Side>,
}

impl TryFrom<pb::RowDigestsRequest> for RowDigestsRequest {
    type Error = WireError;
    fn try_from(r: pb::RowDigestsRequest) -> Result<RowDigestsRequest, WireError> {
        Ok(RowDigestsRequest {
            method: method_from(r.method, "method")?,
            seal: seal_from(r.seal)?,
            segment: segment_from(r.segment, "segment")?,
            level: level_from(r.level, "level")?,
            columns: columns_from(r.columns)?,
            key_len: key_len(r.key_len),
            dataset: r.dataset,
            run_id: run_id_from(r.run_id)?,
            side: side_from(r.side)?,
        })
    }
}

impl From<RowDigestsRequest> for pb::RowDigestsRequest {
    fn from(r: RowDigestsRequest) -> Self {
        pb::RowDigestsRequest {
            dataset: r.dataset,
            columns: columns_to(&r.columns),
            key_len: r.key_len as u32,
            method: method_to(r.method),
            segment: Some(pb::Segment::from(&r.segment)),
            level: level_to(r.level),
            seal: r.seal.map(pb::Seal::from),
            run_id: r.run_id,
            side: side_to(r.side),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RowDigest {
    pub key_hash: u64,
    pub row_hash: u64,
}

/// One batch of a RowDigests stream (see the proto for the release-log heads).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RowDigestBatch {
    pub digests: Vec<RowDigest>,
    pub release_log_head: String,
    /// On the last batch: what the agent signed over the whole stream.
    pub envelope: Option<Envelope>,
}

impl TryFrom<pb::RowDigestBatch> for RowDigestBatch {
    type Error = WireError;
    fn try_from(b: pb::RowDigestBatch) -> Result<RowDigestBatch, WireError> {
        Ok(RowDigestBatch {
            envelope: envelope_from(b.envelope, "envelope")?,
            digests: b
                .digests
                .into_iter()
                .map(|d| RowDigest {
                    key_hash: d.key_hash,
                    row_hash: d.row_hash,
                })
                .collect(),
            release_log_head: b.release_log_head,
        })
    }
}

impl From<RowDigestBatch> for pb::RowDigestBatch {
    fn from(b: RowDigestBatch) -> Self {
        pb::RowDigestBatch {
            digests: b
                .digests
                .into_iter()
                .map(|d| pb::RowDigest {
                    key_hash: d.key_hash,
                    row_hash: d.row_hash,
                })
                .collect(),
            release_log_head: b.release_log_head,
            envelope: envelope_to(b.envelope),
        }
    }
}
