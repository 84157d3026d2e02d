//! Golden tests of the SQL each dialect renders: a change to any engine's SQL shows up
//! as a diff of a file under tests/golden/ that a reviewer reads. Regenerate with
//! `TALLY_UPDATE_GOLDEN=1 cargo test -p tally-agent --test golden` and review the diff.

use std::path::Path;

use tally_agent::config::Source;
use tally_agent::dialect::{self, ChildRule, Dialect, FetchShape};
use tally_agent::schema::{BoundColumn, ColumnInfo};
use tally_common::canonical::FieldFormat;
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::seal::RunKeys;
use tally_common::segment::{ColumnSpec, KeyPart, Segment};
use tally_common::types::TypeClass;

fn col(name: &str, class: TypeClass, scale: u32, fixed_char: bool) -> BoundColumn {
    BoundColumn {
        info: ColumnInfo {
            name: name.into(),
            class,
            declared_type: String::new(),
            nullable: true,
            scale: Some(scale),
            fixed_char,
            native: Default::default(),
        },
        spec: ColumnSpec {
            name: name.into(),
            format: FieldFormat::new(class).with_scale(scale).fixed_char(fixed_char),
        },
        zone: None,
    }
}

fn every_class() -> Vec<BoundColumn> {
    vec![
        col("region", TypeClass::Text, 0, false),
        col("id", TypeClass::Integer, 0, false),
        col("amount", TypeClass::Decimal, 2, false),
        col("ratio", TypeClass::Float, 6, false),
        col("ok", TypeClass::Boolean, 0, false),
        col("code", TypeClass::Text, 0, true),
        col("day", TypeClass::Date, 0, false),
        col("at", TypeClass::Timestamp, 3, false),
        col("at_utc", TypeClass::TimestampTz, 6, false),
        col("t", TypeClass::Time, 0, false),
        col("u", TypeClass::Uuid, 0, false),
        col("b", TypeClass::Binary, 0, false),
    ]
}

fn render(d: &dyn Dialect) -> String {
    let cols = every_class();
    let key: Vec<&ColumnInfo> = cols[..2].iter().map(|c| &c.info).collect();
    let src = Source::Table(vec!["shop".into(), "orders".into()]);
    let t = |s: &str| KeyPart::Text(s.into());
    let seg = Segment {
        lower: Some(vec![t("EU"), KeyPart::Int(10)]),
        upper: Some(vec![t("US"), KeyPart::Int(0)]),
        hash: None,
        period: None,
        window: None,
    };
    let mut out = String::new();
    let mut section = |title: &str, sql: String, binds: &[KeyPart]| {
        out.push_str(&format!("-- {title}\n{sql}\n"));
        if !binds.is_empty() {
            out.push_str(&format!("-- binds: {binds:?}\n"));
        }
        out.push('\n');
    };
    let rs = dialect::row_string_expr(d, &cols);
    section(
        "row string",
        rs.clone().unwrap_or_else(|| "(in-process)".into()),
        &[],
    );
    // sealed methods with a fixed test key (a real run's key is derived per request)
    let keys = RunKeys {
        k_row: [0xab; 32],
        k_key: [0xcd; 32],
    };
    let hasher = |m: HashMethod| {
        if m.is_sealed() {
            Hasher::sealed(m, &keys)
        } else {
            Hasher::unsealed(m)
        }
    };
    for m in HashMethod::BY_STRENGTH {
        let key = hasher(m).row_key().copied();
        let h = rs
            .as_ref()
            .and_then(|r| d.row_hash_expr(r, m, key.as_ref()))
            .unwrap_or_else(|| "(in-process)".into());
        section(&format!("row checksum {m}"), h, &[]);
    }
    pushdown_subset(d, &src, &key, &hasher, &mut section);
    for shape in [FetchShape::Raw, FetchShape::Canonical, FetchShape::Text] {
        let s = dialect::fetch_rows(d, &src, &cols, &key, &seg, shape, true);
        section(&format!("fetch rows ({shape:?}, ordered)"), s.text, &s.binds);
    }
    if d.name() == "postgres" {
        // the SELECT inside `COPY (...) TO STDOUT`, which takes no binds
        let s = dialect::fetch_rows_inline(d, &src, &cols, &key, &seg, FetchShape::Text, true);
        section("fetch rows (Text, ordered, literal bounds)", s.text, &s.binds);
    }
    let s = dialect::count_rows(d, &src, &key, &cols, &seg).unwrap();
    section("count", s.text, &s.binds);
    let parents = vec![
        (Segment::whole(), ChildRule::Quantile(4)),
        (
            seg.clone(),
            ChildRule::Cuts(vec![
                vec![t("EU"), KeyPart::Int(500)],
                vec![t("JP"), KeyPart::Int(1)],
            ]),
        ),
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
    ];
    for m in [HashMethod::SealedSha256_64, HashMethod::Sha256_64] {
        match dialect::aggregate(d, &src, &cols[..4], &key, &hasher(m), &parents) {
            Some(s) => section(
                &format!("aggregate ({m}): quantile, cuts and hash parents in one query"),
                s.text,
                &s.binds,
            ),
            None => section(&format!("aggregate ({m})"), "(in-process)".into(), &[]),
        }
    }
    let period = tally_common::segment::Period {
        column: "at".into(),
        granularity: tally_common::period::Granularity::Week,
        label: "2024-03-11".into(),
    };
    let cols8 = &cols[..8];
    match dialect::aggregate_periods(
        d,
        &src,
        cols8,
        &key,
        &hasher(HashMethod::SealedMd5_48),
        &Segment::whole(),
        &period,
    ) {
        Some(s) => section("aggregate: one bucket per ISO week", s.text, &s.binds),
        None => section("aggregate per period", "(in-process)".into(), &[]),
    }
    let in_week = Segment {
        period: Some(period),
        ..Segment::default()
    };
    let s = dialect::fetch_rows(d, &src, cols8, &key, &in_week, FetchShape::Canonical, false);
    section("fetch rows of one week", s.text, &s.binds);
    let hashed = Segment {
        hash: Some((1 << 58, 1 << 59)),
        ..seg.clone()
    };
    section(
        "investigation",
        dialect::investigation_sql(d, &src, &cols[..4], &key, &hashed, false),
        &[],
    );
    section(
        "investigation of a sealed run: no hash range (it needs the run key)",
        dialect::investigation_sql(d, &src, &cols[..4], &key, &hashed, true),
        &[],
    );
    let by_id: Vec<BoundColumn> = [1, 2, 3].iter().map(|&i| cols[i].clone()).collect();
    section(
        "investigation of keys: a single integer key",
        dialect::key_sql(
            d,
            &src,
            &by_id,
            &[&by_id[0].info],
            &hashed,
            &[
                vec![KeyPart::Int(7)],
                vec![KeyPart::Int(-42)],
                vec![KeyPart::Int(7)],
            ],
        ),
        &[],
    );
    let windowed = Segment {
        window: Some(tally_common::segment::Window {
            column: "id".into(),
            upper: "1000".into(),
        }),
        ..hashed.clone()
    };
    section(
        "investigation of keys: a composite text key (one holds a quote), within a window",
        dialect::key_sql(
            d,
            &src,
            &cols[..4],
            &key,
            &windowed,
            &[
                vec![t("O'Brien"), KeyPart::Int(7)],
                vec![t("EU"), KeyPart::Int(10)],
            ],
        ),
        &[],
    );
    let (min, max) = dialect::key_min_max(d, &src, &cols[1].info);
    section("key minimum", min, &[]);
    section("key maximum", max, &[]);
    let query = Source::Query("SELECT id, region FROM shop.orders WHERE region <> 'XX'".into());
    let s = dialect::count_rows(d, &query, &key, &cols, &Segment::whole()).unwrap();
    section("count of a query dataset", s.text, &s.binds);
    let w = tally_agent::watermark::WatermarkRead::Query("SELECT MAX(applied) FROM cdc.offsets".into());
    if let Some(sql) = d.watermark_sql(&w) {
        section("watermark (an agent-side query)", sql, &[]);
    }
    for (title, sql) in d.fixed_statements() {
        section(title, sql.to_string(), &[]);
    }
    out
}

/// Where a column of every class cannot render in SQL (a float on SQL Server is made
/// canonical in the agent), the row string, checksums and aggregate of the columns
/// that do: the SQL a pushed-down run of such a table executes.
fn pushdown_subset(
    d: &dyn Dialect,
    src: &Source,
    key: &[&ColumnInfo],
    hasher: &dyn Fn(HashMethod) -> Hasher,
    section: &mut dyn FnMut(&str, String, &[KeyPart]),
) {
    let cols = every_class();
    if dialect::row_string_expr(d, &cols).is_some() {
        return;
    }
    let subset: Vec<BoundColumn> = cols
        .into_iter()
        .filter(|c| d.canonical_expr(c).is_some())
        .collect();
    let Some(rs) = dialect::row_string_expr(d, &subset) else {
        return;
    };
    if d.row_hash_expr(&rs, HashMethod::Md5_48, None).is_none() {
        return;
    }
    let names: Vec<&str> = subset.iter().map(|c| c.info.name.as_str()).collect();
    section(
        &format!("row string of the columns SQL renders ({})", names.join(", ")),
        rs.clone(),
        &[],
    );
    for m in HashMethod::BY_STRENGTH {
        let key = hasher(m).row_key().copied();
        if let Some(h) = d.row_hash_expr(&rs, m, key.as_ref()) {
            section(&format!("row checksum {m} of those columns"), h, &[]);
        }
    }
    let t = |s: &str| KeyPart::Text(s.into());
    let parents = vec![
        (Segment::whole(), ChildRule::Quantile(4)),
        (
            Segment {
                lower: Some(vec![t("EU"), KeyPart::Int(10)]),
                ..Segment::default()
            },
            ChildRule::Cuts(vec![
                vec![t("EU"), KeyPart::Int(500)],
                vec![t("JP"), KeyPart::Int(1)],
            ]),
        ),
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
    ];
    for m in [HashMethod::SealedSha256_64, HashMethod::Md5_48] {
        if let Some(s) = dialect::aggregate(d, src, &subset, key, &hasher(m), &parents) {
            section(
                &format!("aggregate ({m}) of those columns: quantile, cuts and hash parents"),
                s.text,
                &s.binds,
            );
        }
    }
    let period = tally_common::segment::Period {
        column: "at".into(),
        granularity: tally_common::period::Granularity::Month,
        label: "2024-03".into(),
    };
    if let Some(s) = dialect::aggregate_periods(
        d,
        src,
        &subset,
        key,
        &hasher(HashMethod::SealedMd5_48),
        &Segment::whole(),
        &period,
    ) {
        section(
            "aggregate of those columns: one bucket per month",
            s.text,
            &s.binds,
        );
    }
}

fn check(name: &str, d: &dyn Dialect) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.sql"));
    let got = render(d);
    if std::env::var_os("TALLY_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with TALLY_UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    assert!(
        got == want,
        "{name}: rendered SQL differs from {}; rerun with TALLY_UPDATE_GOLDEN=1 and review the diff",
        path.display()
    );
}

#[test]
fn postgres_sql() {
    check("postgres", &dialect::postgres::Postgres::default());
}

#[test]
fn postgres_13_compares_sum_only() {
    let d = dialect::postgres::Postgres { has_bit_xor: false };
    assert!(d.xor_aggregate("h").is_none());
}

#[test]
fn mysql_sql() {
    check("mysql", &dialect::mysql::MySql);
}

#[test]
fn sqlite_sql() {
    check("sqlite", &dialect::sqlite::Sqlite);
}

#[test]
fn mssql_sql() {
    check("mssql", &dialect::mssql::MsSql);
}

#[test]
fn oracle_sql() {
    check("oracle", &dialect::oracle::Oracle);
}

#[cfg(feature = "duckdb")]
#[test]
fn duckdb_sql() {
    check("duckdb", &dialect::duckdb::DuckDb);
}

#[cfg(feature = "spark")]
#[test]
fn spark_sql() {
    check("spark", &dialect::spark::Spark);
}

#[cfg(feature = "clickhouse")]
#[test]
fn clickhouse_sql() {
    check("clickhouse", &dialect::clickhouse::ClickHouse::default());
}

/// A dataset that declares `FINAL` reads its table through it in every statement.
#[cfg(feature = "clickhouse")]
#[test]
fn clickhouse_final_reads_every_statement_through_final() {
    let d = dialect::clickhouse::ClickHouse::FINAL;
    let cols = every_class();
    let key: Vec<&ColumnInfo> = cols[..2].iter().map(|c| &c.info).collect();
    let src = Source::Table(vec!["cdc".into(), "orders".into()]);
    let agg = dialect::aggregate(
        &d,
        &src,
        &cols[..3],
        &key,
        &Hasher::unsealed(HashMethod::Sha256_64),
        &[(Segment::whole(), ChildRule::Quantile(4))],
    )
    .unwrap();
    let fetch = dialect::fetch_rows(&d, &src, &cols, &key, &Segment::whole(), FetchShape::Raw, true);
    let count = dialect::count_rows(&d, &src, &key, &cols, &Segment::whole()).unwrap();
    let (min, _) = dialect::key_min_max(&d, &src, &cols[1].info);
    for sql in [agg.text, fetch.text, count.text, min] {
        assert!(sql.contains("`cdc`.`orders` FINAL"), "{sql}");
    }
}
