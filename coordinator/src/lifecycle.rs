//! One run lifecycle and one clock for `tally run`, `tally serve` (and its schedules)
//! and `tally demo`: every run id is minted here in one form, every run's record opens
//! with the same typed `started` event and closes with the same `finished` event, a
//! finished run is sealed (evidence, then a signed checkpoint of the whole log) the same
//! way, and every "now" a record writes comes from [`now_rfc3339`] / [`unix_ms`].

use serde_json::{Map, Value, json};

use crate::evidence::{self, Signer};
use crate::runlog::RunLog;
use tally_engine::result::RunResult;
use tally_engine::spec::Spec;

/// The current time as RFC 3339 in UTC (`2026-12-05T03:15:55.123456789Z`, a fraction
/// only where it is not zero): what a record's `started`, an audit line's `time` and a
/// run document's `finished` say.
pub fn now_rfc3339() -> String {
    rfc3339(time::OffsetDateTime::now_utc())
}

/// A time as [`now_rfc3339`] writes it.
pub fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Unix seconds, as RFC 3339 (a schedule's tick); empty outside the calendar.
pub fn rfc3339_of_unix(secs: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(secs)
        .map(rfc3339)
        .unwrap_or_default()
}

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// Unix seconds, now.
pub fn unix_secs() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// A run id: the start in Unix milliseconds as lowercase hex, `-`, then `tag` (which
/// says who started it: a process id for `tally run`, `NODE-N` or `N` for `tally
/// serve`, `s-NAME` for a schedule's tick, `demo`, `adhoc-…` for a run without a
/// record). Ordered by the hex number's length, then its text, ids order by start
/// (`serve::newest_first`); every tag is 1 to 110 of `A-Z a-z 0-9 . _ -`, so an id is a
/// valid run id (docs/evidence.md).
pub fn run_id(tag: &str) -> String {
    run_id_at(unix_ms(), tag)
}

/// [`run_id`] at a given start (a schedule's tick, which every replica computes alike).
pub fn run_id_at(unix_ms: i64, tag: &str) -> String {
    format!("{:x}-{tag}", unix_ms.max(0))
}

/// The `started` event that opens every run's record: the spec, its name and when it
/// started; `extra` members (a schedule's name and tick) follow.
pub fn started_event(spec: &Spec, started: &str, extra: &[(&str, Value)]) -> Map<String, Value> {
    let mut e = Map::new();
    e.insert("event".into(), json!("started"));
    e.insert("name".into(), json!(spec.name));
    e.insert("started".into(), json!(started));
    e.insert("spec".into(), serde_json::to_value(spec).unwrap_or_default());
    for (k, v) in extra {
        e.insert((*k).to_string(), v.clone());
    }
    e
}

/// The `finished` event that closes a run's record; `extra` members (a replicated
/// service's name and run document) follow.
pub fn finished_event(result: &RunResult, extra: &[(&str, Value)]) -> Map<String, Value> {
    let mut e = Map::new();
    e.insert("event".into(), json!("finished"));
    e.insert("verdict".into(), json!(verdict_name(result)));
    for (k, v) in extra {
        e.insert((*k).to_string(), v.clone());
    }
    e
}

/// `match`, `differ` or `error`.
pub fn verdict_name(result: &RunResult) -> String {
    serde_json::to_value(&result.verdict)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "error".into())
}

/// Opens a run's record with its `started` event; returns the time it says.
pub async fn start(log: &dyn RunLog, run_id: &str, spec: &Spec) -> Result<String, String> {
    let started = now_rfc3339();
    log.start(run_id, started_event(spec, &started, &[]))
        .await
        .map_err(|e| e.to_string())?;
    Ok(started)
}

/// Closes a finished run's record: its `finished` event, the run's evidence sealed by
/// `signer` (the statement over the result and the checkpoint of its events), then a
/// signed checkpoint of the whole log (docs/evidence.md).
pub async fn finish(
    log: &dyn RunLog,
    run_id: &str,
    result: &RunResult,
    signer: &Signer,
) -> Result<(), String> {
    log.append(run_id, finished_event(result, &[]))
        .await
        .map_err(|e| e.to_string())?;
    seal(log, run_id, result, signer).await
}

/// Seals a run whose record is closed: its evidence, then the whole log's checkpoint.
pub async fn seal(log: &dyn RunLog, run_id: &str, result: &RunResult, signer: &Signer) -> Result<(), String> {
    evidence::seal_run(log, run_id, result, signer).await?;
    crate::ledger::checkpoint(log, signer).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_hex_milliseconds_then_the_tag_and_sort_by_start() {
        assert_eq!(run_id_at(0x1a2b, "demo"), "1a2b-demo");
        assert_eq!(run_id_at(-5, "x"), "0-x");
        let id = run_id("s-nightly");
        assert!(id.ends_with("-s-nightly"), "{id}");
        let ms = i64::from_str_radix(id.split('-').next().unwrap(), 16).unwrap();
        assert!((ms - unix_ms()).abs() < 60_000, "{id}");
    }

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(rfc3339_of_unix(0), "1970-01-01T00:00:00Z");
        let now = now_rfc3339();
        assert!(now.ends_with('Z') && now.contains('T'), "{now}");
    }
}
