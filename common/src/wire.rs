//! Domain types of every `tally.agent.v1` message, and the one place they meet the
//! generated proto structs. `TryFrom<pb::X>` validates and names the offending field
//! (`segments[3].split`, `seal.nonce`); `From<X> for pb::X` builds the message. The agent
//! converts requests at its service edge and the coordinator answers at its client edge,
//! so neither works on `pb::` types beyond them.
//!
//! Two leniencies are deliberate, for agents and coordinators of different builds: a
//! hash method this build does not know is not offered to it (`Describe::hash_methods`
//! skips it), and a column of a type class it does not know is described as
//! [`TypeClass::Other`](crate::types::TypeClass::Other) (no canonical form: refused
//! only if the run compares it). An absent segment is the whole dataset and an absent
//! split is `whole`, as before these types existed.

use serde::{Deserialize, Serialize};
use tally_proto::v1 as pb;

use crate::checksum::HashMethod;
use crate::dsse::Envelope;
use crate::evidence::valid_run_id;
use crate::seal::{NONCE_LEN, SignedZoneKey};
pub use crate::segment::WireError;
use crate::segment::{ColumnSpec, Segment, wire_err};
use crate::types::PrivacyLevel;

mod aggregate;
mod describe;
mod investigation;
pub mod measures;
mod position;
mod reveal;
mod row_digests;

pub use aggregate::{AggregateRequest, AggregateResponse, Bucket, MAX_SEGMENTS};
pub use describe::{Column, Describe, DescribeRequest};
pub use investigation::{
    InvestigationSqlRequest, InvestigationSqlResponse, KeySqlItem, MAX_KEY_SQL_BATCH_KEYS, MAX_KEY_SQL_ITEMS,
    MAX_KEY_SQL_KEYS,
};
pub use position::{PositionResponse, ReadPositionRequest, WaitPositionRequest};
pub use reveal::{MAX_REVEAL_ROWS_PER_CALL, RevealRequest, RevealResponse, RevealedRow};
pub use row_digests::{RowDigest, RowDigestBatch, RowDigestsRequest};

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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::canonical::FieldFormat;
    use crate::period::Granularity;
    use crate::position::{Position, PositionKind};
    use crate::segment::{KeyPart, KeyTuple, Period, Split};
    use crate::types::TypeClass;

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
            items: Vec::new(),
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
            items: Vec::new(),
        });
        round_trip::<_, pb::InvestigationSqlRequest>(InvestigationSqlRequest {
            dataset: "orders".into(),
            columns: cols(),
            key_len: 1,
            segment: seg(),
            sealed: true,
            keys: Vec::new(),
            items: vec![
                KeySqlItem {
                    segment: seg(),
                    keys: vec![vec![KeyPart::Int(7)], vec![KeyPart::Int(9)]],
                },
                KeySqlItem {
                    segment: Segment::whole(),
                    keys: vec![vec![KeyPart::Int(-1)]],
                },
            ],
        });
        round_trip::<_, pb::InvestigationSqlResponse>(InvestigationSqlResponse {
            sql: "SELECT 1".into(),
            release_log_head: "h".into(),
            sqls: Vec::new(),
        });
        round_trip::<_, pb::InvestigationSqlResponse>(InvestigationSqlResponse {
            sql: String::new(),
            release_log_head: "h".into(),
            sqls: vec!["SELECT 7".into(), "SELECT 9".into()],
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

        // batched items: each item's keys as above, their number and all keys bounded
        let item = |keys: Vec<pb::KeyTuple>| pb::KeySqlItem { segment: None, keys };
        let batch = |items: Vec<pb::KeySqlItem>| pb::InvestigationSqlRequest {
            key_len: 2,
            items,
            ..Default::default()
        };
        let ok = InvestigationSqlRequest::try_from(batch(vec![item(vec![tuple(2)]); MAX_KEY_SQL_ITEMS]))
            .expect("256 items");
        assert_eq!(ok.items.len(), MAX_KEY_SQL_ITEMS);
        let e = InvestigationSqlRequest::try_from(batch(vec![item(vec![tuple(2)]); MAX_KEY_SQL_ITEMS + 1]))
            .expect_err("257 items");
        assert_eq!(e.field, "items");
        let e = InvestigationSqlRequest::try_from(batch(vec![item(vec![tuple(2); MAX_KEY_SQL_KEYS]); 21]))
            .expect_err("21,000 keys in all");
        assert!(e.field == "items" && e.message.contains("20000"), "{e:?}");
        let e = InvestigationSqlRequest::try_from(batch(vec![item(vec![tuple(2)]), item(vec![tuple(1)])]))
            .expect_err("a short tuple");
        assert_eq!(e.field, "items[1].keys[0]");
        let e = InvestigationSqlRequest::try_from(batch(vec![item(vec![])])).expect_err("no keys");
        assert_eq!(e.field, "items[0].keys");
        let mut both = batch(vec![item(vec![tuple(2)])]);
        both.keys = vec![tuple(2)];
        assert_eq!(field_of::<InvestigationSqlRequest, _>(both), "items");
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

    /// An even split goes out as its cut list with the even form beside it: an agent
    /// before the form reads the list (the same split), this build reads the even form
    /// only where it restates the list exactly, and a list alone stays a list.
    #[test]
    fn an_even_split_travels_with_its_cut_list_and_must_agree_with_it() {
        use crate::segment::EvenCuts;
        let e = EvenCuts::new(-1000, 250, 7).unwrap();
        let even = AggregateRequest {
            parents: vec![
                (Segment::whole(), Split::Hash(4)),
                (Segment::whole(), Split::Even(e)),
            ],
            ..aggregate()
        };
        round_trip::<_, pb::AggregateRequest>(even.clone());
        let sent = pb::AggregateRequest::from(even.clone());
        let Some(pb::segment_split::Split::Cuts(c)) = &sent.segments[1].split else {
            panic!("an even split is sent as cuts: {:?}", sent.segments[1].split)
        };
        let listed: Vec<KeyTuple> = c
            .cuts
            .iter()
            .map(|t| crate::segment::tuple_from_pb(t.clone(), "t").unwrap())
            .collect();
        assert_eq!(listed, e.cuts(), "the list an older agent reads");
        assert_eq!(c.even, Some(e.to_pb()));
        // an older coordinator's list, however evenly spaced, is a list
        let mut old = sent.clone();
        if let Some(pb::segment_split::Split::Cuts(c)) = &mut old.segments[1].split {
            c.even = None;
        }
        let read = AggregateRequest::try_from(old).unwrap();
        assert_eq!(read.parents[1].1, Split::Cuts(e.cuts()));
        // an even form that says other cuts than the list: refused, naming the field
        let disagree = |f: &dyn Fn(&mut pb::KeyCuts)| {
            let mut r = sent.clone();
            if let Some(pb::segment_split::Split::Cuts(c)) = &mut r.segments[1].split {
                f(c);
            }
            AggregateRequest::try_from(r).unwrap_err()
        };
        let moved = disagree(&|c| c.even.as_mut().unwrap().first += 1);
        assert_eq!(moved.field, "segments[1].split.even");
        assert!(
            moved
                .message
                .contains("states cut 0 as -999, the cut list has -1000"),
            "{moved}"
        );
        assert_eq!(
            disagree(&|c| c.even.as_mut().unwrap().width = 251).field,
            "segments[1].split.even"
        );
        let longer = disagree(&|c| c.even.as_mut().unwrap().count = 8);
        assert_eq!(longer.field, "segments[1].split.even");
        assert_eq!(
            disagree(&|c| {
                c.cuts.pop();
            })
            .field,
            "segments[1].split.even"
        );
        assert_eq!(
            disagree(&|c| c.even.as_mut().unwrap().width = 0).field,
            "segments[1].split.even"
        );
        // a point of the list moved: the list is still valid, the pair is not
        let shifted = disagree(&|c| {
            c.cuts[3].parts[0].value = Some(pb::key_value::Value::Int(-251));
        });
        assert_eq!(shifted.field, "segments[1].split.even");
        assert!(
            shifted
                .message
                .contains("states cut 3 as -250, the cut list has -251"),
            "{shifted}"
        );
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
