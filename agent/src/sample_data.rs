//! Sample datasets for `tally demo` and tests: an orders table written to SQLite, with
//! differences of every kind planted in the copy. Deterministic (seeded), so a run's
//! findings can be checked exactly.

use std::path::Path;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{AssertSqlSafe, Connection};

/// What was planted in the target copy, by key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Planted {
    pub changed: Vec<i64>,
    pub missing_in_target: Vec<i64>,
    pub extra_in_target: Vec<i64>,
}

const CUSTOMERS: [&str; 8] = [
    "Zoë Müller",
    "Łukasz Nowak",
    "Ana Núñez",
    "山田太郎",
    "Søren Kierkegaard",
    "José Álvarez",
    "O'Brien",
    "Ærøskøbing AS",
];
const STATUSES: [&str; 4] = ["new", "paid", "shipped", "returned"];

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// One order row as SQL literal values; the same id always gives the same row, and
/// `changed` moves its amount by one cent.
fn row(id: i64, changed: bool) -> String {
    let rng = &mut Lcg((id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03);
    let customer = CUSTOMERS[(rng.next() % 8) as usize].replace('\'', "''");
    let cents = rng.next() % 1_000_000 + u64::from(changed);
    let status = STATUSES[(rng.next() % 4) as usize];
    let secs = 1_700_000_000 + (id * 37) % 31_536_000;
    let micros = rng.next() % 1_000_000;
    let t = time::OffsetDateTime::from_unix_timestamp(secs).expect("in range");
    let note = if rng.next().is_multiple_of(5) {
        "NULL".to_string()
    } else {
        format!("'note {}'", rng.next() % 1000)
    };
    format!(
        "({id}, '{customer}', {}.{:02}, '{status}', '{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{micros:06}', {note})",
        cents / 100,
        cents % 100,
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// The orders table and its rows as SQL statements (batches of 500 rows), and what was
/// planted: keys 1.. with gaps every 7th; with `plant`, the copy's differences.
pub fn orders_sql(rows: i64, plant: bool) -> (Vec<String>, Planted) {
    let keys: Vec<i64> = (1..=rows + rows / 6)
        .filter(|k| k % 7 != 0)
        .take(rows as usize)
        .collect();
    let pick = |i: usize| keys[(keys.len() * i) / 11];
    let planted = Planted {
        changed: vec![pick(1), pick(4), pick(9)],
        missing_in_target: vec![pick(3), pick(7)],
        // a gap in the middle (keys skip multiples of 7) and one past the end
        extra_in_target: vec![(keys[keys.len() / 2] / 7) * 7, keys[keys.len() - 1] + 10],
    };
    let mut ids: Vec<i64> = keys.clone();
    if plant {
        ids.retain(|k| !planted.missing_in_target.contains(k));
        ids.extend(&planted.extra_in_target);
        ids.sort();
    }
    let mut sql = vec![
        "CREATE TABLE orders (id BIGINT PRIMARY KEY, customer VARCHAR(40) NOT NULL, amount DECIMAL(12,2) NOT NULL, \
         status VARCHAR(16) NOT NULL, created_at TIMESTAMP NOT NULL, note TEXT)"
            .to_string(),
    ];
    for chunk in ids.chunks(500) {
        let values: Vec<String> = chunk
            .iter()
            .map(|&id| row(id, plant && planted.changed.contains(&id)))
            .collect();
        sql.push(format!("INSERT INTO orders VALUES {}", values.join(", ")));
    }
    (sql, planted)
}

/// Writes the orders of [`orders_sql`] to a new SQLite file.
pub async fn write_orders(path: &Path, rows: i64, plant: bool) -> Result<Planted, sqlx::Error> {
    let _ = std::fs::remove_file(path);
    let opts = SqliteConnectOptions::new().filename(path).create_if_missing(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(opts)
        .await?;
    let mut conn = pool.acquire().await?;
    let (sql, planted) = orders_sql(rows, plant);
    let mut tx = conn.begin().await?;
    for stmt in sql {
        sqlx::query(AssertSqlSafe(stmt)).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    drop(conn);
    pool.close().await;
    Ok(planted)
}

/// Writes the orders of [`orders_sql`] to a new DuckDB file.
#[cfg(feature = "duckdb")]
pub fn write_orders_duckdb(path: &Path, rows: i64, plant: bool) -> Result<Planted, duckdb::Error> {
    let _ = std::fs::remove_file(path);
    let conn = duckdb::Connection::open(path)?;
    let (sql, planted) = orders_sql(rows, plant);
    conn.execute_batch("BEGIN")?;
    for stmt in sql {
        conn.execute_batch(&stmt)?;
    }
    conn.execute_batch("COMMIT; CHECKPOINT")?;
    drop(conn);
    Ok(planted)
}
