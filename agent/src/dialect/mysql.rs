//! MySQL 8 and MariaDB 10.5 and later. Text is converted to utf8mb4 before it is
//! measured or hashed (MD5/SHA2 hash the bytes of the string's own character set);
//! ranges and ordering compare the utf8mb4 bytes as a binary string (NO PAD, unlike
//! `utf8mb4_bin`, which ignores trailing spaces); SUM over integers is an exact
//! DECIMAL; BIT_XOR is a native 64-bit aggregate. The session runs with
//! `time_zone = '+00:00'` so TIMESTAMP columns render in UTC.

use tally_common::checksum::HashMethod;
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;

use super::Dialect;
use crate::schema::{BoundColumn, ColumnInfo, Declared, Native, TypeEntry};
use crate::watermark::{Builtin, WatermarkRead};

/// MySQL's and MariaDB's type table, from `information_schema.COLUMNS` (`DATA_TYPE`,
/// `COLUMN_TYPE`, `NUMERIC_SCALE`, `DATETIME_PRECISION`). `json_checked`: MariaDB's
/// `JSON` is a `LONGTEXT` with a `json_valid` check on the column. Every type not
/// listed is `Other`: it has no canonical form and a run naming it is refused.
pub fn classify(data_type: &str, column_type: &str, json_checked: bool) -> TypeEntry {
    use TypeClass::*;
    let d = Declared::parse(column_type);
    let zero_filled = zerofill(column_type);
    let time_scale = Some(d.arg(0).unwrap_or(0));
    match data_type.to_ascii_lowercase().as_str() {
        "tinyint" if d.arg(0) == Some(1) => TypeEntry::of(Boolean),
        "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" if zero_filled => {
            TypeEntry::of(Integer).native(Native::ZeroFill)
        }
        "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" => TypeEntry::of(Integer),
        "year" => TypeEntry::of(Integer).native(Native::ZeroFill),
        "bit" => {
            let n = d.arg(0).unwrap_or(1);
            let class = if n == 1 { Boolean } else { Binary };
            TypeEntry::of(class).native(Native::Bit(n))
        }
        "decimal" | "numeric" | "dec" | "fixed" => TypeEntry::of(Decimal).scale(Some(d.arg(1).unwrap_or(0))),
        "float" => TypeEntry::of(Float).native(Native::Float32),
        "double" | "real" | "double precision" => TypeEntry::of(Float),
        "char" => TypeEntry::of(Text).fixed(),
        "longtext" if json_checked => TypeEntry::of(Json).native(Native::JsonText),
        "json" => TypeEntry::of(Json),
        "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" => TypeEntry::of(Text),
        "enum" | "set" | "inet4" | "inet6" => TypeEntry::of(Text).native(Native::Label),
        "date" => TypeEntry::of(Date),
        "datetime" => TypeEntry::of(Timestamp).scale(time_scale),
        // stored in UTC and shown in the session zone (UTC): an instant
        "timestamp" => TypeEntry::of(TimestampTz).scale(time_scale),
        "time" => TypeEntry::of(Time).scale(time_scale),
        "binary" => TypeEntry::of(Binary).fixed(),
        "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => TypeEntry::of(Binary),
        "uuid" => TypeEntry::of(Uuid),
        // geometry, vectors, …
        _ => TypeEntry::OTHER,
    }
}

/// `int(5) unsigned zerofill` (a table's COLUMN_TYPE), `int zerofill` (a query's).
fn zerofill(declared: &str) -> bool {
    declared
        .split_whitespace()
        .any(|w| w.eq_ignore_ascii_case("zerofill"))
}

/// Doubles at or above this magnitude are rendered from their exponent form: a
/// `DECIMAL(65, s)` cast saturates past 10^(65-s).
const FLOAT_DECIMAL_LIMIT: &str = "1e38";
/// …which leaves room for this many fractional digits.
const FLOAT_MAX_SCALE: u32 = 26;

#[derive(Debug, Clone, Copy, Default)]
pub struct MySql;

fn zero(s: u32) -> String {
    if s == 0 {
        "0".to_string()
    } else {
        format!("0.{}", "0".repeat(s as usize))
    }
}

fn fraction(x: &str, p: u32) -> String {
    match p {
        0 => String::new(),
        1..=6 => format!(", '.', LEFT(DATE_FORMAT({x}, '%f'), {p})"),
        _ => format!(", '.', RPAD(DATE_FORMAT({x}, '%f'), {p}, '0')"),
    }
}

impl Dialect for MySql {
    fn name(&self) -> &'static str {
        "mysql"
    }

    /// `Threads_running` less the running threads of the agent's own database user (its
    /// reads, of this agent or another, and the probe itself; a user always sees its own
    /// threads): MariaDB (and MySQL 5.7) from information_schema, MySQL 8 from
    /// performance_schema.
    fn load_probe_sql(&self) -> &'static [&'static str] {
        &[
            "SELECT CAST(GREATEST(g.VARIABLE_VALUE - (SELECT COUNT(*) FROM information_schema.PROCESSLIST p \
             WHERE p.USER = SUBSTRING_INDEX(USER(), '@', 1) AND p.COMMAND <> 'Sleep'), 0) AS CHAR) \
             FROM information_schema.GLOBAL_STATUS g WHERE g.VARIABLE_NAME = 'THREADS_RUNNING'",
            "SELECT CAST(GREATEST(g.VARIABLE_VALUE - (SELECT COUNT(*) FROM information_schema.PROCESSLIST p \
             WHERE p.USER = SUBSTRING_INDEX(USER(), '@', 1) AND p.COMMAND <> 'Sleep'), 0) AS CHAR) \
             FROM performance_schema.global_status g WHERE g.VARIABLE_NAME = 'Threads_running'",
        ]
    }

    fn quote(&self, ident: &str) -> String {
        format!("`{}`", ident.replace('`', "``"))
    }

    fn placeholder(&self, _n: usize) -> String {
        "?".into()
    }

    fn literal(&self, v: &KeyPart) -> String {
        // a hex literal reads the same with and without NO_BACKSLASH_ESCAPES
        match v {
            KeyPart::Int(i) => i.to_string(),
            KeyPart::Text(s) => format!("CONVERT(X'{}' USING utf8mb4)", hex::encode(s)),
        }
    }

    fn bytewise(&self, e: &str) -> String {
        format!("CAST(CONVERT({e} USING utf8mb4) AS BINARY)")
    }

    fn watermark_sql(&self, read: &WatermarkRead) -> Option<String> {
        Some(match read {
            // without a binary log the position never moves: NULL, refused
            WatermarkRead::Builtin(Builtin::GtidBinlogPos) => {
                "SELECT IF(@@log_bin = 1, CAST(@@gtid_binlog_pos AS CHAR), NULL)".into()
            }
            WatermarkRead::Builtin(Builtin::GtidSlavePos) => "SELECT CAST(@@gtid_slave_pos AS CHAR)".into(),
            WatermarkRead::Query(q) => format!("SELECT CAST(({q}) AS CHAR)"),
            WatermarkRead::Builtin(_) | WatermarkRead::Subscription(_) => return None,
        })
    }

    fn row_value_in(&self) -> bool {
        true
    }

    fn key_expr(&self, col: &ColumnInfo) -> String {
        match col.class {
            TypeClass::Text => format!("CAST(CONVERT({} USING utf8mb4) AS BINARY)", self.quote(&col.name)),
            _ => self.quote(&col.name),
        }
    }

    fn key_param(&self, _n: usize, col: &ColumnInfo) -> String {
        match col.class {
            TypeClass::Text => "CAST(CONVERT(? USING utf8mb4) AS BINARY)".into(),
            _ => "?".into(),
        }
    }

    fn canonical_expr(&self, col: &BoundColumn) -> Option<String> {
        let x = self.quote(&col.info.name);
        let f = col.spec.format;
        let s = f.scale;
        // ZEROFILL, YEAR and BIT render by value, never the engine's padded display text
        let by_value = !matches!(col.info.native, Native::Plain | Native::Float32);
        Some(match f.class {
            TypeClass::Integer | TypeClass::Boolean if by_value => format!("CAST({x} + 0 AS CHAR)"),
            TypeClass::Integer | TypeClass::Boolean => format!("CAST({x} AS CHAR)"),
            // a float as a decimal is made canonical in the agent
            TypeClass::Decimal if col.info.class == TypeClass::Float => return None,
            TypeClass::Decimal if f.exact => {
                let t = format!("CAST({x} AS CHAR)");
                format!(
                    "CASE WHEN {x} = 0 THEN '0' WHEN LOCATE('.', {t}) > 0 THEN TRIM(TRAILING '.' FROM TRIM(TRAILING '0' FROM {t})) ELSE {t} END"
                )
            }
            TypeClass::Decimal => {
                let d = format!("CAST({x} AS DECIMAL(65, {s}))");
                format!("CASE WHEN {d} = 0 THEN '{}' ELSE CAST({d} AS CHAR) END", zero(s))
            }
            // MySQL doubles have no NaN or infinities; the text of a double is its
            // shortest round-trip form (float32 widened exactly first), read back
            // exactly as a DECIMAL below 1e38 and rebuilt from its exponent form above
            TypeClass::Float if s > FLOAT_MAX_SCALE => return None,
            TypeClass::Float => {
                let v = match col.info.native {
                    Native::Float32 => format!("CAST({x} AS DOUBLE)"),
                    _ => x.clone(),
                };
                let t = format!("CAST({v} AS CHAR)");
                let d = format!("CAST({t} AS DECIMAL(65, {s}))");
                let digits = format!("REPLACE(REPLACE(SUBSTRING_INDEX({t}, 'e', 1), '-', ''), '.', '')");
                let exp = format!("CAST(SUBSTRING_INDEX({t}, 'e', -1) AS SIGNED)");
                let frac = if s == 0 {
                    String::new()
                } else {
                    format!(", '.{}'", "0".repeat(s as usize))
                };
                format!(
                    "CASE WHEN ABS({v}) >= {FLOAT_DECIMAL_LIMIT} THEN CONCAT(IF({v} < 0, '-', ''), {digits}, \
                     REPEAT('0', {exp} + 1 - CHAR_LENGTH({digits})){frac}) \
                     WHEN {d} = 0 THEN '{}' ELSE CAST({d} AS CHAR) END",
                    zero(s)
                )
            }
            TypeClass::Text if f.fixed_char => format!("TRIM(TRAILING ' ' FROM CONVERT({x} USING utf8mb4))"),
            TypeClass::Text => format!("CONVERT({x} USING utf8mb4)"),
            TypeClass::Date => format!("DATE_FORMAT({x}, '%Y-%m-%d')"),
            TypeClass::Timestamp => {
                format!("CONCAT(DATE_FORMAT({x}, '%Y-%m-%dT%H:%i:%s'){})", fraction(&x, s))
            }
            // a DATETIME read in another zone than UTC is converted in the agent:
            // CONVERT_TZ returns its argument unchanged outside the TIMESTAMP range
            // (before 1970, after 2038), and date arithmetic gives NULL past 0001-9999,
            // where the UTC instant leaves the years a DATETIME holds
            TypeClass::TimestampTz if col.zone.as_deref().is_some_and(|z| z != "+00:00") => return None,
            TypeClass::TimestampTz => format!(
                "CONCAT(DATE_FORMAT({x}, '%Y-%m-%dT%H:%i:%s'){}, 'Z')",
                fraction(&x, s)
            ),
            TypeClass::Time => {
                // DATE_FORMAT's %f of a negative TIME carries the sign: read the microseconds
                let us = format!("LPAD(MICROSECOND({x}), 6, '0')");
                let frac = match s {
                    0 => String::new(),
                    1..=6 => format!(", '.', LEFT({us}, {s})"),
                    _ => format!(", '.', RPAD({us}, {s}, '0')"),
                };
                format!("CONCAT(TIME_FORMAT({x}, '%H:%i:%s'){frac})")
            }
            TypeClass::Uuid => format!("LOWER(CAST({x} AS CHAR))"),
            TypeClass::Binary if col.info.class == TypeClass::Text => {
                format!("LOWER(HEX(CONVERT({x} USING utf8mb4)))")
            }
            TypeClass::Binary => match col.info.native {
                // HEX of a BIT value drops leading zero digits: pad to the whole bytes
                Native::Bit(n) => format!("LOWER(LPAD(HEX({x}), {}, '0'))", n.div_ceil(8) * 2),
                _ if f.fixed_char => format!("LOWER(HEX(TRIM(TRAILING 0x00 FROM {x})))"),
                _ => format!("LOWER(HEX({x}))"),
            },
            // JSON is made canonical in the agent (RFC 8785), never in SQL
            TypeClass::Json | TypeClass::Other => return None,
        })
    }

    fn text_expr(&self, col: &BoundColumn) -> Option<String> {
        // the server's own text (sessions run in UTC): cheaper than DATE_FORMAT and
        // DECIMAL(65) casts. TIME stays in SQL: TIME_FORMAT gives the canonical form.
        let x = self.quote(&col.info.name);
        let class = col.spec.format.class;
        match (col.info.class, class) {
            (TypeClass::Text | TypeClass::Json, TypeClass::Json) => {
                return Some(format!("CONVERT({x} USING utf8mb4)"));
            }
            // the column itself: the server sends text in the session's
            // character_set_results (utf8mb4), so a CONVERT only costs server CPU
            // (measured: docs/performance.md); the agent checks the bytes are UTF-8
            (TypeClass::Text, TypeClass::Text) => return Some(x),
            // a DATETIME read in its dataset's zone: its fields, to which the connector
            // appends the zone's offset, and the reference converts to UTC
            (TypeClass::Timestamp, TypeClass::TimestampTz) if col.zone.is_some() => return Some(x),
            (TypeClass::Float, TypeClass::Float | TypeClass::Decimal) => {
                return Some(match col.info.native {
                    Native::Float32 => format!("CAST(CAST({x} AS DOUBLE) AS CHAR)"),
                    _ => format!("CAST({x} AS CHAR)"),
                });
            }
            (have, want) if have != want => return None,
            _ => {}
        }
        match class {
            // the column itself, read as the binary protocol sends it: integers as
            // integers, DATE and DATETIME as their fields, decimals as the server's
            // text; the agent renders them (connector/mysql.rs `Wire`), sparing the
            // server a cast per value (measured: docs/performance.md). A ZEROFILL
            // decimal keeps the cast (its padded text is the server's to write)
            TypeClass::Integer | TypeClass::Decimal | TypeClass::Date | TypeClass::Timestamp
                if col.info.native == Native::Plain && !zerofill(&col.info.declared_type) =>
            {
                Some(x)
            }
            TypeClass::Decimal | TypeClass::Date | TypeClass::Timestamp => Some(format!("CAST({x} AS CHAR)")),
            TypeClass::TimestampTz => Some(format!("CONCAT(CAST({x} AS CHAR), 'Z')")),
            _ => None,
        }
    }

    fn field_expr(&self, canonical: &str) -> String {
        format!("COALESCE(CONCAT(LENGTH({canonical}), ':', {canonical}), '~')")
    }

    fn concat(&self, parts: &[String]) -> String {
        if parts.len() == 1 {
            parts[0].clone()
        } else {
            format!("CONCAT({})", parts.join(", "))
        }
    }

    fn row_hash_expr(&self, row: &str, method: HashMethod, key: Option<&[u8; 32]>) -> Option<String> {
        let bytes = keyed_bytes(row, key);
        Some(match method.base() {
            HashMethod::Md5_48 => {
                format!("(CAST(CONV(LEFT(MD5({bytes}), 12), 16, 10) AS SIGNED) - 140737488355328)")
            }
            _ => format!("CAST(CONV(LEFT(SHA2({bytes}, 256), 16), 16, 10) AS UNSIGNED)"),
        })
    }

    fn bucket_hash_expr(&self, key_row: &str, key: Option<&[u8; 32]>) -> Option<String> {
        let bytes = keyed_bytes(key_row, key);
        Some(format!(
            "CAST(CONV(LEFT(SHA2({bytes}, 256), 15), 16, 10) AS SIGNED)"
        ))
    }

    fn xor_aggregate(&self, h: &str) -> Option<String> {
        Some(format!("CAST(BIT_XOR({h}) AS CHAR)"))
    }

    fn sum_text(&self, h: &str) -> String {
        format!("CAST(SUM({h}) AS CHAR)")
    }

    fn int_div(&self, a: &str, b: &str) -> String {
        format!("({a} DIV {b})")
    }

    fn int_text(&self, e: &str) -> String {
        format!("CAST({e} AS CHAR)")
    }

    fn text_int(&self, e: &str) -> String {
        format!("CAST({e} AS SIGNED)")
    }
}

/// A row-string expression after a sealed method's key, as one binary string: both
/// parts cast to BINARY, so the session's character set never reinterprets the key's
/// bytes (MariaDB refuses them as utf8mb4 under a strict sql_mode) and the row keeps
/// its utf8mb4 bytes.
fn keyed_bytes(row: &str, key: Option<&[u8; 32]>) -> String {
    match key {
        None => row.to_string(),
        Some(k) => format!(
            "CONCAT(CAST(X'{}' AS BINARY), CAST({row} AS BINARY))",
            hex::encode(k)
        ),
    }
}
