//! An adversarial review of the engine (answers and recorded events an attacker or a
//! bug could produce). Each ignored test names the bug it proves: it fails today and
//! passes once the bug is fixed.

use super::*;

/// Drives a run answering like the fakes, but `tamper` may rewrite each answer first
/// (as an agent bug or an edited run log would).
fn drive_tampered(spec: &Spec, s: &Fake, t: &Fake, tamper: impl Fn(&mut Event)) -> (Vec<Value>, RunResult) {
    let mut e = Engine::new(spec.clone(), "a", "b");
    let mut open: Vec<Command> = Vec::new();
    let mut events = Vec::new();
    let mut next = e.start();
    loop {
        for c in next {
            if let Command::Finish { result } = c {
                return (events, *result);
            }
            if c.call().is_some() {
                open.push(c);
            }
        }
        assert!(!open.is_empty(), "the engine stopped without a result");
        let c = open.remove(0);
        let mut ev = answer(&c, s, t);
        tamper(&mut ev);
        events.push(serde_json::to_value(&ev).unwrap());
        next = e.step(ev);
    }
}

fn level_1_emptied(ev: &mut Event) {
    if let Event::Aggregated {
        level: 1, response, ..
    } = ev
    {
        response.buckets.clear();
    }
}

#[test]

fn level_1_answered_with_no_buckets_on_both_sides_is_not_a_match() {
    let (s, t) = planted();
    let spec = spec("bisection: { factor: 2, threshold: 2 }\n");
    // sanity: the honest run differs
    assert_eq!(drive(&spec, &s, &t).result.verdict, Verdict::Differ);
    let (_, r) = drive_tampered(&spec, &s, &t, level_1_emptied);
    assert_ne!(
        r.verdict,
        Verdict::Match,
        "different data reported as match: levels {:?}, counts {:?}/{:?}",
        r.levels,
        r.source.count,
        r.target.count
    );
}

#[test]

fn buckets_for_a_parent_not_asked_are_refused_not_dropped() {
    let (s, t) = planted();
    let spec = spec("bisection: { factor: 2, threshold: 2 }\n");
    let (_, r) = drive_tampered(&spec, &s, &t, |ev| {
        if let Event::Aggregated {
            level: 1, response, ..
        } = ev
        {
            for b in &mut response.buckets {
                b.parent = 1;
            }
        }
    });
    assert_ne!(r.verdict, Verdict::Match, "levels {:?}", r.levels);
}

#[test]

fn a_replayed_log_whose_level_1_answers_carry_no_buckets_does_not_replay_to_match() {
    let (s, t) = planted();
    let spec = spec("bisection: { factor: 2, threshold: 2 }\n");
    let (events, _) = drive_tampered(&spec, &s, &t, level_1_emptied);
    // the log as an editor (or a faulty replica) would leave it: describe + level 1
    let mut log = vec![serde_json::json!({"event": "started", "spec": &spec})];
    log.extend(events.into_iter().take(3));
    let mut e = Engine::new(spec.clone(), "a", "b");
    let _ = e.start();
    let replayed = e.replay(&log);
    let verdict = e.result().map(|r| r.verdict.clone());
    assert!(
        replayed.is_err() || verdict != Some(Verdict::Match),
        "replay finished the run as {verdict:?} on data that differ"
    );
}

#[test]

fn a_replay_with_a_gap_in_seq_is_refused() {
    let (s, t) = planted();
    let spec = self::spec("bisection: { strategy: hash, factor: 2, threshold: 2 }\n");
    let whole = drive(&spec, &s, &t);
    let mut log: Vec<Value> = whole.events[..3].to_vec();
    for (n, v) in log.iter_mut().enumerate() {
        v["seq"] = Value::from(n as u64 + 1);
    }
    // the level-1 source answer is lost: seq 1, 3 (hash levels ask both sides at once,
    // so the target's answer is in place)
    assert_eq!(log[1]["side"], "source");
    log.remove(1);
    let mut e = Engine::new(spec.clone(), "a", "b");
    let _ = e.start();
    assert!(e.replay(&log).is_err(), "a gap in seq was replayed");
}

#[test]

fn a_recorded_bucket_with_an_inverted_hash_range_fails_the_replay_without_panicking() {
    let (s, t) = planted();
    let spec = spec("bisection: { strategy: hash, factor: 2, threshold: 2 }\n");
    let whole = drive(&spec, &s, &t);
    let mut log = whole.events[..3].to_vec();
    // both level-1 answers: every bucket gets hash range [9, 3) (the wire refuses it)
    // and enough rows to be split again (the differing ones still differ by their sums)
    for v in &mut log[1..3] {
        assert_eq!(v["event"], "aggregated");
        for b in v["response"]["buckets"].as_array_mut().unwrap() {
            b["segment"]["hash"] = serde_json::json!([9, 3]);
            b["count"] = Value::from(1000);
        }
    }
    let replayed = std::panic::catch_unwind(move || {
        let mut e = Engine::new(spec.clone(), "a", "b");
        let _ = e.start();
        e.replay(&log).map(|_| e.result().map(|r| r.verdict.clone()))
    });
    let out = replayed.expect("the replay panicked");
    // refused: either the replay or the run (verdict error), never used
    assert!(
        matches!(out, Err(_) | Ok(Some(Verdict::Error))),
        "an invalid recorded segment was accepted: {out:?}"
    );
}

#[test]
fn row_counts_near_u64_max_trip_the_scan_gate_instead_of_wrapping_past_it() {
    let (s, t) = planted();
    let spec = spec("bisection: { factor: 2, threshold: 2 }\ngates: { max_rows_scanned: 100000 }\n");
    // the estimate gate: u64::MAX + 1 wrapped to 0 (and panicked in debug builds)
    let (_, r) = drive_tampered(&spec, &s, &t, |ev| {
        if let Event::Described { source, target } = ev {
            (source.row_estimate, target.row_estimate) = (u64::MAX, 1);
        }
    });
    let e = r.error.expect("the gate trips");
    assert!(e.message.contains("max_rows_scanned"), "{}", e.message);
    // the scan gate after a level: two huge rows_scanned wrapped to a small sum
    let (_, r) = drive_tampered(&spec, &s, &t, |ev| {
        if let Event::Aggregated { response, .. } = ev {
            response.rows_scanned = u64::MAX / 2 + 2;
        }
    });
    let e = r.error.expect("the gate trips");
    assert!(
        e.message.contains("max_rows_scanned") && r.levels.len() == 1,
        "{} after {} levels",
        e.message,
        r.levels.len()
    );
}
