//! The `tally.agent.v1.Agent` gRPC service: wire types in, domain types through the
//! policy and the dataset, wire types out, and one release-log record per call, written
//! before the response leaves: a call the log cannot record releases nothing.

mod digests;
mod reads;

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tally_common::PrivacyLevel;
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::evidence::{AgentResult, Scope, SignedBucket};
use tally_common::segment::{Segment, Split};
use tally_common::wire::measures::MeasuresResponse;
use tally_common::wire::{
    AggregateRequest, AggregateResponse, Bucket, Describe, InvestigationSqlRequest, PositionResponse,
    ReadPositionRequest, Seal, WaitPositionRequest,
};
use tally_proto::v1 as pb;
use tally_proto::v1::agent_server::Agent;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::dataset::{Dataset, watermark};
use crate::error::AgentError;
use crate::policy;
use crate::release::{self, Asked};
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

/// One call as received: who asked, which RPC, for which dataset, the request as the
/// release log records it (its digest is over the wire form), and the call's span.
struct Call {
    client: String,
    rpc: &'static str,
    dataset: String,
    asked: Asked,
    span: tracing::Span,
}

impl Call {
    /// The call and its wire request.
    fn of<W>(
        req: Request<W>,
        rpc: &'static str,
        asked: impl FnOnce(&W) -> Asked,
        dataset: impl FnOnce(&W) -> &str,
    ) -> (Call, W) {
        let client = client_name(&req);
        let wire = req.into_inner();
        let asked = asked(&wire);
        let dataset = dataset(&wire).to_string();
        let span = tracing::info_span!("call", rpc, dataset = %dataset, client = %client);
        let call = Call {
            client,
            rpc,
            dataset,
            asked,
            span,
        };
        (call, wire)
    }

    /// Records the call in the release log with `outcome` (see [`record_line`]).
    fn record_as(
        &self,
        log: &ReleaseLog,
        outcome: &str,
        released: serde_json::Value,
    ) -> Result<String, Status> {
        record_line(
            log,
            &self.client,
            self.rpc,
            &self.dataset,
            &self.asked,
            outcome,
            released,
        )
    }

    /// What the agent signs of its answer to this call (docs/evidence.md): the call, its
    /// scope and the release log's head; the answer's content is set by the caller.
    fn evidence(&self, identity: &Identity, run_id: String, scope: Scope, head: &str) -> AgentResult {
        AgentResult {
            run_id,
            agent: identity.name.clone(),
            dataset: self.dataset.clone(),
            rpc: self.rpc.into(),
            request_sha256: self.asked.sha256.clone(),
            scope,
            buckets: None,
            digests_sha256: None,
            groups_sha256: None,
            release_log_head: head.to_string(),
            time: tally_common::evidence::now_rfc3339(),
        }
    }
}

impl AgentService {
    fn dataset(&self, name: &str) -> Result<Arc<Dataset>, AgentError> {
        self.datasets
            .get(name)
            .cloned()
            .ok_or_else(|| AgentError::UnknownDataset(name.to_string()))
    }

    /// The frame of every unary call: `body` runs in the call's span; its outcome, and
    /// what `released` says an answer releases, is recorded in the release log before
    /// anything is sent (a call the log cannot record releases nothing); `answer` builds
    /// the response with the log's new head.
    async fn unary<O, R>(
        &self,
        call: Call,
        body: impl Future<Output = Result<O, AgentError>>,
        released: impl FnOnce(&O) -> serde_json::Value,
        answer: impl FnOnce(O, &Call, String) -> Result<R, Status>,
    ) -> Result<Response<R>, Status> {
        let result = body.instrument(call.span.clone()).await;
        let head = match &result {
            Ok(o) => call.record_as(&self.log, "ok", released(o))?,
            Err(e) => call.record_as(&self.log, &outcome_of(e), json!({}))?,
        };
        Ok(Response::new(answer(result?, &call, head)?))
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
        let (call, wire) = Call::of(req, "Describe", Asked::describe, |w| &w.dataset);
        let r = tally_common::wire::DescribeRequest::from(wire);
        self.unary(
            call,
            self.describe_dataset(&r.dataset),
            |d| json!({"schema": true, "key_range": d.key_range.is_some(), "key_histogram": d.key_histogram.len()}),
            |d, _, head| {
                Ok(Describe {
                    release_log_head: head,
                    ..d
                }
                .into())
            },
        )
        .await
    }

    async fn aggregate(
        &self,
        req: Request<pb::AggregateRequest>,
    ) -> Result<Response<pb::AggregateResponse>, Status> {
        let (call, wire) = Call::of(req, "Aggregate", Asked::aggregate, |w| &w.dataset);
        let run_id = wire.run_id.clone();
        let body = async {
            let started = std::time::Instant::now();
            let r = AggregateRequest::try_from(wire)?;
            let parents: Vec<&Segment> = r.parents.iter().map(|(s, _)| s).collect();
            let scope = Scope::of(r.side, r.method, &r.columns, r.key_len, &parents, r.seal.as_ref());
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
                segments = r.parents.len(),
                buckets = out.buckets.len(),
                rows = out.rows_scanned,
                ms = started.elapsed().as_millis() as u64,
                "aggregate done"
            );
            let response = AggregateResponse {
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
            };
            // what was released is summarised from the message as sent
            Ok((pb::AggregateResponse::from(response), scope))
        };
        self.unary(
            call,
            body,
            |(o, _)| {
                let mut v = release::aggregate_released(&o.buckets);
                v["key_bounds"] = json!(o.buckets.iter().any(|b| {
                    b.segment
                        .as_ref()
                        .is_some_and(|s| s.lower.is_some() || s.upper.is_some())
                }));
                v["path"] = json!(o.path);
                v["rows_scanned"] = json!(o.rows_scanned.to_string());
                v
            },
            |(response, scope), call, head| {
                let signed = AgentResult {
                    buckets: Some(
                        response
                            .buckets
                            .iter()
                            .map(|b| {
                                SignedBucket::new(b.parent.into(), b.child.into(), b.count, b.sum, b.xor)
                            })
                            .collect(),
                    ),
                    ..call.evidence(&self.identity, run_id, scope, &head)
                };
                let envelope = self.identity.sign(&signed)?;
                Ok(pb::AggregateResponse {
                    release_log_head: head,
                    envelope: serde_json::to_string(&envelope)
                        .map_err(|e| Status::internal(e.to_string()))?,
                    ..response
                })
            },
        )
        .await
    }

    type RowDigestsStream = DigestStream;

    async fn row_digests(
        &self,
        req: Request<pb::RowDigestsRequest>,
    ) -> Result<Response<DigestStream>, Status> {
        self.stream_digests(req).await
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
        let (call, wire) = Call::of(req, "InvestigationSql", Asked::investigation_sql, |w| &w.dataset);
        let body = async {
            let r = InvestigationSqlRequest::try_from(wire)?;
            let ds = self.dataset(&r.dataset)?;
            let seg = r.segment;
            policy::check_aggregate(&ds.config.policy, &ds.name, &[(seg.clone(), Split::Whole)])?;
            for item in &r.items {
                policy::check_aggregate(
                    &ds.config.policy,
                    &ds.name,
                    &[(item.segment.clone(), Split::Whole)],
                )?;
            }
            // SQL naming keys carries them: only where this dataset reveals keys
            if !r.keys.is_empty() || !r.items.is_empty() {
                policy::check_level(&ds.config.policy, &ds.name, PrivacyLevel::WithKeys, false)?;
            }
            let mut s = ds.session().await?;
            let b = ds.bind(&mut s, r.columns, r.key_len).await?;
            s.finish().await?;
            // many leaves' keys in one call: one description, one answer each
            if !r.items.is_empty() {
                let sqls = r
                    .items
                    .iter()
                    .map(|item| ds.key_sql(&b, &item.segment, &item.keys))
                    .collect::<crate::error::Result<Vec<_>>>()?;
                return Ok((String::new(), sqls));
            }
            if !r.keys.is_empty() {
                return Ok((ds.key_sql(&b, &seg, &r.keys)?, Vec::new()));
            }
            // a dataset that serves sealed checksums only has no unsealed hash ranges
            let sealed = r.sealed || !ds.config.policy.allow_unsealed;
            Ok((ds.investigation_sql(&b, &seg, sealed), Vec::new()))
        };
        self.unary(
            call,
            body,
            |_| json!({"sql": true}),
            |(sql, sqls), _, head| {
                Ok(tally_common::wire::InvestigationSqlResponse {
                    sql,
                    release_log_head: head,
                    sqls,
                }
                .into())
            },
        )
        .await
    }

    async fn measures(
        &self,
        req: Request<pb::MeasuresRequest>,
    ) -> Result<Response<pb::MeasuresResponse>, Status> {
        let (call, wire) = Call::of(req, "Measures", Asked::measures, |w| &w.dataset);
        let run_id = wire.run_id.clone();
        self.unary(
            call,
            self.compute_measures(wire),
            |(o, _, clear_flags)| release::measures_released(o, clear_flags),
            |(response, scope, _), call, head| {
                let signed = AgentResult {
                    groups_sha256: Some(tally_common::evidence::groups_sha256(&response.groups)),
                    ..call.evidence(&self.identity, run_id, scope, &head)
                };
                let envelope = self.identity.sign(&signed)?;
                Ok(MeasuresResponse {
                    release_log_head: head,
                    envelope: Some(envelope),
                    ..response
                }
                .into())
            },
        )
        .await
    }

    async fn read_position(
        &self,
        req: Request<pb::ReadPositionRequest>,
    ) -> Result<Response<pb::PositionResponse>, Status> {
        let (call, wire) = Call::of(req, "ReadPosition", Asked::read_position, |w| &w.dataset);
        let body = async {
            let r = ReadPositionRequest::try_from(wire)?;
            let ds = self.dataset(&r.dataset)?;
            watermark::read_source(&ds).await
        };
        self.unary(
            call,
            body,
            |p| json!({"position": {"kind": p.kind.name(), "value": p.value}}),
            |position, _, head| {
                Ok(PositionResponse {
                    position,
                    reached: true,
                    release_log_head: head,
                }
                .into())
            },
        )
        .await
    }

    async fn wait_position(
        &self,
        req: Request<pb::WaitPositionRequest>,
    ) -> Result<Response<pb::PositionResponse>, Status> {
        let (call, wire) = Call::of(req, "WaitPosition", Asked::wait_position, |w| &w.dataset);
        let body = async {
            let r = WaitPositionRequest::try_from(wire)?;
            let ds = self.dataset(&r.dataset)?;
            let _slot = Arc::clone(&self.waits).try_acquire_owned().map_err(|_| {
                AgentError::Busy(format!(
                    "{MAX_WAITS} position waits are in progress on this agent"
                ))
            })?;
            watermark::wait(&ds, &r.position, Duration::from_millis(r.timeout_ms)).await
        };
        self.unary(
            call,
            body,
            |(p, reached)| json!({"position": {"kind": p.kind.name(), "value": p.value}, "reached": reached}),
            |(position, reached), _, head| {
                Ok(PositionResponse {
                    position,
                    reached,
                    release_log_head: head,
                }
                .into())
            },
        )
        .await
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
