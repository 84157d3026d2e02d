//! Domain types of the `Measures` call (comparison mode `measures`, DESIGN §5) and
//! their proto conversions.

use serde::{Deserialize, Serialize};
use tally_proto::v1 as pb;

use super::{
    Seal, columns_from, columns_to, envelope_from, envelope_to, key_len, method_from, method_to, run_id_from,
    seal_from,
};
use crate::checksum::HashMethod;
use crate::dsse::Envelope;
use crate::measures::MeasureValues;
use crate::period::Granularity;
use crate::segment::{ColumnSpec, Window, WireError, wire_err};

/// Parents one request may split.
pub const MAX_PARENTS: usize = 10_000;

/// A group's labels, one per group_by level (`None`: NULL).
pub type Labels = Vec<Option<String>>;

/// One level of a group_by hierarchy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupBy {
    pub column: String,
    /// The calendar period of a date/timestamp column; `None`: the value itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granularity: Option<Granularity>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeasuresRequest {
    pub dataset: String,
    /// Key columns first, then every group_by and measure column, each once.
    pub columns: Vec<ColumnSpec>,
    pub key_len: usize,
    pub group_by: Vec<GroupBy>,
    pub measures: Vec<String>,
    /// Groups of the level above to split; empty at the first level.
    pub parents: Vec<Labels>,
    pub window: Option<Window>,
    pub method: HashMethod,
    pub seal: Option<Seal>,
    pub run_id: String,
    /// As in [`super::AggregateRequest`].
    pub side: Option<super::Side>,
}

fn labels_from(l: pb::GroupLabels) -> Labels {
    l.labels.into_iter().map(|t| t.text).collect()
}

fn labels_to(l: &Labels) -> pb::GroupLabels {
    pb::GroupLabels {
        labels: l.iter().map(|t| pb::OptionalText { text: t.clone() }).collect(),
    }
}

impl TryFrom<pb::MeasuresRequest> for MeasuresRequest {
    type Error = WireError;
    fn try_from(r: pb::MeasuresRequest) -> Result<MeasuresRequest, WireError> {
        if r.group_by.is_empty() {
            return Err(wire_err("group_by", "at least one level needed"));
        }
        let group_by = r
            .group_by
            .into_iter()
            .enumerate()
            .map(|(i, g)| {
                let granularity = match g.granularity.as_str() {
                    "" => None,
                    t => Some(Granularity::parse(t).ok_or_else(|| {
                        wire_err(
                            format!("group_by[{i}].granularity"),
                            "hour, day, week, month, quarter, year or empty",
                        )
                    })?),
                };
                Ok(GroupBy {
                    column: g.column,
                    granularity,
                })
            })
            .collect::<Result<Vec<_>, WireError>>()?;
        let depth = group_by.len();
        if r.parents.len() > MAX_PARENTS {
            return Err(wire_err("parents", format!("at most {MAX_PARENTS}")));
        }
        let parents: Vec<Labels> = r.parents.into_iter().map(labels_from).collect();
        if let Some(i) = parents.iter().position(|p| p.len() + 1 != depth) {
            return Err(wire_err(
                format!("parents[{i}]"),
                format!("{} labels expected (the levels above this one)", depth - 1),
            ));
        }
        if depth > 1 && parents.is_empty() {
            return Err(wire_err("parents", "a level below the first splits given groups"));
        }
        let window = match r.window {
            None => None,
            Some(w) => {
                let seg = crate::segment::Segment::from_pb(
                    pb::Segment {
                        window: Some(w),
                        ..Default::default()
                    },
                    "segment",
                )?;
                seg.window
            }
        };
        Ok(MeasuresRequest {
            columns: columns_from(r.columns)?,
            key_len: key_len(r.key_len),
            group_by,
            measures: r.measures,
            parents,
            window,
            method: method_from(r.method, "method")?,
            seal: seal_from(r.seal)?,
            run_id: run_id_from(r.run_id)?,
            side: super::side_from(r.side)?,
            dataset: r.dataset,
        })
    }
}

impl From<MeasuresRequest> for pb::MeasuresRequest {
    fn from(r: MeasuresRequest) -> Self {
        pb::MeasuresRequest {
            dataset: r.dataset,
            columns: columns_to(&r.columns),
            key_len: r.key_len as u32,
            group_by: r
                .group_by
                .iter()
                .map(|g| pb::GroupBy {
                    column: g.column.clone(),
                    granularity: g.granularity.map(|g| g.name().to_string()).unwrap_or_default(),
                })
                .collect(),
            measures: r.measures,
            parents: r.parents.iter().map(labels_to).collect(),
            window: r.window.map(|w| pb::Window {
                column: w.column,
                upper: w.upper,
            }),
            method: method_to(r.method),
            seal: r.seal.map(pb::Seal::from),
            run_id: r.run_id,
            side: super::side_to(r.side),
        }
    }
}

/// One measure of one group: in clear where the policy allows, its digest always.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeasureOut {
    /// `None` unless the dataset's policy lists the column in `measures`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clear: Option<MeasureValues>,
    /// 16 lowercase hex digits in JSON.
    #[serde(with = "hex_u64")]
    pub digest: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeasureGroup {
    pub labels: Labels,
    pub count: u64,
    pub measures: Vec<MeasureOut>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MeasuresResponse {
    pub groups: Vec<MeasureGroup>,
    pub rows_scanned: u64,
    pub release_log_head: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envelope: Option<Envelope>,
}

impl TryFrom<pb::MeasuresResponse> for MeasuresResponse {
    type Error = WireError;
    fn try_from(r: pb::MeasuresResponse) -> Result<MeasuresResponse, WireError> {
        let groups = r
            .groups
            .into_iter()
            .enumerate()
            .map(|(i, g)| {
                let measures = g
                    .measures
                    .into_iter()
                    .enumerate()
                    .map(|(j, m)| {
                        let given = m.sum.is_some()
                            || m.min.is_some()
                            || m.max.is_some()
                            || m.non_null > 0
                            || m.nan > 0
                            || m.pos_inf > 0
                            || m.neg_inf > 0;
                        if !m.clear && given {
                            return Err(wire_err(
                                format!("groups[{i}].measures[{j}]"),
                                "values given but not marked clear",
                            ));
                        }
                        Ok(MeasureOut {
                            clear: m.clear.then_some(MeasureValues {
                                non_null: m.non_null,
                                sum: m.sum,
                                min: m.min,
                                max: m.max,
                                nan: m.nan,
                                pos_inf: m.pos_inf,
                                neg_inf: m.neg_inf,
                            }),
                            digest: m.digest,
                        })
                    })
                    .collect::<Result<Vec<_>, WireError>>()?;
                Ok(MeasureGroup {
                    labels: g.labels.into_iter().map(|t| t.text).collect(),
                    count: g.count,
                    measures,
                })
            })
            .collect::<Result<Vec<_>, WireError>>()?;
        Ok(MeasuresResponse {
            groups,
            rows_scanned: r.rows_scanned,
            release_log_head: r.release_log_head,
            envelope: envelope_from(r.envelope, "envelope")?,
        })
    }
}

impl From<MeasuresResponse> for pb::MeasuresResponse {
    fn from(r: MeasuresResponse) -> Self {
        pb::MeasuresResponse {
            groups: r
                .groups
                .into_iter()
                .map(|g| pb::MeasureGroup {
                    labels: g
                        .labels
                        .into_iter()
                        .map(|text| pb::OptionalText { text })
                        .collect(),
                    count: g.count,
                    measures: g
                        .measures
                        .into_iter()
                        .map(|m| {
                            let clear = m.clear.is_some();
                            let v = m.clear.unwrap_or_default();
                            pb::MeasureValue {
                                non_null: v.non_null,
                                nan: v.nan,
                                pos_inf: v.pos_inf,
                                neg_inf: v.neg_inf,
                                sum: v.sum,
                                min: v.min,
                                max: v.max,
                                clear,
                                digest: m.digest,
                            }
                        })
                        .collect(),
                })
                .collect(),
            rows_scanned: r.rows_scanned,
            release_log_head: r.release_log_head,
            envelope: envelope_to(r.envelope),
        }
    }
}

mod hex_u64 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{v:016x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let t = String::deserialize(d)?;
        crate::evidence::parse_hex64(&t).ok_or_else(|| D::Error::custom("16 lowercase hex digits expected"))
    }
}

/// A measure's digest input: the row string of ("measure", its index, its compared
/// form `class:scale`, the group's labels, the non-NULL count, the specials' counts,
/// sum, min, max), hashed with the run's k_row (SHA-256). Injective (DESIGN §3's row
/// string; a group's label count is its level's), so equal digests mean equal values
/// but for a 2^-64 chance; the form keeps digests of one value at two scales apart.
pub fn digest_input(index: usize, form: &str, labels: &Labels, v: &MeasureValues) -> String {
    let counts: Vec<String> = [v.non_null, v.nan, v.pos_inf, v.neg_inf]
        .iter()
        .map(u64::to_string)
        .collect();
    let index = index.to_string();
    let fields = [Some("measure"), Some(index.as_str()), Some(form)]
        .into_iter()
        .chain(labels.iter().map(Option::as_deref))
        .chain(counts.iter().map(|c| Some(c.as_str())))
        .chain([v.sum.as_deref(), v.min.as_deref(), v.max.as_deref()]);
    crate::canonical::row_string(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_responses_round_trip_and_bad_ones_name_the_field() {
        let req = MeasuresRequest {
            dataset: "orders".into(),
            columns: Vec::new(),
            key_len: 0,
            group_by: vec![
                GroupBy {
                    column: "region".into(),
                    granularity: None,
                },
                GroupBy {
                    column: "at".into(),
                    granularity: Some(Granularity::Day),
                },
            ],
            measures: vec!["amount".into()],
            parents: vec![vec![Some("EU".into())], vec![None]],
            window: Some(Window {
                column: "at".into(),
                upper: "2026-12-01".into(),
            }),
            method: HashMethod::SealedSha256_64,
            seal: None,
            run_id: "r1".into(),
            side: Some(super::super::Side::Source),
        };
        assert_eq!(
            MeasuresRequest::try_from(pb::MeasuresRequest::from(req.clone())).unwrap(),
            req
        );
        let resp = MeasuresResponse {
            groups: vec![MeasureGroup {
                labels: vec![Some("EU".into()), None],
                count: 3,
                measures: vec![
                    MeasureOut {
                        clear: Some(MeasureValues {
                            non_null: 2,
                            sum: Some("1.5".into()),
                            min: None,
                            max: Some("1".into()),
                            nan: 1,
                            ..Default::default()
                        }),
                        digest: 7,
                    },
                    MeasureOut {
                        clear: None,
                        digest: u64::MAX,
                    },
                ],
            }],
            rows_scanned: 3,
            release_log_head: "h".into(),
            envelope: None,
        };
        assert_eq!(
            MeasuresResponse::try_from(pb::MeasuresResponse::from(resp.clone())).unwrap(),
            resp
        );
        let bad = |f: fn(&mut pb::MeasuresRequest)| {
            let mut p = pb::MeasuresRequest::from(req.clone());
            f(&mut p);
            MeasuresRequest::try_from(p).unwrap_err().field
        };
        assert_eq!(bad(|p| p.group_by.clear()), "group_by");
        assert_eq!(
            bad(|p| p.group_by[1].granularity = "fortnight".into()),
            "group_by[1].granularity"
        );
        assert_eq!(
            bad(|p| p.parents[1].labels.push(pb::OptionalText { text: None })),
            "parents[1]"
        );
        assert_eq!(bad(|p| p.parents.clear()), "parents");
        assert_eq!(
            bad(|p| p.window.as_mut().unwrap().upper.clear()),
            "segment.window.upper"
        );
        // values the agent did not mark clear are refused, never shown
        let mut p = pb::MeasuresResponse::from(resp);
        p.groups[0].measures[1].sum = Some("9".into());
        assert_eq!(
            MeasuresResponse::try_from(p).unwrap_err().field,
            "groups[0].measures[1]"
        );
    }

    #[test]
    fn digest_inputs_tell_apart_what_differs() {
        let v = |s: &str| MeasureValues {
            non_null: 2,
            sum: Some(s.into()),
            min: Some("1".into()),
            max: Some("2".into()),
            ..Default::default()
        };
        let l = vec![Some("EU".into())];
        let d = |i, form, labels: &Labels, v: &MeasureValues| digest_input(i, form, labels, v);
        let a = d(0, "decimal:2", &l, &v("3"));
        assert_ne!(a, d(1, "decimal:2", &l, &v("3")));
        assert_ne!(a, d(0, "decimal:3", &l, &v("3")));
        assert_ne!(a, d(0, "decimal:2", &vec![None], &v("3")));
        assert_ne!(a, d(0, "decimal:2", &vec![Some(String::new())], &v("3")));
        let more = MeasureValues {
            non_null: 3,
            ..v("3")
        };
        assert_ne!(a, d(0, "decimal:2", &l, &more));
        let nan = MeasureValues { nan: 1, ..v("3") };
        assert_ne!(a, d(0, "decimal:2", &l, &nan));
        assert_ne!(a, d(0, "decimal:2", &l, &v("3.5")));
        assert_eq!(a, d(0, "decimal:2", &l, &v("3")));
    }
}
