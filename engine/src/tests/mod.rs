//! The engine without I/O: driven by fake sides that answer like agents (integer keys
//! with a row hash each), its commands and results asserted.

use serde_json::Value;
use tally_common::checksum::HashMethod;
use tally_common::segment::{KeyPart, KeyTuple, Segment, Split};
use tally_common::wire::{
    AggregateRequest, AggregateResponse, Bucket, Column, Describe, RevealRequest, RevealResponse,
    RevealedRow, RowDigest,
};
use tally_common::{PrivacyLevel, TypeClass};

use super::*;
use crate::result::{DiffKind, RunResult, Verdict};

mod adversarial;
mod confirm_leaves;
mod measures;
mod rows;
mod watermark;

/// One side's rows: key → row hash (a key listed twice is a duplicate).
#[derive(Clone)]
struct Fake {
    rows: Vec<(i64, u64)>,
    /// Offers a sealed method, with a zone key.
    sealed: bool,
    /// Reveals at most this many rows in the run, as an agent's `max_reveal_rows`: a
    /// call gets what is left (saying so), and a call once it is spent is refused.
    reveal_budget: Option<usize>,
    /// Rows revealed so far in the run.
    revealed: std::cell::Cell<usize>,
    /// The policy's `time_columns`.
    time_columns: Vec<String>,
    /// The replication position its watermark reads (none: no watermark configured).
    position: Option<tally_common::position::Position>,
    /// Under `strategy: time`, a row's period label from its row hash (none: every row
    /// in period "A").
    period_of: Option<fn(u64) -> String>,
}

fn key_hash(k: i64) -> u64 {
    (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5555
}

fn key(k: i64) -> KeyTuple {
    vec![KeyPart::Int(k)]
}

impl Fake {
    fn new(n: i64) -> Fake {
        Fake {
            rows: (0..n).map(|k| (k, 1000 + k as u64 * 7)).collect(),
            sealed: false,
            reveal_budget: None,
            revealed: std::cell::Cell::new(0),
            time_columns: Vec::new(),
            position: None,
            period_of: None,
        }
    }

    fn label(&self, h: u64) -> String {
        self.period_of.map_or_else(|| "A".to_string(), |f| f(h))
    }

    /// Whether row (`k`, `h`) is in `seg`: its key, bucket hash and period.
    fn holds(&self, seg: &Segment, k: i64, h: u64) -> bool {
        Fake::in_seg(seg, k) && seg.period.as_ref().is_none_or(|p| p.label == self.label(h))
    }

    fn in_seg(seg: &Segment, k: i64) -> bool {
        // a window on the key (`id <= n`), as the agents filter it
        let windowed = seg
            .window
            .as_ref()
            .is_none_or(|w| w.column != "id" || w.upper.parse::<i64>().is_ok_and(|n| k <= n));
        windowed && seg.contains(&key(k), tally_common::segment::bucket_hash(key_hash(k)))
    }

    fn aggregate(&self, req: &AggregateRequest) -> AggregateResponse {
        let mut buckets = Vec::new();
        let mut scanned = 0;
        for (p, (seg, split)) in req.parents.iter().enumerate() {
            let mut rows: Vec<(i64, u64)> = self
                .rows
                .iter()
                .copied()
                .filter(|(k, h)| self.holds(seg, *k, *h))
                .collect();
            rows.sort();
            scanned += rows.len() as u64;
            let children = match split {
                Split::Quantile(n) => {
                    let chunk = (rows.len() as u64).div_ceil(u64::from(*n)).max(1) as usize;
                    let cuts: Vec<KeyTuple> =
                        rows.iter().step_by(chunk).skip(1).map(|(k, _)| key(*k)).collect();
                    seg.cut_children(&cuts)
                }
                Split::Cuts(c) => seg.cut_children(c),
                Split::Even(e) => seg.cut_children(&e.cuts()),
                Split::Hash(n) => seg.hash_children(*n),
                Split::Whole => vec![seg.clone()],
                Split::Period { column, granularity } => {
                    let labels: std::collections::BTreeSet<String> =
                        rows.iter().map(|(_, h)| self.label(*h)).collect();
                    labels
                        .into_iter()
                        .map(|label| Segment {
                            period: Some(tally_common::segment::Period {
                                column: column.clone(),
                                granularity: *granularity,
                                label,
                            }),
                            ..seg.clone()
                        })
                        .collect()
                }
            };
            for (c, child) in children.into_iter().enumerate() {
                let (mut count, mut sum, mut xor) = (0, 0u64, 0u64);
                for (k, h) in rows.iter().filter(|(k, h)| self.holds(&child, *k, *h)) {
                    let _ = k;
                    count += 1;
                    sum = sum.wrapping_add(*h);
                    xor ^= *h;
                }
                buckets.push(Bucket {
                    parent: p,
                    child: c,
                    segment: child,
                    count,
                    sum,
                    xor: Some(xor),
                });
            }
        }
        AggregateResponse {
            buckets,
            path: "pushdown".into(),
            rows_scanned: scanned,
            release_log_head: String::new(),
            envelope: None,
        }
    }

    fn digests(&self, seg: &Segment) -> Vec<RowDigest> {
        self.rows
            .iter()
            .filter(|(k, h)| self.holds(seg, *k, *h))
            .map(|(k, h)| RowDigest {
                key_hash: key_hash(*k),
                row_hash: *h,
            })
            .collect()
    }

    /// As an agent answers: at most `MAX_REVEAL_ROWS_PER_CALL` rows a call, within
    /// what is left of its budget, refused once that is spent.
    fn reveal(&self, req: &RevealRequest) -> Result<RevealResponse, crate::error::RunError> {
        let left = self
            .reveal_budget
            .map_or(usize::MAX, |b| b.saturating_sub(self.revealed.get()));
        if left == 0 {
            return Err(crate::error::RunError::PolicyRefused {
                agent: "fake".into(),
                rpc: "RevealKeys".into(),
                message: "refused by policy max_reveal_rows of dataset x: this run's reveal budget for the dataset is spent"
                    .into(),
            });
        }
        let asked = (req.limit as usize)
            .min(tally_common::wire::MAX_REVEAL_ROWS_PER_CALL)
            .min(req.key_hashes.len());
        let limit = asked.min(left);
        let mut rows: Vec<RevealedRow> = req
            .key_hashes
            .iter()
            .filter_map(|h| self.rows.iter().find(|(k, _)| key_hash(*k) == *h))
            .map(|(k, _)| RevealedRow {
                key_hash: key_hash(*k),
                key: key(*k),
                values: Vec::new(),
            })
            .collect();
        let truncated = rows.len() > limit || req.key_hashes.len() > limit;
        rows.truncate(limit);
        self.revealed.set(self.revealed.get() + rows.len());
        Ok(RevealResponse {
            rows,
            truncated,
            withheld_by: (truncated && limit < asked).then(|| "max_reveal_rows".to_string()),
            ..Default::default()
        })
    }

    fn describe(&self, dataset: &str) -> Describe {
        let col = |name: &str| Column {
            name: name.into(),
            class: TypeClass::Integer,
            declared_type: "bigint".into(),
            nullable: false,
            scale: None,
            fixed_char: false,
            masked: false,
        };
        Describe {
            dataset: dataset.into(),
            columns: if self.time_columns.is_empty() {
                vec![col("id"), col("amount")]
            } else {
                vec![
                    col("id"),
                    col("amount"),
                    Column {
                        class: TypeClass::Timestamp,
                        declared_type: "timestamp".into(),
                        ..col("at")
                    },
                ]
            },
            key: vec!["id".into()],
            row_estimate: self.rows.len() as u64,
            hash_methods: vec![HashMethod::Sha256_64, HashMethod::SealedSha256_64],
            zone_key: self.sealed.then(|| tally_common::seal::SignedZoneKey {
                agent: dataset.into(),
                public_key: [3; 32],
                signature: vec![1],
                certificates: vec![vec![2]],
            }),
            xor_supported: true,
            max_level: PrivacyLevel::Detailed,
            expose_key_bounds: true,
            time_columns: self.time_columns.clone(),
            watermark: self.position.as_ref().map(|p| p.kind),
            ..Default::default()
        }
    }
}

fn spec(extra: &str) -> Spec {
    spec_hashed("sha256_64", extra)
}

fn spec_hashed(hash: &str, extra: &str) -> Spec {
    tally_common::config_file::parse_yaml(
        std::path::Path::new("s.yaml"),
        &format!(
            "name: t\nsource: {{ agent: a, dataset: x }}\ntarget: {{ agent: b, dataset: y }}\nhash: {hash}\n{extra}"
        ),
    )
    .unwrap()
}

/// The planted differences: key 500 changed, 1200 missing in the target, 5000 extra.
fn planted() -> (Fake, Fake) {
    let s = Fake::new(2000);
    let mut t = s.clone();
    t.rows.retain(|(k, _)| *k != 1200);
    t.rows.iter_mut().find(|(k, _)| *k == 500).unwrap().1 = 1;
    t.rows.push((5000, 9));
    (s, t)
}

/// The answer a fake pair gives to one call.
fn answer(c: &Command, s: &Fake, t: &Fake) -> Event {
    let side = |x: &Side| if *x == Side::Source { s } else { t };
    match c {
        Command::Describe { source, target } => Event::Described {
            source: Box::new(s.describe(source)),
            target: Box::new(t.describe(target)),
        },
        Command::DrawNonce => Event::NonceDrawn { nonce: [7; 16] },
        Command::ReadClock => Event::ClockRead {
            unix_ms: 1_764_590_400_000,
        },
        Command::Aggregate {
            level,
            side: x,
            request,
        } => Event::Aggregated {
            level: *level,
            side: *x,
            response: side(x).aggregate(request),
            elapsed_ms: 3,
            request: None,
        },
        Command::Wait { round, .. } => Event::Waited { round: *round },
        Command::Recheck {
            round,
            side: x,
            request,
        } => Event::Rechecked {
            round: *round,
            side: *x,
            response: side(x).aggregate(request),
            request: None,
        },
        Command::ReadPosition { round, .. } => Event::PositionRead {
            round: *round,
            position: s.position.clone().expect("a source with a watermark"),
        },
        Command::WaitPosition { round, request } => {
            let have = t.position.clone().expect("a target with a watermark");
            Event::PositionApplied {
                round: *round,
                response: tally_common::wire::PositionResponse {
                    reached: have.reached(&request.position).unwrap(),
                    position: have,
                    release_log_head: String::new(),
                },
                elapsed_ms: 40,
            }
        }
        Command::RowDigests {
            round,
            range,
            side: x,
            request,
        } => Event::Digests {
            round: *round,
            range: *range,
            side: *x,
            digests: side(x).digests(&request.segment),
            envelope: None,
            request: None,
        },
        Command::Reveal {
            range,
            page,
            side: x,
            request,
            ..
        } => events::reveal_answer(*range, *page, *x, side(x).reveal(request)).unwrap_or_else(|e| {
            Event::Failed {
                code: e.code().into(),
                message: e.to_string(),
            }
        }),
        Command::InvestigationSql { leaf, side: x, .. } => Event::InvestigationSql {
            leaf: *leaf,
            side: *x,
            sql: format!("select {leaf} -- {}", x.name()),
        },
        Command::KeySql {
            first,
            side: x,
            request,
        } => Event::KeySql {
            first: *first,
            side: *x,
            sqls: request
                .items
                .iter()
                .map(|item| {
                    format!(
                        "select {} -- {}",
                        item.keys
                            .iter()
                            .map(tally_common::segment::format_tuple)
                            .collect::<Vec<_>>()
                            .join(" "),
                        x.name()
                    )
                })
                .collect(),
        },
        other => panic!("not a call: {other:?}"),
    }
}

/// What one run did: every command, every event (as the run log holds it), the result.
struct Trace {
    commands: Vec<Command>,
    events: Vec<Value>,
    /// The calls outstanding after each event (index n: after events[..=n]).
    outstanding: Vec<Vec<Call>>,
    result: RunResult,
}

/// Drives `engine` from `first` to the end, answering the oldest open call first.
fn drive_from(engine: &mut Engine, first: Vec<Command>, s: &Fake, t: &Fake) -> Trace {
    let mut open: Vec<Command> = Vec::new();
    let mut tr = Trace {
        commands: Vec::new(),
        events: Vec::new(),
        outstanding: Vec::new(),
        result: empty_result(&spec("")),
    };
    let take = |cmds: Vec<Command>, open: &mut Vec<Command>, tr: &mut Trace| -> Option<RunResult> {
        let mut done = None;
        for c in cmds {
            if let Command::Finish { result } = &c {
                done = Some((**result).clone());
            }
            if c.call().is_some() {
                open.push(c.clone());
            }
            tr.commands.push(c);
        }
        done
    };
    if let Some(r) = take(first, &mut open, &mut tr) {
        tr.result = r;
        return tr;
    }
    while !open.is_empty() {
        let c = open.remove(0);
        let e = answer(&c, s, t);
        tr.events.push(serde_json::to_value(&e).unwrap());
        let next = engine.step(e);
        let done = take(next, &mut open, &mut tr);
        tr.outstanding
            .push(open.iter().filter_map(Command::call).collect());
        if let Some(r) = done {
            tr.result = r;
            return tr;
        }
    }
    panic!("the engine stopped without a result");
}

fn drive(spec: &Spec, s: &Fake, t: &Fake) -> Trace {
    let mut e = Engine::new(spec.clone(), "a", "b");
    let first = e.start();
    drive_from(&mut e, first, s, t)
}

fn calls(tr: &Trace, pick: fn(&Command) -> bool) -> usize {
    tr.commands.iter().filter(|c| pick(c)).count()
}

fn json(r: &RunResult) -> Value {
    let mut v = serde_json::to_value(r).unwrap();
    v["elapsed_ms"] = Value::from(0);
    v
}

#[test]
fn a_clean_run_ends_after_level_1_with_match() {
    let s = Fake::new(1000);
    let tr = drive(&spec("bisection: { factor: 8, threshold: 256 }\n"), &s, &s);
    assert_eq!(tr.result.verdict, Verdict::Match, "{:?}", tr.result.error);
    assert_eq!(tr.result.levels.len(), 1);
    assert!(tr.result.leaves.is_empty());
    assert_eq!(
        (tr.result.source.count, tr.result.target.queries),
        (Some(1000), 1)
    );
    let kinds: Vec<Option<Call>> = tr
        .commands
        .iter()
        .map(Command::call)
        .filter(Option::is_some)
        .collect();
    // quantile: the source picks the cut points, the target follows
    assert_eq!(
        kinds,
        vec![
            Some(Call::Describe),
            Some(Call::Aggregate(1, Side::Source)),
            Some(Call::Aggregate(1, Side::Target))
        ]
    );
    assert_eq!(calls(&tr, |c| matches!(c, Command::LevelDone { .. })), 1);
}

#[test]
fn a_differing_run_drills_and_finds_the_planted_rows() {
    let (s, t) = planted();
    let tr = drive(
        &spec("bisection: { factor: 2, threshold: 2 }\nreporting: { level: with_keys }\n"),
        &s,
        &t,
    );
    let r = &tr.result;
    assert_eq!(r.verdict, Verdict::Differ, "{:?}", r.error);
    assert!(r.levels.len() >= 2, "{} levels", r.levels.len());
    assert!(!r.leaves.is_empty());
    assert!(
        r.leaves
            .iter()
            .all(|l| l.sql.as_ref().is_some_and(|s| s.source.ends_with("source")))
    );
    let mut found: Vec<(DiffKind, KeyTuple)> = r
        .differences
        .iter()
        .flatten()
        .map(|d| (d.kind, d.key.clone()))
        .collect();
    found.sort();
    assert_eq!(
        found,
        vec![
            (DiffKind::MissingInTarget, key(1200)),
            (DiffKind::ExtraInTarget, key(5000)),
            (DiffKind::Changed, key(500)),
        ]
    );
    let counts = r.difference_counts.as_ref().unwrap();
    assert_eq!(
        (counts.missing_in_target, counts.extra_in_target, counts.changed),
        (1, 1, 1)
    );
    // every level is one aggregate per side
    assert_eq!(r.source.queries as usize, r.levels.len());
    assert_eq!(
        calls(&tr, |c| matches!(c, Command::Aggregate { .. })),
        2 * r.levels.len()
    );
}

#[test]
fn gates_stop_the_run_with_a_clear_verdict() {
    let (s, t) = planted();
    let tr = drive(
        &spec("bisection: { factor: 2, threshold: 2 }\ngates: { max_queries: 1 }\n"),
        &s,
        &t,
    );
    let e = tr.result.error.as_ref().expect("an error");
    assert_eq!(
        (tr.result.verdict.clone(), e.code.as_str()),
        (Verdict::Error, "gate_tripped")
    );
    assert!(e.message.contains("max_queries"), "{}", e.message);
    assert_eq!(tr.result.levels.len(), 1);
    assert!(
        !tr.commands
            .iter()
            .any(|c| c.call() == Some(Call::Aggregate(2, Side::Source)))
    );
    // the estimate gate trips before any aggregate
    let tr = drive(&spec("gates: { max_rows_scanned: 100 }\n"), &s, &t);
    assert!(
        tr.result
            .error
            .as_ref()
            .unwrap()
            .message
            .contains("the first level would read about 4000 rows")
    );
    assert_eq!(calls(&tr, |c| matches!(c, Command::Aggregate { .. })), 0);
}

#[test]
fn an_agent_failure_ends_the_run_with_its_code_and_what_was_found() {
    let (s, t) = planted();
    let mut e = Engine::new(spec("bisection: { factor: 2, threshold: 2 }\n"), "a", "b");
    let first = e.start();
    let described = answer(&first[0], &s, &t);
    let cmds = e.step(described);
    let agg = cmds.iter().find(|c| c.call().is_some()).unwrap().clone();
    let cmds = e.step(answer(&agg, &s, &t));
    assert!(
        cmds.iter()
            .any(|c| c.call() == Some(Call::Aggregate(1, Side::Target)))
    );
    let cmds = e.step(Event::Failed {
        code: "agent_unreachable".into(),
        message: "agent b (x) unreachable during Aggregate: down".into(),
    });
    let [Command::Finish { result }] = cmds.as_slice() else {
        panic!("{cmds:?}")
    };
    assert_eq!(result.verdict, Verdict::Error);
    assert_eq!(result.error.as_ref().unwrap().code, "agent_unreachable");
    assert!(e.pending().is_empty() && e.is_finished());
    // nothing is stepped on after the end
    assert_eq!(e.check(&answer(&agg, &s, &t)).unwrap_err(), "the run is over");
}

#[test]
fn replaying_any_prefix_leaves_exactly_the_unanswered_calls_pending_and_ends_the_same() {
    let (s, t) = planted();
    let spec = spec("bisection: { factor: 2, threshold: 2 }\nreporting: { level: with_keys }\n");
    let whole = drive(&spec, &s, &t);
    assert!(calls(&whole, |c| matches!(c, Command::RowDigests { .. })) > 0);
    for cut in 0..whole.events.len() {
        let mut e = Engine::new(spec.clone(), "a", "b");
        let _ = e.start();
        // the run log also holds events the engine does not own
        let mut log = vec![serde_json::json!({"event": "started", "spec": &spec})];
        log.extend(whole.events[..=cut].iter().cloned());
        log.push(serde_json::json!({"event": "level", "level_out": {}}));
        e.replay(&log).unwrap_or_else(|err| panic!("cut {cut}: {err}"));
        let pending: Vec<Call> = e.pending().iter().filter_map(Command::call).collect();
        assert_eq!(pending, whole.outstanding[cut], "cut {cut}");
        if e.is_finished() {
            assert_eq!(json(e.result().unwrap()), json(&whole.result));
            continue;
        }
        let first = e.pending();
        let rest = drive_from(&mut e, first, &s, &t);
        assert_eq!(json(&rest.result), json(&whole.result), "cut {cut}");
        // nothing answered before the cut is asked again
        assert_eq!(rest.events.len(), whole.events.len() - cut - 1, "cut {cut}");
    }
}

#[test]
fn an_engine_serialized_mid_run_continues_identically() {
    let (s, t) = planted();
    let spec = spec("bisection: { factor: 2, threshold: 2 }\nreporting: { level: with_keys }\n");
    let whole = drive(&spec, &s, &t);
    for cut in [1, 3, whole.events.len() / 2, whole.events.len() - 2] {
        let mut e = Engine::new(spec.clone(), "a", "b");
        let _ = e.start();
        e.replay(&whole.events[..=cut]).unwrap();
        let text = serde_json::to_string(&e).unwrap();
        let mut back: Engine = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), text);
        let (first, again) = (e.pending(), back.pending());
        let a = drive_from(&mut e, first, &s, &t);
        let b = drive_from(&mut back, again, &s, &t);
        assert_eq!(a.commands, b.commands, "cut {cut}");
        assert_eq!(json(&a.result), json(&b.result));
    }
}

#[test]
fn a_recorded_event_out_of_place_or_unreadable_fails_the_replay_naming_it() {
    let (s, t) = planted();
    let spec = spec("bisection: { factor: 2, threshold: 2 }\n");
    let whole = drive(&spec, &s, &t);
    let replay = |events: Vec<Value>| {
        let mut e = Engine::new(spec.clone(), "a", "b");
        let _ = e.start();
        e.replay(&events).unwrap_err().to_string()
    };
    // level 1's aggregates before the describe
    let mut v = whole.events.clone();
    v.swap(0, 1);
    let err = replay(v);
    assert!(err.contains("event 1 (aggregated): out of place"), "{err}");
    // an answer given twice
    let mut v = whole.events[..2].to_vec();
    let mut again = whole.events[1].clone();
    again["seq"] = Value::from(3);
    v.push(again);
    let err = replay(v);
    assert!(err.contains("event 3 (aggregated): out of place"), "{err}");
    // a kind this build does not know (the runner's old `resolved`), a malformed one
    let err = replay(vec![
        serde_json::json!({"event": "resolved", "seq": 1, "nonce": null}),
    ]);
    assert!(err.contains("event 1 (resolved): does not load"), "{err}");
    let mut bad = whole.events[0].clone();
    bad["source"] = Value::from(3);
    assert!(replay(vec![bad]).contains("(described): does not load"));
    // a run started with another spec
    let other = serde_json::json!({"event": "started", "spec": self::spec("")});
    assert!(replay(vec![other]).contains("started with another spec"));
}

#[test]
fn a_sealed_run_draws_its_nonce_once_and_a_replay_keeps_it() {
    let (mut s, mut t) = planted();
    (s.sealed, t.sealed) = (true, true);
    let spec = spec_hashed(
        "sealed_sha256_64",
        "bisection: { factor: 2, threshold: 2 }\nreporting: { level: with_keys }\n",
    );
    let whole = drive(&spec, &s, &t);
    assert_eq!(
        whole.result.hash_method, "sealed_sha256_64",
        "{:?}",
        whole.result.error
    );
    assert_eq!(calls(&whole, |c| matches!(c, Command::DrawNonce)), 1);
    assert_eq!(whole.events[1]["event"], "nonce_drawn");
    assert_eq!(whole.events[1]["nonce"], hex::encode([7u8; 16]));
    // every request is sealed with that nonce, naming the peer
    let seal = |c: &Command| match c {
        Command::Aggregate { request, .. } => request.seal.clone(),
        Command::RowDigests { request, .. } => request.seal.clone(),
        Command::Reveal { request, .. } => request.seal.clone(),
        _ => None,
    };
    let seals: Vec<_> = whole.commands.iter().filter_map(seal).collect();
    assert!(seals.len() > 4);
    assert!(
        seals
            .iter()
            .all(|s| s.nonce == [7; 16] && s.peer.public_key == [3; 32])
    );
    // a replay after level 1 asks level 2 with the recorded nonce, not a new one
    let cut = whole
        .events
        .iter()
        .position(|e| e["event"] == "aggregated" && e["level"] == 2)
        .unwrap();
    let mut e = Engine::new(spec.clone(), "a", "b");
    let _ = e.start();
    e.replay(&whole.events[..cut]).unwrap();
    let pending = e.pending();
    assert!(
        !pending.is_empty()
            && pending
                .iter()
                .all(|c| seal(c).is_some_and(|s| s.nonce == [7; 16]))
    );
    assert!(!pending.iter().any(|c| matches!(c, Command::DrawNonce)));
}

/// A window (DESIGN §5) is fixed before level 1 and carried by every request's segment;
/// only differences up to its bound are found. A window on a column the agent's policy
/// does not list is refused before any scan.
#[test]
fn a_window_is_fixed_once_and_every_request_carries_it() {
    let (s, t) = planted();
    let mut s_open = s.clone();
    let mut t_open = t.clone();
    s_open.time_columns = vec!["id".into()];
    t_open.time_columns = vec!["id".into()];
    let spec = spec(
        "bisection: { factor: 2, threshold: 2 }\nreporting: { level: with_keys }\nwindow: { column: id, as_of: 1000 }\n",
    );
    let tr = drive(&spec, &s_open, &t_open);
    let r = json(&tr.result);
    assert_eq!(r["verdict"], "differ", "{r}");
    // 500 changed is inside the window; 1200 missing and 5000 extra are beyond it
    let keys: Vec<Value> = r["differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["key"][0].clone())
        .collect();
    assert_eq!(keys, vec![Value::from(500)], "{r}");
    assert_eq!(r["window"], serde_json::json!({"column": "id", "upper": "1000"}));
    let w = Some(tally_common::segment::Window {
        column: "id".into(),
        upper: "1000".into(),
    });
    let mut asked = 0;
    for c in &tr.commands {
        let segs: Vec<&Segment> = match c {
            Command::Aggregate { request, .. } => request.parents.iter().map(|(s, _)| s).collect(),
            Command::RowDigests { request, .. } => vec![&request.segment],
            Command::Reveal { request, .. } => vec![&request.segment],
            Command::InvestigationSql { request, .. } => vec![&request.segment],
            _ => continue,
        };
        for seg in segs {
            assert_eq!(seg.window, w, "{c:?}");
            asked += 1;
        }
    }
    assert!(asked > 4);
    assert_eq!(
        calls(&tr, |c| matches!(c, Command::ReadClock)),
        0,
        "as_of reads no clock"
    );

    // the agents' policies list no time column: refused from describe
    let tr = drive(&spec, &s, &t);
    let r = json(&tr.result);
    assert_eq!(r["error"]["code"], "policy_refused", "{r}");
    assert_eq!(calls(&tr, |c| matches!(c, Command::Aggregate { .. })), 0);
    // a lag on an integer column asks the clock, then refuses plainly
    let tr = drive(&spec.clone_with_window_lag(), &s_open, &t_open);
    let r = json(&tr.result);
    assert_eq!(calls(&tr, |c| matches!(c, Command::ReadClock)), 1);
    assert_eq!(r["error"]["code"], "config", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("window.lag needs a date or timestamp"),
        "{r}"
    );
}

impl Spec {
    fn clone_with_window_lag(&self) -> Spec {
        let mut s = self.clone();
        s.window = Some(crate::spec::WindowSpec {
            column: Some("id".into()),
            as_of: None,
            lag: Some("5m".into()),
            watermark: None,
            timeout: None,
        });
        s
    }
}

/// Confirm rounds (DESIGN §5 step 6): by the first round the target has caught up on
/// two of the three planted rows; only the third is a difference, the two are in
/// flight, and their keys are never revealed. A second round re-reads only what still
/// differs. Replaying the log from any point ends the same.
#[test]
fn confirm_rounds_report_rows_that_agree_again_as_in_flight() {
    let (s, t) = planted();
    let hash_of = |f: &Fake, k: i64| f.rows.iter().find(|(x, _)| *x == k).unwrap().1;
    let mut later = t.clone();
    later.rows.iter_mut().find(|(k, _)| *k == 500).unwrap().1 = hash_of(&s, 500);
    later.rows.push((1200, hash_of(&s, 1200)));
    let spec = spec(
        "bisection: { factor: 2, threshold: 2 }\nreporting: { level: with_keys }\nconfirm: { after: 2s, rounds: 2 }\n",
    );
    let mut e = Engine::new(spec.clone(), "a", "b");
    let mut open: Vec<Command> = e.start().into_iter().filter(|c| c.call().is_some()).collect();
    let (mut events, mut commands, mut waited) = (Vec::new(), Vec::new(), false);
    let result = loop {
        let c = open.remove(0);
        let ev = answer(&c, &s, if waited { &later } else { &t });
        waited |= matches!(ev, Event::Waited { .. });
        events.push(serde_json::to_value(&ev).unwrap());
        let next = e.step(ev);
        let done = next.iter().find_map(|c| match c {
            Command::Finish { result } => Some((**result).clone()),
            _ => None,
        });
        commands.extend(next.iter().cloned());
        open.extend(next.into_iter().filter(|c| c.call().is_some()));
        if let Some(r) = done {
            break r;
        }
    };
    let r = json(&result);
    assert_eq!(r["verdict"], "differ", "{r}");
    let diffs = r["differences"].as_array().unwrap();
    assert_eq!(diffs.len(), 1, "{r}");
    assert_eq!(diffs[0]["kind"], "extra_in_target");
    assert_eq!(diffs[0]["key"][0], 5000);
    assert_eq!(
        r["difference_counts"],
        serde_json::json!({"missing_in_target": 0, "extra_in_target": 1, "changed": 0})
    );
    assert_eq!(
        r["in_flight"],
        serde_json::json!({"missing_in_target": 1, "extra_in_target": 0, "changed": 1})
    );
    let waits: Vec<&Command> = commands
        .iter()
        .filter(|c| matches!(c, Command::Wait { .. }))
        .collect();
    assert_eq!(waits.len(), 2);
    assert!(matches!(waits[0], Command::Wait { round: 1, ms: 2000 }));
    // no key of an in-flight row was asked to be revealed
    for c in &commands {
        if let Command::Reveal { request, .. } = c {
            for k in [500, 1200] {
                assert!(!request.key_hashes.contains(&key_hash(k)), "{k} revealed: {c:?}");
            }
        }
    }
    // round 2 reads only the range of the row that still differed
    let round_two: Vec<&Command> = commands
        .iter()
        .filter(|c| matches!(c, Command::RowDigests { round: 2, .. }))
        .collect();
    assert_eq!(round_two.len(), 2, "{round_two:?}");
    // the record replays to the same result
    let mut again = Engine::new(spec.clone(), "a", "b");
    let _ = again.start();
    again.replay(&events).unwrap();
    assert_eq!(json(again.result().unwrap()), r);

    // a row gone from both sides by the round: 1200, missing in the target, deleted on
    // the source too. In a plain key range both sides agree it does not exist (a
    // delete replicated: in flight); under a window it may only have left the window
    // (updated past the bound on both sides), so it stays a difference
    let mut s_later = s.clone();
    s_later.rows.retain(|(k, _)| *k != 1200);
    // the policy lists `id` (for the windowed run; unused without a window)
    s_later.time_columns = vec!["id".into()];
    let run = |spec: &Spec, s: &Fake, t: &Fake| {
        let mut e = Engine::new(spec.clone(), "a", "b");
        let mut open: Vec<Command> = e.start().into_iter().filter(|c| c.call().is_some()).collect();
        let mut waited = false;
        loop {
            let c = open.remove(0);
            let ev = if waited {
                answer(&c, &s_later, t)
            } else {
                answer(&c, s, t)
            };
            waited |= matches!(ev, Event::Waited { .. });
            let next = e.step(ev);
            let done = next.iter().find_map(|c| match c {
                Command::Finish { result } => Some((**result).clone()),
                _ => None,
            });
            open.extend(next.into_iter().filter(|c| c.call().is_some()));
            if let Some(r) = done {
                break json(&r);
            }
        }
    };
    let r = run(&spec, &s, &t);
    assert_eq!(
        r["in_flight"],
        serde_json::json!({"missing_in_target": 1, "extra_in_target": 0, "changed": 0}),
        "{r}"
    );
    let mut s_open = s.clone();
    let mut t_open = t.clone();
    s_open.time_columns = vec!["id".into()];
    t_open.time_columns = vec!["id".into()];
    let windowed = spec_with_window(&spec);
    let r = run(&windowed, &s_open, &t_open);
    // counted as a difference; its key cannot be listed, as no side holds the row now
    assert_eq!(
        r["difference_counts"],
        serde_json::json!({"missing_in_target": 1, "extra_in_target": 1, "changed": 1}),
        "{r}"
    );
    assert_eq!(
        r["in_flight"],
        serde_json::json!({"missing_in_target": 0, "extra_in_target": 0, "changed": 0})
    );
}

fn spec_with_window(spec: &Spec) -> Spec {
    let mut s = spec.clone();
    s.window = Some(crate::spec::WindowSpec {
        column: Some("id".into()),
        as_of: Some(crate::spec::AsOf::Int(100_000)),
        lag: None,
        watermark: None,
        timeout: None,
    });
    s
}
