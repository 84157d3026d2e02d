//! The `tally.agent.v1.Agent` gRPC service: wire types in, domain types through the
//! policy and the dataset, wire types out, and one release-log record per call, written
//! before the response leaves: a call the log cannot record releases nothing.

use std::collections::{BTreeMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;

use serde_json::json;
use tally_common::PrivacyLevel;
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::segment::{ColumnSpec, Segment, Split, tuple_to_pb};
use tally_proto::v1 as pb;
use tally_proto::v1::agent_server::Agent;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::dataset::{Bound, Dataset};
use crate::error::AgentError;
use crate::policy;
use crate::release::{self, Asked, DigestsSent};
use crate::release_log::ReleaseLog;
use crate::reveal_budget::RevealBudget;
use crate::sealing::{self, Zone};
use crate::tls::client_name;

pub struct AgentService {
    pub datasets: BTreeMap<String, Arc<Dataset>>,
    pub log: Arc<ReleaseLog>,
    /// `max_reveal_rows` per dataset per hour: the one piece of state the agent keeps
    /// between calls, and it can only refuse (see [`RevealBudget`]).
    pub reveals: RevealBudget,
    /// The zone key that seals this agent's checksums; `None`: unsealed only.
    pub zone: Option<Arc<Zone>>,
}

impl std::fmt::Debug for AgentService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentService")
            .field("datasets", &self.datasets.keys())
            .finish()
    }
}

fn method_from(v: i32) -> Result<HashMethod, AgentError> {
    HashMethod::from_pb(v).ok_or_else(|| {
        AgentError::InvalidArgument(
            "method: expected sealed_sha256_64, sealed_md5_48, sha256_64 or md5_48".into(),
        )
    })
}

fn columns_from(cols: Vec<pb::ColumnRef>) -> Result<Vec<ColumnSpec>, AgentError> {
    cols.into_iter()
        .enumerate()
        .map(|(i, c)| ColumnSpec::from_pb(c, &format!("columns[{i}]")).map_err(AgentError::from))
        .collect()
}

fn segment_from(s: Option<pb::Segment>, field: &str) -> Result<Segment, AgentError> {
    Ok(s.map(|s| Segment::from_pb(s, field))
        .transpose()?
        .unwrap_or_default())
}

fn outcome_of(e: &AgentError) -> String {
    match e {
        AgentError::Policy { key, .. } => format!("denied:{key}"),
        AgentError::Seal(_) => "denied:seal".to_string(),
        e => format!("error:{}", e.code()),
    }
}

/// One release-log line: who asked, the request's digest and summary, the outcome and
/// what was released.
fn record_line(
    log: &ReleaseLog,
    client: &str,
    rpc: &str,
    dataset: &str,
    asked: &Asked,
    outcome: &str,
    released: serde_json::Value,
) -> Result<String, Status> {
    log.append(json!({"client": client, "rpc": rpc, "dataset": dataset,
                      "request_sha256": asked.sha256, "request": asked.summary,
                      "outcome": outcome, "released": released}))
        .map_err(|_| Status::from(AgentError::ReleaseLog))
}

type DigestStream = Pin<Box<dyn Stream<Item = Result<pb::RowDigestBatch, Status>> + Send>>;

impl AgentService {
    fn dataset(&self, name: &str) -> Result<Arc<Dataset>, AgentError> {
        self.datasets
            .get(name)
            .cloned()
            .ok_or_else(|| AgentError::UnknownDataset(name.to_string()))
    }

    /// Records one call in the release log; the log's new head, or the refusal to
    /// send when it cannot be written.
    fn record<T>(
        &self,
        client: &str,
        rpc: &str,
        dataset: &str,
        asked: &Asked,
        result: &Result<T, AgentError>,
        released: serde_json::Value,
    ) -> Result<String, Status> {
        let outcome = match result {
            Ok(_) => "ok".to_string(),
            Err(e) => outcome_of(e),
        };
        let released = if result.is_ok() { released } else { json!({}) };
        record_line(&self.log, client, rpc, dataset, asked, &outcome, released)
    }

    /// The hasher of a request's method and seal (see [`sealing::hasher`]).
    fn hasher(&self, ds: &Dataset, method: HashMethod, seal: Option<pb::Seal>) -> Result<Hasher, AgentError> {
        sealing::hasher(self.zone.as_deref(), method, seal, &ds.config.policy, &ds.name)
    }

    async fn bound(&self, ds: &Dataset, cols: Vec<pb::ColumnRef>, key_len: u32) -> Result<Bound, AgentError> {
        ds.bind(columns_from(cols)?, key_len as usize).await
    }
}

#[tonic::async_trait]
impl Agent for AgentService {
    async fn describe(
        &self,
        req: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeResponse>, Status> {
        let client = client_name(&req);
        let r = req.into_inner();
        let asked = Asked::describe(&r);
        let span = tracing::info_span!("describe", dataset = %r.dataset, client = %client);
        let result = async {
            let ds = self.dataset(&r.dataset)?;
            let info = ds.describe().await?;
            let p = &ds.config.policy;
            let range = if p.expose_key_bounds {
                ds.key_min_max(&info).await?
            } else {
                None
            };
            let int_tuple =
                |v: i64| tally_common::segment::tuple_to_pb(&vec![tally_common::segment::KeyPart::Int(v)]);
            let d = ds.connector.dialect_for(&info);
            Ok(pb::DescribeResponse {
                dataset: r.dataset.clone(),
                columns: info
                    .columns
                    .iter()
                    .map(|c| pb::Column {
                        name: c.name.clone(),
                        type_class: pb::TypeClass::from(c.class) as i32,
                        declared_type: c.declared_type.clone(),
                        nullable: c.nullable,
                        scale: c.scale,
                        fixed_char: c.fixed_char,
                        masked: policy::is_masked(p, &c.name),
                    })
                    .collect(),
                key: info.key.clone(),
                row_estimate: info.row_estimate,
                engine: info.engine.to_string(),
                engine_version: info.engine_version.clone(),
                time_zone: ds.config.time_zone.clone(),
                // every engine can be hashed in-process; pushdown is an optimisation.
                // Sealed methods need the zone key; unsealed ones the dataset's consent.
                hash_methods: HashMethod::BY_STRENGTH
                    .into_iter()
                    .filter(|m| {
                        if m.is_sealed() {
                            self.zone.is_some()
                        } else {
                            p.allow_unsealed
                        }
                    })
                    .map(|m| pb::HashMethod::from(m) as i32)
                    .collect(),
                zone_key: self.zone.as_ref().map(|z| z.signed.to_pb()),
                xor_supported: !ds.connector.supports_pushdown() || d.xor_aggregate("h").is_some(),
                max_level: pb::PrivacyLevel::from(p.max_level) as i32,
                expose_key_bounds: p.expose_key_bounds,
                min_segment_rows: p.min_segment_rows,
                time_columns: p.time_columns.clone(),
                key_min: range.map(|r| int_tuple(r.0)),
                key_max: range.map(|r| int_tuple(r.1)),
                release_log_head: String::new(),
            })
        }
        .instrument(span)
        .await;
        let released = match &result {
            Ok(d) => json!({"schema": true, "key_range": d.key_min.is_some()}),
            Err(_) => json!({}),
        };
        let head = self.record(&client, "Describe", &r.dataset, &asked, &result, released)?;
        Ok(Response::new(pb::DescribeResponse {
            release_log_head: head,
            ..result?
        }))
    }

    async fn aggregate(
        &self,
        req: Request<pb::AggregateRequest>,
    ) -> Result<Response<pb::AggregateResponse>, Status> {
        let client = client_name(&req);
        let r = req.into_inner();
        let asked = Asked::aggregate(&r);
        let n_segments = r.segments.len();
        let span =
            tracing::info_span!("aggregate", dataset = %r.dataset, client = %client, segments = n_segments);
        let started = std::time::Instant::now();
        let result = async {
            let ds = self.dataset(&r.dataset)?;
            let method = method_from(r.method)?;
            let h = self.hasher(&ds, method, r.seal)?;
            if r.segments.is_empty() || r.segments.len() > 100_000 {
                return Err(AgentError::InvalidArgument(
                    "segments: between 1 and 100000 needed".into(),
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
                .collect::<Result<Vec<_>, AgentError>>()?;
            policy::check_disjoint(&parents)?;
            policy::check_aggregate(&ds.config.policy, &ds.name, &parents)?;
            let b = self.bound(&ds, r.columns, r.key_len).await?;
            let out = ds.aggregate(&b, &h, &parents, r.in_process).await?;
            policy::check_bucket_counts(
                &ds.config.policy,
                &ds.name,
                out.buckets.iter().map(|b| b.agg.count()),
            )?;
            tracing::info!(
                path = out.path.name(),
                buckets = out.buckets.len(),
                rows = out.rows_scanned,
                ms = started.elapsed().as_millis() as u64,
                "aggregate done"
            );
            Ok(pb::AggregateResponse {
                buckets: out
                    .buckets
                    .iter()
                    .map(|b| pb::Bucket {
                        parent: b.parent as u32,
                        child: b.child as u32,
                        segment: Some(pb::Segment::from(&b.segment)),
                        count: b.agg.count(),
                        sum: b.agg.sum(),
                        xor: b.agg.xor(),
                    })
                    .collect(),
                path: out.path.name().to_string(),
                rows_scanned: policy::reported_rows_scanned(&ds.config.policy, out.rows_scanned),
                release_log_head: String::new(),
            })
        }
        .instrument(span)
        .await;
        let released = match &result {
            Ok(o) => {
                let mut v = release::aggregate_released(&o.buckets);
                v["key_bounds"] = json!(o.buckets.iter().any(|b| {
                    b.segment
                        .as_ref()
                        .is_some_and(|s| s.lower.is_some() || s.upper.is_some())
                }));
                v["path"] = json!(o.path);
                v["rows_scanned"] = json!(o.rows_scanned.to_string());
                v
            }
            Err(_) => json!({}),
        };
        let head = self.record(&client, "Aggregate", &r.dataset, &asked, &result, released)?;
        Ok(Response::new(pb::AggregateResponse {
            release_log_head: head,
            ..result?
        }))
    }

    type RowDigestsStream = DigestStream;

    async fn row_digests(
        &self,
        req: Request<pb::RowDigestsRequest>,
    ) -> Result<Response<DigestStream>, Status> {
        let client = client_name(&req);
        let r = req.into_inner();
        let asked = Asked::row_digests(&r);
        let prepared = async {
            let ds = self.dataset(&r.dataset)?;
            policy::check_level(&ds.config.policy, &ds.name, PrivacyLevel::WithKeys, false)?;
            let method = method_from(r.method)?;
            let h = self.hasher(&ds, method, r.seal.clone())?;
            let seg = segment_from(r.segment, "segment")?;
            if seg.has_key_bounds() && !ds.config.policy.expose_key_bounds {
                return Err(AgentError::Policy {
                    dataset: ds.name.clone(),
                    key: "expose_key_bounds",
                    message: "key values may not leave this zone; use bisection strategy hash".into(),
                });
            }
            policy::check_periods(&ds.config.policy, &ds.name, &seg)?;
            let b = self.bound(&ds, r.columns, r.key_len).await?;
            // count first: a range above max_digest_rows is refused before any digest
            // leaves (keys only, unless a period filter needs its column)
            let mut counting = b.clone();
            if seg.period.is_none() {
                counting.cols.truncate(counting.key_len);
            }
            let counted = ds
                .aggregate(&counting, &h, &[(seg.clone(), Split::Whole)], false)
                .await?;
            let rows: u64 = counted.buckets.iter().map(|b| b.agg.count()).sum();
            policy::check_digest_rows(&ds.config.policy, &ds.name, rows)?;
            Ok((ds, h, seg, b))
        }
        .await;
        // a refused request is recorded as such; an accepted one opens with a
        // `started` line (nothing is streamed unless it is written) and closes with the
        // count and outcome once the stream has ended
        let rpc = "RowDigests";
        let (ds, h, seg, b) = match prepared {
            Err(e) => {
                record_line(
                    &self.log,
                    &client,
                    rpc,
                    &r.dataset,
                    &asked,
                    &outcome_of(&e),
                    json!({}),
                )?;
                return Err(e.into());
            }
            Ok(p) => p,
        };
        let opened = record_line(&self.log, &client, rpc, &r.dataset, &asked, "started", json!({}))?;
        let log = Arc::clone(&self.log);
        let dataset = r.dataset.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<pb::RowDigestBatch, Status>>(4);
        let span = tracing::info_span!("row_digests", dataset = %dataset, client = %client);
        tokio::spawn(
            async move {
                let txc = tx.clone();
                let mut sent = DigestsSent::default();
                let mut cancelled = false;
                let policy = ds.config.policy.clone();
                let result = ds
                    .digests(&b, &h, &seg, 4096, &mut |batch| {
                        // rows written since the count cannot carry the stream past the
                        // limit: the batch that would cross it is not sent
                        if sent.count + batch.len() as u64 > policy.max_digest_rows {
                            policy::check_digest_rows(&policy, &ds.name, u64::MAX)?;
                        }
                        let msg = pb::RowDigestBatch {
                            digests: batch
                                .into_iter()
                                .map(|(k, r)| pb::RowDigest {
                                    key_hash: k,
                                    row_hash: r,
                                })
                                .collect(),
                            release_log_head: opened.clone(),
                        };
                        let counted = msg.digests.clone();
                        // a full channel waits for the client: memory stays bounded
                        let r = txc.blocking_send_or_closed(Ok(msg));
                        match &r {
                            Ok(()) => counted.iter().for_each(|d| sent.add(d)),
                            Err(_) => cancelled = true,
                        }
                        r
                    })
                    .await;
                let outcome = match &result {
                    Ok(_) => "ok".to_string(),
                    Err(_) if cancelled => "cancelled".to_string(),
                    Err(e) => outcome_of(e),
                };
                let closed = record_line(&log, &client, rpc, &dataset, &asked, &outcome, sent.released());
                let last = match (result, closed) {
                    (_, Err(status)) => Err(status),
                    (Err(e), _) => Err(Status::from(e)),
                    (Ok(_), Ok(head)) => Ok(pb::RowDigestBatch {
                        digests: Vec::new(),
                        release_log_head: head,
                    }),
                };
                if !cancelled {
                    let _ = tx.send(last).await;
                }
            }
            .instrument(span),
        );
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn reveal_keys(
        &self,
        req: Request<pb::RevealRequest>,
    ) -> Result<Response<pb::RevealResponse>, Status> {
        self.reveal(req, PrivacyLevel::WithKeys).await
    }

    async fn reveal_rows(
        &self,
        req: Request<pb::RevealRequest>,
    ) -> Result<Response<pb::RevealResponse>, Status> {
        self.reveal(req, PrivacyLevel::Detailed).await
    }

    async fn investigation_sql(
        &self,
        req: Request<pb::InvestigationSqlRequest>,
    ) -> Result<Response<pb::InvestigationSqlResponse>, Status> {
        let client = client_name(&req);
        let r = req.into_inner();
        let asked = Asked::investigation_sql(&r);
        let result = async {
            let ds = self.dataset(&r.dataset)?;
            let seg = segment_from(r.segment.clone(), "segment")?;
            policy::check_aggregate(&ds.config.policy, &ds.name, &[(seg.clone(), Split::Whole)])?;
            let b = self.bound(&ds, r.columns.clone(), r.key_len).await?;
            // a dataset that serves sealed checksums only has no unsealed hash ranges
            let sealed = r.sealed || !ds.config.policy.allow_unsealed;
            Ok(ds.investigation_sql(&b, &seg, sealed))
        }
        .await;
        let head = self.record(
            &client,
            "InvestigationSql",
            &r.dataset,
            &asked,
            &result,
            json!({"sql": true}),
        )?;
        Ok(Response::new(pb::InvestigationSqlResponse {
            sql: result?,
            release_log_head: head,
        }))
    }
}

impl AgentService {
    async fn reveal(
        &self,
        req: Request<pb::RevealRequest>,
        level: PrivacyLevel,
    ) -> Result<Response<pb::RevealResponse>, Status> {
        let client = client_name(&req);
        let r = req.into_inner();
        let rpc = if level == PrivacyLevel::Detailed {
            "RevealRows"
        } else {
            "RevealKeys"
        };
        let asked = Asked::reveal(rpc, &r);
        let result = async {
            let ds = self.dataset(&r.dataset)?;
            policy::check_level(&ds.config.policy, &ds.name, level, r.consent_acknowledged)?;
            if !ds.config.policy.expose_key_bounds {
                return Err(AgentError::Policy {
                    dataset: ds.name.clone(),
                    key: "expose_key_bounds",
                    message: "key values may not leave this zone".into(),
                });
            }
            let nonce = r.seal.as_ref().map(|s| s.nonce.clone());
            let h = sealing::key_hasher(self.zone.as_deref(), r.seal, &ds.config.policy, &ds.name)?;
            let seg = segment_from(r.segment, "segment")?;
            policy::check_periods(&ds.config.policy, &ds.name, &seg)?;
            let mut b = self.bound(&ds, r.columns, r.key_len).await?;
            if level != PrivacyLevel::Detailed && seg.period.is_none() {
                // keys only: read just the key columns (an index-only range scan where
                // the engine can); a period filter needs its column, so it keeps them all
                b.cols.truncate(b.key_len);
            }
            let wanted: HashSet<u64> = r.key_hashes.iter().copied().collect();
            let asked_for = (r.limit as usize).min(policy::MAX_REVEAL_ROWS).min(wanted.len());
            // the run's and the hour's budgets are reserved before the scan (two
            // concurrent calls cannot both spend the last rows) and what was not
            // released is given back
            let budget =
                self.reveals
                    .reserve(&ds.config.policy, &ds.name, nonce.as_deref(), asked_for as u64)?;
            let limit = budget.rows() as usize;
            let scanned = ds.rows_by_key_hash(&b, &h, &seg, &wanted, limit).await;
            let released = scanned.as_ref().map_or(0, |(rows, _)| rows.len() as u64);
            self.reveals.settle(budget, released);
            let (rows, truncated) = scanned?;
            let masked: Vec<bool> = b
                .cols
                .iter()
                .map(|c| policy::is_masked(&ds.config.policy, &c.info.name))
                .collect();
            let rows: Vec<pb::RevealedRow> = rows
                .into_iter()
                .map(|(kh, row)| pb::RevealedRow {
                    key_hash: kh,
                    key: Some(tuple_to_pb(&row.key)),
                    values: if level == PrivacyLevel::Detailed {
                        row.fields
                            .into_iter()
                            .zip(&masked)
                            .map(|(v, m)| pb::OptionalText {
                                text: if *m { None } else { v },
                            })
                            .collect()
                    } else {
                        Vec::new()
                    },
                })
                .collect();
            Ok(pb::RevealResponse {
                truncated: truncated || r.key_hashes.len() > limit,
                rows,
                release_log_head: String::new(),
            })
        }
        .await;
        let released = match &result {
            Ok(resp) => release::reveal_released(&resp.rows, level == PrivacyLevel::Detailed),
            Err(_) => json!({}),
        };
        let head = self.record(&client, rpc, &r.dataset, &asked, &result, released)?;
        Ok(Response::new(pb::RevealResponse {
            release_log_head: head,
            ..result?
        }))
    }
}

/// Sending from inside a synchronous row callback that runs on the async runtime.
trait SendOrClosed<T> {
    fn blocking_send_or_closed(&self, v: T) -> crate::error::Result<()>;
}

impl<T: Send> SendOrClosed<T> for tokio::sync::mpsc::Sender<T> {
    fn blocking_send_or_closed(&self, v: T) -> crate::error::Result<()> {
        // try_send first; when the client is slower than the database, wait in place
        match self.try_send(v) {
            Ok(()) => Ok(()),
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => {
                Err(AgentError::InvalidArgument("client went away".into()))
            }
            Err(tokio::sync::mpsc::error::TrySendError::Full(v)) => tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current()
                    .block_on(self.send(v))
                    .map_err(|_| AgentError::InvalidArgument("client went away".into()))
            }),
        }
    }
}
