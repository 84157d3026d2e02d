//! Domain types of every `tally.agent.v1` message, and the one place they meet the
//! generated proto structs. `TryFrom<pb::X>` validates and names the offending field
//! (`segments[3].split`, `seal.nonce`); `From<X> for pb::X` builds the message. The agent
//! converts requests at its service edge and the coordinator answers at its client edge,
//! so neither works on `pb::` types beyond them.
//!
//! Two leniencies are deliberate, for agents and coordinators of different builds: a
//! hash method this build does not know is not offered to it (`Describe::hash_methods`
//! skips it), and a column of a type class it does not know is described as
//! [`TypeClass::Other`] (no canonical form: refused only if the run compares it). An
//! absent segment is the whole dataset and an absent split is `whole`, as before these
//! types existed.

use serde::{Deserialize, Serialize};
use tally_proto::v1 as pb;

use crate::checksum::HashMethod;
use crate::dsse::Envelope;
use crate::evidence::valid_run_id;
use crate::position::{Position, PositionKind};
use crate::seal::{NONCE_LEN, SignedZoneKey};
pub use crate::segment::WireError;

pub mod measures;
use crate::segment::{ColumnSpec, KeyTuple, Segment, Split, tuple_from_pb, tuple_to_pb, wire_err};
use crate::types::{PrivacyLevel, TypeClass};

/// Aggregate requests carry between 1 and this many parent segments.
pub const MAX_SEGMENTS: usize = 100_000;

fn method_from(v: i32, field: &str) -> Result<HashMethod, WireError> {
    HashMethod::from_pb(v).ok_or_else(|| {
        wire_err(
            field,
            "expected sealed_sha256_64, sealed_md5_48, sha256_64 or md5_48",
        )
    })
}

fn method_to(m: HashMethod) -> i32 {
    pb::HashMethod::from(m) as i32
}

fn level_from(v: i32, field: &str) -> Result<PrivacyLevel, WireError> {
    PrivacyLevel::try_from(v).map_err(|m| wire_err(field, m))
}

fn level_to(l: PrivacyLevel) -> i32 {
    pb::PrivacyLevel::from(l) as i32
}

fn columns_from(cols: Vec<pb::ColumnRef>) -> Result<Vec<ColumnSpec>, WireError> {
    cols.into_iter()
        .enumerate()
        .map(|(i, c)| ColumnSpec::from_pb(c, &format!("columns[{i}]")))
        .collect()
}

fn columns_to(cols: &[ColumnSpec]) -> Vec<pb::ColumnRef> {
    cols.iter().map(pb::ColumnRef::from).collect()
}

/// An absent segment is the whole dataset.
fn segment_from(s: Option<pb::Segment>, field: &str) -> Result<Segment, WireError> {
    Ok(s.map(|s| Segment::from_pb(s, field))
        .transpose()?
        .unwrap_or_default())
}

fn seal_from(s: Option<pb::Seal>) -> Result<Option<Seal>, WireError> {
    s.map(|s| Seal::try_from(s).map_err(|e| e.at("seal"))).transpose()
}

fn key_len(k: u32) -> usize {
    k as usize
}

/// What makes a request sealed: the run nonce, the peer agent's signed zone key and
/// the peer's dataset (DESIGN §4.1). Whether a request must or must not carry one is
/// the agent's policy, not the wire's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seal {
    pub nonce: [u8; NONCE_LEN],
    pub peer: SignedZoneKey,
    pub peer_dataset: String,
}

impl TryFrom<pb::Seal> for Seal {
    type Error = WireError;
    fn try_from(s: pb::Seal) -> Result<Seal, WireError> {
        let nonce: [u8; NONCE_LEN] = s.nonce.as_slice().try_into().map_err(|_| {
            wire_err(
                "nonce",
                format!("{NONCE_LEN} bytes expected, got {}", s.nonce.len()),
            )
        })?;
        let peer = s.peer.ok_or_else(|| wire_err("peer", "missing"))?;
        let peer = SignedZoneKey::from_pb(peer, "peer")?;
        let valid_name = !s.peer_dataset.is_empty()
            && s.peer_dataset
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !valid_name {
            return Err(wire_err(
                "peer_dataset",
                "the peer's dataset name (letters, digits, '-', '_', '.') is needed",
            ));
        }
        Ok(Seal {
            nonce,
            peer,
            peer_dataset: s.peer_dataset,
        })
    }
}

impl From<Seal> for pb::Seal {
    fn from(s: Seal) -> Self {
        pb::Seal {
            nonce: s.nonce.to_vec(),
            peer: Some(s.peer.to_pb()),
            peer_dataset: s.peer_dataset,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeRequest {
    pub dataset: String,
}

impl From<pb::DescribeRequest> for DescribeRequest {
    fn from(r: pb::DescribeRequest) -> Self {
        DescribeRequest { dataset: r.dataset }
    }
}

impl From<DescribeRequest> for pb::DescribeRequest {
    fn from(r: DescribeRequest) -> Self {
        pb::DescribeRequest { dataset: r.dataset }
    }
}

/// One column of a described dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Column {
    pub name: String,
    pub class: TypeClass,
    /// The engine's own type name, for humans (e.g. "numeric(12,2)").
    pub declared_type: String,
    pub nullable: bool,
    /// Declared scale for decimals, fractional-second precision for times.
    pub scale: Option<u32>,
    pub fixed_char: bool,
    /// Masked by policy: compared, never revealed.
    pub masked: bool,
}

impl Column {
    fn from_pb(c: pb::Column, field: &str) -> Result<Column, WireError> {
        if c.name.is_empty() {
            return Err(wire_err(format!("{field}.name"), "empty column name"));
        }
        let class = match pb::TypeClass::try_from(c.type_class) {
            Ok(pb::TypeClass::Unspecified) => {
                return Err(wire_err(format!("{field}.type_class"), "unspecified"));
            }
            // a class of a newer agent: no canonical form in this build
            Err(_) => TypeClass::Other,
            Ok(_) => {
                TypeClass::try_from(c.type_class).map_err(|m| wire_err(format!("{field}.type_class"), m))?
            }
        };
        Ok(Column {
            name: c.name,
            class,
            declared_type: c.declared_type,
            nullable: c.nullable,
            scale: c.scale,
            fixed_char: c.fixed_char,
            masked: c.masked,
        })
    }
}

impl From<Column> for pb::Column {
    fn from(c: Column) -> Self {
        pb::Column {
            name: c.name,
            type_class: pb::TypeClass::from(c.class) as i32,
            declared_type: c.declared_type,
            nullable: c.nullable,
            scale: c.scale,
            fixed_char: c.fixed_char,
            masked: c.masked,
        }
    }
}

/// An agent's description of one dataset (the `DescribeResponse`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Describe {
    pub dataset: String,
    pub columns: Vec<Column>,
    pub key: Vec<String>,
    /// From catalog statistics; may be stale, never a scan.
    pub row_estimate: u64,
    pub engine: String,
    pub engine_version: String,
    /// The methods this agent offers for the dataset, known to this build.
    pub hash_methods: Vec<HashMethod>,
    pub xor_supported: bool,
    pub max_level: PrivacyLevel,
    pub expose_key_bounds: bool,
    pub min_segment_rows: u64,
    /// The smallest and largest key, where the policy exposes key bounds.
    pub key_range: Option<(KeyTuple, KeyTuple)>,
    pub time_zone: String,
    pub time_columns: Vec<String>,
    /// The agent's signed zone key; `None` when it cannot seal.
    pub zone_key: Option<SignedZoneKey>,
    pub release_log_head: String,
    /// The PEM of the agent's TLS certificate (and intermediates), whose key signs its
    /// answers.
    #[serde(default)]
    pub certificate_pem: String,
    /// The kind of replication position the dataset's watermark reads; `None` when the
    /// agent config sets no watermark for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<PositionKind>,
    /// Columns the policy allows as group labels of mode measures (`group_columns`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group_columns: Vec<String>,
    /// Columns whose SUM/MIN/MAX the policy releases in clear (`measures`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measures: Vec<String>,
    /// Warnings about the dataset's engine that every run involving it carries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engine_warnings: Vec<String>,
    /// A single integer key's histogram bounds from the engine's statistics, ascending
    /// (where the policy exposes key bounds and the engine keeps them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_histogram: Vec<i64>,
    /// The policy's `max_digest_rows` (0: not said by an older agent).
    #[serde(default)]
    pub max_digest_rows: u64,
    /// The dataset's `empty_string_is_null`: its empty texts are rendered as NULL.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub empty_string_is_null: bool,
}

impl Describe {
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name.eq_ignore_ascii_case(name))
    }

    /// The key range of a single integer key.
    pub fn int_key_range(&self) -> Option<(i64, i64)> {
        use crate::segment::KeyPart;
        let (lo, hi) = self.key_range.as_ref()?;
        match (lo.as_slice(), hi.as_slice()) {
            ([KeyPart::Int(a)], [KeyPart::Int(b)]) => Some((*a, *b)),
            _ => None,
        }
    }
}

impl TryFrom<pb::DescribeResponse> for Describe {
    type Error = WireError;
    fn try_from(d: pb::DescribeResponse) -> Result<Describe, WireError> {
        let columns = d
            .columns
            .into_iter()
            .enumerate()
            .map(|(i, c)| Column::from_pb(c, &format!("columns[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let key_range = match (d.key_min, d.key_max) {
            (None, None) => None,
            (Some(lo), Some(hi)) => Some((tuple_from_pb(lo, "key_min")?, tuple_from_pb(hi, "key_max")?)),
            (Some(_), None) => return Err(wire_err("key_max", "missing while key_min is given")),
            (None, Some(_)) => return Err(wire_err("key_min", "missing while key_max is given")),
        };
        Ok(Describe {
            dataset: d.dataset,
            columns,
            key: d.key,
            row_estimate: d.row_estimate,
            engine: d.engine,
            engine_version: d.engine_version,
            hash_methods: d
                .hash_methods
                .into_iter()
                .filter_map(HashMethod::from_pb)
                .collect(),
            xor_supported: d.xor_supported,
            max_level: level_from(d.max_level, "max_level")?,
            expose_key_bounds: d.expose_key_bounds,
            min_segment_rows: d.min_segment_rows,
            key_range,
            time_zone: d.time_zone,
            time_columns: d.time_columns,
            zone_key: d
                .zone_key
                .map(|z| SignedZoneKey::from_pb(z, "zone_key"))
                .transpose()?,
            release_log_head: d.release_log_head,
            certificate_pem: d.certificate_pem,
            watermark: match d.watermark.as_str() {
                "" => None,
                k => Some(
                    PositionKind::from_name(k)
                        .ok_or_else(|| wire_err("watermark", "expected lsn, gtid, integer or empty"))?,
                ),
            },
            group_columns: d.group_columns,
            measures: d.measures,
            engine_warnings: d.engine_warnings,
            key_histogram: d.key_histogram,
            max_digest_rows: d.max_digest_rows,
            empty_string_is_null: d.empty_string_is_null,
        })
    }
}

impl From<Describe> for pb::DescribeResponse {
    fn from(d: Describe) -> Self {
        let (key_min, key_max) = match d.key_range {
            Some((lo, hi)) => (Some(tuple_to_pb(&lo)), Some(tuple_to_pb(&hi))),
            None => (None, None),
        };
        pb::DescribeResponse {
            dataset: d.dataset,
            columns: d.columns.into_iter().map(pb::Column::from).collect(),
            key: d.key,
            row_estimate: d.row_estimate,
            engine: d.engine,
            engine_version: d.engine_version,
            hash_methods: d.hash_methods.into_iter().map(method_to).collect(),
            xor_supported: d.xor_supported,
            max_level: level_to(d.max_level),
            expose_key_bounds: d.expose_key_bounds,
            min_segment_rows: d.min_segment_rows,
            key_min,
            key_max,
            time_zone: d.time_zone,
            release_log_head: d.release_log_head,
            time_columns: d.time_columns,
            zone_key: d.zone_key.map(|z| z.to_pb()),
            certificate_pem: d.certificate_pem,
            watermark: d.watermark.map(|k| k.name().to_string()).unwrap_or_default(),
            group_columns: d.group_columns,
            measures: d.measures,
            engine_warnings: d.engine_warnings,
            key_histogram: d.key_histogram,
            max_digest_rows: d.max_digest_rows,
            empty_string_is_null: d.empty_string_is_null,
        }
    }
}

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

/// Which side of a run a call goes to; an agent signs the side it was asked to answer
/// as (docs/evidence.md), so one side's answers cannot stand for the other's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    Source,
    Target,
}

impl Side {
    /// The side across.
    pub fn other(self) -> Side {
        match self {
            Side::Source => Side::Target,
            Side::Target => Side::Source,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Side::Source => "source",
            Side::Target => "target",
        }
    }
}

/// A request's `side`: `source` or `target`; empty (a coordinator before it) is none.
pub(crate) fn side_from(text: String) -> Result<Option<Side>, WireError> {
    match text.as_str() {
        "" => Ok(None),
        "source" => Ok(Some(Side::Source)),
        "target" => Ok(Some(Side::Target)),
        _ => Err(wire_err("side", "source or target (or empty) needed")),
    }
}

pub(crate) fn side_to(side: Option<Side>) -> String {
    side.map(|s| s.name().to_string()).unwrap_or_default()
}

fn run_id_from(id: String) -> Result<String, WireError> {
    if valid_run_id(&id) {
        Ok(id)
    } else {
        Err(wire_err(
            "run_id",
            "1 to 128 characters of A-Z a-z 0-9 . _ - needed (the run the answer is signed for)",
        ))
    }
}

/// A signed answer's envelope, sent as JSON text; empty when the agent sent none.
fn envelope_from(text: String, field: &str) -> Result<Option<Envelope>, WireError> {
    if text.is_empty() {
        return Ok(None);
    }
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| wire_err(field, format!("not a DSSE envelope: {e}")))
}

fn envelope_to(e: Option<Envelope>) -> String {
    e.map(|e| serde_json::to_string(&e).expect("envelopes serialize"))
        .unwrap_or_default()
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
    /// As in [`AggregateRequest`].
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

/// `ReadPosition`: the dataset whose replication position to read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadPositionRequest {
    pub dataset: String,
    pub run_id: String,
}

impl TryFrom<pb::ReadPositionRequest> for ReadPositionRequest {
    type Error = WireError;
    fn try_from(r: pb::ReadPositionRequest) -> Result<ReadPositionRequest, WireError> {
        Ok(ReadPositionRequest {
            run_id: run_id_from(r.run_id)?,
            dataset: r.dataset,
        })
    }
}

impl From<ReadPositionRequest> for pb::ReadPositionRequest {
    fn from(r: ReadPositionRequest) -> Self {
        pb::ReadPositionRequest {
            dataset: r.dataset,
            run_id: r.run_id,
        }
    }
}

fn position_from(p: Option<pb::Position>, field: &str) -> Result<Position, WireError> {
    let p = p.ok_or_else(|| wire_err(field, "missing"))?;
    let kind = PositionKind::from_name(&p.kind)
        .ok_or_else(|| wire_err(format!("{field}.kind"), "expected lsn, gtid or integer"))?;
    Position::parse(kind, &p.value).map_err(|m| wire_err(format!("{field}.value"), m))
}

fn position_to(p: Position) -> pb::Position {
    pb::Position {
        kind: p.kind.name().to_string(),
        value: p.value,
    }
}

/// `WaitPosition`: wait until the dataset has applied `position` (a source's), at most
/// `timeout_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitPositionRequest {
    pub dataset: String,
    pub position: Position,
    pub timeout_ms: u64,
    pub run_id: String,
}

impl TryFrom<pb::WaitPositionRequest> for WaitPositionRequest {
    type Error = WireError;
    fn try_from(r: pb::WaitPositionRequest) -> Result<WaitPositionRequest, WireError> {
        Ok(WaitPositionRequest {
            position: position_from(r.position, "position")?,
            run_id: run_id_from(r.run_id)?,
            timeout_ms: r.timeout_ms,
            dataset: r.dataset,
        })
    }
}

impl From<WaitPositionRequest> for pb::WaitPositionRequest {
    fn from(r: WaitPositionRequest) -> Self {
        pb::WaitPositionRequest {
            dataset: r.dataset,
            position: Some(position_to(r.position)),
            timeout_ms: r.timeout_ms,
            run_id: r.run_id,
        }
    }
}

/// A position read (`ReadPosition`) or last read while waiting (`WaitPosition`, with
/// whether it reached the one asked for).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PositionResponse {
    pub position: Position,
    pub reached: bool,
    pub release_log_head: String,
}

impl TryFrom<pb::PositionResponse> for PositionResponse {
    type Error = WireError;
    fn try_from(r: pb::PositionResponse) -> Result<PositionResponse, WireError> {
        Ok(PositionResponse {
            position: position_from(r.position, "position")?,
            reached: r.reached,
            release_log_head: r.release_log_head,
        })
    }
}

impl From<PositionResponse> for pb::PositionResponse {
    fn from(r: PositionResponse) -> Self {
        pb::PositionResponse {
            position: Some(position_to(r.position)),
            reached: r.reached,
            release_log_head: r.release_log_head,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::canonical::FieldFormat;
    use crate::period::Granularity;
    use crate::segment::{KeyPart, Period};

    fn zone_key(agent: &str) -> SignedZoneKey {
        SignedZoneKey {
            agent: agent.into(),
            public_key: [7; 32],
            signature: vec![1, 2, 3],
            certificates: vec![vec![4, 5], vec![6]],
        }
    }

    fn seal() -> Seal {
        Seal {
            nonce: [9; NONCE_LEN],
            peer: zone_key("agent-b.example"),
            peer_dataset: "orders_v2".into(),
        }
    }

    fn cols() -> Vec<ColumnSpec> {
        vec![
            ColumnSpec {
                name: "id".into(),
                format: FieldFormat::new(TypeClass::Integer),
            },
            ColumnSpec {
                name: "amount".into(),
                format: FieldFormat::new(TypeClass::Decimal).with_scale(2).exact(true),
            },
            ColumnSpec {
                name: "code".into(),
                format: FieldFormat::new(TypeClass::Text).fixed_char(true),
            },
        ]
    }

    fn seg() -> Segment {
        Segment {
            lower: Some(vec![KeyPart::Int(10)]),
            upper: Some(vec![KeyPart::Int(250)]),
            hash: Some((0, 1 << 59)),
            period: Some(Period {
                column: "at".into(),
                granularity: Granularity::Month,
                label: "2024-04".into(),
            }),
            window: Some(crate::segment::Window {
                column: "updated_at".into(),
                upper: "2024-04-30T23:59:59Z".into(),
            }),
        }
    }

    /// domain → proto → domain is the identity.
    fn round_trip<D, P>(d: D)
    where
        D: Clone + PartialEq + std::fmt::Debug + Into<P> + TryFrom<P>,
        <D as TryFrom<P>>::Error: std::fmt::Debug,
    {
        let back = D::try_from(d.clone().into()).expect("a built message converts back");
        assert_eq!(back, d);
    }

    fn describe() -> Describe {
        Describe {
            dataset: "orders".into(),
            columns: vec![
                Column {
                    name: "id".into(),
                    class: TypeClass::Integer,
                    declared_type: "bigint".into(),
                    nullable: false,
                    scale: None,
                    fixed_char: false,
                    masked: false,
                },
                Column {
                    name: "amount".into(),
                    class: TypeClass::Decimal,
                    declared_type: "numeric(12,2)".into(),
                    nullable: true,
                    scale: Some(2),
                    fixed_char: false,
                    masked: true,
                },
            ],
            key: vec!["id".into()],
            row_estimate: 1_000_000,
            engine: "postgres".into(),
            engine_version: "17.2".into(),
            hash_methods: vec![HashMethod::SealedSha256_64, HashMethod::Md5_48],
            xor_supported: true,
            max_level: PrivacyLevel::WithKeys,
            expose_key_bounds: true,
            min_segment_rows: 5,
            key_range: Some((vec![KeyPart::Int(-4)], vec![KeyPart::Int(i64::MAX)])),
            time_zone: "+02:00".into(),
            time_columns: vec!["at".into()],
            zone_key: Some(zone_key("agent-a.example")),
            release_log_head: "ab".repeat(32),
            certificate_pem: "-----BEGIN CERTIFICATE-----\n".into(),
            watermark: Some(PositionKind::Lsn),
            group_columns: vec!["region".into()],
            measures: vec!["amount".into()],
            engine_warnings: vec!["not live-verified".into()],
            key_histogram: vec![-5, 0, 1_000_000_000_000_000],
            max_digest_rows: 100_000,
            empty_string_is_null: true,
        }
    }

    fn aggregate() -> AggregateRequest {
        AggregateRequest {
            dataset: "orders".into(),
            columns: cols(),
            key_len: 1,
            method: HashMethod::SealedMd5_48,
            parents: vec![
                (Segment::whole(), Split::Quantile(32)),
                (seg(), Split::Hash(16)),
                (
                    Segment::whole(),
                    Split::Cuts(vec![
                        vec![KeyPart::Text("a".into())],
                        vec![KeyPart::Text("m".into())],
                    ]),
                ),
                (
                    Segment::whole(),
                    Split::Period {
                        column: "at".into(),
                        granularity: Granularity::Day,
                    },
                ),
                (Segment::whole(), Split::Whole),
            ],
            in_process: true,
            seal: Some(seal()),
            run_id: "19b2c-0".into(),
            side: Some(Side::Target),
        }
    }

    fn envelope() -> Envelope {
        Envelope {
            payload_type: crate::dsse::AGENT_RESULT.into(),
            payload: "e30=".into(),
            signatures: vec![crate::dsse::Signature {
                keyid: "agent-a".into(),
                sig: "AA==".into(),
            }],
        }
    }

    #[test]
    fn a_request_without_a_plain_run_id_or_an_answer_with_a_broken_envelope_is_refused() {
        for bad in ["", "a b", "../x", &"r".repeat(129)] {
            let mut m = pb::AggregateRequest::from(aggregate());
            m.run_id = bad.to_string();
            let e = AggregateRequest::try_from(m).unwrap_err().to_string();
            assert!(e.starts_with("run_id:"), "{bad:?}: {e}");
            let mut m = pb::RowDigestsRequest::from(RowDigestsRequest {
                dataset: "orders".into(),
                columns: cols(),
                key_len: 1,
                method: HashMethod::Sha256_64,
                segment: seg(),
                level: PrivacyLevel::WithKeys,
                seal: None,
                run_id: "r".into(),
                side: None,
            });
            m.run_id = bad.to_string();
            let e = RowDigestsRequest::try_from(m).unwrap_err().to_string();
            assert!(e.starts_with("run_id:"), "{bad:?}: {e}");
        }
        let m = pb::AggregateResponse {
            envelope: "{\"payloadType\": 1}".into(),
            ..Default::default()
        };
        let e = AggregateResponse::try_from(m).unwrap_err().to_string();
        assert!(e.starts_with("envelope: not a DSSE envelope"), "{e}");
        let b = pb::RowDigestBatch {
            envelope: "[]".into(),
            ..Default::default()
        };
        assert!(RowDigestBatch::try_from(b).is_err());
    }

    #[test]
    fn every_message_round_trips() {
        round_trip::<_, pb::DescribeResponse>(describe());
        round_trip::<_, pb::DescribeResponse>(Describe {
            key_range: None,
            zone_key: None,
            max_level: PrivacyLevel::CountOnly,
            ..describe()
        });
        round_trip::<_, pb::AggregateRequest>(aggregate());
        round_trip::<_, pb::AggregateRequest>(AggregateRequest {
            seal: None,
            method: HashMethod::Sha256_64,
            ..aggregate()
        });
        round_trip::<_, pb::AggregateResponse>(AggregateResponse {
            buckets: vec![
                Bucket {
                    parent: 0,
                    child: 3,
                    segment: seg(),
                    count: 12,
                    sum: u64::MAX,
                    xor: Some(5),
                },
                Bucket {
                    parent: 1,
                    child: 0,
                    segment: Segment::whole(),
                    count: 0,
                    sum: 0,
                    xor: None,
                },
            ],
            path: "pushdown".into(),
            rows_scanned: 12,
            release_log_head: "h".into(),
            envelope: Some(envelope()),
        });
        round_trip::<_, pb::RowDigestsRequest>(RowDigestsRequest {
            dataset: "orders".into(),
            columns: cols(),
            key_len: 1,
            method: HashMethod::SealedSha256_64,
            segment: seg(),
            level: PrivacyLevel::Detailed,
            seal: Some(seal()),
            run_id: "r".into(),
            side: Some(Side::Source),
        });
        round_trip::<_, pb::RowDigestBatch>(RowDigestBatch {
            digests: vec![RowDigest {
                key_hash: 1,
                row_hash: u64::MAX,
            }],
            release_log_head: "h".into(),
            envelope: None,
        });
        round_trip::<_, pb::RowDigestBatch>(RowDigestBatch {
            digests: Vec::new(),
            release_log_head: "h".into(),
            envelope: Some(envelope()),
        });
        round_trip::<_, pb::RevealRequest>(RevealRequest {
            dataset: "orders".into(),
            columns: cols(),
            key_len: 1,
            segment: seg(),
            key_hashes: vec![3, u64::MAX],
            limit: 2,
            level: PrivacyLevel::WithKeys,
            consent_acknowledged: true,
            seal: None,
        });
        round_trip::<_, pb::RevealResponse>(RevealResponse {
            rows: vec![RevealedRow {
                key_hash: 3,
                key: vec![KeyPart::Int(1), KeyPart::Text("x".into())],
                values: vec![Some("1.50".into()), None],
            }],
            truncated: true,
            release_log_head: "h".into(),
            withheld_by: Some("max_reveal_rows".into()),
        });
        round_trip::<_, pb::InvestigationSqlRequest>(InvestigationSqlRequest {
            dataset: "orders".into(),
            columns: cols(),
            key_len: 1,
            segment: seg(),
            sealed: true,
            keys: Vec::new(),
        });
        round_trip::<_, pb::InvestigationSqlRequest>(InvestigationSqlRequest {
            dataset: "orders".into(),
            columns: cols(),
            key_len: 2,
            segment: seg(),
            sealed: false,
            keys: vec![
                vec![KeyPart::Int(1), KeyPart::Text("O'Brien".into())],
                vec![KeyPart::Int(-2), KeyPart::Text(String::new())],
            ],
        });
        round_trip::<_, pb::InvestigationSqlResponse>(InvestigationSqlResponse {
            sql: "SELECT 1".into(),
            release_log_head: "h".into(),
        });
        round_trip::<_, pb::DescribeRequest>(DescribeRequest {
            dataset: "orders".into(),
        });
        let pos = Position::parse(PositionKind::Gtid, "0-1-42").unwrap();
        round_trip::<_, pb::ReadPositionRequest>(ReadPositionRequest {
            dataset: "orders".into(),
            run_id: "r1".into(),
        });
        round_trip::<_, pb::WaitPositionRequest>(WaitPositionRequest {
            dataset: "orders".into(),
            position: pos.clone(),
            timeout_ms: 60_000,
            run_id: "r1".into(),
        });
        round_trip::<_, pb::PositionResponse>(PositionResponse {
            position: pos,
            reached: true,
            release_log_head: "h".into(),
        });
        round_trip::<_, pb::Seal>(seal());
    }

    fn field_of<D, P>(p: P) -> String
    where
        D: TryFrom<P, Error = WireError> + std::fmt::Debug,
    {
        D::try_from(p).expect_err("must be refused").field
    }

    #[test]
    fn validation_names_the_field() {
        let agg = || pb::AggregateRequest::from(aggregate());
        let refused = |r: pb::AggregateRequest| field_of::<AggregateRequest, _>(r);
        assert_eq!(refused(pb::AggregateRequest { method: 0, ..agg() }), "method");
        assert_eq!(refused(pb::AggregateRequest { method: 99, ..agg() }), "method");
        assert_eq!(
            refused(pb::AggregateRequest {
                segments: vec![],
                ..agg()
            }),
            "segments"
        );
        let mut r = agg();
        r.segments[3].split = Some(pb::segment_split::Split::Hash(0));
        assert_eq!(refused(r), "segments[3].split");
        let mut r = agg();
        r.segments[1].segment.as_mut().unwrap().hash_hi = None;
        assert_eq!(refused(r), "segments[1].hash_lo");
        let mut r = agg();
        r.columns[1].type_class = 99;
        let e = AggregateRequest::try_from(r).unwrap_err();
        assert_eq!(e.field, "columns[1].type_class");
        assert_eq!(e.to_string(), "columns[1].type_class: unknown type class 99");
        // the seal's structure; whether one is needed is the agent's policy
        let with_seal = |f: &dyn Fn(&mut pb::Seal)| {
            let mut r = agg();
            f(r.seal.as_mut().unwrap());
            AggregateRequest::try_from(r).unwrap_err().to_string()
        };
        assert_eq!(
            with_seal(&|s| s.nonce = vec![1; 8]),
            "seal.nonce: 16 bytes expected, got 8"
        );
        assert_eq!(with_seal(&|s| s.peer = None), "seal.peer: missing");
        assert_eq!(
            with_seal(&|s| s.peer.as_mut().unwrap().public_key = vec![1]),
            "seal.peer.public_key: 32 bytes expected"
        );
        assert!(with_seal(&|s| s.peer_dataset = "a\nb".into()).starts_with("seal.peer_dataset: "));
        assert!(with_seal(&|s| s.peer_dataset.clear()).starts_with("seal.peer_dataset: "));

        let d = || pb::DescribeResponse::from(describe());
        let refused = |r: pb::DescribeResponse| field_of::<Describe, _>(r);
        assert_eq!(refused(pb::DescribeResponse { max_level: 0, ..d() }), "max_level");
        assert_eq!(refused(pb::DescribeResponse { key_max: None, ..d() }), "key_max");
        let mut r = d();
        r.columns[1].type_class = 0;
        assert_eq!(refused(r), "columns[1].type_class");
        let mut r = d();
        r.zone_key.as_mut().unwrap().signature.clear();
        assert_eq!(refused(r), "zone_key.signature");
        let mut r = d();
        r.key_min.as_mut().unwrap().parts[0].value = None;
        assert_eq!(refused(r), "key_min.parts[0]");
        // a newer agent's class and method: described as other, not offered
        let mut r = d();
        r.columns[1].type_class = 99;
        r.hash_methods.push(99);
        let ok = Describe::try_from(r).unwrap();
        assert_eq!(ok.columns[1].class, TypeClass::Other);
        assert_eq!(ok.hash_methods, describe().hash_methods);

        let mut r = pb::AggregateResponse::from(AggregateResponse {
            buckets: vec![Bucket {
                parent: 0,
                child: 0,
                segment: seg(),
                count: 1,
                sum: 1,
                xor: None,
            }],
            ..Default::default()
        });
        r.buckets[0].segment = None;
        assert_eq!(field_of::<AggregateResponse, _>(r), "buckets[0].segment");
        let r = pb::RevealResponse {
            rows: vec![pb::RevealedRow::default()],
            ..Default::default()
        };
        assert_eq!(field_of::<RevealResponse, _>(r), "rows[0].key");
        let r = pb::RowDigestsRequest {
            method: pb::HashMethod::Sha25664 as i32,
            level: 0,
            ..Default::default()
        };
        assert_eq!(field_of::<RowDigestsRequest, _>(r), "level");
        let r = pb::RevealRequest {
            level: pb::PrivacyLevel::WithKeys as i32,
            columns: vec![pb::ColumnRef::default()],
            ..Default::default()
        };
        assert_eq!(field_of::<RevealRequest, _>(r), "columns[0].type_class");
        let r = pb::InvestigationSqlRequest {
            segment: Some(pb::Segment {
                period: Some(pb::Period {
                    column: "at".into(),
                    granularity: "fortnight".into(),
                    label: String::new(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            field_of::<InvestigationSqlRequest, _>(r),
            "segment.period.granularity"
        );
    }

    #[test]
    fn key_sql_refuses_too_many_keys_and_tuples_of_another_length() {
        let tuple = |n: usize| pb::KeyTuple {
            parts: (0..n)
                .map(|i| pb::KeyValue {
                    value: Some(pb::key_value::Value::Int(i as i64)),
                })
                .collect(),
        };
        let ask = |keys: Vec<pb::KeyTuple>| pb::InvestigationSqlRequest {
            key_len: 2,
            keys,
            ..Default::default()
        };
        let most =
            InvestigationSqlRequest::try_from(ask(vec![tuple(2); MAX_KEY_SQL_KEYS])).expect("1,000 keys");
        assert_eq!(most.keys.len(), MAX_KEY_SQL_KEYS);
        let e = InvestigationSqlRequest::try_from(ask(vec![tuple(2); MAX_KEY_SQL_KEYS + 1]))
            .expect_err("1,001 keys");
        assert_eq!(e.field, "keys");
        assert!(e.message.contains("at most 1000"), "{}", e.message);
        let e = InvestigationSqlRequest::try_from(ask(vec![tuple(2), tuple(1)])).expect_err("a short tuple");
        assert_eq!(e.field, "keys[1]");
        let e = InvestigationSqlRequest::try_from(ask(vec![tuple(3)])).expect_err("a long tuple");
        assert_eq!(e.field, "keys[0]");
        let mut empty = tuple(2);
        empty.parts[1].value = None;
        assert_eq!(
            field_of::<InvestigationSqlRequest, _>(ask(vec![empty])),
            "keys[0].parts[1]"
        );
    }

    #[test]
    fn absent_segment_and_split_are_whole() {
        let r = AggregateRequest::try_from(pb::AggregateRequest {
            method: pb::HashMethod::Sha25664 as i32,
            segments: vec![pb::SegmentSplit::default()],
            run_id: "r".into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(r.parents, vec![(Segment::whole(), Split::Whole)]);
    }

    fn key_part() -> impl Strategy<Value = KeyPart> {
        prop_oneof![
            any::<i64>().prop_map(KeyPart::Int),
            "[a-zé\\x00 ]{0,6}".prop_map(KeyPart::Text)
        ]
    }

    fn tuple() -> impl Strategy<Value = KeyTuple> {
        prop::collection::vec(key_part(), 1..3)
    }

    fn segment() -> impl Strategy<Value = Segment> {
        (
            prop::option::of(tuple()),
            prop::option::of(tuple()),
            prop::option::of((0u64..HASH_SPACE_MINUS_ONE, 1u64..1 << 40)),
            prop::option::of((0usize..6, "[0-9-]{0,10}")),
            prop::option::of("[0-9:T.-]{1,30}"),
        )
            .prop_map(|(lower, upper, hash, period, window)| Segment {
                lower,
                upper,
                hash: hash.map(|(lo, w)| (lo, lo.saturating_add(w).min(crate::segment::HASH_SPACE))),
                period: period.map(|(g, label)| Period {
                    column: "at".into(),
                    granularity: GRANULARITIES[g],
                    label,
                }),
                window: window.map(|upper| crate::segment::Window {
                    column: "updated_at".into(),
                    upper,
                }),
            })
    }

    const HASH_SPACE_MINUS_ONE: u64 = crate::segment::HASH_SPACE - 1;
    const GRANULARITIES: [Granularity; 6] = [
        Granularity::Hour,
        Granularity::Day,
        Granularity::Week,
        Granularity::Month,
        Granularity::Quarter,
        Granularity::Year,
    ];

    fn split() -> impl Strategy<Value = Split> {
        prop_oneof![
            Just(Split::Whole),
            (1u32..=1024).prop_map(Split::Quantile),
            (1u32..=1024).prop_map(Split::Hash),
            prop::collection::btree_set(tuple(), 0..5).prop_map(|c| Split::Cuts(c.into_iter().collect())),
            (0usize..6).prop_map(|g| Split::Period {
                column: "at".into(),
                granularity: GRANULARITIES[g],
            }),
        ]
    }

    proptest! {
        #[test]
        fn aggregates_round_trip(
            parents in prop::collection::vec((segment(), split()), 1..6),
            buckets in prop::collection::vec((segment(), any::<u64>(), any::<u64>(), prop::option::of(any::<u64>())), 0..6),
            sealed in any::<bool>(),
        ) {
            round_trip::<_, pb::AggregateRequest>(AggregateRequest {
                parents,
                seal: sealed.then(seal),
                ..aggregate()
            });
            round_trip::<_, pb::AggregateResponse>(AggregateResponse {
                buckets: buckets
                    .into_iter()
                    .enumerate()
                    .map(|(i, (segment, count, sum, xor))| Bucket { parent: i, child: i / 2, segment, count, sum, xor })
                    .collect(),
                path: "in_process".into(),
                rows_scanned: 3,
                release_log_head: String::new(),
                envelope: None,
            });
        }
    }
}
