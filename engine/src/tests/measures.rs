//! Mode measures in the engine: one Measures call per side per level, only diverging
//! groups descend, clear values compared within their tolerance, sealed ones by digest,
//! parents whose children do not account for them reported as inconsistent, and the
//! policy and tolerance refusals before any call.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher as _};

use tally_common::measures::MeasureAcc;
use tally_common::period::period_label;
use tally_common::wire::measures::{
    Labels, MeasureGroup, MeasureOut, MeasuresRequest, MeasuresResponse, digest_input,
};

use super::*;

/// A table: (id, region, day, amount as canonical decimal text or NULL).
#[derive(Clone)]
struct Table {
    rows: Vec<(i64, &'static str, String, Option<String>)>,
    /// The policy's measures (released in clear).
    clear: Vec<String>,
    group_columns: Vec<String>,
}

fn table() -> Table {
    let regions = ["AMER", "APAC", "EU"];
    let rows = (0..600)
        .map(|i: i64| {
            (
                i,
                regions[(i % 3) as usize],
                format!("2026-11-{:02}", 1 + i % 10),
                (i % 17 != 0).then(|| format!("{}.{:02}", i * 3, i % 100)),
            )
        })
        .collect();
    Table {
        rows,
        clear: vec!["amount".into()],
        group_columns: vec!["region".into()],
    }
}

impl Table {
    fn describe(&self, dataset: &str) -> Describe {
        let col = |name: &str, class, declared: &str, scale| Column {
            name: name.into(),
            class,
            declared_type: declared.into(),
            nullable: true,
            scale,
            fixed_char: false,
            masked: false,
        };
        Describe {
            dataset: dataset.into(),
            columns: vec![
                col("id", TypeClass::Integer, "bigint", None),
                col("region", TypeClass::Text, "text", None),
                col("day", TypeClass::Date, "date", None),
                col("amount", TypeClass::Decimal, "numeric(12,2)", Some(2)),
            ],
            key: vec!["id".into()],
            row_estimate: self.rows.len() as u64,
            hash_methods: vec![HashMethod::SealedSha256_64],
            zone_key: Some(tally_common::seal::SignedZoneKey {
                agent: dataset.into(),
                public_key: [3; 32],
                signature: vec![1],
                certificates: vec![vec![2]],
            }),
            xor_supported: true,
            max_level: PrivacyLevel::CountOnly,
            expose_key_bounds: false,
            time_columns: vec!["day".into()],
            group_columns: self.group_columns.clone(),
            measures: self.clear.clone(),
            ..Default::default()
        }
    }

    fn measures(&self, req: &MeasuresRequest) -> MeasuresResponse {
        let depth = req.group_by.len();
        let mut acc: BTreeMap<Labels, (u64, MeasureAcc)> = BTreeMap::new();
        for (_, region, day, amount) in &self.rows {
            let labels: Labels = req
                .group_by
                .iter()
                .map(|g| match (g.column.as_str(), g.granularity) {
                    ("region", None) => Some(region.to_string()),
                    ("day", None) => Some(day.clone()),
                    ("day", Some(gr)) => period_label(Some(day), gr),
                    other => panic!("group by {other:?}"),
                })
                .collect();
            if depth > 1 && !req.parents.iter().any(|p| p[..] == labels[..depth - 1]) {
                continue;
            }
            let e = acc.entry(labels).or_default();
            e.0 += 1;
            e.1.add(amount.as_deref()).unwrap();
        }
        let clear = self.clear.iter().any(|c| c == "amount");
        MeasuresResponse {
            groups: acc
                .into_iter()
                .map(|(labels, (count, a))| {
                    let v = a.values();
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    digest_input(0, "decimal:2", &labels, &v).hash(&mut h);
                    MeasureGroup {
                        labels,
                        count,
                        measures: req
                            .measures
                            .iter()
                            .map(|_| MeasureOut {
                                clear: clear.then(|| v.clone()),
                                digest: h.finish(),
                            })
                            .collect(),
                    }
                })
                .collect(),
            rows_scanned: self.rows.len() as u64,
            ..Default::default()
        }
    }
}

fn spec(extra: &str) -> Spec {
    spec_hashed(
        "auto",
        &format!(
            "mode: measures\ngroup_by: [region, {{ column: day, granularity: day }}]\nmeasures: [amount]\n{extra}"
        ),
    )
}

/// Runs to the end; `later` answers from level 2 on, when given (data changed).
fn run(spec: &Spec, s: &Table, t: &Table, later: Option<&Table>) -> (RunResult, Vec<Command>, Vec<Value>) {
    let mut e = Engine::new(spec.clone(), "a", "b");
    let mut open: Vec<Command> = e.start().into_iter().filter(|c| c.call().is_some()).collect();
    let (mut commands, mut events) = (Vec::new(), Vec::new());
    loop {
        let c = open.remove(0);
        let ev = match &c {
            Command::Describe { source, target } => Event::Described {
                source: Box::new(s.describe(source)),
                target: Box::new(t.describe(target)),
            },
            Command::DrawNonce => Event::NonceDrawn { nonce: [7; 16] },
            Command::Measures { level, side, request } => {
                let table = match (side, later) {
                    (Side::Source, _) => s,
                    (Side::Target, Some(l)) if *level > 1 => l,
                    (Side::Target, _) => t,
                };
                Event::Measured {
                    level: *level,
                    side: *side,
                    response: table.measures(request),
                    elapsed_ms: 5,
                    request: None,
                }
            }
            other => panic!("not asked in mode measures: {other:?}"),
        };
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

fn measures_calls(commands: &[Command]) -> Vec<(u32, Side, usize)> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::Measures { level, side, request } => Some((*level, *side, request.parents.len())),
            _ => None,
        })
        .collect()
}

#[test]
fn equal_sides_match_after_one_query_per_side() {
    let s = table();
    let (r, commands, _) = run(&spec(""), &s, &s, None);
    assert_eq!(r.verdict, Verdict::Match, "{:?}", r.error);
    assert_eq!(
        measures_calls(&commands),
        vec![(1, Side::Source, 0), (1, Side::Target, 0)]
    );
    assert_eq!((r.source.count, r.target.count), (Some(600), Some(600)));
    assert_eq!(r.groups, Some(Vec::new()));
    assert_eq!(r.levels.len(), 1);
    assert_eq!((r.levels[0].segments, r.levels[0].differing), (3, 0));
}

#[test]
fn a_broken_day_of_one_region_is_found_in_two_levels_asking_only_its_region() {
    let s = table();
    let mut t = s.clone();
    // the backfill of EU on 2026-11-04 wrote every amount with a stray leading 1
    for row in t.rows.iter_mut().filter(|r| r.1 == "EU" && r.2 == "2026-11-04") {
        row.3 = row.3.as_ref().map(|a| format!("1{a}"));
    }
    let (r, commands, _) = run(&spec(""), &s, &t, None);
    assert_eq!(r.verdict, Verdict::Differ, "{:?}", r.error);
    assert_eq!(
        measures_calls(&commands),
        vec![
            (1, Side::Source, 0),
            (1, Side::Target, 0),
            (2, Side::Source, 1),
            (2, Side::Target, 1)
        ]
    );
    let g = r.groups.as_ref().unwrap();
    assert_eq!(g.len(), 1, "{g:?}");
    let labels: Vec<_> = g[0].group.iter().map(|l| l.value.clone().unwrap()).collect();
    assert_eq!(labels, vec!["EU", "2026-11-04"]);
    assert_eq!(g[0].group[1].granularity.as_deref(), Some("day"));
    assert_eq!(g[0].differing, vec!["amount"]);
    assert_eq!(g[0].source.count, g[0].target.count);
    let (a, b) = (&g[0].source.measures[0], &g[0].target.measures[0]);
    assert!(!a.sealed && a.values.as_ref().unwrap().sum != b.values.as_ref().unwrap().sum);
    assert_eq!(
        r.levels.iter().map(|l| l.differing).collect::<Vec<_>>(),
        vec![1, 1]
    );
    let j = json(&r);
    assert_eq!(j["groups"][0]["group"][0]["column"], "region");
    assert_eq!(j["groups"][0]["source"]["measures"][0]["name"], "amount");
}

#[test]
fn differences_within_the_tolerance_agree_and_are_reported_as_such() {
    let s = table();
    let mut t = s.clone();
    let row = t
        .rows
        .iter_mut()
        .find(|r| r.1 == "APAC" && r.3.is_some())
        .unwrap();
    let cents: i64 = row.3.as_ref().unwrap().replace('.', "").parse().unwrap();
    row.3 = Some(format!("{}.{:02}", (cents + 1) / 100, (cents + 1) % 100));
    let (r, _, _) = run(&spec("tolerance: { amount: 0.01 }\n"), &s, &t, None);
    assert_eq!(r.verdict, Verdict::Match, "{:?}", r.groups);
    assert_eq!(r.tolerated_groups, Some(1));
    let g = r.groups.as_ref().unwrap();
    assert_eq!(
        (g[0].differing.len(), g[0].tolerated.clone()),
        (0, vec!["amount".to_string()])
    );
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("within their measures' tolerance"))
    );
    // a relative tolerance too small for a cent on the region's sum: a difference
    let (r, _, _) = run(&spec("tolerance: { amount: 0.0000001% }\n"), &s, &t, None);
    assert_eq!(r.verdict, Verdict::Differ);
    // and without one, exactly
    let (r, _, _) = run(&spec(""), &s, &t, None);
    assert_eq!(r.verdict, Verdict::Differ);
}

#[test]
fn a_measure_one_policy_does_not_release_is_compared_by_digest_and_shown_sealed() {
    let s = table();
    let mut t = s.clone();
    t.clear.clear();
    t.rows[5].3 = Some("1.00".into());
    let (r, _, _) = run(&spec(""), &s, &t, None);
    assert_eq!(r.verdict, Verdict::Differ, "{:?}", r.error);
    let g = r.groups.as_ref().unwrap();
    assert_eq!(g.len(), 1);
    assert_eq!(g[0].differing, vec!["amount"]);
    for side in [&g[0].source, &g[0].target] {
        assert!(
            side.measures[0].sealed && side.measures[0].values.is_none(),
            "{side:?}"
        );
    }
    // a NULL turned into a value with the same sum is caught (the non-NULL count)
    let mut u = s.clone();
    let i = u.rows.iter().position(|r| r.3.is_none()).unwrap();
    u.rows[i].3 = Some("0.00".into());
    let (r, _, _) = run(&spec(""), &s, &u, None);
    assert_eq!(r.verdict, Verdict::Differ);
    // a tolerance cannot apply to a sealed comparison: refused before any call
    let (r, commands, _) = run(&spec("tolerance: { amount: 1 }\n"), &s, &t, None);
    assert_eq!(r.error.as_ref().unwrap().code, "config");
    assert!(
        r.error.as_ref().unwrap().message.contains("tolerance.amount"),
        "{:?}",
        r.error
    );
    assert!(measures_calls(&commands).is_empty());
}

#[test]
fn a_group_column_a_policy_does_not_list_is_refused_before_any_call() {
    let s = table();
    let mut t = s.clone();
    t.group_columns.clear();
    let (r, commands, _) = run(&spec(""), &s, &t, None);
    let e = r.error.unwrap();
    assert_eq!(e.code, "policy_refused");
    assert!(
        e.message.contains("group_columns") && e.message.contains("region"),
        "{}",
        e.message
    );
    assert!(measures_calls(&commands).is_empty());
}

#[test]
fn a_parent_whose_children_do_not_add_up_is_reported_inconsistent() {
    let s = table();
    let mut t = s.clone();
    t.rows[2].3 = Some("9999.99".into()); // EU, differs from level 1 on
    // between the levels the target loses a row of that region elsewhere
    let mut later = t.clone();
    let gone = later.rows.iter().position(|r| r.1 == "EU" && r.0 != 2).unwrap();
    later.rows.remove(gone);
    let (r, _, _) = run(&spec(""), &s, &t, Some(&later));
    assert_eq!(r.verdict, Verdict::Differ);
    let g = r.groups.unwrap();
    let inconsistent: Vec<_> = g.iter().filter(|g| g.inconsistent).collect();
    assert_eq!(inconsistent.len(), 1, "{g:?}");
    assert_eq!(inconsistent[0].level, 1);
    assert_eq!(inconsistent[0].group[0].value.as_deref(), Some("EU"));
    assert_eq!(r.levels[1].inconsistent, 1);
}

#[test]
fn a_parent_whose_childrens_values_do_not_add_up_is_reported_inconsistent() {
    let s = table();
    let mut t = s.clone();
    t.rows[2].3 = Some("9999.99".into()); // EU, differs from level 1 on
    // between the levels an EU amount changes on the target: the counts still add up,
    // the sums do not
    let mut later = t.clone();
    let row = later
        .rows
        .iter_mut()
        .find(|r| r.1 == "EU" && r.0 != 2 && r.3.is_some())
        .unwrap();
    row.3 = Some("0.01".into());
    let (r, _, _) = run(&spec(""), &s, &t, Some(&later));
    assert_eq!(r.verdict, Verdict::Differ);
    let g = r.groups.unwrap();
    let bad: Vec<_> = g.iter().filter(|g| g.inconsistent).collect();
    assert_eq!(bad.len(), 1, "{g:?}");
    assert!(
        bad[0].reason.as_deref().unwrap().contains("values of measure 0"),
        "{:?}",
        bad[0].reason
    );
    // children each within a tolerance that their parent's sum is not: inconsistent,
    // and the reason says why
    let mut u = s.clone();
    let mut days = std::collections::HashSet::new();
    // a cent on one EU row of each day: each day within 0.01, the region's sum not
    for row in u.rows.iter_mut().filter(|r| r.1 == "EU" && r.3.is_some()) {
        if !days.insert(row.2.clone()) {
            continue;
        }
        let cents: i64 = row.3.as_ref().unwrap().replace('.', "").parse().unwrap();
        row.3 = Some(format!("{}.{:02}", (cents + 1) / 100, (cents + 1) % 100));
    }
    let (r, _, _) = run(&spec("tolerance: { amount: 0.01 }\n"), &s, &u, None);
    assert_eq!(r.verdict, Verdict::Differ);
    let g = r.groups.unwrap();
    let bad: Vec<_> = g.iter().filter(|g| g.inconsistent).collect();
    assert_eq!(bad.len(), 1, "{g:?}");
    assert!(
        bad[0].reason.as_deref().unwrap().contains("within tolerance"),
        "{:?}",
        bad[0].reason
    );
}

#[test]
fn a_replayed_measures_run_asks_only_what_its_log_lacks_and_ends_the_same() {
    let s = table();
    let mut t = s.clone();
    t.rows[2].3 = Some("9999.99".into());
    let spec = spec("");
    let (whole, _, events) = run(&spec, &s, &t, None);
    for cut in 0..events.len() - 1 {
        let mut e = Engine::new(spec.clone(), "a", "b");
        let _ = e.start();
        e.replay(&events[..=cut])
            .unwrap_or_else(|err| panic!("cut {cut}: {err}"));
        assert!(!e.is_finished(), "cut {cut}");
        let pending = e.pending();
        assert!(!pending.is_empty(), "cut {cut}");
        // finish it by answering what is pending, and what follows
        let mut open = pending;
        let result = loop {
            let c = open.remove(0);
            let next = e.step(match &c {
                Command::DrawNonce => Event::NonceDrawn { nonce: [7; 16] },
                Command::Measures { level, side, request } => Event::Measured {
                    level: *level,
                    side: *side,
                    response: if *side == Side::Source { &s } else { &t }.measures(request),
                    elapsed_ms: 5,
                    request: None,
                },
                other => panic!("cut {cut}: {other:?}"),
            });
            if let Some(r) = next.iter().find_map(|c| match c {
                Command::Finish { result } => Some((**result).clone()),
                _ => None,
            }) {
                break r;
            }
            open.extend(next.into_iter().filter(|c| c.call().is_some()));
        };
        assert_eq!(json(&result), json(&whole), "cut {cut}");
    }
}
