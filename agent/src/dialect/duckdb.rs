//! DuckDB (1.x): a local `.duckdb` file, or an in-memory database whose dataset is a
//! query over CSV or Parquet files (`read_csv`, `read_parquet`). Everything pushes
//! down (`md5`, `sha256`, exact `SUM` into HUGEINT, `bit_xor`) but doubles, JSON and a
//! `TIMESTAMP` read in a dataset's `time_zone`, which the agent renders. Text is
//! bytewise (DuckDB's default collation); `strlen` counts octets.

use tally_common::checksum::HashMethod;
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;

use super::Dialect;
use crate::schema::{BoundColumn, ColumnInfo, Declared, Native, TypeEntry};

/// DuckDB's type table, over the names `DESCRIBE` reports. Every type not listed
/// (INTERVAL, LIST, STRUCT, MAP, UNION, BIT, TIME WITH TIME ZONE, …) is `Other`.
pub fn classify(declared: &str) -> TypeEntry {
    use TypeClass::*;
    let d = Declared::parse(declared);
    match d.base.as_str() {
        "tinyint" | "smallint" | "integer" | "bigint" | "hugeint" | "utinyint" | "usmallint" | "uinteger"
        | "ubigint" | "uhugeint" => TypeEntry::of(Integer),
        "decimal" | "numeric" => TypeEntry::of(Decimal).scale(Some(d.arg(1).unwrap_or(3))),
        "float" | "real" | "float4" => TypeEntry::of(Float).native(Native::Float32),
        "double" | "float8" => TypeEntry::of(Float),
        "boolean" => TypeEntry::of(Boolean),
        "varchar" | "text" | "string" => TypeEntry::of(Text),
        "enum" => TypeEntry::of(Text).native(Native::Label),
        "date" => TypeEntry::of(Date),
        "timestamp_s" => TypeEntry::of(Timestamp).scale(Some(0)),
        "timestamp_ms" => TypeEntry::of(Timestamp).scale(Some(3)),
        "timestamp_ns" => TypeEntry::of(Timestamp).scale(Some(9)),
        "timestamp" | "datetime" => TypeEntry::of(Timestamp).scale(Some(6)),
        "timestamp with time zone" | "timestamptz" => TypeEntry::of(TimestampTz).scale(Some(6)),
        "time" => TypeEntry::of(Time).scale(Some(6)),
        "uuid" => TypeEntry::of(Uuid),
        "blob" | "bytea" | "varbinary" => TypeEntry::of(Binary),
        "json" => TypeEntry::of(Json),
        _ => TypeEntry::OTHER,
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct DuckDb;

fn zero(s: u32) -> String {
    if s == 0 {
        "0".to_string()
    } else {
        format!("0.{}", "0".repeat(s as usize))
    }
}

/// `.` and the first `p` digits of the microseconds of `x`, or nothing at precision 0.
fn fraction(x: &str, p: u32) -> String {
    let us = format!("lpad(CAST(date_part('microseconds', {x}) % 1000000 AS VARCHAR), 6, '0')");
    match p {
        0 => String::new(),
        1..=6 => format!(" || '.' || substr({us}, 1, {p})"),
        _ => format!(" || '.' || rpad({us}, {p}, '0')"),
    }
}

impl Dialect for DuckDb {
    fn name(&self) -> &'static str {
        "duckdb"
    }

    fn quote(&self, ident: &str) -> String {
        format!("\"{}\"", ident.replace('"', "\"\""))
    }

    fn placeholder(&self, _n: usize) -> String {
        "?".into()
    }

    fn literal(&self, v: &KeyPart) -> String {
        // from_hex gives the bytes as a BLOB, decode reads them as UTF-8 VARCHAR
        match v {
            KeyPart::Int(i) => i.to_string(),
            KeyPart::Text(s) => format!("decode(from_hex('{}'))", hex::encode(s)),
        }
    }

    fn key_expr(&self, col: &ColumnInfo) -> String {
        let x = self.quote(&col.name);
        match col.class {
            // bytewise whatever the column's collation (`COLLATE NOCASE`); an ENUM
            // compares by its position in the type, its label as text
            TypeClass::Text if col.native == Native::Label => {
                format!("CAST({x} AS VARCHAR) COLLATE \"binary\"")
            }
            TypeClass::Text => format!("{x} COLLATE \"binary\""),
            _ => x,
        }
    }

    /// DuckDB turns `(a, b) >= (x, y) AND (a, b) < (z, w)` into a BETWEEN of two
    /// STRUCTs, which it then refuses ("Invalid type for BETWEEN", issue 31 F11):
    /// composite bounds are expanded lexicographically instead.
    fn row_values(&self) -> bool {
        false
    }

    /// An ENUM as its label: the driver hands over its position in the type.
    fn raw_expr(&self, col: &BoundColumn) -> String {
        let x = self.quote(&col.info.name);
        match col.info.native {
            Native::Label => format!("CAST({x} AS VARCHAR)"),
            _ => x,
        }
    }

    fn key_param(&self, _n: usize, col: &ColumnInfo) -> String {
        match col.class {
            TypeClass::Integer => "CAST(? AS BIGINT)".into(),
            _ => "CAST(? AS VARCHAR)".into(),
        }
    }

    fn canonical_expr(&self, col: &BoundColumn) -> Option<String> {
        let x = self.quote(&col.info.name);
        let f = col.spec.format;
        let s = f.scale;
        Some(match f.class {
            TypeClass::Integer => match col.info.class {
                TypeClass::Boolean => format!("CASE WHEN {x} THEN '1' WHEN NOT {x} THEN '0' END"),
                _ => format!("CAST({x} AS VARCHAR)"),
            },
            // a float as a decimal, and doubles past DECIMAL(38)'s range: made canonical
            // in the agent from the double's shortest text (text_expr)
            TypeClass::Decimal if col.info.class == TypeClass::Float => return None,
            TypeClass::Float => return None,
            TypeClass::Decimal if f.exact => {
                let t = format!("CAST({x} AS VARCHAR)");
                format!(
                    "CASE WHEN {x} = 0 THEN '0' WHEN strpos({t}, '.') > 0 THEN rtrim(rtrim({t}, '0'), '.') ELSE {t} END"
                )
            }
            TypeClass::Decimal => {
                let d = format!("CAST({x} AS DECIMAL(38, {s}))");
                format!(
                    "CASE WHEN {d} = 0 THEN '{}' ELSE CAST({d} AS VARCHAR) END",
                    zero(s)
                )
            }
            TypeClass::Boolean => match col.info.class {
                TypeClass::Integer => format!("CAST({x} AS VARCHAR)"),
                _ => format!("CASE WHEN {x} THEN '1' WHEN NOT {x} THEN '0' END"),
            },
            TypeClass::Text if f.fixed_char => format!("rtrim(CAST({x} AS VARCHAR), ' ')"),
            TypeClass::Text => format!("CAST({x} AS VARCHAR)"),
            TypeClass::Date => format!("CAST(CAST({x} AS DATE) AS VARCHAR)"),
            // a TIMESTAMP read in another zone than UTC is converted in the agent: the
            // instant's UTC year may leave 0001-9999 (0001-01-01 00:30 at +02:00), which
            // DuckDB's text writes as `0001-12-31 (BC)` or `10000-…`, not canonically;
            // subtracting the offset in SQL also fails within a day of DuckDB's extremes
            TypeClass::TimestampTz if col.zone.as_deref().is_some_and(|z| z != "+00:00") => return None,
            // a TIMESTAMP_NS is rendered in the agent from its count: a cast to TIMESTAMP
            // drops the nanoseconds and rounds toward 1970, so `1969-12-31 23:59:59.999999999`
            // became `1970-01-01T00:00:00.000000` (issue 31 F15)
            TypeClass::Timestamp | TypeClass::TimestampTz if nanoseconds(&col.info) => return None,
            TypeClass::Timestamp | TypeClass::TimestampTz => {
                // the session runs in UTC, so a TIMESTAMPTZ casts to its UTC wall time
                // (and a TIMESTAMP read in UTC is its own wall time)
                let t = format!("CAST({x} AS TIMESTAMP)");
                let z = if f.class == TypeClass::TimestampTz {
                    " || 'Z'"
                } else {
                    ""
                };
                format!(
                    "CAST(CAST({t} AS DATE) AS VARCHAR) || 'T' || strftime({t}, '%H:%M:%S'){}{z}",
                    fraction(&t, s)
                )
            }
            TypeClass::Time => format!("substr(CAST({x} AS VARCHAR), 1, 8){}", fraction(&x, s)),
            TypeClass::Uuid => format!("lower(CAST({x} AS VARCHAR))"),
            TypeClass::Binary if col.info.class == TypeClass::Text => format!("lower(hex(encode({x})))"),
            TypeClass::Binary if f.fixed_char => format!("regexp_replace(lower(hex({x})), '(00)+$', '')"),
            TypeClass::Binary => format!("lower(hex({x}))"),
            // JSON is made canonical in the agent (RFC 8785), never in SQL
            TypeClass::Json | TypeClass::Other => return None,
        })
    }

    fn text_expr(&self, col: &BoundColumn) -> Option<String> {
        let x = self.quote(&col.info.name);
        match (col.info.class, col.spec.format.class) {
            // the shortest round-trip text of the double (a FLOAT widened exactly)
            (TypeClass::Float, TypeClass::Float | TypeClass::Decimal) => {
                Some(format!("CAST(CAST({x} AS DOUBLE) AS VARCHAR)"))
            }
            (TypeClass::Json | TypeClass::Text, TypeClass::Json) => Some(format!("CAST({x} AS VARCHAR)")),
            // a TIMESTAMP read in its dataset's zone: the stored count, which the connector
            // writes as its local reading with the zone's offset, and the reference
            // converts to UTC for every year
            (TypeClass::Timestamp, TypeClass::TimestampTz) if col.zone.is_some() => Some(x),
            // a TIMESTAMP_NS: its count, which the connector writes with all nine digits
            (TypeClass::Timestamp, TypeClass::Timestamp | TypeClass::TimestampTz)
                if nanoseconds(&col.info) =>
            {
                Some(x)
            }
            _ => None,
        }
    }

    fn field_expr(&self, canonical: &str) -> String {
        format!("COALESCE(CAST(strlen({canonical}) AS VARCHAR) || ':' || {canonical}, '~')")
    }

    fn concat(&self, parts: &[String]) -> String {
        if parts.len() == 1 {
            parts[0].clone()
        } else {
            format!("({})", parts.join(" || "))
        }
    }

    fn row_hash_expr(&self, row: &str, method: HashMethod, key: Option<&[u8; 32]>) -> Option<String> {
        let bytes = keyed_bytes(row, key);
        Some(match method.base() {
            HashMethod::Md5_48 => {
                format!("(CAST('0x' || substr(md5({bytes}), 1, 12) AS BIGINT) - 140737488355328)")
            }
            _ => format!("CAST('0x' || substr(sha256({bytes}), 1, 16) AS UBIGINT)"),
        })
    }

    fn bucket_hash_expr(&self, key_row: &str, key: Option<&[u8; 32]>) -> Option<String> {
        let bytes = keyed_bytes(key_row, key);
        Some(format!("CAST('0x' || substr(sha256({bytes}), 1, 15) AS BIGINT)"))
    }

    fn xor_aggregate(&self, h: &str) -> Option<String> {
        Some(format!("CAST(bit_xor({h}) AS VARCHAR)"))
    }

    fn sum_text(&self, h: &str) -> String {
        format!("CAST(SUM({h}) AS VARCHAR)")
    }

    fn int_div(&self, a: &str, b: &str) -> String {
        format!("({a} // {b})")
    }

    fn int_text(&self, e: &str) -> String {
        format!("CAST({e} AS VARCHAR)")
    }
}

/// A `TIMESTAMP_NS` column (the only DuckDB type with a 9-digit fraction).
fn nanoseconds(info: &ColumnInfo) -> bool {
    info.class == TypeClass::Timestamp && info.scale == Some(9)
}

/// A row-string expression after a sealed method's key, as one BLOB (the row's UTF-8).
fn keyed_bytes(row: &str, key: Option<&[u8; 32]>) -> String {
    match key {
        None => row.to_string(),
        Some(k) => format!("(unhex('{}') || encode({row}))", hex::encode(k)),
    }
}
