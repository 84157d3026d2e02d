//! `tally verify`: the offline checks of a bundle, in the order of docs/evidence.md.
//! Each check is one function named for it, and [`verify_into`] calls them in that
//! order, so a bundle that fails two checks always reports the first.

mod agent_results;
mod certificates;
mod claims;
mod coordinator;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;
use time::format_description::well_known::Rfc3339;

use super::bundle::Bundle;
use crate::ledger::{LEDGER, SignedCheckpoint};
use crate::signing::{Check, valid};

/// The checks made so far, in order.
struct Checks(Vec<Check>);

impl Checks {
    /// Records a check; `None` (stop) when it failed.
    fn check(&mut self, name: impl Into<String>, outcome: Result<String, String>) -> Option<()> {
        let ok = outcome.is_ok();
        self.0.push(Check {
            name: name.into(),
            outcome,
        });
        ok.then_some(())
    }

    /// Records a check whose outcome carries what later checks read beside what it
    /// found; `None` (stop) when it failed.
    fn take<T>(&mut self, name: impl Into<String>, outcome: Result<(T, String), String>) -> Option<T> {
        match outcome {
            Ok((value, found)) => self.check(name, Ok(found)).map(|()| value),
            Err(e) => {
                let _ = self.check(name, Err(e));
                None
            }
        }
    }
}

/// Checks a bundle offline against `ca_pem` (one or more CA certificates), in the
/// order of docs/evidence.md; stops at the first check that fails.
pub fn verify(bundle_text: &[u8], ca_pem: &[u8]) -> Vec<Check> {
    let mut c = Checks(Vec::new());
    let _ = verify_into(&mut c, bundle_text, ca_pem);
    c.0
}

/// Every check of a bundle, in order; `None` at the first that fails.
fn verify_into(c: &mut Checks, bundle_text: &[u8], ca_pem: &[u8]) -> Option<()> {
    let checker = c.take("the CA", certificates::the_ca(ca_pem))?;
    let b = c.take("bundle format", certificates::bundle_format(bundle_text))?;
    let signed_at = c.take("checkpoint time", certificates::checkpoint_time(&b))?;
    // one check per certificate, named for it
    let certs = certificates::certificates(c, &checker, &b, signed_at)?;
    let (coordinator, payload) = c.take(
        "statement signature",
        coordinator::statement_signature(&certs, &b),
    )?;
    let st = c.take("statement", coordinator::statement(&payload))?;
    let p = &st.predicate;
    let result = c.take("result digest", coordinator::result_digest(&b, &st))?;
    c.check("result", coordinator::result(&result, p))?;
    let events = c.take("event chain", coordinator::event_chain(&b, p))?;
    c.check("checkpoint", coordinator::checkpoint(&certs, &b, p, events.len()))?;
    let spec = c.take("spec", coordinator::spec(&events, p))?;
    // one check per signed answer, named for it
    let answers = agent_results::each(c, &certs, &b, &events, p, &spec, signed_at)?;
    c.check("agent_results", agent_results::agent_results(&b, &answers))?;
    c.check("sides", agent_results::sides(p, &answers, &spec))?;
    c.check(
        "result fields",
        claims::result_fields(&result, &spec, &answers.aggregates),
    )?;
    c.check("level-1 totals", claims::level_one_totals(&events, p, &result))?;
    c.check("verdict", claims::verdict(&events, &spec, p, &coordinator))?;
    c.check(
        "fidelity",
        claims::fidelity_claim(&events, &spec, p.fidelity.as_ref()),
    )
}

/// [`verify`], then, against an export of the whole log (`tally audit export`), the
/// log's own checks (`crate::ledger::verify`, with `since`) and that the bundle's events
/// are, byte for byte, the first lines of its run in the export, and that a ledger line
/// pins the run at or past them: the bundle is the run the signed log holds.
pub fn verify_with_log(
    bundle_text: &[u8],
    ca_pem: &[u8],
    export: &str,
    since: Option<&SignedCheckpoint>,
) -> Vec<Check> {
    let mut checks = verify(bundle_text, ca_pem);
    if !valid(&checks) {
        return checks;
    }
    let log = crate::ledger::verify(export, ca_pem, since);
    let log_ok = valid(&log);
    checks.extend(log.into_iter().map(|c| Check {
        name: format!("log: {}", c.name),
        outcome: c.outcome,
    }));
    if !log_ok {
        return checks;
    }
    checks.push(Check {
        name: "bundle in the log".into(),
        outcome: bundle_in_the_log(bundle_text, export),
    });
    checks
}

/// The bundle's events are its run's first lines in the export, and the log's ledger
/// pins the run at or past them.
fn bundle_in_the_log(bundle_text: &[u8], export: &str) -> Result<String, String> {
    let b: Bundle = serde_json::from_slice(bundle_text).map_err(|e| e.to_string())?;
    let mut lines = Vec::with_capacity(b.events.len());
    for e in &b.events {
        lines.push(
            String::from_utf8(STANDARD.decode(e).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?,
        );
    }
    let first: Value =
        serde_json::from_str(lines.first().ok_or("the bundle has no events")?).map_err(|e| e.to_string())?;
    let run = first["run"].as_str().unwrap_or_default().to_string();
    let in_log: Vec<&str> = export
        .lines()
        .filter(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .is_some_and(|v| v["run"] == run.as_str())
        })
        .collect();
    if in_log.len() < lines.len() || lines.iter().zip(&in_log).any(|(a, b)| a != b) {
        return Err(format!(
            "the bundle's {} events are not the first lines of run {run} in the log ({} lines there)",
            lines.len(),
            in_log.len()
        ));
    }
    let pinned = export
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["run"] == LEDGER)
        .flat_map(|v| v["runs"].as_array().cloned().unwrap_or_default())
        .filter(|r| r["run"] == run.as_str())
        .filter_map(|r| r["seq"].as_u64())
        .max()
        .unwrap_or(0);
    if pinned < lines.len() as u64 {
        return Err(format!(
            "the log's ledger pins run {run} only up to line {pinned}, the bundle has {} events",
            lines.len()
        ));
    }
    Ok(format!(
        "its {} events are run {run}'s first lines in the log, pinned by its ledger (up to line {pinned})",
        lines.len()
    ))
}

/// `YYYY-MM-DDTHH:MM:SS` then, with `fraction`, an optional `.` and 1 to 9 digits,
/// then `Z`: RFC 3339 in UTC, never `+00:00` nor lowercase `t`/`z`; a real time.
fn utc_time(t: &str, fraction: bool) -> Result<time::OffsetDateTime, String> {
    let b = t.as_bytes();
    let digit = |i: usize| b.get(i).is_some_and(u8::is_ascii_digit);
    let shape = b.len() >= 20
        && (0..19).all(|i| match i {
            4 | 7 => b[i] == b'-',
            10 => b[i] == b'T',
            13 | 16 => b[i] == b':',
            _ => digit(i),
        })
        && b[b.len() - 1] == b'Z'
        && match b.len() {
            20 => true,
            n => fraction && b[19] == b'.' && (22..=30).contains(&n) && (20..n - 1).all(digit),
        };
    if !shape {
        return Err(format!(
            "time {t:?} is not RFC 3339 in UTC{} (YYYY-MM-DDTHH:MM:SS{}Z)",
            if fraction { "" } else { " in whole seconds" },
            if fraction { "[.fraction]" } else { "" }
        ));
    }
    time::OffsetDateTime::parse(t, &Rfc3339).map_err(|e| format!("time {t:?}: {e}"))
}

/// No object of a JSON text has two members of one name (docs/evidence.md: a parser
/// that keeps the first and one that keeps the last would read two documents).
fn unique_members(what: &str, bytes: &[u8]) -> Result<(), String> {
    let text = std::str::from_utf8(bytes).map_err(|_| format!("{what} is not UTF-8"))?;
    tally_common::jcs::unique_members(text).map_err(|e| format!("{what}: {e}"))
}

fn b64(field: &str, text: &str) -> Result<Vec<u8>, String> {
    STANDARD
        .decode(text)
        .map_err(|_| format!("{field} is not strict base64"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_in_utc_and_whole_seconds_where_the_format_says() {
        assert!(utc_time("2026-12-01T20:17:49Z", false).is_ok());
        for bad in [
            "2026-12-01T20:17:49.5Z",
            "2026-12-01T20:17:49+00:00",
            "2026-12-01t20:17:49z",
            "2026-12-01 20:17:49Z",
            "2026-13-01T20:17:49Z",
            "2026-12-01T20:17:49",
            "",
        ] {
            assert!(utc_time(bad, false).is_err(), "{bad}");
        }
        // a run's start may carry a fraction, in UTC still
        assert!(utc_time("2026-12-01T21:17:29.20226721Z", true).is_ok());
        assert!(utc_time("2026-12-01T21:17:29Z", true).is_ok());
        assert!(utc_time("2026-12-04T23:16:53.881977077Z", true).is_ok());
        assert!(utc_time("2026-12-04T23:16:53.1Z", true).is_ok());
        for bad in [
            "2026-12-01T21:17:29.Z",
            "2026-12-01T21:17:29.1234567890Z",
            "2026-12-01T21:17:29.5+00:00",
        ] {
            assert!(utc_time(bad, true).is_err(), "{bad}");
        }
    }
}
