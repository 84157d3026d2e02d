//! PostgreSQL (12 and later). Everything pushes down: the canonical text per type
//! class, MD5 and SHA-256 of the row string (`convert_to(.., 'UTF8')`, never a bytea
//! cast, which would parse backslash escapes), exact `SUM` over `bigint` (numeric) and
//! `bit_xor` (PostgreSQL 14 and later; older servers compare SUM only).

use tally_common::checksum::HashMethod;
use tally_common::types::TypeClass;

use super::Dialect;
use crate::schema::{BoundColumn, ColumnInfo};

#[derive(Debug, Clone, Copy)]
pub struct Postgres {
    /// `bit_xor(bigint)` exists from PostgreSQL 14.
    pub has_bit_xor: bool,
}

impl Default for Postgres {
    fn default() -> Self {
        Postgres { has_bit_xor: true }
    }
}

/// `.` and the first `p` digits of the microseconds, or nothing at precision 0.
fn fraction(us: &str, p: u32) -> String {
    match p {
        0 => String::new(),
        1..=6 => format!(" || '.' || substr({us}, 1, {p})"),
        _ => format!(" || '.' || rpad({us}, {p}, '0')"),
    }
}

impl Dialect for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn quote(&self, ident: &str) -> String {
        format!("\"{}\"", ident.replace('"', "\"\""))
    }

    fn placeholder(&self, n: usize) -> String {
        format!("${n}")
    }

    fn key_expr(&self, col: &ColumnInfo) -> String {
        match col.class {
            TypeClass::Text => format!("{} COLLATE \"C\"", self.quote(&col.name)),
            _ => self.quote(&col.name),
        }
    }

    fn key_param(&self, n: usize, col: &ColumnInfo) -> String {
        match col.class {
            TypeClass::Integer => format!("${n}::bigint"),
            _ => format!("${n}::text"),
        }
    }

    fn canonical_expr(&self, col: &BoundColumn) -> Option<String> {
        let x = self.quote(&col.info.name);
        let f = col.spec.format;
        let s = f.scale;
        Some(match f.class {
            TypeClass::Integer => match col.info.class {
                TypeClass::Boolean => format!("CASE WHEN {x} THEN '1' WHEN NOT {x} THEN '0' END"),
                TypeClass::Decimal => format!("round({x}, 0)::text"),
                _ => format!("{x}::text"),
            },
            TypeClass::Decimal => {
                let zero = if s == 0 {
                    "0".to_string()
                } else {
                    format!("0.{}", "0".repeat(s as usize))
                };
                format!(
                    "CASE WHEN round({x}::numeric, {s}) = 0 THEN '{zero}' ELSE round({x}::numeric, {s})::text END"
                )
            }
            TypeClass::Float => {
                let zero = if s == 0 {
                    "0".to_string()
                } else {
                    format!("0.{}", "0".repeat(s as usize))
                };
                // float8 text is the shortest round-trip decimal (extra_float_digits >= 1,
                // set per connection); numeric input reads its exponent form exactly
                format!(
                    "CASE WHEN {x} = 'NaN'::float8 THEN 'NaN' WHEN {x} = 'Infinity'::float8 THEN 'Infinity' \
                     WHEN {x} = '-Infinity'::float8 THEN '-Infinity' \
                     WHEN round({x}::float8::text::numeric, {s}) = 0 THEN '{zero}' \
                     ELSE round({x}::float8::text::numeric, {s})::text END"
                )
            }
            TypeClass::Boolean => match col.info.class {
                TypeClass::Integer => format!("{x}::text"),
                // NULL matches neither branch and stays NULL
                _ => format!("CASE WHEN {x} THEN '1' WHEN NOT {x} THEN '0' END"),
            },
            TypeClass::Text if f.fixed_char => format!("rtrim({x}::text, ' ')"),
            TypeClass::Text => format!("{x}::text"),
            TypeClass::Date => format!("to_char({x}, 'YYYY-MM-DD')"),
            TypeClass::Timestamp => {
                format!(
                    "to_char({x}, 'YYYY-MM-DD\"T\"HH24:MI:SS'){}",
                    fraction(&format!("to_char({x}, 'US')"), s)
                )
            }
            TypeClass::TimestampTz => {
                let u = format!("({x} AT TIME ZONE 'UTC')");
                format!(
                    "to_char({u}, 'YYYY-MM-DD\"T\"HH24:MI:SS'){} || 'Z'",
                    fraction(&format!("to_char({u}, 'US')"), s)
                )
            }
            TypeClass::Time => {
                let i = format!("{x}::interval");
                format!(
                    "to_char({i}, 'HH24:MI:SS'){}",
                    fraction(&format!("to_char({i}, 'US')"), s)
                )
            }
            TypeClass::Uuid => format!("{x}::text"),
            TypeClass::Binary => format!("encode({x}, 'hex')"),
            // JSON is made canonical in the agent (RFC 8785), never in SQL
            TypeClass::Json | TypeClass::Other => return None,
        })
    }

    fn text_expr(&self, col: &BoundColumn) -> Option<String> {
        // the output functions under the agent's session settings (DateStyle ISO,
        // TimeZone UTC, extra_float_digits 1): far cheaper than to_char and round
        let x = self.quote(&col.info.name);
        let class = col.spec.format.class;
        if col.info.class != class {
            return None;
        }
        match class {
            TypeClass::Decimal
            | TypeClass::Date
            | TypeClass::Timestamp
            | TypeClass::TimestampTz
            | TypeClass::Time => Some(format!("{x}::text")),
            TypeClass::Float => Some(format!("{x}::float8::text")),
            _ => None,
        }
    }

    fn field_expr(&self, canonical: &str) -> String {
        format!("COALESCE(octet_length({canonical})::text || ':' || {canonical}, '~')")
    }

    fn concat(&self, parts: &[String]) -> String {
        if parts.len() == 1 {
            parts[0].clone()
        } else {
            format!("({})", parts.join(" || "))
        }
    }

    fn row_hash_expr(&self, row: &str, method: HashMethod) -> Option<String> {
        Some(match method {
            HashMethod::Md5_48 => {
                format!(
                    "(('x' || substr(md5(convert_to({row}, 'UTF8')), 1, 12))::bit(48)::bigint - 140737488355328)"
                )
            }
            HashMethod::Sha256_64 => {
                format!(
                    "('x' || substr(encode(sha256(convert_to({row}, 'UTF8')), 'hex'), 1, 16))::bit(64)::bigint"
                )
            }
        })
    }

    fn bucket_hash_expr(&self, key_row: &str) -> Option<String> {
        Some(format!(
            "('x' || substr(encode(sha256(convert_to({key_row}, 'UTF8')), 'hex'), 1, 15))::bit(60)::bigint"
        ))
    }

    fn xor_aggregate(&self, h: &str) -> Option<String> {
        self.has_bit_xor.then(|| format!("bit_xor({h})::text"))
    }

    fn sum_text(&self, h: &str) -> String {
        format!("SUM({h})::text")
    }

    fn int_div(&self, a: &str, b: &str) -> String {
        format!("({a} / {b})")
    }

    fn fence(&self) -> &'static str {
        // without it PostgreSQL inlines the row hash into SUM and bit_xor: computed twice
        " OFFSET 0"
    }

    fn int_text(&self, e: &str) -> String {
        format!("({e})::text")
    }

    fn week_start(&self, canonical: &str) -> Option<String> {
        Some(format!(
            "to_char(date_trunc('week', substr({canonical}, 1, 10)::date), 'YYYY-MM-DD')"
        ))
    }
}
