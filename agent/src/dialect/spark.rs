//! Spark SQL (Apache Spark 3.5+/4.x over Spark Connect, and Databricks), with ANSI mode
//! on and the session time zone UTC (the connector sets both and refuses a session
//! where they do not read back). Renderings verified live against Spark 4.3.0
//! (docs/research/spark-connect.md §3):
//!
//! - decimals render from `CAST(x AS STRING)` (plain BigDecimal text); a wider scale is
//!   padded as text, since `CAST(x AS DECIMAL(38, s))` overflows under ANSI for wide
//!   values; a narrower one rounds half away from zero with `round`;
//! - doubles are NOT rendered in SQL: the JVM's `Double.toString` is not the shortest
//!   text and `CAST(NaN AS DECIMAL)` is NULL even under ANSI; the connector reads the
//!   Arrow `Float64` and the agent renders it;
//! - the row checksum is `conv(.., 16, -10)` (a negative base returns the signed
//!   value: the unsigned text would fail the BIGINT cast under ANSI), summed as
//!   `DECIMAL(38, 0)` (`SUM(bigint)` overflow is an error under ANSI, `try_sum` a silent
//!   NULL) and reduced mod 2^64 in the agent;
//! - text compares bytewise under the default `UTF8_BINARY` collation; a column of
//!   another collation is refused (classified `other`).

use tally_common::checksum::HashMethod;
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;

use super::Dialect;
use crate::schema::{BoundColumn, ColumnInfo, Declared, Native, TypeEntry};

/// Spark's type table, over the names `DESCRIBE` reports (`decimal(10,2)`, `char(6)`,
/// `timestamp_ntz`). ARRAY, MAP, STRUCT, VARIANT, INTERVAL, TIME and text of a
/// collation other than `UTF8_BINARY` are `Other`: a run naming them is refused.
pub fn classify(declared: &str) -> TypeEntry {
    use TypeClass::*;
    let lower = declared.trim().to_ascii_lowercase();
    // `string collate UTF8_LCASE`: its order and equality are not bytewise
    if let Some((_, collation)) = lower.split_once(" collate ")
        && collation.trim() != "utf8_binary"
    {
        return TypeEntry::OTHER;
    }
    let d = Declared::parse(lower.split(" collate ").next().unwrap_or(""));
    match d.base.as_str() {
        "tinyint" | "byte" | "smallint" | "short" | "int" | "integer" | "bigint" | "long" => {
            TypeEntry::of(Integer)
        }
        "decimal" | "dec" | "numeric" => TypeEntry::of(Decimal).scale(Some(d.arg(1).unwrap_or(0))),
        "float" | "real" => TypeEntry::of(Float).native(Native::Float32),
        "double" => TypeEntry::of(Float),
        "boolean" => TypeEntry::of(Boolean),
        "string" | "varchar" => TypeEntry::of(Text),
        "char" => TypeEntry::of(Text).fixed(),
        "binary" => TypeEntry::of(Binary),
        "date" => TypeEntry::of(Date),
        // TIMESTAMP is an instant (LTZ), shown in the session zone (UTC)
        "timestamp" | "timestamp_ltz" => TypeEntry::of(TimestampTz).scale(Some(6)),
        "timestamp_ntz" => TypeEntry::of(Timestamp).scale(Some(6)),
        _ => TypeEntry::OTHER,
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Spark;

fn zero(s: u32) -> String {
    if s == 0 {
        "0".to_string()
    } else {
        format!("0.{}", "0".repeat(s as usize))
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.f…]` of a timestamp expression read in the session zone.
fn timestamp(t: &str, p: u32) -> String {
    let us = format!("date_format({t}, 'SSSSSS')");
    let fraction = match p {
        0 => String::new(),
        1..=6 => format!(" || '.' || substr({us}, 1, {p})"),
        _ => format!(" || '.' || rpad({us}, {p}, '0')"),
    };
    format!("CAST(CAST({t} AS DATE) AS STRING) || 'T' || date_format({t}, 'HH:mm:ss'){fraction}")
}

impl Dialect for Spark {
    fn name(&self) -> &'static str {
        "spark"
    }

    fn quote(&self, ident: &str) -> String {
        format!("`{}`", ident.replace('`', "``"))
    }

    fn placeholder(&self, _n: usize) -> String {
        "?".into()
    }

    fn literal(&self, v: &KeyPart) -> String {
        // unhex gives the bytes as BINARY, decode reads them as UTF-8 STRING
        match v {
            KeyPart::Int(i) => i.to_string(),
            KeyPart::Text(s) => format!("decode(unhex('{}'), 'UTF-8')", hex::encode(s)),
        }
    }

    /// Text compares bytewise (`UTF8_BINARY`, NO PAD); a CHAR(n) key without the
    /// padding Spark adds on read, as its canonical text.
    fn key_expr(&self, col: &ColumnInfo) -> String {
        let x = self.quote(&col.name);
        match col.class {
            TypeClass::Text if col.fixed_char => format!("rtrim({x})"),
            _ => x,
        }
    }

    /// Spark compares row values as STRUCTs, and refuses two whose field names differ
    /// (`named_struct(k0, ..) < named_struct(col1, ..)`, verified on 4.3.0): composite
    /// bounds are expanded lexicographically instead.
    fn row_values(&self) -> bool {
        false
    }

    fn canonical_expr(&self, col: &BoundColumn) -> Option<String> {
        let x = self.quote(&col.info.name);
        let f = col.spec.format;
        let s = f.scale;
        let text = format!("CAST({x} AS STRING)");
        Some(match f.class {
            TypeClass::Integer => match col.info.class {
                TypeClass::Boolean => format!("CASE WHEN {x} THEN '1' WHEN NOT {x} THEN '0' END"),
                _ => text,
            },
            // doubles (and doubles compared as decimals) are rendered in the agent
            TypeClass::Decimal if col.info.class == TypeClass::Float => return None,
            TypeClass::Float => return None,
            TypeClass::Decimal if f.exact => format!(
                "CASE WHEN {x} = 0 THEN '0' WHEN instr({text}, '.') > 0 THEN \
                 TRIM(TRAILING '.' FROM TRIM(TRAILING '0' FROM {text})) ELSE {text} END"
            ),
            TypeClass::Decimal => {
                let k = match col.info.class {
                    TypeClass::Decimal => col.info.scale.unwrap_or(0),
                    _ => 0,
                };
                if s == k {
                    format!("CASE WHEN {x} = 0 THEN '{}' ELSE {text} END", zero(s))
                } else if s > k {
                    // padded as text: a cast to DECIMAL(38, s) overflows for wide values
                    let pad = format!(
                        "{}{}",
                        if k == 0 { "." } else { "" },
                        "0".repeat((s - k) as usize)
                    );
                    format!("CASE WHEN {x} = 0 THEN '{}' ELSE {text} || '{pad}' END", zero(s))
                } else {
                    // round is HALF_UP (away from zero); its type shrinks, no overflow
                    let r = format!("round({x}, {s})");
                    format!(
                        "CASE WHEN {r} = 0 THEN '{}' ELSE CAST({r} AS STRING) END",
                        zero(s)
                    )
                }
            }
            TypeClass::Boolean => match col.info.class {
                TypeClass::Integer => text,
                _ => format!("CASE WHEN {x} THEN '1' WHEN NOT {x} THEN '0' END"),
            },
            // a CHAR(n) reads padded to n
            TypeClass::Text if f.fixed_char || col.info.fixed_char => {
                format!("TRIM(TRAILING ' ' FROM {text})")
            }
            TypeClass::Text => match col.info.class {
                TypeClass::Text => x,
                _ => text,
            },
            TypeClass::Date => format!("CAST(CAST({x} AS DATE) AS STRING)"),
            TypeClass::Timestamp => timestamp(&x, s),
            TypeClass::TimestampTz => {
                // a TIMESTAMP_NTZ read in a dataset's zone: its UTC instant
                let t = match (&col.zone, col.info.class) {
                    (Some(z), TypeClass::Timestamp) if z != "+00:00" && z != "UTC" => {
                        format!("convert_timezone('{}', 'UTC', {x})", z.replace('\'', ""))
                    }
                    _ => x,
                };
                format!("{} || 'Z'", timestamp(&t, s))
            }
            TypeClass::Uuid => format!("lower({text})"),
            TypeClass::Binary if col.info.class == TypeClass::Text => {
                format!("lower(hex(encode({x}, 'UTF-8')))")
            }
            // Spark has no BINARY(n); the other side's padding is dropped here too (only
            // whole zero bytes: a match of (00)+ at an odd offset cannot reach the end)
            TypeClass::Binary if f.fixed_char => format!("regexp_replace(lower(hex({x})), '(00)+$', '')"),
            TypeClass::Binary => format!("lower(hex({x}))"),
            TypeClass::Time | TypeClass::Json | TypeClass::Other => return None,
        })
    }

    /// A double (a FLOAT widened exactly) arrives as an Arrow `Float64`, which the
    /// connector writes as the shortest text that reads back as it.
    fn text_expr(&self, col: &BoundColumn) -> Option<String> {
        let x = self.quote(&col.info.name);
        match (col.info.class, col.spec.format.class) {
            (TypeClass::Float, TypeClass::Float | TypeClass::Decimal) => Some(format!("CAST({x} AS DOUBLE)")),
            _ => None,
        }
    }

    fn field_expr(&self, canonical: &str) -> String {
        format!("COALESCE(CAST(octet_length({canonical}) AS STRING) || ':' || {canonical}, '~')")
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
                format!("(CAST(conv(substr(md5({bytes}), 1, 12), 16, 10) AS BIGINT) - 140737488355328)")
            }
            // to_base -10: the signed value (base 10 gives the unsigned text, which
            // fails the BIGINT cast under ANSI)
            _ => format!("CAST(conv(substr(sha2({bytes}, 256), 1, 16), 16, -10) AS BIGINT)"),
        })
    }

    fn bucket_hash_expr(&self, key_row: &str, key: Option<&[u8; 32]>) -> Option<String> {
        let bytes = keyed_bytes(key_row, key);
        Some(format!(
            "CAST(conv(substr(sha2({bytes}, 256), 1, 15), 16, 10) AS BIGINT)"
        ))
    }

    fn xor_aggregate(&self, h: &str) -> Option<String> {
        Some(format!("CAST(bit_xor({h}) AS STRING)"))
    }

    /// Exact: `SUM(bigint)` overflows into an error under ANSI, `try_sum` into NULL.
    fn sum_text(&self, h: &str) -> String {
        format!("CAST(SUM(CAST({h} AS DECIMAL(38, 0))) AS STRING)")
    }

    fn watermark_sql(&self, read: &crate::watermark::WatermarkRead) -> Option<String> {
        match read {
            crate::watermark::WatermarkRead::Query(q) => Some(format!("SELECT CAST(({q}) AS STRING)")),
            _ => None,
        }
    }

    /// `div` truncates toward zero, as every engine's integer division here.
    fn int_div(&self, a: &str, b: &str) -> String {
        format!("({a} div {b})")
    }

    fn text_int(&self, e: &str) -> String {
        format!("CAST({e} AS INT)")
    }

    fn int_text(&self, e: &str) -> String {
        format!("CAST({e} AS STRING)")
    }

    fn fixed_statements(&self) -> Vec<(&'static str, &'static str)> {
        vec![("version", VERSION_SQL)]
    }
}

/// The server's version (`4.3.0 98bc02…`).
pub const VERSION_SQL: &str = "SELECT version()";

/// A row-string expression after a sealed method's key, as one BINARY (the row's UTF-8).
fn keyed_bytes(row: &str, key: Option<&[u8; 32]>) -> String {
    match key {
        None => row.to_string(),
        Some(k) => format!("concat(unhex('{}'), encode({row}, 'UTF-8'))", hex::encode(k)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spark_types_classify_and_nested_or_collated_ones_are_other() {
        for (t, class, scale) in [
            ("bigint", TypeClass::Integer, None),
            ("tinyint", TypeClass::Integer, None),
            ("decimal(38,10)", TypeClass::Decimal, Some(10)),
            ("double", TypeClass::Float, None),
            ("string", TypeClass::Text, None),
            ("varchar(6)", TypeClass::Text, None),
            ("string collate UTF8_BINARY", TypeClass::Text, None),
            ("binary", TypeClass::Binary, None),
            ("timestamp", TypeClass::TimestampTz, Some(6)),
            ("timestamp_ntz", TypeClass::Timestamp, Some(6)),
        ] {
            let e = classify(t);
            assert_eq!(
                (e.class, e.scale.filter(|_| scale.is_some())),
                (class, scale),
                "{t}"
            );
        }
        assert!(classify("char(6)").fixed);
        for t in [
            "array<int>",
            "map<string,int>",
            "struct<a:int>",
            "variant",
            "interval day to second",
            "string collate UTF8_LCASE",
            "time(6)",
        ] {
            assert_eq!(classify(t).class, TypeClass::Other, "{t}");
        }
    }

    #[test]
    fn identifiers_double_their_backticks() {
        assert_eq!(Spark.quote("a`b"), "`a``b`");
    }
}
