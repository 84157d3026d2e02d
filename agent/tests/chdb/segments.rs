//! The statements of a segment on chdb, against the same rows computed by the
//! reference in Rust: the bucketed aggregate of quantile, cut, hash and integer-range
//! parents in one query (plain and sealed), the per-month aggregate, a count, the key's
//! bounds (also of an empty table), an ordered row fetch, rows of one period, and the
//! investigation SQL people paste.

use std::collections::BTreeMap;

use tally_agent::config::Source;
use tally_agent::dialect::clickhouse::ClickHouse;
use tally_agent::dialect::{self, ChildRule, Dialect, FetchShape};
use tally_agent::schema::{BoundColumn, ColumnInfo};
use tally_common::canonical::{FieldFormat, row_string};
use tally_common::checksum::{HashMethod, Hasher, wrap_decimal_sum};
use tally_common::period::{Granularity, period_label};
use tally_common::seal::RunKeys;
use tally_common::segment::{ColumnSpec, KeyPart, Period, Segment, bucket_hash};
use tally_common::types::TypeClass;

use super::{Query, run, run_under, say};

const ROWS: i64 = 400;

struct Row {
    id: i64,
    fields: Vec<Option<String>>,
}

impl Row {
    fn string(&self) -> String {
        row_string(self.fields.iter().map(Option::as_deref))
    }
    fn key_string(&self) -> String {
        row_string([Some(self.id.to_string().as_str())])
    }
}

/// The table's rows: values as inserted, and their canonical texts.
fn rows() -> (Vec<String>, Vec<Row>) {
    let names = ["Zoë", "Øre", "ñandú", "日本", "a:b", "~", "", "Ärger", "zz", "AA"];
    let mut inserts = Vec::new();
    let mut rows = Vec::new();
    for i in 1..=ROWS {
        let id = i * 3 + (i % 5);
        let code = format!("{}-{}", names[(i % 10) as usize], i % 97);
        let amount = format!("{}.{:02}", (i * 7919) % 100000, i % 100);
        let (date, time, us) = (
            format!("2024-{:02}-{:02}", 1 + i % 12, 1 + i % 28),
            format!("{:02}:{:02}:{:02}", i % 24, i % 60, (i * 7) % 60),
            format!("{:06}", (i * 104729) % 1_000_000),
        );
        let ok = match i % 3 {
            0 => None,
            1 => Some(true),
            _ => Some(false),
        };
        inserts.push(format!(
            "({id}, unhex('{}'), CAST('{amount}' AS Decimal(12, 2)), parseDateTime64BestEffort('{date} {time}.{us}', 6, 'UTC'), {})",
            hex::encode(&code),
            ok.map_or("NULL".into(), |b: bool| b.to_string())
        ));
        let amount = tally_common::canonical::canonical_from_text(
            &FieldFormat::new(TypeClass::Decimal).with_scale(2),
            Some(&amount),
        )
        .unwrap();
        rows.push(Row {
            id,
            fields: vec![
                Some(id.to_string()),
                Some(code),
                amount,
                Some(format!("{date}T{time}.{us}Z")),
                ok.map(|b| if b { "1" } else { "0" }.to_string()),
            ],
        });
    }
    let setup = vec![
        "CREATE TABLE orders (id Int64, code LowCardinality(String), amount Decimal(12, 2), \
         placed DateTime64(6, 'UTC'), ok Nullable(Bool)) ENGINE = ReplacingMergeTree ORDER BY id"
            .to_string(),
        format!("INSERT INTO orders VALUES {}", inserts.join(", ")),
        "CREATE TABLE empty (id Int64) ENGINE = MergeTree ORDER BY id".to_string(),
        // a CDC target: two versions of one key in two parts, left unmerged
        "CREATE TABLE cdc (id Int64, v String) ENGINE = ReplacingMergeTree ORDER BY id".to_string(),
        "SYSTEM STOP MERGES cdc".to_string(),
        "INSERT INTO cdc VALUES (1, 'old')".to_string(),
        "INSERT INTO cdc VALUES (1, 'new')".to_string(),
    ];
    (setup, rows)
}

fn columns() -> Vec<BoundColumn> {
    [
        ("id", "Int64", 0),
        ("code", "LowCardinality(String)", 0),
        ("amount", "Decimal(12, 2)", 2),
        ("placed", "DateTime64(6, 'UTC')", 6),
        ("ok", "Nullable(Bool)", 0),
    ]
    .iter()
    .map(|(n, t, s)| {
        let info = tally_agent::dialect::clickhouse::classify(t).column(n.to_string(), t.to_string(), true);
        BoundColumn {
            spec: ColumnSpec {
                name: n.to_string(),
                format: FieldFormat::new(info.class).with_scale(*s),
            },
            info,
            zone: None,
        }
    })
    .collect()
}

/// (count, wrapped sum, xor, first key) per (parent, child), as the reference has them.
type Buckets = BTreeMap<(usize, usize), (u64, u64, u64, Option<i64>)>;

fn expected(rows: &[Row], hasher: &Hasher, parents: &[(Segment, ChildRule)]) -> Buckets {
    let mut out = Buckets::new();
    for (p, (seg, rule)) in parents.iter().enumerate() {
        let mut inside: Vec<&Row> = rows
            .iter()
            .filter(|r| {
                seg.contains(
                    &vec![KeyPart::Int(r.id)],
                    bucket_hash(hasher.key(r.key_string().as_bytes())),
                )
            })
            .collect();
        inside.sort_by_key(|r| r.id);
        let n = inside.len();
        for (j, r) in inside.iter().enumerate() {
            let bh = bucket_hash(hasher.key(r.key_string().as_bytes()));
            let b = match rule {
                ChildRule::Whole => 0,
                ChildRule::Quantile(q) => {
                    // NTILE: the first n % q tiles hold one row more
                    let (q, big) = (*q as usize, n / *q as usize + 1);
                    let extra = n % q;
                    if j < extra * big {
                        j / big
                    } else {
                        extra + (j - extra * big) / (n / q)
                    }
                }
                ChildRule::Cuts(cuts) => cuts
                    .iter()
                    .position(|c| &vec![KeyPart::Int(r.id)] < c)
                    .unwrap_or(cuts.len()),
                ChildRule::Hash { lo, width } => ((bh - lo) / width) as usize,
                ChildRule::IntRange {
                    first,
                    last,
                    lo,
                    width,
                    children,
                } => {
                    if r.id < *first {
                        0
                    } else if r.id >= *last {
                        children - 1
                    } else {
                        ((r.id - lo) / width) as usize
                    }
                }
            };
            let h = hasher.row(r.string().as_bytes());
            let first = matches!(rule, ChildRule::Quantile(_)).then_some(r.id);
            let e = out.entry((p, b)).or_insert((0, 0, 0, first));
            e.0 += 1;
            e.1 = e.1.wrapping_add(h);
            e.2 ^= h;
        }
    }
    out
}

/// The buckets the engine answered. A child's first key is read for quantile parents
/// only, as the agent reads it (dataset/aggregate.rs): the query reports one for every
/// parent when any is quantile, meaningless for the others.
fn got(rows: &super::Rows, parents: &[(Segment, ChildRule)]) -> Buckets {
    rows.iter()
        .map(|r| {
            let n = |i: usize| r[i].as_deref().unwrap().parse::<u64>().unwrap();
            let w = |i: usize| wrap_decimal_sum(r[i].as_deref().unwrap()).unwrap();
            let p = n(0) as usize;
            let quantile = matches!(parents[p].1, ChildRule::Quantile(_));
            let first = r[5].as_deref().filter(|_| quantile).map(|k| k.parse().unwrap());
            ((p, n(1) as usize), (n(2), w(3), w(4), first))
        })
        .collect()
}

#[test]
fn segment_statements_on_chdb() {
    let d = ClickHouse::default();
    let (setup, rows) = rows();
    let cols = columns();
    let key: Vec<&ColumnInfo> = vec![&cols[0].info];
    let src = Source::Table(vec!["orders".into()]);
    let keys = RunKeys {
        k_row: [0xab; 32],
        k_key: [0xcd; 32],
    };
    let hashers = [
        Hasher::unsealed(HashMethod::Sha256_64),
        Hasher::unsealed(HashMethod::Md5_48),
        Hasher::sealed(HashMethod::SealedSha256_64, &keys),
    ];
    let int = |i: i64| vec![KeyPart::Int(i)];
    let range = Segment {
        lower: Some(int(100)),
        upper: Some(int(900)),
        ..Segment::default()
    };
    let parents = vec![
        (Segment::whole(), ChildRule::Quantile(7)),
        (range.clone(), ChildRule::Cuts(vec![int(300), int(451)])),
        (
            Segment {
                hash: Some((0, 1 << 59)),
                ..Segment::default()
            },
            ChildRule::Hash {
                lo: 0,
                width: 1 << 57,
            },
        ),
        (
            Segment {
                lower: Some(int(100)),
                ..Segment::default()
            },
            ChildRule::IntRange {
                first: 200,
                last: 800,
                lo: 100,
                width: 100,
                children: 8,
            },
        ),
    ];
    let mut queries = Vec::new();
    for h in &hashers {
        queries.push(Query::bound(
            &dialect::aggregate(&d, &src, &cols, &key, h, &parents).unwrap(),
        ));
    }
    let month = Period {
        column: "placed".into(),
        granularity: Granularity::Month,
        label: "2024-03".into(),
    };
    queries.push(Query::bound(
        &dialect::aggregate_periods(&d, &src, &cols, &key, &hashers[0], &range, &month).unwrap(),
    ));
    queries.push(Query::bound(
        &dialect::count_rows(&d, &src, &key, &cols, &range).unwrap(),
    ));
    let (min, max) = dialect::key_min_max(&d, &src, &cols[0].info);
    let (emin, _) = dialect::key_min_max(&d, &Source::Table(vec!["empty".into()]), &cols[0].info);
    queries.extend([Query::plain(min), Query::plain(max), Query::plain(emin)]);
    queries.push(Query::bound(&dialect::fetch_rows(
        &d,
        &src,
        &cols,
        &key,
        &range,
        FetchShape::Canonical,
        true,
    )));
    let in_month = Segment {
        period: Some(month.clone()),
        ..range.clone()
    };
    queries.push(Query::bound(&dialect::fetch_rows(
        &d,
        &src,
        &cols,
        &key,
        &in_month,
        FetchShape::Canonical,
        true,
    )));
    let hashed = Segment {
        hash: Some((1 << 58, 1 << 59)),
        ..range.clone()
    };
    let paste = |s: String| Query::plain(s.trim_end_matches(';').to_string());
    queries.push(paste(dialect::investigation_sql(
        &d, &src, &cols, &key, &hashed, false,
    )));
    queries.push(paste(dialect::key_sql(
        &d,
        &src,
        &cols,
        &key,
        &hashed,
        &[int(rows[10].id), int(rows[20].id), int(-1)],
    )));
    let cdc = Source::Table(vec!["cdc".into()]);
    for d in [ClickHouse::default(), ClickHouse::FINAL] {
        queries.push(Query::bound(
            &dialect::count_rows(&d, &cdc, &key, &cols, &Segment::whole()).unwrap(),
        ));
    }
    let (version, results) = run(&setup, &queries);
    let results: Vec<super::Rows> = results
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or_else(|e| panic!("statement {i} failed: {e}\n{}", queries[i].sql)))
        .collect();

    for (h, r) in hashers.iter().zip(&results) {
        assert_eq!(
            got(r, &parents),
            expected(&rows, h, &parents),
            "{}: aggregate",
            h.method()
        );
    }
    let in_range: Vec<&Row> = rows.iter().filter(|r| (100..900).contains(&r.id)).collect();
    let mut months: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for r in &in_range {
        let label = period_label(r.fields[3].as_deref(), Granularity::Month).unwrap();
        let h = hashers[0].row(r.string().as_bytes());
        let e = months.entry(label).or_default();
        *e = (e.0 + 1, e.1.wrapping_add(h), e.2 ^ h);
    }
    let got_months: BTreeMap<String, (u64, u64, u64)> = results[3]
        .iter()
        .map(|r| {
            let w = |i: usize| wrap_decimal_sum(r[i].as_deref().unwrap()).unwrap();
            (r[5].clone().unwrap(), (w(2), w(3), w(4)))
        })
        .collect();
    assert_eq!(got_months, months, "per-month aggregate");
    assert_eq!(results[4], vec![vec![Some(in_range.len().to_string())]], "count");
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let (lo, hi) = (ids.iter().min().unwrap(), ids.iter().max().unwrap());
    assert_eq!(results[5], vec![vec![Some(lo.to_string())]], "key minimum");
    assert_eq!(results[6], vec![vec![Some(hi.to_string())]], "key maximum");
    assert_eq!(results[7], vec![vec![None]], "the minimum of no rows is NULL");
    let fetched: Vec<String> = results[8]
        .iter()
        .map(|r| row_string(r.iter().map(Option::as_deref)))
        .collect();
    // in key order (ids are not generated in order: i * 3 + i % 5)
    let mut by_key = in_range.clone();
    by_key.sort_by_key(|r| r.id);
    let want: Vec<String> = by_key.iter().map(|r| r.string()).collect();
    assert_eq!(fetched, want, "ordered canonical fetch");
    let march = in_range
        .iter()
        .filter(|r| r.fields[3].as_deref().unwrap().starts_with("2024-03"))
        .count();
    assert_eq!(results[9].len(), march, "rows of one period");
    let hashed_rows = in_range
        .iter()
        .filter(|r| {
            let bh = bucket_hash(hashers[0].key(r.key_string().as_bytes()));
            (1 << 58..1 << 59).contains(&bh)
        })
        .count();
    assert_eq!(results[10].len(), hashed_rows, "investigation SQL");
    assert_eq!(results[11].len(), 2, "investigation of keys");
    assert_eq!(
        results[12],
        vec![vec![Some("2".to_string())]],
        "both versions, without FINAL"
    );
    assert_eq!(
        results[13],
        vec![vec![Some("1".to_string())]],
        "the last version, through FINAL"
    );
    say(&format!(
        "{version}: bucketed aggregates (quantile, cuts, hash, integer range; sha256_64, md5_48, sealed), \
         the per-month aggregate, count, key bounds, fetches, investigation SQL and a FINAL read agree with the reference \
         over {ROWS} rows"
    ));
}

/// Columns named like the aggregate's own aliases are hashed as the table's columns. In
/// ClickHouse a SELECT's alias stands for a table column of the same name inside that
/// SELECT: with the aliases once called `p`, `b`, `h`, `f`, `n`, `s`, `x` and `lbl`, a
/// table's column `b` was hashed as the child number, and two tables that differ only
/// there had one sum (a false pass, found in review). Each parent here is a quantile
/// parent, so the first-key flag's aliases are in the statement too.
#[test]
fn columns_named_like_the_aggregates_aliases_are_hashed_as_columns() {
    let names = ["p", "b", "h", "f", "n", "s", "x", "lbl", "u", "z"];
    let cols: Vec<BoundColumn> = std::iter::once("id")
        .chain(names)
        .map(|n| {
            let info = tally_agent::dialect::clickhouse::classify("Int64").column(
                n.to_string(),
                "Int64".into(),
                true,
            );
            BoundColumn {
                spec: ColumnSpec {
                    name: n.to_string(),
                    format: FieldFormat::new(info.class),
                },
                info,
                zone: None,
            }
        })
        .collect();
    let key: Vec<&ColumnInfo> = vec![&cols[0].info];
    let defs: Vec<String> = std::iter::once("id")
        .chain(names)
        .map(|n| format!("`{n}` Int64"))
        .collect();
    // two tables with the same ids and different values in every other column
    let table = |t: &str, k: i64| -> (String, Vec<Vec<i64>>) {
        let rows: Vec<Vec<i64>> = (1..=50)
            .map(|id| {
                std::iter::once(id)
                    .chain((1..=names.len() as i64).map(|c| id * c * k))
                    .collect()
            })
            .collect();
        let values: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "({})",
                    r.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
                )
            })
            .collect();
        (format!("INSERT INTO {t} VALUES {}", values.join(", ")), rows)
    };
    let (ins1, rows1) = table("t1", 1);
    let (ins2, rows2) = table("t2", 7);
    let setup = vec![
        format!(
            "CREATE TABLE t1 ({}) ENGINE = MergeTree ORDER BY id",
            defs.join(", ")
        ),
        format!(
            "CREATE TABLE t2 ({}) ENGINE = MergeTree ORDER BY id",
            defs.join(", ")
        ),
        ins1,
        ins2,
    ];
    let h = Hasher::unsealed(HashMethod::Sha256_64);
    let d = ClickHouse::default();
    let parents = [(Segment::whole(), ChildRule::Quantile(2))];
    let agg = |t: &str| {
        Query::bound(
            &dialect::aggregate(&d, &Source::Table(vec![t.into()]), &cols, &key, &h, &parents).unwrap(),
        )
    };
    let (_, results) = run(&setup, &[agg("t1"), agg("t2")]);
    let want = |rows: &[Vec<i64>]| -> (u64, u64) {
        rows.iter().fold((0, 0), |(n, s), r| {
            let string = row_string(
                r.iter()
                    .map(|v| Some(v.to_string()))
                    .collect::<Vec<_>>()
                    .iter()
                    .map(Option::as_deref),
            );
            (n + 1, s.wrapping_add(h.row(string.as_bytes())))
        })
    };
    for (r, rows) in results.into_iter().zip([&rows1, &rows2]) {
        let r = r.unwrap();
        let got = r.iter().fold((0u64, 0u64), |(n, s), row| {
            let c: u64 = row[2].as_deref().unwrap().parse().unwrap();
            (
                n + c,
                s.wrapping_add(wrap_decimal_sum(row[3].as_deref().unwrap()).unwrap()),
            )
        });
        assert_eq!(got, want(rows), "{r:?}");
        // the first keys of the two quantile children are ids
        assert_eq!(r[0][5].as_deref(), Some("1"), "{r:?}");
        assert_eq!(r[1][5].as_deref(), Some("26"), "{r:?}");
    }
    say("columns named like the aggregate's aliases: hashed as the table's columns");
}

/// An Enum, IPv4 or IPv6 column compared as binary (the other side keeps the text as
/// bytes) is the bytes of its text, as the reference encodes a text read as binary;
/// its own storage (a number, packed address bytes) never reaches the hash.
#[test]
fn label_types_compared_as_binary_are_the_bytes_of_their_text() {
    let setup = vec![
        "CREATE TABLE labels (e Enum8('red' = 1, 'it''s' = 2), a IPv4, b IPv6) ENGINE = Memory".to_string(),
        "INSERT INTO labels VALUES ('it''s', '10.0.0.1', '2001:db8::1')".to_string(),
    ];
    let d = ClickHouse::default();
    let cols: Vec<BoundColumn> = [
        ("e", "Enum8('red' = 1, 'it''s' = 2)"),
        ("a", "IPv4"),
        ("b", "IPv6"),
    ]
    .iter()
    .map(|(n, t)| {
        let info = tally_agent::dialect::clickhouse::classify(t).column(n.to_string(), t.to_string(), true);
        BoundColumn {
            spec: ColumnSpec {
                name: n.to_string(),
                format: FieldFormat::new(TypeClass::Binary),
            },
            info,
            zone: None,
        }
    })
    .collect();
    let exprs: Vec<String> = cols
        .iter()
        .map(|c| d.canonical_expr(c).expect("rendered in SQL"))
        .collect();
    let (_, results) = run(
        &setup,
        &[Query::plain(format!("SELECT {} FROM labels", exprs.join(", ")))],
    );
    let got = results.into_iter().next().unwrap().unwrap();
    let want: Vec<Option<String>> = ["it's", "10.0.0.1", "2001:db8::1"]
        .iter()
        .map(|t| Some(hex::encode(t)))
        .collect();
    assert_eq!(got, vec![want]);
}

/// A user's settings profile cannot cut or filter a result while the server answers as
/// if complete (found in review): limits reached in `break` mode, `limit`/`offset` and
/// the additional filters are undone by the dialect's settings, so a count is exact or
/// the statement fails, and a fetch holds every row. (The TabSeparated NULL text the
/// settings also pin is the connector's format, not chdb's JSON here.)
#[test]
fn a_settings_profile_cannot_cut_or_filter_a_result() {
    let setup = vec![
        "CREATE TABLE big (id Int64, v Nullable(String)) ENGINE = MergeTree ORDER BY id".to_string(),
        // in two halves: a profile below limits each insert's reads to 60,000 rows
        "INSERT INTO big SELECT number, if(number % 2 = 0, NULL, '') FROM numbers(50000)".to_string(),
        "INSERT INTO big SELECT number + 50000, if(number % 2 = 0, NULL, '') FROM numbers(50000)".to_string(),
    ];
    let d = ClickHouse::default();
    let cols: Vec<BoundColumn> = [("id", "Int64"), ("v", "Nullable(String)")]
        .iter()
        .map(|(n, t)| {
            let info =
                tally_agent::dialect::clickhouse::classify(t).column(n.to_string(), t.to_string(), true);
            BoundColumn {
                spec: ColumnSpec {
                    name: n.to_string(),
                    format: FieldFormat::new(info.class),
                },
                info,
                zone: None,
            }
        })
        .collect();
    let key: Vec<&ColumnInfo> = vec![&cols[0].info];
    let src = Source::Table(vec!["big".into()]);
    let count = Query::bound(&dialect::count_rows(&d, &src, &key, &cols, &Segment::whole()).unwrap());
    let fetch = Query::bound(&dialect::fetch_rows(
        &d,
        &src,
        &cols,
        &key,
        &Segment::whole(),
        FetchShape::Canonical,
        true,
    ));
    let cut = [
        ("read_overflow_mode", "break"),
        ("limit", "3"),
        ("offset", "8"),
        ("additional_result_filter", "id < 10"),
        ("additional_table_filters", "{'big': 'id < 10'}"),
    ];
    let (_, r) = run_under(&cut, &setup, &[count.clone(), fetch.clone()]);
    assert_eq!(r[0].as_ref().unwrap(), &vec![vec![Some("100000".to_string())]]);
    let rows = r[1].as_ref().unwrap();
    assert_eq!(rows.len(), 100_000, "every row fetched");
    // limits the profile sets in rows read or rows answered, in `break` mode: the
    // statement fails, never answers a part
    let (_, r) = run_under(
        &[("read_overflow_mode", "break"), ("max_rows_to_read", "60000")],
        &setup,
        &[count, fetch.clone()],
    );
    // the count may come from the parts' metadata, read whole: exact, or an error
    if let Ok(n) = &r[0] {
        assert_eq!(n, &vec![vec![Some("100000".to_string())]]);
    }
    assert!(r[1].is_err(), "{:?}", r[1].as_ref().map(Vec::len));
    let (_, r) = run_under(
        &[("result_overflow_mode", "break"), ("max_result_rows", "1000")],
        &setup,
        &[fetch],
    );
    assert!(
        r[0].as_ref().is_err_and(|e| e.contains("TOO_MANY_ROWS")),
        "{:?}",
        r[0].as_ref().map(Vec::len)
    );
    say("a settings profile's limits, filters and NULL text cannot cut a result");
}
