//! Watermarks in the engine (DESIGN §5, `window: {watermark: wait, timeout}`): before
//! the drill, and before each confirm round's reads, the source agent reads its
//! replication position and the target agent waits until it has applied it. The
//! positions go into the result (`positions`) and, as events, into the run log; a
//! resumed run does not wait again for a position its log shows reached.
//!
//! What it guarantees: every change the source had committed when its position was
//! read is in the target when the target is read. Changes the source makes after that
//! can still differ; a column window whose bound is read before the position
//! (`lag`), or confirm rounds (which wait again), take care of those
//! (docs/live-data.md).

use tally_common::position::Position;
use tally_common::wire::{Describe, PositionResponse, ReadPositionRequest, WaitPositionRequest};

use super::{Command, Engine, Out, Step};
use crate::error::RunError;
use crate::result::PositionsOut;
use crate::spec::Spec;

/// Before any scan: a spec that waits for a watermark needs both datasets to read one,
/// of the same kind (an LSN cannot be compared with a GTID position).
pub(super) fn check_watermarks(
    spec: &Spec,
    agents: &(String, String),
    s: &Describe,
    t: &Describe,
) -> Result<(), RunError> {
    if spec.watermark_timeout_ms().is_none() {
        return Ok(());
    }
    let missing = |agent: &str, d: &Describe| {
        RunError::Watermark(format!(
            "window.watermark: dataset {} of agent {agent} has no watermark: set datasets.{}.watermark in that \
             agent's config (a builtin such as pg_wal_lsn or gtid_slave_pos, or a query over the pipeline's \
             offset table)",
            d.dataset, d.dataset
        ))
    };
    let sk = s.watermark.ok_or_else(|| missing(&agents.0, s))?;
    let tk = t.watermark.ok_or_else(|| missing(&agents.1, t))?;
    if sk != tk {
        return Err(RunError::Watermark(format!(
            "window.watermark: the source reads {sk} positions, the target {tk}: a target can only wait for a \
             position of its own kind (use a query watermark over the pipeline's offset table on both sides)"
        )));
    }
    Ok(())
}

impl Engine {
    /// Whether the positions of `round` are aligned, or need not be (no watermark).
    pub(super) fn positions_synced(&self, round: u32) -> bool {
        self.spec.watermark_timeout_ms().is_none()
            || self
                .res
                .positions
                .iter()
                .any(|p| p.round == round && p.target.is_some())
    }

    /// Asks the source's position for `round`.
    pub(super) fn sync_positions(&mut self, out: &mut Out, round: u32) {
        let request = ReadPositionRequest {
            dataset: self.spec.source.dataset.clone(),
            run_id: String::new(),
        };
        self.ask(out, Command::ReadPosition { round, request });
    }

    pub(super) fn on_position_read(&mut self, out: &mut Out, round: u32, position: Position) -> Step {
        if position.value.is_empty() {
            // every position reaches an empty one: waiting for it would align nothing
            return Err(RunError::Watermark(format!(
                "the source (agent {}, dataset {}) reported an empty {} position",
                self.agents.0, self.spec.source.dataset, position.kind
            ))
            .into());
        }
        let timeout_ms = self.spec.watermark_timeout_ms().expect("asked for a watermark");
        let timeout = self.spec.window.as_ref().and_then(|w| w.timeout.clone());
        self.say(
            out,
            format!(
                "watermark: source at {position}; waiting up to {} for the target to apply it",
                timeout
                    .as_deref()
                    .unwrap_or(crate::spec::DEFAULT_WATERMARK_TIMEOUT)
            ),
        );
        self.res.positions.retain(|p| p.round != round);
        self.res.positions.push(PositionsOut {
            round,
            source: position.clone(),
            target: None,
            waited_ms: 0,
        });
        let request = WaitPositionRequest {
            dataset: self.spec.target.dataset.clone(),
            position,
            timeout_ms,
            run_id: String::new(),
        };
        self.ask(out, Command::WaitPosition { round, request });
        Ok(())
    }

    pub(super) fn on_position_applied(
        &mut self,
        out: &mut Out,
        round: u32,
        r: PositionResponse,
        elapsed_ms: u64,
    ) -> Step {
        let entry = self
            .res
            .positions
            .iter_mut()
            .find(|p| p.round == round)
            .expect("the source position is read first");
        entry.waited_ms = elapsed_ms;
        // the agent says whether it reached it; the coordinator checks that it did
        let behind = !r.position.reached(&entry.source).unwrap_or(false);
        if r.reached && behind {
            return Err(RunError::Watermark(format!(
                "the target (agent {}, dataset {}) claims to have reached the source's position {} at {}, which is \
                 behind it ({})",
                self.agents.1,
                self.spec.target.dataset,
                entry.source,
                r.position,
                r.position.behind(&entry.source),
            ))
            .into());
        }
        if !r.reached || behind {
            let timeout = self.spec.window.as_ref().and_then(|w| w.timeout.clone());
            return Err(RunError::Watermark(format!(
                "the target (agent {}, dataset {}) did not apply the source's position {} within {}: it is {} \
                 ({}); its replication may be stopped or far behind. Check it, or raise window.timeout",
                self.agents.1,
                self.spec.target.dataset,
                entry.source,
                timeout.as_deref().unwrap_or(crate::spec::DEFAULT_WATERMARK_TIMEOUT),
                r.position,
                r.position.behind(&entry.source),
            ))
            .into());
        }
        entry.target = Some(r.position.clone());
        self.say(
            out,
            format!(
                "watermark: target at {} after {elapsed_ms} ms: it has applied the source's position",
                r.position
            ),
        );
        if round == 0 {
            self.after_window(out)
        } else {
            self.on_confirm_synced(out, round)
        }
    }
}
