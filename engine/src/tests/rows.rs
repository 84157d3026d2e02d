//! The engine's rows phase: classification bookkeeping, duplicates, the sample limit,
//! what each side is asked to reveal, and the window of ranges in flight.

use super::*;

fn with_keys(level: &str, extra: &str) -> Spec {
    spec(&format!(
        "bisection: {{ factor: 2, threshold: 2 }}\nreporting: {{ level: {level}, sample_limit: 100 }}\n{extra}"
    ))
}

/// `n` rows changed in the target, 50 keys apart (so their ranges do not merge).
fn scattered(n: i64) -> (Fake, Fake) {
    let s = Fake::new(4000);
    let mut t = s.clone();
    for (k, h) in t.rows.iter_mut() {
        if *k % 50 == 25 && *k / 50 < n {
            *h ^= 1;
        }
    }
    (s, t)
}

fn reveal_hashes(tr: &Trace, side: Side) -> Vec<u64> {
    tr.commands
        .iter()
        .filter_map(|c| match c {
            Command::Reveal { side: x, request, .. } if *x == side => Some(request.key_hashes.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn duplicate_keys_in_a_differing_range_are_counted_and_warned_about() {
    let (mut s, t) = planted();
    // key 500 (changed in the target) twice on the source
    s.rows.push((500, 1000 + 500 * 7));
    let tr = drive(&with_keys("with_keys", ""), &s, &t);
    let r = &tr.result;
    assert_eq!(r.verdict, Verdict::Differ, "{:?}", r.error);
    let d = r.duplicate_keys.as_ref().expect("duplicates reported");
    assert_eq!((d.source, d.target), (1, 0));
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("duplicate keys in the differing segments: 1 on the source"))
    );
    // the duplicate is one row, compared as one: still exactly one changed row
    assert_eq!(r.difference_counts.as_ref().unwrap().changed, 1);
}

#[test]
fn the_sample_limit_cuts_the_differences_and_the_reveals_but_not_the_counts() {
    let (s, t) = scattered(30);
    let spec =
        spec("bisection: { factor: 2, threshold: 2 }\nreporting: { level: with_keys, sample_limit: 10 }\n");
    let tr = drive(&spec, &s, &t);
    let r = &tr.result;
    assert_eq!(r.difference_counts.as_ref().unwrap().changed, 30, "{:?}", r.error);
    assert!(r.truncated);
    assert_eq!(r.differences.as_ref().unwrap().len(), 10);
    // only the kept findings are revealed, and at with_keys a changed row's key comes
    // from the source alone
    assert_eq!(reveal_hashes(&tr, Side::Source).len(), 10);
    assert!(reveal_hashes(&tr, Side::Target).is_empty());
}

#[test]
fn an_agent_whose_reveal_budget_runs_out_leaves_differences_out_and_the_result_says_so() {
    // 30 changed rows, a source whose budget is spent (it reveals nothing)
    let (mut s, t) = scattered(30);
    s.reveal_budget = Some(0);
    let tr = drive(&with_keys("with_keys", ""), &s, &t);
    let r = &tr.result;
    assert_eq!(r.verdict, Verdict::Differ, "{:?}", r.error);
    assert_eq!(r.difference_counts.as_ref().unwrap().changed, 30);
    let listed = r.differences.as_ref().unwrap().len();
    assert!(listed < 30, "{listed} listed");
    assert!(r.truncated, "a cut-short list must say it is cut short");
    let w = r.warnings.iter().find(|w| w.contains("withheld"));
    let w = w.unwrap_or_else(|| panic!("no warning: {:?}", r.warnings));
    assert!(
        w.contains("(source)") && w.contains("max_reveal_rows") && w.contains(&format!("lists {listed} of")),
        "{w}"
    );
    // a whole reveal says nothing of the kind
    let (s, t) = scattered(30);
    let r = drive(&with_keys("with_keys", ""), &s, &t).result;
    assert!(!r.truncated && r.withheld.is_empty() && r.warnings.iter().all(|w| !w.contains("withheld")));
}

#[test]
fn each_side_reveals_only_its_rows_and_detailed_asks_both_for_changed_ones() {
    let (s, t) = planted();
    let tr = drive(&with_keys("with_keys", ""), &s, &t);
    let (src, tgt) = (reveal_hashes(&tr, Side::Source), reveal_hashes(&tr, Side::Target));
    let (changed, missing, extra) = (tests::key_hash(500), tests::key_hash(1200), tests::key_hash(5000));
    assert_eq!(
        (
            src.contains(&changed),
            src.contains(&missing),
            src.contains(&extra)
        ),
        (true, true, false)
    );
    assert_eq!(tgt, vec![extra]);
    assert!(
        tr.commands
            .iter()
            .all(|c| !matches!(c, Command::Reveal { rows: true, .. }))
    );
    let tr = drive(&with_keys("detailed", ""), &s, &t);
    let tgt = reveal_hashes(&tr, Side::Target);
    assert!(tgt.contains(&changed) && tgt.contains(&extra) && !tgt.contains(&missing));
    assert!(
        tr.commands
            .iter()
            .any(|c| matches!(c, Command::Reveal { rows: true, .. }))
    );
}

#[test]
fn at_most_eight_ranges_and_32_leaves_sql_are_in_flight_and_all_are_done_in_order() {
    let (s, t) = scattered(40);
    let tr = drive(&with_keys("with_keys", ""), &s, &t);
    let r = &tr.result;
    assert_eq!(r.difference_counts.as_ref().unwrap().changed, 40, "{:?}", r.error);
    let most = |pick: fn(&Call) -> bool| {
        tr.outstanding
            .iter()
            .map(|o| o.iter().filter(|c| pick(c)).count())
            .max()
    };
    assert_eq!(
        most(|c| matches!(c, Call::Digests(..))),
        Some(16),
        "8 ranges, 2 sides"
    );
    assert_eq!(
        most(|c| matches!(c, Call::Sql(..))),
        Some(64),
        "investigation SQL of 32 leaves, 2 sides"
    );
    assert!(
        most(|c| matches!(c, Call::Reveal(..))).unwrap() <= 8,
        "8 ranges, one side each"
    );
    // the ranges are classified in order, whatever order their digests arrive in
    let lines: Vec<&String> = tr
        .commands
        .iter()
        .filter_map(|c| match c {
            Command::Progress { line } if line.starts_with("rows of range") => Some(line),
            _ => None,
        })
        .collect();
    assert_eq!(lines.len(), 40);
    assert!(lines[0].starts_with("rows of range 1/40") && lines[39].starts_with("rows of range 40/40"));
    // differences in key order (range order): the reveals were taken in order too
    let keys: Vec<KeyTuple> = r.differences.iter().flatten().map(|d| d.key.clone()).collect();
    let mut sorted = keys.clone();
    sorted.sort_by_key(|k| match k.as_slice() {
        [KeyPart::Int(i)] => *i,
        _ => 0,
    });
    assert_eq!(keys, sorted);
}

#[test]
fn answers_arriving_newest_first_give_the_same_result() {
    let (s, t) = scattered(12);
    let spec = with_keys("with_keys", "");
    let whole = drive(&spec, &s, &t);
    let mut e = Engine::new(spec, "a", "b");
    let mut open: Vec<Command> = e.start();
    let result = loop {
        let c = open.pop().expect("a call open until the end");
        let next = e.step(answer(&c, &s, &t));
        if let Some(Command::Finish { result }) = next.iter().find(|c| matches!(c, Command::Finish { .. })) {
            break result.clone();
        }
        open.extend(next.into_iter().filter(|c| c.call().is_some()));
    };
    assert_eq!(json(&result), json(&whole.result));
}

/// Drives a detailed run of `planted()` until both sides of one range are asked for
/// their reveals: the engine then, and that range.
fn at_a_two_sided_reveal() -> (Engine, usize) {
    let (s, t) = planted();
    let mut e = Engine::new(with_keys("detailed", ""), "a", "b");
    let mut open: Vec<Command> = e.start();
    loop {
        open.retain(|c| c.call().is_some());
        let both = open.iter().find_map(|c| match c {
            Command::Reveal {
                range,
                side: Side::Target,
                ..
            } if open
                .iter()
                .any(|o| matches!(o, Command::Reveal { range: r, side: Side::Source, .. } if r == range)) =>
            {
                Some(*range)
            }
            _ => None,
        });
        if let Some(range) = both {
            return (e, range);
        }
        assert!(!open.is_empty(), "the run ended before a two-sided reveal");
        let c = open.remove(0);
        let next = e.step(answer(&c, &s, &t));
        open.extend(next);
    }
}

fn revealed(rows: &[(i64, &[Option<&str>])]) -> RevealResponse {
    RevealResponse {
        rows: rows
            .iter()
            .map(|(k, vals)| RevealedRow {
                key_hash: tests::key_hash(*k),
                key: tests::key(*k),
                values: vals.iter().map(|v| v.map(str::to_string)).collect(),
            })
            .collect(),
        ..Default::default()
    }
}

fn both_trimmed(
    e: &Engine,
    range: usize,
    s: RevealResponse,
    t: RevealResponse,
) -> (RevealResponse, RevealResponse) {
    match e.trim(Event::RevealedBoth {
        range,
        page: 0,
        source: s,
        target: t,
    }) {
        Event::RevealedBoth { source, target, .. } => (source, target),
        other => panic!("{other:?}"),
    }
}

#[test]
fn both_sides_reveals_keep_only_the_differing_columns_of_a_changed_row() {
    let (e, range) = at_a_two_sided_reveal();
    // key 500 is the changed row: its amount differs, a third column is equal
    let (s, t) = both_trimmed(
        &e,
        range,
        revealed(&[(500, &[Some("500"), Some("4500"), Some("same")])]),
        revealed(&[(500, &[Some("500"), Some("1"), Some("same")])]),
    );
    assert_eq!(
        s.rows[0].values,
        vec![Some("500".to_string()), Some("4500".to_string()), None]
    );
    assert_eq!(
        t.rows[0].values,
        vec![Some("500".to_string()), Some("1".to_string()), None]
    );
    // a key shown twice on a side is kept whole
    let (s, t) = both_trimmed(
        &e,
        range,
        revealed(&[
            (500, &[Some("500"), Some("4500"), Some("same")]),
            (500, &[Some("500"), Some("4501"), Some("other")]),
        ]),
        revealed(&[(500, &[Some("500"), Some("1"), Some("same")])]),
    );
    assert!(s.rows.iter().all(|r| r.values[2].is_some()), "{s:?}");
    assert_eq!(t.rows[0].values[2].as_deref(), Some("same"));
    // a row not asked of a side is dropped, whatever it holds
    let (s, _) = both_trimmed(
        &e,
        range,
        revealed(&[(500, &[Some("500"), Some("4500")]), (7, &[Some("7"), Some("49")])]),
        revealed(&[(500, &[Some("500"), Some("1")])]),
    );
    assert_eq!(s.rows.len(), 1);
}

/// Drives a detailed run, answering a range's two reveals as one `revealed_both` (as the
/// runtime records them), each trimmed as the runtime trims it; `reveal` gives one
/// side's rows (with values) for the key hashes asked.
fn drive_detailed(
    spec: &Spec,
    s: &Fake,
    t: &Fake,
    reveal: &dyn Fn(Side, &[u64]) -> Vec<RevealedRow>,
) -> (RunResult, Vec<Event>) {
    let mut e = Engine::new(spec.clone(), "a", "b");
    let mut open: Vec<Command> = e.start();
    let mut recorded = Vec::new();
    loop {
        let c = open.remove(0);
        let event = match &c {
            Command::Reveal {
                range,
                page,
                side,
                request,
                ..
            } => {
                let response = |side: Side, hashes: &[u64]| RevealResponse {
                    rows: reveal(side, hashes),
                    ..Default::default()
                };
                let partner = open.iter().position(|o| {
                    matches!(o, Command::Reveal { range: r, page: p, side: x, .. }
                        if r == range && p == page && *x != *side)
                });
                match partner.map(|i| open.remove(i)) {
                    Some(Command::Reveal { request: other, .. }) => {
                        let (sr, tr) = match side {
                            Side::Source => (&request.key_hashes, &other.key_hashes),
                            Side::Target => (&other.key_hashes, &request.key_hashes),
                        };
                        Event::RevealedBoth {
                            range: *range,
                            page: *page,
                            source: response(Side::Source, sr),
                            target: response(Side::Target, tr),
                        }
                    }
                    _ => Event::Revealed {
                        range: *range,
                        page: *page,
                        side: *side,
                        response: response(*side, &request.key_hashes),
                    },
                }
            }
            other => answer(other, s, t),
        };
        let event = e.trim(event);
        // trimming is pure: a recorded (trimmed) answer trims to itself
        assert_eq!(e.trim(event.clone()), event);
        recorded.push(event.clone());
        let next = e.step(event);
        if let Some(Command::Finish { result }) = next.iter().find(|c| matches!(c, Command::Finish { .. })) {
            return ((**result).clone(), recorded);
        }
        open.extend(next.into_iter().filter(|c| c.call().is_some()));
    }
}

#[test]
fn a_key_revealed_twice_by_one_side_keeps_the_values_the_differences_compare() {
    // key 500 changed; the source (an agent that reveals every row of a repeated key)
    // shows it twice, its amount 9 then 7; the target's amount is 9
    let (s, t) = planted();
    let spec = spec(
        "bisection: { factor: 2, threshold: 2 }\nreporting: { level: detailed, sample_limit: 100, consent_acknowledged: true }\n",
    );
    let changed = tests::key_hash(500);
    let row = |k: i64, amount: &str| RevealedRow {
        key_hash: tests::key_hash(k),
        key: key(k),
        values: vec![Some(k.to_string()), Some(amount.to_string())],
    };
    let reveal = |side: Side, hashes: &[u64]| -> Vec<RevealedRow> {
        let mut rows = Vec::new();
        for h in hashes {
            let k = (0..6000)
                .find(|k| tests::key_hash(*k) == *h)
                .expect("a planted key");
            match (side, *h == changed) {
                (Side::Source, true) => rows.extend([row(k, "9"), row(k, "7")]),
                (Side::Target, true) => rows.push(row(k, "9")),
                _ => rows.push(row(k, "1")),
            }
        }
        rows
    };
    let (r, recorded) = drive_detailed(&spec, &s, &t, &reveal);
    assert_eq!(r.verdict, Verdict::Differ, "{:?}", r.error);
    assert!(
        recorded.iter().any(|e| matches!(e, Event::RevealedBoth { .. })),
        "a range with a changed row is revealed by both sides at once"
    );
    let d = r
        .differences
        .iter()
        .flatten()
        .find(|d| d.kind == DiffKind::Changed)
        .expect("the changed row");
    assert_eq!(d.key, key(500));
    // as without any trimming: the last source row (7) against the target's (9)
    assert_eq!(d.columns.as_deref(), Some(&["amount".to_string()][..]));
    let v = &d.values.as_ref().unwrap()["amount"];
    assert_eq!((v.source.as_deref(), v.target.as_deref()), (Some("7"), Some("9")));
}

/// 6,000 rows, the first `n` changed in the target, read as one range.
fn bulk(n: i64) -> (Fake, Fake, Spec) {
    let s = Fake::new(6000);
    let mut t = s.clone();
    for (k, h) in t.rows.iter_mut() {
        if *k < n {
            // not `^= 1`: a flip up and one down would cancel in the sum and the XOR
            *h = h.wrapping_add(0x1_0000_0001);
        }
    }
    let spec = spec(
        "bisection: { factor: 4, threshold: 10000 }\nreporting: { level: with_keys, sample_limit: 10000 }\n",
    );
    (s, t, spec)
}

#[test]
fn a_range_with_more_differing_rows_than_one_reveal_releases_is_revealed_page_by_page() {
    let (s, t, spec) = bulk(5000);
    let tr = drive(&spec, &s, &t);
    let r = &tr.result;
    assert_eq!(r.verdict, Verdict::Differ, "{:?}", r.error);
    assert_eq!(r.difference_counts.as_ref().unwrap().changed, 5000);
    assert_eq!(r.differences.as_ref().unwrap().len(), 5000, "every key listed");
    assert!(!r.truncated && r.withheld.is_empty(), "{:?}", r.withheld);
    let pages: Vec<(usize, u32, usize)> = tr
        .commands
        .iter()
        .filter_map(|c| match c {
            Command::Reveal {
                range, page, request, ..
            } => Some((*range, *page, request.key_hashes.len())),
            _ => None,
        })
        .collect();
    assert_eq!(pages.len(), 5, "{pages:?}");
    assert!(
        pages.iter().all(|(r, _, n)| *r == pages[0].0 && *n == 1000),
        "{pages:?}"
    );
}

#[test]
fn reveals_go_on_until_an_agents_budget_stops_them_and_the_result_names_it() {
    // the source may reveal 2,500 rows in the run: two pages whole, the third cut
    // short (its agent names the budget), the rest not asked or refused
    let (mut s, t, spec) = bulk(5000);
    s.reveal_budget = Some(2500);
    let r = drive(&spec, &s, &t).result;
    assert_eq!(r.verdict, Verdict::Differ, "{:?}", r.error);
    assert_eq!(r.differences.as_ref().unwrap().len(), 2500);
    assert!(r.truncated);
    assert_eq!(
        r.withheld,
        vec![crate::result::Withheld {
            budget: "max_reveal_rows".into(),
            agent: Some("a".into()),
            side: Some("source".into()),
            keys: 2500,
        }]
    );
    assert!(
        r.render()
            .contains("keys withheld: 2500 by agent a (source) reveal budget max_reveal_rows")
    );
    // the sample limit is a budget too, and named as one
    let (s, t, _) = bulk(5000);
    let spec = spec_limited(3000);
    let r = drive(&spec, &s, &t).result;
    assert_eq!(r.differences.as_ref().unwrap().len(), 3000);
    assert_eq!(
        r.withheld,
        vec![crate::result::Withheld {
            budget: "reporting.sample_limit".into(),
            agent: None,
            side: None,
            keys: 2000,
        }]
    );
}

fn spec_limited(sample_limit: u32) -> Spec {
    spec(&format!(
        "bisection: {{ factor: 4, threshold: 10000 }}\nreporting: {{ level: with_keys, sample_limit: {sample_limit} }}\n"
    ))
}

#[test]
fn a_reveal_budget_already_spent_keeps_the_verdict_and_leaves_and_says_keys_were_withheld() {
    let (mut s, t, spec) = bulk(30);
    s.reveal_budget = Some(0);
    let r = drive(&spec, &s, &t).result;
    assert_eq!(r.verdict, Verdict::Differ, "{:?}", r.error);
    assert!(r.error.is_none());
    assert!(!r.leaves.is_empty());
    assert_eq!(r.difference_counts.as_ref().unwrap().changed, 30);
    assert_eq!(r.differences.as_ref().unwrap().len(), 0);
    assert!(r.truncated);
    assert_eq!(r.withheld.len(), 1);
    assert_eq!(
        (r.withheld[0].budget.as_str(), r.withheld[0].keys),
        ("max_reveal_rows", 30)
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["withheld"][0]["budget"], "max_reveal_rows");
    assert_eq!(json["withheld"][0]["agent"], "a");
    // any other refusal of a reveal still ends the run
    let other = crate::error::RunError::PolicyRefused {
        agent: "a".into(),
        rpc: "RevealKeys".into(),
        message: "refused by policy max_level of dataset x: level with_keys is above detailed".into(),
    };
    assert!(events::reveal_answer(0, 0, Side::Source, Err(other)).is_err());
}

fn by_month() -> Spec {
    spec(
        "bisection: { strategy: time, factor: 2, threshold: 2, time_column: at, time_granularity: month }\n\
         reporting: { level: with_keys, sample_limit: 100 }\n",
    )
}

/// F14 of issue 31: under `strategy: time`, key 1423 once on the source (period A) and
/// twice on the target (that row in A, a copy in period B). Period A matches, period B
/// finds the key on the target only: looked up in every period, it is `changed` with
/// its copies, never `extra_in_target` (the source holds it).
#[test]
fn a_key_repeated_on_one_side_in_another_period_is_classified_against_every_period() {
    let mut s = Fake::new(2000);
    s.time_columns = vec!["at".into()];
    s.period_of = Some(|h| if h == 77_777 { "B".into() } else { "A".into() });
    let mut t = s.clone();
    t.rows.push((1423, 77_777));
    let spec = by_month();
    let tr = drive(&spec, &s, &t);
    let r = &tr.result;
    assert_eq!(r.verdict, Verdict::Differ, "{:?}", r.error);
    let c = r.difference_counts.as_ref().unwrap();
    assert_eq!(
        (c.missing_in_target, c.extra_in_target, c.changed),
        (0, 0, 1),
        "{c:?}"
    );
    let d = r.differences.as_ref().unwrap();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].kind, DiffKind::Changed);
    assert_eq!(d[0].key, key(1423));
    let copies = d[0].duplicates.expect("copies listed");
    assert_eq!((copies.source, copies.target), (1, 2));
    let dk = r.duplicate_keys.as_ref().expect("duplicates reported");
    assert_eq!((dk.source, dk.target), (0, 1));
}

/// The lookup costs nothing when no period's range finds a key on one side only.
#[test]
fn under_strategy_time_a_changed_row_asks_no_lookup() {
    let mut s = Fake::new(2000);
    s.time_columns = vec!["at".into()];
    let mut t = s.clone();
    t.rows.iter_mut().find(|(k, _)| *k == 500).unwrap().1 = 1;
    let spec = by_month();
    let tr = drive(&spec, &s, &t);
    let r = &tr.result;
    assert_eq!(r.difference_counts.as_ref().unwrap().changed, 1, "{:?}", r.error);
    let whole_period = calls(
        &tr,
        |c| matches!(c, Command::RowDigests { request, .. } if request.segment.period.is_none()),
    );
    assert_eq!(whole_period, 0);
}

#[test]
fn each_leaf_gets_per_key_sql_of_each_kind_of_difference_in_it_and_a_replay_asks_none_again() {
    use crate::result::DiffKind;
    let (s, t) = planted();
    for level in ["with_keys", "detailed"] {
        let spec = with_keys(level, "");
        let whole = drive(&spec, &s, &t);
        let r = &whole.result;
        assert_eq!(r.verdict, Verdict::Differ, "{:?}", r.error);
        // one request per side carries every (leaf, kind) item, each naming exactly
        // that kind's keys of the leaf within the leaf's segment
        let asks: Vec<(Side, &tally_common::wire::InvestigationSqlRequest)> = whole
            .commands
            .iter()
            .filter_map(|c| match c {
                Command::KeySql { first, side, request } => {
                    assert_eq!(*first, 0, "one batch");
                    Some((*side, request))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            asks.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            vec![Side::Source, Side::Target],
            "{level}: one request per side"
        );
        for (_, request) in &asks {
            assert!(request.keys.is_empty());
            let mut keys: Vec<String> = request
                .items
                .iter()
                .map(|i| {
                    assert_eq!(i.keys.len(), 1);
                    let key = tally_common::segment::format_tuple(&i.keys[0]);
                    // the leaf whose segment the item names shows its SQL
                    let leaf = r
                        .leaves
                        .iter()
                        .find(|l| {
                            l.key_sql
                                .iter()
                                .any(|k| k.source == format!("select {key} -- source"))
                        })
                        .expect("the item's leaf shows it");
                    assert_eq!(i.segment, leaf.bounds, "{key}");
                    key
                })
                .collect();
            keys.sort();
            assert_eq!(keys, vec!["1200", "500", "5000"], "{level}");
        }
        for (kind, key) in [
            (DiffKind::Changed, "500"),
            (DiffKind::MissingInTarget, "1200"),
            (DiffKind::ExtraInTarget, "5000"),
        ] {
            // the leaf shows it, under its range SQL
            let leaf = r
                .leaves
                .iter()
                .find(|l| l.key_sql.iter().any(|k| k.kind == kind))
                .unwrap_or_else(|| panic!("{level}: {kind:?} shown"));
            assert!(leaf.sql.is_some());
            let shown: Vec<_> = leaf.key_sql.iter().filter(|k| k.kind == kind).collect();
            assert_eq!(shown.len(), 1, "{level}: {kind:?} once");
            assert_eq!(shown[0].keys, 1);
            assert_eq!(shown[0].source, format!("select {key} -- source"));
            assert_eq!(shown[0].target, format!("select {key} -- target"));
        }
        let shown: usize = r.leaves.iter().map(|l| l.key_sql.len()).sum();
        assert_eq!(shown, 3, "{level}");
        // a replay cut after each key_sql event asks only the ones not recorded
        let answers: Vec<usize> = (0..whole.events.len())
            .filter(|&i| whole.events[i]["event"] == "key_sql")
            .collect();
        assert_eq!(answers.len(), 2);
        for &cut in &answers {
            let mut e = Engine::new(spec.clone(), "a", "b");
            let _ = e.start();
            e.replay(&whole.events[..=cut]).unwrap();
            if e.is_finished() {
                assert_eq!(json(e.result().unwrap()), json(&whole.result), "cut {cut}");
                continue;
            }
            let first = e.pending();
            let rest = drive_from(&mut e, first, &s, &t);
            let again = rest
                .commands
                .iter()
                .filter(|c| matches!(c, Command::KeySql { .. }))
                .count();
            let recorded = answers.iter().filter(|&&k| k <= cut).count();
            assert_eq!(
                again,
                2 - recorded,
                "cut {cut}: only the unrecorded ones are asked"
            );
            assert_eq!(rest.events.len(), whole.events.len() - cut - 1, "cut {cut}");
            assert_eq!(json(&rest.result), json(&whole.result), "cut {cut}");
        }
    }
    // a recorded answer with another number of SQL texts than its batch has items
    // does not fit the run: replaying it ends the run with an error, nothing padded
    let spec = with_keys("with_keys", "");
    let whole = drive(&spec, &s, &t);
    let at = whole
        .events
        .iter()
        .position(|e| e["event"] == "key_sql")
        .expect("a key_sql event");
    for change in [0usize, 1] {
        let mut events = whole.events[..=at].to_vec();
        let sqls = events[at]["sqls"].as_array_mut().expect("sqls");
        if change == 0 {
            sqls.pop();
        } else {
            sqls.push(serde_json::json!("select 1"));
        }
        let mut e = Engine::new(spec.clone(), "a", "b");
        let _ = e.start();
        e.replay(&events).unwrap();
        assert!(e.is_finished(), "change {change}");
        let r = e.result().unwrap();
        assert_eq!(r.verdict, Verdict::Error, "change {change}");
        let err = r.error.as_ref().expect("an error");
        assert!(err.message.contains("answers for 3 items"), "{err:?}");
    }
    // count_only asks none
    let tr = drive(&with_keys("count_only", ""), &s, &t);
    assert_eq!(calls(&tr, |c| matches!(c, Command::KeySql { .. })), 0);
    assert!(tr.result.leaves.iter().all(|l| l.key_sql.is_empty()));
}
