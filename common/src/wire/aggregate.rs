//! `Aggregate`: count and checksum aggregates per child bucket of parent segments.

use serde::{Deserialize, Serialize};
use tally_proto::v1 as pb;

use super::{
    Seal, Side, columns_from, columns_to, envelope_from, envelope_to, key_len, method_from, method_to,
    run_id_from, seal_from, segment_from, side_from, side_to,
};
use crate::checksum::HashMethod;
use crate::dsse::Envelope;
use crate::segment::{ColumnSpec, Segment, Split, WireError, wire_err};

/// Aggregate requests carry between 1 and this many parent segments.
pub const MAX_SEGMENTS: usize = 100_000;

/// Count and checksum aggregates per child bucket of each parent segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggregateRequest {
    pub dataset: String,
    /// Key columns first, then compared columns: the order of the row string.
    pub columns: Vec<ColumnSpec>,
    pub key_len: usize,
    pub method: HashMethod,
    /// Each parent segment with how to split it; 1 to [`MAX_SEGMENTS`].
    pub parents: Vec<(Segment, Split)>,
    /// Ask for the in-process path even where pushdown is possible.
    pub in_process: bool,
    pub seal: Option<Seal>,
    /// The run the call belongs to (signed into the answer).
    pub run_id: String,
    /// The side the agent answers as (signed into the answer); `None` from a
    /// coordinator before it.
    pub side: Option<Side>,
}

impl TryFrom<pb::AggregateRequest> for AggregateRequest {
    type Error = WireError;
    fn try_from(r: pb::AggregateRequest) -> Result<AggregateRequest, WireError> {
        let method = method_from(r.method, "method")?;
        let seal = seal_from(r.seal)?;
        let run_id = run_id_from(r.run_id)?;
        if r.segments.is_empty() || r.segments.len() > MAX_SEGMENTS {
            return Err(wire_err(
                "segments",
                format!("between 1 and {MAX_SEGMENTS} needed"),
            ));
        }
        let parents = r
            .segments
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let f = format!("segments[{i}]");
                Ok((
                    segment_from(s.segment, &f)?,
                    Split::from_pb(s.split, &format!("{f}.split"))?,
                ))
            })
            .collect::<Result<Vec<_>, WireError>>()?;
        Ok(AggregateRequest {
            dataset: r.dataset,
            columns: columns_from(r.columns)?,
            key_len: key_len(r.key_len),
            method,
            parents,
            in_process: r.in_process,
            seal,
            run_id,
            side: side_from(r.side)?,
        })
    }
}

impl From<AggregateRequest> for pb::AggregateRequest {
    fn from(r: AggregateRequest) -> Self {
        pb::AggregateRequest {
            dataset: r.dataset,
            columns: columns_to(&r.columns),
            key_len: r.key_len as u32,
            method: method_to(r.method),
            segments: r
                .parents
                .iter()
                .map(|(seg, split)| pb::SegmentSplit {
                    segment: Some(pb::Segment::from(seg)),
                    split: Some(split.to_pb()),
                })
                .collect(),
            in_process: r.in_process,
            seal: r.seal.map(pb::Seal::from),
            run_id: r.run_id,
            side: side_to(r.side),
        }
    }
}

/// One child bucket of a parent segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// The index of the parent in the request.
    pub parent: usize,
    pub child: usize,
    pub segment: Segment,
    pub count: u64,
    /// SUM of row checksums mod 2^64.
    pub sum: u64,
    pub xor: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AggregateResponse {
    pub buckets: Vec<Bucket>,
    /// How the agent computed it: "pushdown" or "in_process".
    pub path: String,
    pub rows_scanned: u64,
    pub release_log_head: String,
    /// What the agent signed over this answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envelope: Option<Envelope>,
}

impl TryFrom<pb::AggregateResponse> for AggregateResponse {
    type Error = WireError;
    fn try_from(r: pb::AggregateResponse) -> Result<AggregateResponse, WireError> {
        let buckets = r
            .buckets
            .into_iter()
            .enumerate()
            .map(|(i, b)| {
                let f = format!("buckets[{i}].segment");
                let segment = b.segment.ok_or_else(|| wire_err(&f, "missing"))?;
                Ok(Bucket {
                    parent: b.parent as usize,
                    child: b.child as usize,
                    segment: Segment::from_pb(segment, &f)?,
                    count: b.count,
                    sum: b.sum,
                    xor: b.xor,
                })
            })
            .collect::<Result<Vec<_>, WireError>>()?;
        Ok(AggregateResponse {
            buckets,
            path: r.path,
            rows_scanned: r.rows_scanned,
            release_log_head: r.release_log_head,
            envelope: envelope_from(r.envelope, "envelope")?,
        })
    }
}

impl From<AggregateResponse> for pb::AggregateResponse {
    fn from(r: AggregateResponse) -> Self {
        pb::AggregateResponse {
            buckets: r
                .buckets
                .into_iter()
                .map(|b| pb::Bucket {
                    parent: b.parent as u32,
                    child: b.child as u32,
                    segment: Some(pb::Segment::from(&b.segment)),
                    count: b.count,
                    sum: b.sum,
                    xor: b.xor,
                })
                .collect(),
            path: r.path,
            rows_scanned: r.rows_scanned,
            release_log_head: r.release_log_head,
            envelope: envelope_to(r.envelope),
        }
    }
}
