//! MySQL 8 and MariaDB 10.5 and later. Text is converted to utf8mb4 before it is
//! measured or hashed (MD5/SHA2 hash the bytes of the string's own character set);
//! ranges and ordering use the `utf8mb4_bin` collation; SUM over integers is an exact
//! DECIMAL; BIT_XOR is a native 64-bit aggregate. The session runs with
//! `time_zone = '+00:00'` so TIMESTAMP columns render in UTC.

use tally_common::checksum::HashMethod;
use tally_common::types::TypeClass;

use super::Dialect;
use crate::schema::{BoundColumn, ColumnInfo};

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

    fn quote(&self, ident: &str) -> String {
        format!("`{}`", ident.replace('`', "``"))
    }

    fn placeholder(&self, _n: usize) -> String {
        "?".into()
    }

    fn key_expr(&self, col: &ColumnInfo) -> String {
        match col.class {
            TypeClass::Text => format!(
                "CONVERT({} USING utf8mb4) COLLATE utf8mb4_bin",
                self.quote(&col.name)
            ),
            _ => self.quote(&col.name),
        }
    }

    fn key_param(&self, _n: usize, col: &ColumnInfo) -> String {
        match col.class {
            TypeClass::Text => "CONVERT(? USING utf8mb4) COLLATE utf8mb4_bin".into(),
            _ => "?".into(),
        }
    }

    fn canonical_expr(&self, col: &BoundColumn) -> Option<String> {
        let x = self.quote(&col.info.name);
        let f = col.spec.format;
        let s = f.scale;
        Some(match f.class {
            TypeClass::Integer | TypeClass::Boolean => format!("CAST({x} AS CHAR)"),
            TypeClass::Decimal => {
                let d = format!("CAST({x} AS DECIMAL(65, {s}))");
                format!("CASE WHEN {d} = 0 THEN '{}' ELSE CAST({d} AS CHAR) END", zero(s))
            }
            // MySQL doubles have no NaN or infinities; the text of a double is its
            // shortest round-trip form, read back exactly as a DECIMAL
            TypeClass::Float => {
                let d = format!("CAST(CAST({x} AS CHAR) AS DECIMAL(65, {s}))");
                format!("CASE WHEN {d} = 0 THEN '{}' ELSE CAST({d} AS CHAR) END", zero(s))
            }
            TypeClass::Text if f.fixed_char => format!("TRIM(TRAILING ' ' FROM CONVERT({x} USING utf8mb4))"),
            TypeClass::Text => format!("CONVERT({x} USING utf8mb4)"),
            TypeClass::Date => format!("DATE_FORMAT({x}, '%Y-%m-%d')"),
            TypeClass::Timestamp => {
                format!("CONCAT(DATE_FORMAT({x}, '%Y-%m-%dT%H:%i:%s'){})", fraction(&x, s))
            }
            TypeClass::TimestampTz => {
                format!(
                    "CONCAT(DATE_FORMAT({x}, '%Y-%m-%dT%H:%i:%s'){}, 'Z')",
                    fraction(&x, s)
                )
            }
            TypeClass::Time => format!("CONCAT(TIME_FORMAT({x}, '%H:%i:%s'){})", fraction(&x, s)),
            TypeClass::Uuid => format!("LOWER(CAST({x} AS CHAR))"),
            TypeClass::Binary => format!("LOWER(HEX({x}))"),
            // JSON is made canonical in the agent (RFC 8785), never in SQL
            TypeClass::Json | TypeClass::Other => return None,
        })
    }

    fn text_expr(&self, col: &BoundColumn) -> Option<String> {
        // the server's own text (sessions run in UTC): cheaper than DATE_FORMAT and
        // DECIMAL(65) casts. TIME stays in SQL: its text may be negative or past 24h.
        let x = self.quote(&col.info.name);
        let class = col.spec.format.class;
        if col.info.class != class {
            return None;
        }
        match class {
            TypeClass::Decimal | TypeClass::Float | TypeClass::Date | TypeClass::Timestamp => {
                Some(format!("CAST({x} AS CHAR)"))
            }
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

    fn row_hash_expr(&self, row: &str, method: HashMethod) -> Option<String> {
        Some(match method {
            HashMethod::Md5_48 => {
                format!("(CAST(CONV(LEFT(MD5({row}), 12), 16, 10) AS SIGNED) - 140737488355328)")
            }
            HashMethod::Sha256_64 => format!("CAST(CONV(LEFT(SHA2({row}, 256), 16), 16, 10) AS UNSIGNED)"),
        })
    }

    fn bucket_hash_expr(&self, key_row: &str) -> Option<String> {
        Some(format!(
            "CAST(CONV(LEFT(SHA2({key_row}, 256), 15), 16, 10) AS SIGNED)"
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

    fn week_start(&self, canonical: &str) -> Option<String> {
        Some(format!(
            "DATE_FORMAT(DATE(substr({canonical}, 1, 10)) - INTERVAL WEEKDAY(DATE(substr({canonical}, 1, 10))) DAY, '%Y-%m-%d')"
        ))
    }
}
