//! An agent in this process: the real agent service (`tally_agent::service`, its
//! datasets, policies, sealing and release log) called without gRPC, TLS or a process.
//! It drives runs in tests of the run engine and the rows phase; `tally demo` and every
//! deployment use [`tally_coordinator::client::Agent`] over mutual TLS instead.
//!
//! What it skips is exactly the transport: the TLS handshake and the agent's
//! `allowed_clients` check (the caller's certificate name reads `unknown` in the
//! release log).

use std::path::Path;
use std::sync::Arc;

use futures::StreamExt;
use tally_agent::service::AgentService;
use tally_common::wire::{
    AggregateRequest, AggregateResponse, Describe, DescribeRequest, InvestigationSqlRequest,
    InvestigationSqlResponse, PositionResponse, ReadPositionRequest, RevealRequest, RevealResponse,
    RowDigestBatch, RowDigestsRequest, WaitPositionRequest,
};
use tally_proto::v1 as pb;
use tally_proto::v1::agent_server::Agent as _;
use tonic::{Request, Status};

use tally_coordinator::client::{AgentApi, Digests};
use tally_engine::error::RunError;

/// The endpoint errors name for an in-process agent.
const ENDPOINT: &str = "in-process";

pub struct InProcessAgent {
    name: String,
    service: Arc<AgentService>,
}

impl std::fmt::Debug for InProcessAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessAgent")
            .field("name", &self.name)
            .finish()
    }
}

impl InProcessAgent {
    pub fn new(name: &str, service: Arc<AgentService>) -> InProcessAgent {
        InProcessAgent {
            name: name.to_string(),
            service,
        }
    }

    /// The agent `tally-agent -c path` would serve, in this process.
    pub fn from_config(name: &str, path: &Path) -> Result<InProcessAgent, RunError> {
        let cfg =
            tally_agent::config::AgentConfig::load(path).map_err(|e| RunError::Config(e.to_string()))?;
        let service =
            tally_agent::server::service(&cfg, path).map_err(|e| RunError::Config(e.to_string()))?;
        Ok(InProcessAgent::new(name, Arc::new(service)))
    }

    fn error(&self, rpc: &str, s: Status) -> RunError {
        tally_coordinator::client::run_error(&self.name, ENDPOINT, rpc, s)
    }

    fn valid<T>(
        &self,
        rpc: &str,
        answer: Result<T, tally_common::segment::WireError>,
    ) -> Result<T, RunError> {
        answer.map_err(|e| RunError::malformed(&self.name, rpc, e))
    }
}

#[tonic::async_trait]
impl AgentApi for InProcessAgent {
    fn name(&self) -> &str {
        &self.name
    }

    async fn describe(&self, dataset: &str) -> Result<Describe, RunError> {
        let req = pb::DescribeRequest::from(DescribeRequest {
            dataset: dataset.to_string(),
        });
        let d = self
            .service
            .describe(Request::new(req))
            .await
            .map_err(|s| self.error("Describe", s))?;
        self.valid("Describe", Describe::try_from(d.into_inner()))
    }

    async fn aggregate(&self, req: AggregateRequest) -> Result<AggregateResponse, RunError> {
        let a = self
            .service
            .aggregate(Request::new(pb::AggregateRequest::from(req)))
            .await
            .map_err(|s| self.error("Aggregate", s))?;
        self.valid("Aggregate", AggregateResponse::try_from(a.into_inner()))
    }

    async fn row_digests(&self, req: RowDigestsRequest) -> Result<Digests, RunError> {
        let mut stream = self
            .service
            .row_digests(Request::new(pb::RowDigestsRequest::from(req)))
            .await
            .map_err(|s| self.error("RowDigests", s))?
            .into_inner();
        let mut out = Digests::default();
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(|s| self.error("RowDigests", s))?;
            out.add(self.valid("RowDigests", RowDigestBatch::try_from(batch))?);
        }
        Ok(out)
    }

    async fn reveal(&self, req: RevealRequest, rows: bool) -> Result<RevealResponse, RunError> {
        let rpc = if rows { "RevealRows" } else { "RevealKeys" };
        let req = Request::new(pb::RevealRequest::from(req));
        let r = if rows {
            self.service.reveal_rows(req).await
        } else {
            self.service.reveal_keys(req).await
        }
        .map_err(|s| self.error(rpc, s))?;
        self.valid(rpc, RevealResponse::try_from(r.into_inner()))
    }

    async fn investigation_sql(
        &self,
        req: InvestigationSqlRequest,
    ) -> Result<InvestigationSqlResponse, RunError> {
        let r = self
            .service
            .investigation_sql(Request::new(pb::InvestigationSqlRequest::from(req)))
            .await
            .map_err(|s| self.error("InvestigationSql", s))?;
        Ok(InvestigationSqlResponse::from(r.into_inner()))
    }

    async fn measures(
        &self,
        req: tally_common::wire::measures::MeasuresRequest,
    ) -> Result<tally_common::wire::measures::MeasuresResponse, RunError> {
        let r = self
            .service
            .measures(Request::new(pb::MeasuresRequest::from(req)))
            .await
            .map_err(|s| self.error("Measures", s))?;
        self.valid(
            "Measures",
            tally_common::wire::measures::MeasuresResponse::try_from(r.into_inner()),
        )
    }

    async fn read_position(&self, req: ReadPositionRequest) -> Result<PositionResponse, RunError> {
        let r = self
            .service
            .read_position(Request::new(pb::ReadPositionRequest::from(req)))
            .await
            .map_err(|s| self.error("ReadPosition", s))?;
        self.valid("ReadPosition", PositionResponse::try_from(r.into_inner()))
    }

    async fn wait_position(&self, req: WaitPositionRequest) -> Result<PositionResponse, RunError> {
        let r = self
            .service
            .wait_position(Request::new(pb::WaitPositionRequest::from(req)))
            .await
            .map_err(|s| self.error("WaitPosition", s))?;
        self.valid("WaitPosition", PositionResponse::try_from(r.into_inner()))
    }
}
