//! A dataset's `time_zone` (agent config) applies on every engine alike: a timestamp
//! without zone compared with a timestamp with zone is read in that zone and converted
//! to UTC, by the engine's SQL and by the agent's own read, as the run's warning says
//! (issue 31 F5: SQLite ignored it and refused the run; DuckDB's SQL ignored it too).

use std::sync::Arc;

use tally_agent::dataset::Dataset;
use tally_agent::dialect;
use tally_agent::schema::ColumnInfo;
use tally_common::canonical::FieldFormat;
use tally_common::segment::{ColumnSpec, Segment};
use tally_common::types::TypeClass;
use tally_e2e::engines::{self, EngineFixture};

const WANT: &str = "1:127:2024-03-15T12:30:00.000000Z";

async fn zone_on(e: Box<dyn EngineFixture>) {
    let e = &*e;
    let name = e.name();
    let dir = tempfile::tempdir().unwrap();
    let l = e.create("tz", dir.path()).await;
    let table = l.table("tz");
    l.exec(&format!(
        "CREATE TABLE {table} (id BIGINT PRIMARY KEY, ts {});\nINSERT INTO {table} VALUES (1, '2024-03-15 14:30:00');\n",
        e.timestamp_type()
    ))
    .await;
    let source = l.source("tz");
    let conn = Arc::new(l.connector);
    let tables = match &source {
        tally_agent::config::Source::Table(p) => p.join("."),
        _ => unreachable!(),
    };
    let config: tally_agent::config::DatasetConfig = tally_common::config_file::parse_yaml(
        std::path::Path::new("x"),
        &format!("{{ url: 'sqlite://x', table: '{tables}', key: [id], time_zone: '+02:00' }}"),
    )
    .unwrap();
    let ds = Dataset::new("tz".into(), config, source.clone(), conn.clone());
    let cols = vec![
        ColumnSpec {
            name: "id".into(),
            format: FieldFormat::new(TypeClass::Integer),
        },
        ColumnSpec {
            name: "ts".into(),
            format: FieldFormat::new(TypeClass::TimestampTz),
        },
    ];
    let b = ds.bind(&mut ds.session().await.unwrap(), cols, 1).await.unwrap();
    assert_eq!(b.cols[1].info.class, TypeClass::Timestamp, "{name}");
    // the agent's own read
    let key: Vec<&ColumnInfo> = vec![&b.cols[0].info];
    let shape = conn.fetch_shape();
    let sql = dialect::fetch_rows_inline(
        conn.dialect(),
        &source,
        &b.cols,
        &key,
        &Segment::whole(),
        shape,
        false,
    );
    let mut rows = Vec::new();
    conn.scan("tz", &sql, shape, &b.cols, 1, &mut |r| {
        rows.push(r.row_string().to_string());
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(rows, [WANT], "{name}: the agent's read");
    // the engine's SQL, where it renders the row
    if let Some(row) = dialect::row_string_expr(conn.dialect(), &b.cols) {
        let sql = format!(
            "SELECT {} FROM {}",
            e.as_text(&row),
            dialect::relation(conn.dialect(), &source)
        );
        assert_eq!(
            conn.query_text("tz", &sql).await.unwrap().as_deref(),
            Some(WANT),
            "{name}: the engine's SQL"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_engine_reads_a_timestamp_in_its_datasets_time_zone() {
    let mut failed = Vec::new();
    for e in engines::available() {
        let name = e.name();
        if let Err(err) = tokio::spawn(zone_on(e)).await {
            let why = match err.try_into_panic() {
                Ok(p) => p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
                Err(e) => e.to_string(),
            };
            failed.push(format!("{name}: {why}"));
        }
    }
    assert!(failed.is_empty(), "failed on:\n{}", failed.join("\n"));
}
