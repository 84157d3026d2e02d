//! What the engine is told (events: agents' answers and what the runtime measured or
//! drew) and what it asks for (commands). Events are what the run log records, as
//! JSON objects tagged `"event"`; replaying them rebuilds the engine.

use serde::{Deserialize, Serialize};
use tally_common::position::Position;
use tally_common::seal::NONCE_LEN;
use tally_common::wire::measures::{MeasuresRequest, MeasuresResponse};
use tally_common::wire::{
    AggregateRequest, AggregateResponse, Describe, InvestigationSqlRequest, PositionResponse,
    ReadPositionRequest, RevealRequest, RevealResponse, RowDigest, RowDigestsRequest, WaitPositionRequest,
};

use crate::result::{LevelOut, RunResult};

/// Which side a call goes to (the wire's: an agent signs the side it answers as).
pub use tally_common::wire::Side;

/// An answer the engine steps on. Every event is appended to the run log before the
/// engine sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Both sides' descriptions of their datasets.
    Described {
        source: Box<Describe>,
        target: Box<Describe>,
    },
    /// The run nonce of a sealed run, drawn by the runtime (a resumed run keeps it).
    NonceDrawn {
        #[serde(with = "hex_nonce")]
        nonce: [u8; NONCE_LEN],
    },
    /// The coordinator's clock, read once for a window's `lag` (a resumed run keeps it).
    ClockRead { unix_ms: i64 },
    /// The wait before confirm round `round` is over.
    Waited { round: u32 },
    /// The source's replication position, read before the drill (round 0) or before
    /// confirm round `round`'s reads (a window's `watermark: wait`).
    PositionRead {
        #[serde(default, skip_serializing_if = "is_zero")]
        round: u32,
        position: Position,
    },
    /// The target's answer to waiting until it had applied that position.
    PositionApplied {
        #[serde(default, skip_serializing_if = "is_zero")]
        round: u32,
        response: PositionResponse,
        elapsed_ms: u64,
    },
    /// One side's aggregate of drill level `level`.
    Aggregated {
        level: u32,
        side: Side,
        response: AggregateResponse,
        elapsed_ms: u64,
        /// The request the agent signed this answer to, as docs/evidence.md "The
        /// requests" writes it (its RFC 8785 SHA-256 is the answer's `request_sha256`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<Box<serde_json::Value>>,
    },
    /// One side's (key hash, row hash) pairs of rows-phase range `range` (in confirm
    /// round `round`; 0 for the rows phase itself).
    Digests {
        #[serde(default, skip_serializing_if = "is_zero")]
        round: u32,
        range: usize,
        side: Side,
        #[serde(with = "packed_digests")]
        digests: Vec<RowDigest>,
        /// What the agent signed over the stream (DESIGN §12).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        envelope: Option<tally_common::dsse::Envelope>,
        /// The request the agent signed this answer to, as docs/evidence.md "The
        /// requests" writes it (its RFC 8785 SHA-256 is the answer's `request_sha256`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<Box<serde_json::Value>>,
    },
    /// One side's revealed rows of page `page` of rows-phase range `range` (when only
    /// that side was asked: missing or extra rows). A call an agent refused because a
    /// reveal budget was spent is recorded as an empty answer naming that budget
    /// ([`reveal_answer`]).
    Revealed {
        range: usize,
        #[serde(default, skip_serializing_if = "is_zero")]
        page: u32,
        side: Side,
        response: RevealResponse,
    },
    /// Both sides' revealed rows of a page of range `range`, recorded together once both
    /// are in, so that what is kept of a changed row is only what differs (a side
    /// recorded alone would keep the values of its unchanged columns too).
    RevealedBoth {
        range: usize,
        #[serde(default, skip_serializing_if = "is_zero")]
        page: u32,
        source: RevealResponse,
        target: RevealResponse,
    },
    /// One side's investigation SQL of leaf `leaf`.
    InvestigationSql { leaf: usize, side: Side, sql: String },
    /// One side's investigation SQL of exactly the keys of each per-key SQL item of the
    /// batch that starts at item `first` (with_keys and detailed, after the rows phase):
    /// one per item, in order.
    KeySql {
        first: usize,
        side: Side,
        sqls: Vec<String>,
    },
    /// One side's aggregates of the differing leaves in confirm round `round`
    /// (count_only: leaves are re-checked whole).
    Rechecked {
        round: u32,
        side: Side,
        response: AggregateResponse,
        /// The request the agent signed this answer to, as docs/evidence.md "The
        /// requests" writes it (its RFC 8785 SHA-256 is the answer's `request_sha256`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<Box<serde_json::Value>>,
    },
    /// One side's groups of level `level` of mode measures.
    Measured {
        level: u32,
        side: Side,
        response: MeasuresResponse,
        elapsed_ms: u64,
        /// The request the agent signed this answer to, as docs/evidence.md "The
        /// requests" writes it (its RFC 8785 SHA-256 is the answer's `request_sha256`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<Box<serde_json::Value>>,
    },
    /// A call failed (or a gate the runtime enforces tripped): the run ends with this
    /// error (`RunError::code` and its message).
    Failed { code: String, message: String },
}

impl Event {
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Described { .. } => "described",
            Event::NonceDrawn { .. } => "nonce_drawn",
            Event::ClockRead { .. } => "clock_read",
            Event::Waited { .. } => "waited",
            Event::PositionRead { .. } => "position_read",
            Event::PositionApplied { .. } => "position_applied",
            Event::Aggregated { .. } => "aggregated",
            Event::Digests { .. } => "digests",
            Event::Revealed { .. } => "revealed",
            Event::RevealedBoth { .. } => "revealed_both",
            Event::InvestigationSql { .. } => "investigation_sql",
            Event::KeySql { .. } => "key_sql",
            Event::Measured { .. } => "measured",
            Event::Rechecked { .. } => "rechecked",
            Event::Failed { .. } => "failed",
        }
    }

    /// Every call this event answers: one, both reveals of a range for `revealed_both`,
    /// none for `failed` (which ends the run whatever was asked).
    pub fn calls(&self) -> Vec<Call> {
        vec![match self {
            Event::Described { .. } => Call::Describe,
            Event::NonceDrawn { .. } => Call::Nonce,
            Event::ClockRead { .. } => Call::Clock,
            Event::Waited { round } => Call::Wait(*round),
            Event::PositionRead { round, .. } => Call::Position(*round),
            Event::PositionApplied { round, .. } => Call::Applied(*round),
            Event::Aggregated { level, side, .. } => Call::Aggregate(*level, *side),
            Event::Digests {
                round, range, side, ..
            } => Call::Digests(*round, *range, *side),
            Event::Revealed {
                range, page, side, ..
            } => Call::Reveal(*range, *page, *side),
            Event::RevealedBoth { range, page, .. } => {
                return vec![
                    Call::Reveal(*range, *page, Side::Source),
                    Call::Reveal(*range, *page, Side::Target),
                ];
            }
            Event::InvestigationSql { leaf, side, .. } => Call::Sql(*leaf, *side),
            Event::KeySql { first, side, .. } => Call::KeySql(*first, *side),
            Event::Measured { level, side, .. } => Call::Measures(*level, *side),
            Event::Rechecked { round, side, .. } => Call::Recheck(*round, *side),
            Event::Failed { .. } => return Vec::new(),
        }]
    }
}

/// What the engine asks the runtime to do. Calls that come out of one step may run
/// concurrently; the others are done in order, at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Command {
    /// Describe both datasets; answered by one `described` event.
    Describe { source: String, target: String },
    /// Draw a run nonce; answered by `nonce_drawn`.
    DrawNonce,
    /// Read the clock (a window's `lag`); answered by `clock_read`.
    ReadClock,
    Aggregate {
        level: u32,
        side: Side,
        request: AggregateRequest,
    },
    RowDigests {
        #[serde(default, skip_serializing_if = "is_zero")]
        round: u32,
        range: usize,
        side: Side,
        request: RowDigestsRequest,
    },
    /// Wait `ms` milliseconds before confirm round `round`; answered by `waited`.
    Wait { round: u32, ms: u64 },
    /// Read the source's replication position; answered by `position_read`.
    ReadPosition {
        #[serde(default, skip_serializing_if = "is_zero")]
        round: u32,
        request: ReadPositionRequest,
    },
    /// Have the target wait until it has applied a position; answered by
    /// `position_applied`.
    WaitPosition {
        #[serde(default, skip_serializing_if = "is_zero")]
        round: u32,
        request: WaitPositionRequest,
    },
    /// RevealRows when `rows`, else RevealKeys: page `page` of range `range` (a
    /// range's key hashes are asked in pages of at most
    /// [`tally_common::wire::MAX_REVEAL_ROWS_PER_CALL`]).
    Reveal {
        range: usize,
        #[serde(default, skip_serializing_if = "is_zero")]
        page: u32,
        side: Side,
        request: RevealRequest,
        rows: bool,
    },
    InvestigationSql {
        leaf: usize,
        side: Side,
        request: InvestigationSqlRequest,
    },
    /// Investigation SQL of the keys of each item of the batch that starts at item
    /// `first` (the request's `items`: a leaf's keys of one kind of difference each);
    /// answered by `key_sql`.
    KeySql {
        first: usize,
        side: Side,
        request: InvestigationSqlRequest,
    },
    /// Confirm round `round` at count_only: one side's aggregates of the differing
    /// leaves, whole; answered by `rechecked`.
    Recheck {
        round: u32,
        side: Side,
        request: AggregateRequest,
    },
    /// Mode measures: one side's groups of level `level`; answered by `measured`.
    Measures {
        level: u32,
        side: Side,
        request: MeasuresRequest,
    },
    /// A level completed: the runtime records `{"event": "level", "level_out": ..}`
    /// (for progress readers; replay skips it).
    LevelDone { level_out: LevelOut },
    /// A progress line for humans.
    Progress { line: String },
    /// The run is over.
    Finish { result: Box<RunResult> },
}

impl Command {
    /// The call this command makes, if it is one (the others need no answer).
    pub fn call(&self) -> Option<Call> {
        Some(match self {
            Command::Describe { .. } => Call::Describe,
            Command::DrawNonce => Call::Nonce,
            Command::ReadClock => Call::Clock,
            Command::Aggregate { level, side, .. } => Call::Aggregate(*level, *side),
            Command::RowDigests {
                round, range, side, ..
            } => Call::Digests(*round, *range, *side),
            Command::Wait { round, .. } => Call::Wait(*round),
            Command::ReadPosition { round, .. } => Call::Position(*round),
            Command::WaitPosition { round, .. } => Call::Applied(*round),
            Command::Reveal {
                range, page, side, ..
            } => Call::Reveal(*range, *page, *side),
            Command::InvestigationSql { leaf, side, .. } => Call::Sql(*leaf, *side),
            Command::KeySql { first, side, .. } => Call::KeySql(*first, *side),
            Command::Measures { level, side, .. } => Call::Measures(*level, *side),
            Command::Recheck { round, side, .. } => Call::Recheck(*round, *side),
            Command::LevelDone { .. } | Command::Progress { .. } | Command::Finish { .. } => return None,
        })
    }
}

/// A call's identity: what an answer must match to be in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Call {
    Describe,
    Nonce,
    Clock,
    Wait(u32),
    /// The source's position before the drill (0) or a confirm round.
    Position(u32),
    /// The target's wait for it.
    Applied(u32),
    Aggregate(u32, Side),
    /// (confirm round, range, side)
    Digests(u32, usize, Side),
    /// (range, page, side)
    Reveal(usize, u32, Side),
    Sql(usize, Side),
    /// (first item of the batch, side) of investigation SQL of keys.
    KeySql(usize, Side),
    /// (level, side) of mode measures.
    Measures(u32, Side),
    /// (confirm round, side) of a count_only confirm round.
    Recheck(u32, Side),
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Call::Describe => write!(f, "describe"),
            Call::Nonce => write!(f, "the run nonce"),
            Call::Clock => write!(f, "the clock"),
            Call::Aggregate(l, s) => write!(f, "the {} aggregate of level {l}", s.name()),
            Call::Digests(0, r, s) => write!(f, "the {} digests of range {r}", s.name()),
            Call::Digests(n, r, s) => write!(f, "the {} digests of range {r} in confirm round {n}", s.name()),
            Call::Wait(n) => write!(f, "the wait before confirm round {n}"),
            Call::Position(0) => write!(f, "the source position"),
            Call::Position(n) => write!(f, "the source position before confirm round {n}"),
            Call::Applied(0) => write!(f, "the target's wait for the source position"),
            Call::Applied(n) => write!(
                f,
                "the target's wait for the source position before confirm round {n}"
            ),
            Call::Reveal(r, 0, s) => write!(f, "the {} reveal of range {r}", s.name()),
            Call::Reveal(r, p, s) => write!(f, "the {} reveal of range {r}, page {p}", s.name()),
            Call::Sql(l, s) => write!(f, "the {} investigation sql of leaf {l}", s.name()),
            Call::KeySql(first, s) => {
                write!(f, "the {} investigation sql of keys from item {first}", s.name())
            }
            Call::Measures(l, s) => write!(f, "the {} measures of level {l}", s.name()),
            Call::Recheck(n, s) => write!(f, "the {} aggregate of confirm round {n}", s.name()),
        }
    }
}

/// The nonce as hex, as the run log has always shown it.
mod hex_nonce {
    use super::NONCE_LEN;
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(n: &[u8; NONCE_LEN], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(n))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; NONCE_LEN], D::Error> {
        let text = String::deserialize(d)?;
        hex::decode(&text)
            .ok()
            .and_then(|n| n.try_into().ok())
            .ok_or_else(|| D::Error::custom(format!("nonce: {} hex digits expected", 2 * NONCE_LEN)))
    }
}

/// Digests as one hex string, 32 digits per row (key hash, then row hash): a range
/// holds up to `threshold` rows per side, and JSON objects would triple the log.
mod packed_digests {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};
    use tally_common::wire::RowDigest;

    pub fn serialize<S: Serializer>(d: &[RowDigest], s: S) -> Result<S::Ok, S::Error> {
        let mut out = String::with_capacity(d.len() * 32);
        for r in d {
            out.push_str(&format!("{:016x}{:016x}", r.key_hash, r.row_hash));
        }
        s.serialize_str(&out)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RowDigest>, D::Error> {
        let text = String::deserialize(d)?;
        // lowercase hex only: one spelling per list (from_str_radix alone would take
        // uppercase digits and a leading `+`)
        if text.len() % 32 != 0 || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(D::Error::custom(
                "digests: 32 lowercase hex digits per row expected",
            ));
        }
        let word =
            |s: &str| u64::from_str_radix(s, 16).map_err(|e| D::Error::custom(format!("digests: {e}")));
        (0..text.len() / 32)
            .map(|i| {
                let row = &text[i * 32..(i + 1) * 32];
                Ok(RowDigest {
                    key_hash: word(&row[..16])?,
                    row_hash: word(&row[16..])?,
                })
            })
            .collect()
    }
}

/// The event a reveal call's outcome is recorded as. A refusal because one of the
/// agent's reveal budgets is spent (`max_reveal_rows`, `max_reveal_rows_per_hour`) is
/// an empty answer naming that budget: the run keeps its verdict and leaves and says
/// the keys were withheld. Any other failure ends the run.
pub fn reveal_answer(
    range: usize,
    page: u32,
    side: Side,
    outcome: Result<RevealResponse, crate::error::RunError>,
) -> Result<Event, crate::error::RunError> {
    let spent = |e: &crate::error::RunError| match e {
        crate::error::RunError::PolicyRefused { message, .. } => spent_reveal_budget(message),
        _ => None,
    };
    let response = match outcome {
        Ok(r) => r,
        Err(e) => match spent(&e) {
            Some(budget) => RevealResponse {
                truncated: true,
                withheld_by: Some(budget.to_string()),
                ..RevealResponse::default()
            },
            None => return Err(e),
        },
    };
    Ok(Event::Revealed {
        range,
        page,
        side,
        response,
    })
}

/// The reveal budget an agent's refusal names (`refused by policy <key> of dataset …`).
fn spent_reveal_budget(message: &str) -> Option<&'static str> {
    ["max_reveal_rows_per_hour", "max_reveal_rows"]
        .into_iter()
        .find(|key| message.contains(&format!("refused by policy {key} ")))
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
