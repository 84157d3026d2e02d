//! The bodies of the calls that read a dataset and answer at once: Describe,
//! Measures, RevealKeys and RevealRows (their frame is [`AgentService::unary`]).

use std::collections::HashSet;

use tally_common::PrivacyLevel;
use tally_common::checksum::HashMethod;
use tally_common::evidence::Scope;
use tally_common::segment::{KeyPart, Segment};
use tally_common::wire::measures::{MeasuresRequest, MeasuresResponse};
use tally_common::wire::{Column, Describe, RevealRequest, RevealResponse, RevealedRow};
use tally_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::{AgentService, Call, engine_warnings};
use crate::error::AgentError;
use crate::policy;
use crate::release::{self, Asked};
use crate::sealing;

impl AgentService {
    /// What Describe answers of a dataset (the release log's head is set once recorded).
    pub(super) async fn describe_dataset(&self, name: &str) -> Result<Describe, AgentError> {
        let ds = self.dataset(name)?;
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
            dataset: name.to_string(),
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

    /// What Measures answers, the scope it signs, and which measures left in clear.
    pub(super) async fn compute_measures(
        &self,
        wire: pb::MeasuresRequest,
    ) -> Result<(MeasuresResponse, Scope, Vec<bool>), AgentError> {
        let started = std::time::Instant::now();
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
        let mut signed_scope = Scope::of(r.side, r.method, &r.columns, r.key_len, &[&seg], r.seal.as_ref());
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
        // one transaction: the level is one snapshot of this side
        let mut s = ds.session().await?;
        let b = ds.bind(&mut s, r.columns.clone(), r.key_len).await?;
        let plan =
            crate::measures::Plan::new(&ds.name, &b, &r, |c| p.releases_measure(c), !p.expose_key_bounds)?;
        let (groups, rows) = crate::measures::compute(&ds, &mut s, &b, &h, &r, &plan).await?;
        let clear_flags: Vec<bool> = plan.measures.iter().map(|(_, c)| *c).collect();
        s.finish().await?;
        policy::check_bucket_counts(p, &ds.name, groups.iter().map(|g| g.count))?;
        tracing::info!(
            groups = groups.len(),
            rows,
            ms = started.elapsed().as_millis() as u64,
            "measures done"
        );
        let response = MeasuresResponse {
            groups,
            rows_scanned: policy::reported_rows_scanned(p, rows),
            release_log_head: String::new(),
            envelope: None,
        };
        Ok((response, signed_scope, clear_flags))
    }

    /// RevealKeys and RevealRows: the rows of a segment whose key hashes were asked
    /// for, within the policy's level and the reveal budgets.
    pub(super) async fn reveal(
        &self,
        req: Request<pb::RevealRequest>,
        level: PrivacyLevel,
    ) -> Result<Response<pb::RevealResponse>, Status> {
        let rpc = if level == PrivacyLevel::Detailed {
            "RevealRows"
        } else {
            "RevealKeys"
        };
        let (call, wire) = Call::of(req, rpc, |w| Asked::reveal(rpc, w), |w| &w.dataset);
        self.unary(
            call,
            self.reveal_rows_of(wire, level),
            |resp| release::reveal_released(&resp.rows, level == PrivacyLevel::Detailed),
            |resp, _, head| {
                Ok(pb::RevealResponse {
                    release_log_head: head,
                    ..resp
                })
            },
        )
        .await
    }

    /// What a reveal answers (the release log's head is set once recorded).
    async fn reveal_rows_of(
        &self,
        wire: pb::RevealRequest,
        level: PrivacyLevel,
    ) -> Result<pb::RevealResponse, AgentError> {
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
        Ok(pb::RevealResponse::from(RevealResponse {
            truncated,
            rows,
            release_log_head: String::new(),
            withheld_by: limited_by.filter(|_| truncated).map(str::to_string),
        }))
    }
}
