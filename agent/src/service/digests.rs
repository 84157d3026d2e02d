//! RowDigests: the one streaming call. A refused request is recorded as such; an
//! accepted one opens with a `started` line (nothing is streamed unless it is written)
//! and closes with the count and outcome once the stream has ended.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::json;
use tally_common::PrivacyLevel;
use tally_common::evidence::Scope;
use tally_common::segment::Split;
use tally_common::wire::{RowDigest, RowDigestBatch, RowDigestsRequest};
use tally_proto::v1 as pb;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::{AgentService, Call, DigestStream, outcome_of};
use crate::connector::Flow;
use crate::error::AgentError;
use crate::policy;
use crate::release::{Asked, DigestsSent};

/// Digests per streamed batch.
const BATCH: usize = 4096;

impl AgentService {
    pub(super) async fn stream_digests(
        &self,
        req: Request<pb::RowDigestsRequest>,
    ) -> Result<Response<DigestStream>, Status> {
        let (call, wire) = Call::of(req, "RowDigests", Asked::row_digests, |w| &w.dataset);
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
        let (ds, mut s, h, seg, b, scope): (_, _, _, _, _, Scope) = match prepared {
            Err(e) => {
                call.record_as(&self.log, &outcome_of(&e), json!({}))?;
                return Err(e.into());
            }
            Ok(p) => p,
        };
        let opened = call.record_as(&self.log, "started", json!({}))?;
        let log = Arc::clone(&self.log);
        let identity = Arc::clone(&self.identity);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<pb::RowDigestBatch, Status>>(4);
        let span = call.span.clone();
        tokio::spawn(
            async move {
                // what the client took, and whether it went away
                let sent = Arc::new(Mutex::new(DigestsSent::default()));
                let gone = Arc::new(AtomicBool::new(false));
                let policy = ds.config.policy.clone();
                let result = ds
                    .digests(&mut s, &b, &h, &seg, BATCH, &mut |batch| {
                        // rows written since the count cannot carry the stream past the
                        // limit: the batch that would cross it is not sent
                        let count = sent.lock().unwrap_or_else(|p| p.into_inner()).count();
                        if count + batch.len() as u64 > policy.max_digest_rows {
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
                        let (tx, sent, gone) = (tx.clone(), Arc::clone(&sent), Arc::clone(&gone));
                        // a full channel waits for the client, and the read with it: memory
                        // stays bounded
                        Ok(Flow::Wait(Box::pin(async move {
                            let counted = msg.digests.clone();
                            if tx.send(Ok(msg)).await.is_err() {
                                gone.store(true, Ordering::Relaxed);
                                return Err(AgentError::InvalidArgument("client went away".into()));
                            }
                            let mut sent = sent.lock().unwrap_or_else(|p| p.into_inner());
                            counted.iter().for_each(|d| sent.add(d));
                            Ok(())
                        })))
                    })
                    .await;
                let cancelled = gone.load(Ordering::Relaxed);
                let sent = std::mem::take(&mut *sent.lock().unwrap_or_else(|p| p.into_inner()));
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
                let closed = call.record_as(&log, &outcome, sent.released());
                let last = match (result, closed) {
                    (_, Err(status)) => Err(status),
                    (Err(e), _) => Err(Status::from(e)),
                    (Ok(_), Ok(head)) => {
                        let signed = tally_common::evidence::AgentResult {
                            digests_sha256: Some(sent.hash.hex()),
                            ..call.evidence(&identity, run_id, scope, &head)
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
}
