//! SQLite datasets take the dataset options the other engines take: a `time_zone`
//! reads timestamps without zone in that zone when they are compared with timestamps
//! with zone.

use tally_agent::connector::Connector;
use tally_agent::dataset::Dataset;
use tally_agent::dialect;
use tally_agent::schema::ColumnInfo;
use tally_common::canonical::FieldFormat;
use tally_common::checksum::{HashMethod, Hasher};
use tally_common::segment::{ColumnSpec, Segment, Split};
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

async fn database(dir: &std::path::Path) -> Database {
    let l = Sqlite.create("ds", dir).await;
    l.exec(SCHEMA).await;
    l
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
