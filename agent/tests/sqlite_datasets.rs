//! SQLite datasets take the dataset options and forms the other engines take: a
//! `query:` dataset's columns are classified by the types their tables declare, as a
//! table dataset's are, and a `time_zone` reads timestamps without zone in that zone
//! when they are compared with timestamps with zone.

use tally_agent::connector::Connector;
use tally_agent::connector::sqlite::NO_DECLARED_TYPE;
use tally_agent::dataset::Dataset;
use tally_agent::dialect;
use tally_agent::schema::{ColumnInfo, DatasetInfo};
use tally_common::canonical::FieldFormat;
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::segment::{ColumnSpec, KeyPart, Segment, Split};
use tally_common::types::TypeClass;
use tally_e2e::engines::{Database, EngineFixture, sqlite::Sqlite};

const SCHEMA: &str = "CREATE TABLE t (id INTEGER PRIMARY KEY, amount DECIMAL(12,4), n NUMERIC, u UUID, \
     c CHAR(5), v VARCHAR(10), ts TIMESTAMPTZ, at TIMESTAMP(3), j JSON, f DOUBLE);\n\
     INSERT INTO t VALUES (1, 12.5, 3, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'ab', 'x', \
     '2024-03-15 14:30:00+00:00', '2024-03-15 14:30:00.123', '{\"a\":1}', 0.5);\n";

fn dataset(name: &str, body: &str, url: &str) -> Dataset {
    let config: tally_agent::config::DatasetConfig = tally_common::config_file::parse_yaml(
        std::path::Path::new("x"),
        &format!("{{ url: '{url}', {body}, key: [id] }}"),
    )
    .unwrap();
    let source = config.source();
    Dataset::new(name.into(), config, source, Connector::open(url).unwrap())
}

async fn describe(ds: &Dataset) -> DatasetInfo {
    ds.describe(&mut ds.session().await.unwrap()).await.unwrap()
}

fn column<'a>(info: &'a DatasetInfo, name: &str) -> &'a ColumnInfo {
    info.column(name).unwrap_or_else(|| panic!("no column {name}"))
}

async fn database(dir: &std::path::Path) -> Database {
    let l = Sqlite.create("ds", dir).await;
    l.exec(SCHEMA).await;
    l
}

/// F6: a query's plain columns are what the table declares (with the declared scale
/// and padding), never the driver's NULL for a type it does not map; an expression,
/// for which SQLite declares no type, is `other` and says why.
#[tokio::test]
async fn a_query_column_has_its_tables_declared_type() {
    let dir = tempfile::tempdir().unwrap();
    let l = database(dir.path()).await;
    let table = describe(&dataset("tbl", "table: t", &l.url)).await;
    let query = describe(&dataset(
        "qry",
        "query: 'SELECT id, amount, n, u, c, v, ts, at, j, f, amount * 2 AS doubled, CAST(n AS DECIMAL(9,2)) AS cast_n FROM t'",
        &l.url,
    ))
    .await;
    for name in ["id", "amount", "n", "u", "c", "v", "ts", "at", "j", "f"] {
        let (t, q) = (column(&table, name), column(&query, name));
        assert_eq!(
            (q.class, q.scale, q.fixed_char, q.declared_type.as_str()),
            (t.class, t.scale, t.fixed_char, t.declared_type.as_str()),
            "query column {name} as the table's"
        );
    }
    assert_eq!(column(&query, "amount").class, TypeClass::Decimal);
    assert_eq!(column(&query, "amount").scale, Some(4));
    assert_eq!(column(&query, "n").class, TypeClass::Decimal);
    for name in ["doubled", "cast_n"] {
        let c = column(&query, name);
        assert_eq!(c.class, TypeClass::Other, "{name}");
        assert_eq!(c.declared_type, NO_DECLARED_TYPE, "{name}");
    }
}

/// F5: a TIMESTAMP compared with a timestamptz is read in the dataset's `time_zone`,
/// as the run's warning says (it was refused: the text carried no offset).
#[tokio::test]
async fn a_timestamp_is_read_in_the_datasets_time_zone() {
    let dir = tempfile::tempdir().unwrap();
    let l = database(dir.path()).await;
    let ds = dataset("tz", "table: t, time_zone: '+02:00'", &l.url);
    let cols = vec![
        ColumnSpec {
            name: "id".into(),
            format: FieldFormat::new(TypeClass::Integer),
        },
        ColumnSpec {
            name: "at".into(),
            format: FieldFormat::new(TypeClass::TimestampTz).with_scale(3),
        },
    ];
    let b = ds.bind(&mut ds.session().await.unwrap(), cols, 1).await.unwrap();
    let key: Vec<&ColumnInfo> = vec![&b.cols[0].info];
    let shape = l.connector.fetch_shape();
    let sql = dialect::fetch_rows(
        l.connector.dialect(),
        &ds.source,
        &b.cols,
        &key,
        &Segment::whole(),
        shape,
        false,
    );
    let mut rows = Vec::new();
    l.connector
        .scan("tz", &sql, shape, &b.cols, 1, &mut |r| {
            rows.push(r.row_string().to_string());
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(rows, ["1:124:2024-03-15T12:30:00.123Z"]);
    let out = ds
        .aggregate(
            &mut ds.session().await.unwrap(),
            &b,
            &Hasher::unsealed(HashMethod::Sha256_64),
            &[(Segment::whole(), Split::Whole)],
            false,
        )
        .await
        .unwrap();
    assert_eq!(out.buckets[0].agg.count(), 1);
}

/// F17: a key's parts follow the one rule of every engine: an integer only where the
/// column is an integer compared as one, the canonical text otherwise. SQLite made any
/// INTEGER-stored key an integer part, so an integer keyed against another engine's
/// decimal (whose parts are the decimal's text) paired no row: every row was reported
/// missing on one side and extra on the other.
#[tokio::test]
async fn key_parts_are_integers_only_for_integers_compared_as_integers() {
    let dir = tempfile::tempdir().unwrap();
    let l = Sqlite.create("keys", dir.path()).await;
    l.exec("CREATE TABLE k (id INTEGER PRIMARY KEY, d DECIMAL(12,0));\nINSERT INTO k VALUES (7, 7);\n")
        .await;
    let h = Hasher::unsealed(HashMethod::Sha256_64);
    for (key, format, expected) in [
        ("id", FieldFormat::new(TypeClass::Integer), KeyPart::Int(7)),
        // an integer keyed against a decimal: the decimal's text
        (
            "id",
            FieldFormat::new(TypeClass::Decimal),
            KeyPart::Text("7".into()),
        ),
        (
            "d",
            FieldFormat::new(TypeClass::Decimal),
            KeyPart::Text("7".into()),
        ),
    ] {
        let config: tally_agent::config::DatasetConfig = tally_common::config_file::parse_yaml(
            std::path::Path::new("x"),
            &format!("{{ url: '{}', table: k, key: [{key}] }}", l.url),
        )
        .unwrap();
        let source = config.source();
        let ds = Dataset::new("k".into(), config, source, Connector::open(&l.url).unwrap());
        let mut s = ds.session().await.unwrap();
        let b = ds
            .bind(
                &mut s,
                vec![ColumnSpec {
                    name: key.into(),
                    format,
                }],
                1,
            )
            .await
            .unwrap();
        let wanted: std::collections::HashSet<u64> =
            [h.key(tally_common::canonical::row_string([Some("7")]).as_bytes())].into();
        let (rows, _) = ds
            .rows_by_key_hash(&mut s, &b, &h, &Segment::whole(), &wanted, 10)
            .await
            .unwrap();
        s.finish().await.unwrap();
        let keys: Vec<&Vec<KeyPart>> = rows.iter().map(|(_, r)| &r.key).collect();
        assert_eq!(
            keys,
            vec![&vec![expected]],
            "key {key} compared as {:?}",
            format.class
        );
    }
}
