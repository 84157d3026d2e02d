//! The `tally.agent.v1.Agent` gRPC service: wire types in, domain types through the
//! policy and the dataset, wire types out, and one release-log record per call, written
//! before the response leaves: a call the log cannot record releases nothing.

use std::collections::{BTreeMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tally_common::PrivacyLevel;
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::evidence::{AgentResult, Scope, SignedBucket};
use tally_common::segment::{KeyPart, Segment, Split};
use tally_common::wire::measures::{MeasuresRequest, MeasuresResponse};
use tally_common::wire::{
    AggregateRequest, AggregateResponse, Bucket, Column, Describe, InvestigationSqlRequest, PositionResponse,
    ReadPositionRequest, RevealRequest, RevealResponse, RevealedRow, RowDigest, RowDigestBatch,
    RowDigestsRequest, Seal, WaitPositionRequest,
};
use tally_proto::v1 as pb;
use tally_proto::v1::agent_server::Agent;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::dataset::{Dataset, watermark};
use crate::error::AgentError;
use crate::policy;
use crate::release::{self, Asked, DigestsSent};
use crate::release_log::ReleaseLog;
use crate::reveal_budget::RevealBudget;
use crate::sealing::{self, Identity, Zone};
use crate::tls::client_name;

pub struct AgentService {
    pub datasets: BTreeMap<String, Arc<Dataset>>,
    pub log: Arc<ReleaseLog>,
    /// `max_reveal_rows` per dataset per hour: the one piece of state the agent keeps
    /// between calls, and it can only refuse (see [`RevealBudget`]).
    pub reveals: RevealBudget,
    /// The zone key that seals this agent's checksums; `None`: unsealed only.
    pub zone: Option<Arc<Zone>>,
    /// The key and name Aggregate and RowDigests answers are signed with.
    pub identity: Arc<Identity>,
    /// `WaitPosition` calls in progress at once, at most [`MAX_WAITS`]: each polls
    /// the database for up to an hour.
    pub waits: Arc<tokio::sync::Semaphore>,
}

/// How many `WaitPosition` calls one agent serves at once.
pub const MAX_WAITS: usize = 16;

impl std::fmt::Debug for AgentService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentService")
            .field("datasets", &self.datasets.keys())
            .finish()
    }
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
    fn hasher(&self, ds: &Dataset, method: HashMethod, seal: Option<&Seal>) -> Result<Hasher, AgentError> {
        sealing::hasher(self.zone.as_deref(), method, seal, &ds.config.policy, &ds.name)
    }
}

#[tonic::async_trait]
impl Agent for AgentService {
    async fn describe(
        &self,
        req: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeResponse>, Status> {
        let client = client_name(&req);
        let wire = req.into_inner();
        let asked = Asked::describe(&wire);
        let r = tally_common::wire::DescribeRequest::from(wire);
        let span = tracing::info_span!("describe", dataset = %r.dataset, client = %client);
        let result = async {
            let ds = self.dataset(&r.dataset)?;
            let mut s = ds.session().await?;
            let info = ds.describe(&mut s).await?;
            let p = &ds.config.policy;
            let (range, histogram) = if p.expose_key_bounds {
                (
                    ds.key_min_max(&mut s, &info).await?,
                    ds.key_histogram(&mut s, &info).await,
                )
            } else {
                (None, Vec::new())
            };
            s.finish().await?;
            let d = ds.connector.dialect_for(&info);
            Ok(Describe {
                dataset: r.dataset.clone(),
                columns: info
                    .columns
                    .iter()
                    .map(|c| Column {
                        name: c.name.clone(),
                        class: c.class,
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
                    .collect(),
                zone_key: self.zone.as_ref().map(|z| z.signed.clone()),
                xor_supported: !ds.connector.supports_pushdown() || d.xor_aggregate("h").is_some(),
                max_level: p.max_level,
                expose_key_bounds: p.expose_key_bounds,
                min_segment_rows: p.min_segment_rows,
                time_columns: p.time_columns.clone(),
                key_range: range.map(|(lo, hi)| (vec![KeyPart::Int(lo)], vec![KeyPart::Int(hi)])),
                release_log_head: String::new(),
                certificate_pem: self.identity.certificate_pem.clone(),
                watermark: ds.config.watermark.as_ref().map(|w| w.kind()),
                group_columns: p.group_columns.clone(),
                measures: p.measures.clone(),
                engine_warnings: engine_warnings(&ds),
                key_histogram: histogram,
                max_digest_rows: p.max_digest_rows,
                empty_string_is_null: ds.config.empty_string_is_null,
            })
        }
        .instrument(span)
        .await;
        let released = match &result {
            Ok(d) => {
                json!({"schema": true, "key_range": d.key_range.is_some(), "key_histogram": d.key_histogram.len()})
            }
            Err(_) => json!({}),
        };
        let head = self.record(&client, "Describe", &r.dataset, &asked, &result, released)?;
        Ok(Response::new(
            Describe {
                release_log_head: head,
                ..result?
            }
            .into(),
        ))
    }

    async fn aggregate(
        &self,
        req: Request<pb::AggregateRequest>,
    ) -> Result<Response<pb::AggregateResponse>, Status> {
        let client = client_name(&req);
        let wire = req.into_inner();
        // the release log records the request as received (its digest is over the wire form)
        let asked = Asked::aggregate(&wire);
        let dataset = wire.dataset.clone();
        let run_id = wire.run_id.clone();
        let n_segments = wire.segments.len();
        let span =
            tracing::info_span!("aggregate", dataset = %dataset, client = %client, segments = n_segments);
        let started = std::time::Instant::now();
        let mut scope = None;
        let result = async {
            let r = AggregateRequest::try_from(wire)?;
            let parents: Vec<&Segment> = r.parents.iter().map(|(s, _)| s).collect();
            scope = Some(Scope::of(
                r.side,
                r.method,
                &r.columns,
                r.key_len,
                &parents,
                r.seal.as_ref(),
            ));
            let ds = self.dataset(&r.dataset)?;
            let h = self.hasher(&ds, r.method, r.seal.as_ref())?;
            policy::check_disjoint(&r.parents)?;
            policy::check_aggregate(&ds.config.policy, &ds.name, &r.parents)?;
            // one transaction: the level's buckets are one snapshot of this side
            let mut s = ds.session().await?;
            let b = ds.bind(&mut s, r.columns, r.key_len).await?;
            let out = ds.aggregate(&mut s, &b, &h, &r.parents, r.in_process).await?;
            s.finish().await?;
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
            Ok(AggregateResponse {
                buckets: out
                    .buckets
                    .into_iter()
                    .map(|b| Bucket {
                        parent: b.parent,
                        child: b.child,
                        count: b.agg.count(),
                        sum: b.agg.sum(),
                        xor: b.agg.xor(),
                        segment: b.segment,
                    })
                    .collect(),
                path: out.path.name().to_string(),
                rows_scanned: policy::reported_rows_scanned(&ds.config.policy, out.rows_scanned),
                release_log_head: String::new(),
                // signed once the call is recorded
                envelope: None,
            })
        }
        .instrument(span)
        .await
        // what was released is summarised from the message as sent
        .map(pb::AggregateResponse::from);
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
        let head = self.record(&client, "Aggregate", &dataset, &asked, &result, released)?;
        let response = result?;
        let signed = AgentResult {
            run_id,
            agent: self.identity.name.clone(),
            dataset,
            rpc: "Aggregate".into(),
            request_sha256: asked.sha256,
            scope: scope.ok_or_else(|| Status::internal("the answered request has no scope"))?,
            buckets: Some(
                response
                    .buckets
                    .iter()
                    .map(|b| SignedBucket::new(b.parent.into(), b.child.into(), b.count, b.sum, b.xor))
                    .collect(),
            ),
            digests_sha256: None,
            groups_sha256: None,
            release_log_head: head.clone(),
            time: tally_common::evidence::now_rfc3339(),
        };
        let envelope = self.identity.sign(&signed)?;
        Ok(Response::new(pb::AggregateResponse {
            release_log_head: head,
            envelope: serde_json::to_string(&envelope).map_err(|e| Status::internal(e.to_string()))?,
            ..response
        }))
    }

    type RowDigestsStream = DigestStream;

    async fn row_digests(
        &self,
        req: Request<pb::RowDigestsRequest>,
    ) -> Result<Response<DigestStream>, Status> {
        let client = client_name(&req);
        let wire = req.into_inner();
        let asked = Asked::row_digests(&wire);
        let dataset = wire.dataset.clone();
        let run_id = wire.run_id.clone();
        let prepared = async {
            let r = RowDigestsRequest::try_from(wire)?;
            let scope = Scope::of(
                r.side,
                r.method,
                &r.columns,
                r.key_len,
                &[&r.segment],
                r.seal.as_ref(),
            );
            let ds = self.dataset(&r.dataset)?;
            policy::check_level(&ds.config.policy, &ds.name, PrivacyLevel::WithKeys, false)?;
            let h = self.hasher(&ds, r.method, r.seal.as_ref())?;
            let seg = r.segment;
            if seg.has_key_bounds() && !ds.config.policy.expose_key_bounds {
                return Err(AgentError::Policy {
                    dataset: ds.name.clone(),
                    key: "expose_key_bounds",
                    message: "key values may not leave this zone; use bisection strategy hash".into(),
                });
            }
            policy::check_periods(&ds.config.policy, &ds.name, &seg)?;
            // one transaction from the count to the last digest: rows written meanwhile
            // are not streamed, and the count holds for the stream
            let mut s = ds.session().await?;
            let b = ds.bind(&mut s, r.columns, r.key_len).await?;
            // count first: a range above max_digest_rows is refused before any digest
            // leaves (keys only, unless a period filter needs its column)
            let mut counting = b.clone();
            if seg.period.is_none() && seg.window.is_none() {
                counting.cols.truncate(counting.key_len);
            }
            let counted = ds
                .aggregate(&mut s, &counting, &h, &[(seg.clone(), Split::Whole)], false)
                .await?;
            let rows: u64 = counted.buckets.iter().map(|b| b.agg.count()).sum();
            policy::check_digest_rows(&ds.config.policy, &ds.name, rows)?;
            Ok((ds, s, h, seg, b, scope))
        }
        .await;
        // a refused request is recorded as such; an accepted one opens with a
        // `started` line (nothing is streamed unless it is written) and closes with the
        // count and outcome once the stream has ended
        let rpc = "RowDigests";
        let (ds, mut s, h, seg, b, scope) = match prepared {
            Err(e) => {
                record_line(
                    &self.log,
                    &client,
                    rpc,
                    &dataset,
                    &asked,
                    &outcome_of(&e),
                    json!({}),
                )?;
                return Err(e.into());
            }
            Ok(p) => p,
        };
        let opened = record_line(&self.log, &client, rpc, &dataset, &asked, "started", json!({}))?;
        let log = Arc::clone(&self.log);
        let identity = Arc::clone(&self.identity);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<pb::RowDigestBatch, Status>>(4);
        let span = tracing::info_span!("row_digests", dataset = %dataset, client = %client);
        tokio::spawn(
            async move {
                let txc = tx.clone();
                let mut sent = DigestsSent::default();
                let mut cancelled = false;
                let policy = ds.config.policy.clone();
                let result = ds
                    .digests(&mut s, &b, &h, &seg, 4096, &mut |batch| {
                        // rows written since the count cannot carry the stream past the
                        // limit: the batch that would cross it is not sent
                        if sent.count() + batch.len() as u64 > policy.max_digest_rows {
                            policy::check_digest_rows(&policy, &ds.name, u64::MAX)?;
                        }
                        let msg = pb::RowDigestBatch::from(RowDigestBatch {
                            digests: batch
                                .into_iter()
                                .map(|(key_hash, row_hash)| RowDigest { key_hash, row_hash })
                                .collect(),
                            release_log_head: opened.clone(),
                            envelope: None,
                        });
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
                // a stream that failed leaves its session to close the connection
                let result = match result {
                    Ok(n) => s.finish().await.map(|()| n),
                    Err(e) => Err(e),
                };
                let outcome = match &result {
                    Ok(_) => "ok".to_string(),
                    Err(_) if cancelled => "cancelled".to_string(),
                    Err(e) => outcome_of(e),
                };
                let closed = record_line(&log, &client, rpc, &dataset, &asked, &outcome, sent.released());
                let last = match (result, closed) {
                    (_, Err(status)) => Err(status),
                    (Err(e), _) => Err(Status::from(e)),
                    (Ok(_), Ok(head)) => {
                        let signed = AgentResult {
                            run_id,
                            agent: identity.name.clone(),
                            dataset: dataset.clone(),
                            rpc: rpc.into(),
                            request_sha256: asked.sha256.clone(),
                            scope,
                            buckets: None,
                            digests_sha256: Some(sent.hash.hex()),
                            groups_sha256: None,
                            release_log_head: head.clone(),
                            time: tally_common::evidence::now_rfc3339(),
                        };
                        identity.sign(&signed).map_err(Status::from).map(|envelope| {
                            pb::RowDigestBatch::from(RowDigestBatch {
                                digests: Vec::new(),
                                release_log_head: head,
                                envelope: Some(envelope),
                            })
                        })
                    }
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
        let wire = req.into_inner();
        let asked = Asked::investigation_sql(&wire);
        let dataset = wire.dataset.clone();
        let result = async {
            let r = InvestigationSqlRequest::try_from(wire)?;
            let ds = self.dataset(&r.dataset)?;
            let seg = r.segment;
            policy::check_aggregate(&ds.config.policy, &ds.name, &[(seg.clone(), Split::Whole)])?;
            let mut s = ds.session().await?;
            let b = ds.bind(&mut s, r.columns, r.key_len).await?;
            s.finish().await?;
            // a dataset that serves sealed checksums only has no unsealed hash ranges
            let sealed = r.sealed || !ds.config.policy.allow_unsealed;
            Ok(ds.investigation_sql(&b, &seg, sealed))
        }
        .await;
        let head = self.record(
            &client,
            "InvestigationSql",
            &dataset,
            &asked,
            &result,
            json!({"sql": true}),
        )?;
        Ok(Response::new(
            tally_common::wire::InvestigationSqlResponse {
                sql: result?,
                release_log_head: head,
            }
            .into(),
        ))
    }

    async fn measures(
        &self,
        req: Request<pb::MeasuresRequest>,
    ) -> Result<Response<pb::MeasuresResponse>, Status> {
        let client = client_name(&req);
        let wire = req.into_inner();
        let asked = Asked::measures(&wire);
        let dataset = wire.dataset.clone();
        let run_id = wire.run_id.clone();
        let span = tracing::info_span!("measures", dataset = %dataset, client = %client);
        let started = std::time::Instant::now();
        let mut scope = None;
        let mut clear_flags: Vec<bool> = Vec::new();
        let result = async {
            let r = MeasuresRequest::try_from(wire)?;
            let ds = self.dataset(&r.dataset)?;
            let p = &ds.config.policy;
            policy::check_measures(p, &ds.name, &r)?;
            // measure digests are keyed SHA-256 whatever the run's method
            let h = self.hasher(&ds, HashMethod::SealedSha256_64, r.seal.as_ref())?;
            let seg = Segment {
                window: r.window.clone(),
                ..Default::default()
            };
            let mut signed_scope =
                Scope::of(r.side, r.method, &r.columns, r.key_len, &[&seg], r.seal.as_ref());
            // every row of the window only at the first level (no parent groups)
            signed_scope.whole &= r.parents.is_empty();
            signed_scope.group_by = Some(
                r.group_by
                    .iter()
                    .map(|g| match g.granularity {
                        Some(gr) => format!("{}:{}", g.column, gr.name()),
                        None => g.column.clone(),
                    })
                    .collect(),
            );
            signed_scope.measures = Some(r.measures.clone());
            scope = Some(signed_scope);
            // one transaction: the level is one snapshot of this side
            let mut s = ds.session().await?;
            let b = ds.bind(&mut s, r.columns.clone(), r.key_len).await?;
            let plan = crate::measures::Plan::new(
                &ds.name,
                &b,
                &r,
                |c| p.releases_measure(c),
                !p.expose_key_bounds,
            )?;
            let (groups, rows) = crate::measures::compute(&ds, &mut s, &b, &h, &r, &plan).await?;
            clear_flags = plan.measures.iter().map(|(_, c)| *c).collect();
            s.finish().await?;
            policy::check_bucket_counts(p, &ds.name, groups.iter().map(|g| g.count))?;
            tracing::info!(
                groups = groups.len(),
                rows,
                ms = started.elapsed().as_millis() as u64,
                "measures done"
            );
            Ok(MeasuresResponse {
                groups,
                rows_scanned: policy::reported_rows_scanned(p, rows),
                release_log_head: String::new(),
                envelope: None,
            })
        }
        .instrument(span)
        .await;
        let released = match &result {
            Ok(o) => release::measures_released(o, &clear_flags),
            Err(_) => json!({}),
        };
        let head = self.record(&client, "Measures", &dataset, &asked, &result, released)?;
        let response = result?;
        let signed = AgentResult {
            run_id,
            agent: self.identity.name.clone(),
            dataset,
            rpc: "Measures".into(),
            request_sha256: asked.sha256,
            scope: scope.ok_or_else(|| Status::internal("the answered request has no scope"))?,
            buckets: None,
            digests_sha256: None,
            groups_sha256: Some(tally_common::evidence::groups_sha256(&response.groups)),
            release_log_head: head.clone(),
            time: tally_common::evidence::now_rfc3339(),
        };
        let envelope = self.identity.sign(&signed)?;
        Ok(Response::new(
            MeasuresResponse {
                release_log_head: head,
                envelope: Some(envelope),
                ..response
            }
            .into(),
        ))
    }

    async fn read_position(
        &self,
        req: Request<pb::ReadPositionRequest>,
    ) -> Result<Response<pb::PositionResponse>, Status> {
        let client = client_name(&req);
        let wire = req.into_inner();
        let asked = Asked::read_position(&wire);
        let dataset = wire.dataset.clone();
        let span = tracing::info_span!("read_position", dataset = %dataset, client = %client);
        let result = async {
            let r = ReadPositionRequest::try_from(wire)?;
            let ds = self.dataset(&r.dataset)?;
            watermark::read_source(&ds).await
        }
        .instrument(span)
        .await;
        let released = match &result {
            Ok(p) => json!({"position": {"kind": p.kind.name(), "value": p.value}}),
            Err(_) => json!({}),
        };
        let head = self.record(&client, "ReadPosition", &dataset, &asked, &result, released)?;
        Ok(Response::new(
            PositionResponse {
                position: result?,
                reached: true,
                release_log_head: head,
            }
            .into(),
        ))
    }

    async fn wait_position(
        &self,
        req: Request<pb::WaitPositionRequest>,
    ) -> Result<Response<pb::PositionResponse>, Status> {
        let client = client_name(&req);
        let wire = req.into_inner();
        let asked = Asked::wait_position(&wire);
        let dataset = wire.dataset.clone();
        let span = tracing::info_span!("wait_position", dataset = %dataset, client = %client);
        let result = async {
            let r = WaitPositionRequest::try_from(wire)?;
            let ds = self.dataset(&r.dataset)?;
            let _slot = Arc::clone(&self.waits).try_acquire_owned().map_err(|_| {
                AgentError::Busy(format!(
                    "{MAX_WAITS} position waits are in progress on this agent"
                ))
            })?;
            watermark::wait(&ds, &r.position, Duration::from_millis(r.timeout_ms)).await
        }
        .instrument(span)
        .await;
        let released = match &result {
            Ok((p, reached)) => {
                json!({"position": {"kind": p.kind.name(), "value": p.value}, "reached": reached})
            }
            Err(_) => json!({}),
        };
        let head = self.record(&client, "WaitPosition", &dataset, &asked, &result, released)?;
        let (position, reached) = result?;
        Ok(Response::new(
            PositionResponse {
                position,
                reached,
                release_log_head: head,
            }
            .into(),
        ))
    }
}

impl AgentService {
    async fn reveal(
        &self,
        req: Request<pb::RevealRequest>,
        level: PrivacyLevel,
    ) -> Result<Response<pb::RevealResponse>, Status> {
        let client = client_name(&req);
        let wire = req.into_inner();
        let rpc = if level == PrivacyLevel::Detailed {
            "RevealRows"
        } else {
            "RevealKeys"
        };
        let asked = Asked::reveal(rpc, &wire);
        let dataset = wire.dataset.clone();
        let result = async {
            let r = RevealRequest::try_from(wire)?;
            let ds = self.dataset(&r.dataset)?;
            policy::check_level(&ds.config.policy, &ds.name, level, r.consent_acknowledged)?;
            if !ds.config.policy.expose_key_bounds {
                return Err(AgentError::Policy {
                    dataset: ds.name.clone(),
                    key: "expose_key_bounds",
                    message: "key values may not leave this zone".into(),
                });
            }
            let nonce = r.seal.as_ref().map(|s| s.nonce);
            let h = sealing::key_hasher(self.zone.as_deref(), r.seal.as_ref(), &ds.config.policy, &ds.name)?;
            let seg = r.segment;
            policy::check_periods(&ds.config.policy, &ds.name, &seg)?;
            let mut s = ds.session().await?;
            let mut b = ds.bind(&mut s, r.columns, r.key_len).await?;
            if level != PrivacyLevel::Detailed && seg.period.is_none() && seg.window.is_none() {
                // keys only: read just the key columns (an index-only range scan where
                // the engine can); a period filter needs its column, so it keeps them all
                b.cols.truncate(b.key_len);
            }
            let wanted: HashSet<u64> = r.key_hashes.iter().copied().collect();
            let asked_for = (r.limit as usize).min(policy::MAX_REVEAL_ROWS).min(wanted.len());
            // the run's and the hour's budgets are reserved before the scan (two
            // concurrent calls cannot both spend the last rows) and what was not
            // released is given back
            let budget = self.reveals.reserve(
                &ds.config.policy,
                &ds.name,
                nonce.as_ref().map(|n| &n[..]),
                asked_for as u64,
            )?;
            let limit = budget.rows() as usize;
            let limited_by = budget.limited_by();
            let scanned = match ds.rows_by_key_hash(&mut s, &b, &h, &seg, &wanted, limit).await {
                Ok(found) => s.finish().await.map(|()| found),
                Err(e) => Err(e),
            };
            let released = scanned.as_ref().map_or(0, |(rows, _)| rows.len() as u64);
            self.reveals.settle(budget, released);
            let (rows, truncated) = scanned?;
            let masked: Vec<bool> = b
                .cols
                .iter()
                .map(|c| policy::is_masked(&ds.config.policy, &c.info.name))
                .collect();
            let rows: Vec<RevealedRow> = rows
                .into_iter()
                .map(|(key_hash, row)| {
                    let values = if level == PrivacyLevel::Detailed {
                        row.fields()
                            .zip(&masked)
                            .map(|(v, m)| if *m { None } else { v.map(str::to_string) })
                            .collect()
                    } else {
                        Vec::new()
                    };
                    RevealedRow {
                        key_hash,
                        key: row.key,
                        values,
                    }
                })
                .collect();
            let truncated = truncated || r.key_hashes.len() > limit;
            Ok(RevealResponse {
                truncated,
                rows,
                release_log_head: String::new(),
                withheld_by: limited_by.filter(|_| truncated).map(str::to_string),
            })
        }
        .await
        .map(pb::RevealResponse::from);
        let released = match &result {
            Ok(resp) => release::reveal_released(&resp.rows, level == PrivacyLevel::Detailed),
            Err(_) => json!({}),
        };
        let head = self.record(&client, rpc, &dataset, &asked, &result, released)?;
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

/// What a dataset's describe says of its engine and its settings, for the run's warnings.
fn engine_warnings(ds: &Dataset) -> Vec<String> {
    let mut w: Vec<String> = ds
        .connector
        .not_live_verified()
        .map(str::to_string)
        .into_iter()
        .collect();
    w.extend(ds.connector.engine().notes().iter().map(|n| n.to_string()));
    if ds.config.empty_string_is_null {
        w.push("its empty strings are compared as NULL (empty_string_is_null: true)".into());
    }
    w
}
