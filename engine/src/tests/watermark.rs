//! Watermarks in the engine: the source's position is read and the target waits for it
//! before any scan and before each confirm round's reads; a target that does not reach
//! it, a side without a watermark, or kinds that do not compare end the run before any
//! aggregate; a resumed run does not wait again for what its log shows reached.

use tally_common::position::{Position, PositionKind};

use super::*;

fn gtid(t: &str) -> Option<Position> {
    Some(Position::parse(PositionKind::Gtid, t).unwrap())
}

fn pair(source: &str, target: &str) -> (Fake, Fake) {
    let (mut s, mut t) = planted();
    s.position = gtid(source);
    t.position = gtid(target);
    (s, t)
}

fn kinds(tr: &Trace) -> Vec<Call> {
    tr.commands.iter().filter_map(Command::call).collect()
}

#[test]
fn the_target_waits_for_the_sources_position_before_any_scan() {
    let (s, t) = pair("0-1-42,1-2-7", "0-1-43,1-2-7");
    let spec = spec("bisection: { factor: 2, threshold: 2 }\nwindow: { watermark: wait, timeout: 90s }\n");
    let tr = drive(&spec, &s, &t);
    assert_eq!(tr.result.verdict, Verdict::Differ, "{:?}", tr.result.error);
    let k = kinds(&tr);
    assert_eq!(&k[..3], &[Call::Describe, Call::Position(0), Call::Applied(0)]);
    assert!(matches!(k[3], Call::Aggregate(1, _)), "{k:?}");
    let wait = tr
        .commands
        .iter()
        .find_map(|c| match c {
            Command::WaitPosition { request, .. } => Some(request.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!((wait.dataset.as_str(), wait.timeout_ms), ("y", 90_000));
    assert_eq!(wait.position, gtid("0-1-42,1-2-7").unwrap());
    let p = &tr.result.positions;
    assert_eq!(p.len(), 1);
    assert_eq!((p[0].round, p[0].waited_ms), (0, 40));
    assert_eq!(p[0].source.value, "0-1-42,1-2-7");
    assert_eq!(p[0].target.as_ref().unwrap().value, "0-1-43,1-2-7");
    let j = json(&tr.result);
    assert_eq!(j["positions"][0]["source"]["kind"], "gtid");
    // a column window combines with it (its bound is fixed before the position is read)
    let spec = super::spec(
        "bisection: { factor: 2, threshold: 2 }\nwindow: { column: id, as_of: 100000, watermark: wait }\n",
    );
    let (mut s, mut t) = (s, t);
    s.time_columns = vec!["id".into()];
    t.time_columns = vec!["id".into()];
    let tr = drive(&spec, &s, &t);
    assert_eq!(tr.result.verdict, Verdict::Differ, "{:?}", tr.result.error);
    assert_eq!(tr.result.window.as_ref().unwrap().column, "id");
    assert_eq!(&kinds(&tr)[1..3], &[Call::Position(0), Call::Applied(0)]);
}

#[test]
fn a_target_that_does_not_reach_the_position_ends_the_run_before_any_scan() {
    let spec = spec("window: { watermark: wait }\n");
    // one domain behind: the agent answers "not reached" after its timeout
    let (s, t) = pair("0-1-42,1-2-7", "0-1-42,1-2-6");
    let tr = drive(&spec, &s, &t);
    assert_eq!(tr.result.verdict, Verdict::Error);
    let e = tr.result.error.as_ref().unwrap();
    assert_eq!(e.code, "watermark");
    assert!(
        e.message.contains("0-1-42,1-2-7")
            && e.message.contains("domain 1 at 6 of 7")
            && e.message.contains("10m"),
        "{}",
        e.message
    );
    assert!(tr.result.positions[0].target.is_none());
    assert_eq!(calls(&tr, |c| matches!(c, Command::Aggregate { .. })), 0);
    // an agent that claims "reached" with a position behind the source's is not believed
    let mut e = Engine::new(spec.clone(), "a", "b");
    let first = e.start();
    assert!(matches!(first[0], Command::Describe { .. }));
    let _ = e.step(answer(&first[0], &s, &t));
    let read = e.pending().remove(0);
    let next = e.step(answer(&read, &s, &t));
    let lie = Event::PositionApplied {
        round: 0,
        response: tally_common::wire::PositionResponse {
            position: gtid("0-1-41").unwrap(),
            reached: true,
            release_log_head: String::new(),
        },
        elapsed_ms: 1,
    };
    assert!(next.iter().any(|c| matches!(c, Command::WaitPosition { .. })));
    let end = e.step(lie);
    let Some(Command::Finish { result }) = end.last() else {
        panic!("{end:?}")
    };
    assert_eq!(result.error.as_ref().unwrap().code, "watermark");
}

#[test]
fn a_side_without_a_watermark_or_of_another_kind_is_refused_before_any_call() {
    let spec = spec("window: { watermark: wait }\n");
    let (s, mut t) = pair("0-1-1", "0-1-1");
    t.position = None;
    let tr = drive(&spec, &s, &t);
    let e = tr.result.error.as_ref().unwrap();
    assert_eq!(e.code, "watermark");
    assert!(
        e.message.contains("dataset y of agent b") && e.message.contains("datasets.y.watermark"),
        "{}",
        e.message
    );
    assert_eq!(kinds(&tr), vec![Call::Describe]);
    t.position = Some(Position::parse(PositionKind::Lsn, "0/10").unwrap());
    let tr = drive(&spec, &s, &t);
    let e = tr.result.error.as_ref().unwrap();
    assert!(
        e.message.contains("gtid") && e.message.contains("lsn"),
        "{}",
        e.message
    );
    assert_eq!(kinds(&tr), vec![Call::Describe]);
}

#[test]
fn each_confirm_round_waits_for_the_position_again_before_its_reads() {
    let (s, t) = pair("0-1-5", "0-1-5");
    let spec = spec(
        "bisection: { factor: 2, threshold: 2 }\nreporting: { level: with_keys }\nconfirm: { after: 1s, rounds: 2 }\n\
         window: { watermark: wait }\n",
    );
    let tr = drive(&spec, &s, &t);
    assert_eq!(tr.result.verdict, Verdict::Differ, "{:?}", tr.result.error);
    let k = kinds(&tr);
    for round in 1..=2 {
        let at = |c: Call| {
            k.iter()
                .position(|x| *x == c)
                .unwrap_or_else(|| panic!("{c} in {k:?}"))
        };
        let first_read = k
            .iter()
            .position(|c| matches!(c, Call::Digests(r, ..) if *r == round))
            .unwrap();
        assert!(at(Call::Wait(round)) < at(Call::Position(round)));
        assert!(at(Call::Position(round)) < at(Call::Applied(round)));
        assert!(at(Call::Applied(round)) < first_read, "{k:?}");
    }
    let rounds: Vec<u32> = tr.result.positions.iter().map(|p| p.round).collect();
    assert_eq!(rounds, vec![0, 1, 2]);
}

#[test]
fn a_resumed_run_does_not_wait_again_for_a_position_its_log_shows_reached() {
    let (s, t) = pair("0-1-5", "0-1-9");
    let spec = spec(
        "bisection: { factor: 2, threshold: 2 }\nreporting: { level: with_keys }\nconfirm: { after: 1s, rounds: 1 }\n\
         window: { watermark: wait }\n",
    );
    let whole = drive(&spec, &s, &t);
    for cut in 0..whole.events.len() {
        let mut e = Engine::new(spec.clone(), "a", "b");
        let _ = e.start();
        e.replay(&whole.events[..=cut])
            .unwrap_or_else(|err| panic!("cut {cut}: {err}"));
        let pending: Vec<Call> = e.pending().iter().filter_map(Command::call).collect();
        assert_eq!(pending, whole.outstanding[cut], "cut {cut}");
        if e.is_finished() {
            continue;
        }
        let first = e.pending();
        let rest = drive_from(&mut e, first, &s, &t);
        assert_eq!(json(&rest.result), json(&whole.result), "cut {cut}");
        let asked_again = rest
            .commands
            .iter()
            .filter(|c| matches!(c, Command::ReadPosition { .. } | Command::WaitPosition { .. }))
            .count();
        let logged = whole.events[..=cut]
            .iter()
            .filter(|e| e["event"] == "position_read" || e["event"] == "position_applied")
            .count();
        // two calls per aligned position (round 0 and round 1); none asked twice
        assert_eq!(asked_again + logged, 4, "cut {cut}");
    }
}
