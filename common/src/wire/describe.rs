//! `Describe`: a dataset's columns, key, engine and what its policy offers.

use serde::{Deserialize, Serialize};
use tally_proto::v1 as pb;

use super::{level_from, level_to, method_to};
use crate::checksum::HashMethod;
use crate::position::PositionKind;
use crate::seal::SignedZoneKey;
use crate::segment::{KeyTuple, WireError, tuple_from_pb, tuple_to_pb, wire_err};
use crate::types::{PrivacyLevel, TypeClass};

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
