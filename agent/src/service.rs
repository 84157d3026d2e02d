//! The `tally.agent.v1.Agent` gRPC service: wire types in, domain types through the
//! policy and the dataset, wire types out, and one release-log record per call.

use std::collections::{BTreeMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;

use serde_json::json;
use tally_common::PrivacyLevel;
use tally_common::checksum::HashMethod;
use tally_common::segment::{ColumnSpec, Segment, Split, tuple_to_pb};
use tally_proto::v1 as pb;
use tally_proto::v1::agent_server::Agent;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::dataset::{Bound, Dataset};
use crate::error::AgentError;
use crate::policy;
use crate::release_log::ReleaseLog;
use crate::tls::client_name;

pub struct AgentService {
    pub datasets: BTreeMap<String, Arc<Dataset>>,
    pub log: Arc<ReleaseLog>,
}

impl std::fmt::Debug for AgentService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentService")
            .field("datasets", &self.datasets.keys())
            .finish()
    }
}

fn method_from(v: i32) -> Result<HashMethod, AgentError> {
    match pb::HashMethod::try_from(v) {
        Ok(pb::HashMethod::Md548) => Ok(HashMethod::Md5_48),
        Ok(pb::HashMethod::Sha25664) => Ok(HashMethod::Sha256_64),
        _ => Err(AgentError::InvalidArgument(
            "method: expected md5_48 or sha256_64".into(),
        )),
    }
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

type DigestStream = Pin<Box<dyn Stream<Item = Result<pb::RowDigestBatch, Status>> + Send>>;

impl AgentService {
    fn dataset(&self, name: &str) -> Result<Arc<Dataset>, AgentError> {
        self.datasets
            .get(name)
            .cloned()
            .ok_or_else(|| AgentError::UnknownDataset(name.to_string()))
    }

    /// Records the outcome of one call in the release log.
    fn record<T>(
        &self,
        client: &str,
        rpc: &str,
        dataset: &str,
        result: &Result<T, AgentError>,
        released: serde_json::Value,
    ) {
        let outcome = match result {
            Ok(_) => json!("ok"),
            Err(AgentError::Policy { key, .. }) => json!(format!("denied:{key}")),
            Err(e) => json!(format!("error:{}", e.code())),
        };
        let released = if result.is_ok() { released } else { json!({}) };
        self.log.append(json!({"client": client, "rpc": rpc, "dataset": dataset, "outcome": outcome, "released": released}));
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
                // every engine can be hashed in-process; pushdown is an optimisation
                hash_methods: vec![pb::HashMethod::Sha25664 as i32, pb::HashMethod::Md548 as i32],
                xor_supported: !ds.connector.supports_pushdown() || d.xor_aggregate("h").is_some(),
                max_level: pb::PrivacyLevel::from(p.max_level) as i32,
                expose_key_bounds: p.expose_key_bounds,
                min_segment_rows: p.min_segment_rows,
                key_min: range.map(|r| int_tuple(r.0)),
                key_max: range.map(|r| int_tuple(r.1)),
            })
        }
        .instrument(span)
        .await;
        let released = match &result {
            Ok(d) => json!({"schema": true, "key_range": d.key_min.is_some()}),
            Err(_) => json!({}),
        };
        self.record(&client, "Describe", &r.dataset, &result, released);
        Ok(Response::new(result?))
    }

    async fn aggregate(
        &self,
        req: Request<pb::AggregateRequest>,
    ) -> Result<Response<pb::AggregateResponse>, Status> {
        let client = client_name(&req);
        let r = req.into_inner();
        let n_segments = r.segments.len();
        let span =
            tracing::info_span!("aggregate", dataset = %r.dataset, client = %client, segments = n_segments);
        let started = std::time::Instant::now();
        let result = async {
            let ds = self.dataset(&r.dataset)?;
            let method = method_from(r.method)?;
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
            policy::check_aggregate(&ds.config.policy, &ds.name, &parents)?;
            let b = self.bound(&ds, r.columns, r.key_len).await?;
            let out = ds.aggregate(&b, method, &parents, r.in_process).await?;
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
            Ok(out)
        }
        .instrument(span)
        .await;
        let released = match &result {
            Ok(o) => {
                json!({"buckets": o.buckets.len(), "key_bounds": o.buckets.iter().any(|b| b.segment.has_key_bounds()), "path": o.path.name()})
            }
            Err(_) => json!({}),
        };
        self.record(&client, "Aggregate", &r.dataset, &result, released);
        let out = result?;
        Ok(Response::new(pb::AggregateResponse {
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
            rows_scanned: out.rows_scanned,
        }))
    }

    type RowDigestsStream = DigestStream;

    async fn row_digests(
        &self,
        req: Request<pb::RowDigestsRequest>,
    ) -> Result<Response<DigestStream>, Status> {
        let client = client_name(&req);
        let r = req.into_inner();
        let prepared = async {
            let ds = self.dataset(&r.dataset)?;
            policy::check_level(&ds.config.policy, &ds.name, PrivacyLevel::WithKeys, false)?;
            let method = method_from(r.method)?;
            let seg = segment_from(r.segment, "segment")?;
            if seg.has_key_bounds() && !ds.config.policy.expose_key_bounds {
                return Err(AgentError::Policy {
                    dataset: ds.name.clone(),
                    key: "expose_key_bounds",
                    message: "key values may not leave this zone; use bisection strategy hash".into(),
                });
            }
            let b = self.bound(&ds, r.columns, r.key_len).await?;
            Ok((ds, method, seg, b))
        }
        .await;
        self.record(
            &client,
            "RowDigests",
            &r.dataset,
            &prepared,
            json!({"digests": "streamed"}),
        );
        let (ds, method, seg, b) = prepared?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<pb::RowDigestBatch, Status>>(4);
        tokio::spawn(
            async move {
                let txc = tx.clone();
                let result = ds
                    .digests(&b, method, &seg, 4096, &mut |batch| {
                        let msg = pb::RowDigestBatch {
                            digests: batch
                                .into_iter()
                                .map(|(k, r)| pb::RowDigest {
                                    key_hash: k,
                                    row_hash: r,
                                })
                                .collect(),
                        };
                        // a full channel waits for the client: memory stays bounded
                        txc.blocking_send_or_closed(Ok(msg))
                    })
                    .await;
                if let Err(e) = result {
                    let _ = tx.send(Err(Status::from(e))).await;
                }
            }
            .instrument(tracing::info_span!("row_digests", client = %client)),
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
        let result = async {
            let ds = self.dataset(&r.dataset)?;
            let seg = segment_from(r.segment, "segment")?;
            policy::check_aggregate(&ds.config.policy, &ds.name, &[(seg.clone(), Split::Whole)])?;
            let b = self.bound(&ds, r.columns, r.key_len).await?;
            Ok(ds.investigation_sql(&b, &seg))
        }
        .await;
        self.record(
            &client,
            "InvestigationSql",
            &r.dataset,
            &result,
            json!({"sql": true}),
        );
        Ok(Response::new(pb::InvestigationSqlResponse { sql: result? }))
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
            let seg = segment_from(r.segment, "segment")?;
            let mut b = self.bound(&ds, r.columns, r.key_len).await?;
            if level != PrivacyLevel::Detailed && seg.period.is_none() {
                // keys only: read just the key columns (an index-only range scan where
                // the engine can); a period filter needs its column, so it keeps them all
                b.cols.truncate(b.key_len);
            }
            let wanted: HashSet<u64> = r.key_hashes.iter().copied().collect();
            let limit = (r.limit as usize).min(policy::MAX_REVEAL_ROWS);
            let (rows, truncated) = ds.rows_by_key_hash(&b, &seg, &wanted, limit).await?;
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
            })
        }
        .await;
        let released = match &result {
            Ok(resp) => {
                json!({"rows": resp.rows.len(), "values": level == PrivacyLevel::Detailed, "key_hashes": r.key_hashes.iter().map(|h| format!("{h:016x}")).collect::<Vec<_>>()})
            }
            Err(_) => json!({}),
        };
        self.record(&client, rpc, &r.dataset, &result, released);
        Ok(Response::new(result?))
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
