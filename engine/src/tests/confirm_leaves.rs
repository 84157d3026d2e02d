//! Confirm rounds at count_only: the differing leaves are aggregated again, whole,
//! after each round's wait; those that agree were in flight and leave `leaves`, those
//! that differ in every round stay; a replay does not wait or read again.

use super::*;

/// Runs `spec` with the target answering as `later` once the first wait is over.
fn run(spec: &Spec, s: &Fake, t: &Fake, later: &Fake) -> (RunResult, Vec<Command>, Vec<Value>) {
    let mut e = Engine::new(spec.clone(), "a", "b");
    let mut open: Vec<Command> = e.start().into_iter().filter(|c| c.call().is_some()).collect();
    let (mut commands, mut events, mut waited) = (Vec::new(), Vec::new(), false);
    loop {
        let c = open.remove(0);
        let ev = answer(&c, s, if waited { later } else { t });
        waited |= matches!(ev, Event::Waited { .. });
        events.push(serde_json::to_value(&ev).unwrap());
        let next = e.step(ev);
        commands.extend(next.iter().cloned());
        if let Some(r) = next.iter().find_map(|c| match c {
            Command::Finish { result } => Some((**result).clone()),
            _ => None,
        }) {
            return (r, commands, events);
        }
        open.extend(next.into_iter().filter(|c| c.call().is_some()));
    }
}

#[test]
fn count_only_leaves_that_agree_again_are_in_flight_and_the_others_stay() {
    let (s, t) = planted();
    // by the first round, the target has caught up on 500 and 1200; 5000 stays extra
    let hash_of = |f: &Fake, k: i64| f.rows.iter().find(|(x, _)| *x == k).unwrap().1;
    let mut later = t.clone();
    later.rows.iter_mut().find(|(k, _)| *k == 500).unwrap().1 = hash_of(&s, 500);
    later.rows.push((1200, hash_of(&s, 1200)));
    let spec = spec("bisection: { factor: 4, threshold: 64 }\nconfirm: { after: 3s, rounds: 2 }\n");
    let (r, commands, events) = run(&spec, &s, &t, &later);
    assert_eq!(r.verdict, Verdict::Differ, "{:?}", r.error);
    assert_eq!(r.in_flight_leaves, Some(2));
    assert_eq!(r.leaves.len(), 1, "{:?}", r.leaves);
    let leaf = &r.leaves[0];
    assert!(leaf.bounds.contains(&key(5000), key_hash(5000)), "{leaf:?}");
    // round 1 re-checks the three leaves at once, round 2 only the one left, whole
    let rechecks: Vec<(u32, usize)> = commands
        .iter()
        .filter_map(|c| match c {
            Command::Recheck {
                round,
                request,
                side: Side::Source,
            } => {
                assert!(request.parents.iter().all(|(_, s)| *s == Split::Whole));
                Some((*round, request.parents.len()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(rechecks, vec![(1, 3), (2, 1)]);
    assert!(matches!(
        commands.iter().find(|c| matches!(c, Command::Wait { .. })),
        Some(Command::Wait { round: 1, ms: 3000 })
    ));
    // nothing of a row was asked for at count_only
    assert!(
        !commands
            .iter()
            .any(|c| matches!(c, Command::RowDigests { .. } | Command::Reveal { .. }))
    );
    // every prefix of the record resumes to the same result, asking nothing it holds
    for cut in 0..events.len() - 1 {
        let mut e = Engine::new(spec.clone(), "a", "b");
        let _ = e.start();
        e.replay(&events[..=cut])
            .unwrap_or_else(|err| panic!("cut {cut}: {err}"));
        let mut open = e.pending();
        let mut waited = events[..=cut].iter().any(|v| v["event"] == "waited");
        let result = loop {
            let c = open.remove(0);
            let ev = answer(&c, &s, if waited { &later } else { &t });
            waited |= matches!(ev, Event::Waited { .. });
            let next = e.step(ev);
            if let Some(r) = next.iter().find_map(|c| match c {
                Command::Finish { result } => Some((**result).clone()),
                _ => None,
            }) {
                break r;
            }
            open.extend(next.into_iter().filter(|c| c.call().is_some()));
        };
        assert_eq!(json(&result), json(&r), "cut {cut}");
    }
    // when every leaf agrees again the verdict stays differ, and says why
    let mut all = later.clone();
    all.rows.retain(|(k, _)| *k != 5000);
    let (r, _, _) = run(&spec, &s, &t, &all);
    assert_eq!(r.verdict, Verdict::Differ);
    assert!(r.leaves.is_empty());
    assert_eq!(r.in_flight_leaves, Some(3));
    assert!(
        r.warnings.iter().any(|w| w.contains("no moment was read")),
        "{:?}",
        r.warnings
    );
}
