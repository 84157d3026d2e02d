//! Oracle Database 12.2 and later (`oracle://`). NOT LIVE-VERIFIED: no Oracle server
//! can run where this project's tests run; this SQL is golden-tested, parse-checked
//! under sqlglot's `oracle` dialect, and runs against a live server only where
//! `TALLY_TEST_ORACLE_URL` points at one (docs/engines.md).
//!
//! - The database character set must be AL32UTF8 (the agent refuses others, as it
//!   refuses non-UTF8 PostgreSQL databases): text is then concatenated as UTF-8, and
//!   `UTL_I18N.STRING_TO_RAW(.., 'AL32UTF8')` hands `STANDARD_HASH` its bytes. Never
//!   `CONVERT(.., 'UTF8')`, which is CESU-8.
//! - Numbers and times are rendered with `TO_CHAR` and fixed masks, with the NLS
//!   parameters written into each call; `DATE` carries a time, so it is a timestamp
//!   at precision 0. Zoned timestamps go to UTC through `SYS_EXTRACT_UTC`.
//! - An undeclared `NUMBER` is exact (its scale comes from the data) and is rendered in
//!   the agent; `BINARY_DOUBLE`/`FLOAT` likewise.
//! - Ranges and ordering compare the UTF-8 bytes of text keys as `RAW`.
//! - Oracle has no row-value range comparison (composite bounds are expanded), no
//!   `AS` before a table alias, and no 64-bit XOR aggregate before 21c: SUM only.
//! - `''` is NULL in Oracle. A row string longer than the `VARCHAR2` limit (4000
//!   bytes, or 32767 with `MAX_STRING_SIZE = EXTENDED`), or than the 2000-byte `RAW`
//!   that `UTL_I18N.STRING_TO_RAW` returns under `STANDARD`, makes the pushed-down query
//!   fail (ORA-01489 and the like, never a truncation): the default in-process path
//!   reads such rows and hashes them in the agent.

use tally_common::checksum::HashMethod;
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;

use super::Dialect;
use crate::schema::{BoundColumn, ColumnInfo, Native, TypeEntry};
use crate::watermark::WatermarkRead;

/// Statements every session runs once, after connecting.
pub const SESSION_SETTINGS: [&str; 3] = [
    "ALTER SESSION SET TIME_ZONE = '+00:00'",
    "ALTER SESSION SET NLS_NUMERIC_CHARACTERS = '.,'",
    "ALTER SESSION SET NLS_CALENDAR = 'GREGORIAN'",
];

/// A request's transaction: every query of it reads as of its start.
pub const BEGIN: &str = "SET TRANSACTION READ ONLY";

/// The database character set (must be AL32UTF8).
pub const CHARSET_SQL: &str =
    "SELECT value FROM nls_database_parameters WHERE parameter = 'NLS_CHARACTERSET'";

/// The optimizer's row estimate of a table (`:p1` owner, empty (NULL in Oracle) for the
/// session's schema; `:p2` table), as stored.
pub const ROW_ESTIMATE_SQL: &str = "SELECT NVL(num_rows, 0) FROM all_tables \
     WHERE owner = NVL(:p1, SYS_CONTEXT('USERENV', 'CURRENT_SCHEMA')) AND table_name = :p2";

/// The columns of a relation are read from an empty result of it (the driver's column
/// metadata), so a table and a query describe alike: `SELECT * FROM <rel> WHERE 1 = 0`.
pub fn describe_sql(relation: &str) -> String {
    format!("SELECT * FROM {relation} WHERE 1 = 0")
}

/// Oracle's type table: the driver's type name with its declared precision and scale
/// (`NUMBER` with precision 0 and scale -127 is an undeclared NUMBER). Every type not
/// listed is `Other`: it has no canonical form and a run naming it is refused.
pub fn classify(name: &str, precision: i32, scale: i32) -> TypeEntry {
    use TypeClass::*;
    match name {
        // NUMBER(p) and INTEGER (NUMBER(*,0)) hold whole numbers: integer keys
        "NUMBER" if scale == 0 => TypeEntry::of(Integer),
        "NUMBER" if precision == 0 || scale < 0 => TypeEntry::of(Decimal),
        "NUMBER" => TypeEntry::of(Decimal).scale(Some(scale as u32)),
        "BINARY_FLOAT" => TypeEntry::of(Float).native(Native::Float32),
        "BINARY_DOUBLE" => TypeEntry::of(Float),
        // FLOAT(p) is a decimal NUMBER of up to 38 digits, not an IEEE double: exact
        "FLOAT" => TypeEntry::of(Decimal),
        "BOOLEAN" => TypeEntry::of(Boolean),
        "CHAR" | "NCHAR" => TypeEntry::of(Text).fixed(),
        "VARCHAR2" | "NVARCHAR2" | "CLOB" | "NCLOB" | "LONG" => TypeEntry::of(Text),
        // a DATE carries a time of day, to the second
        "DATE" => TypeEntry::of(Timestamp).scale(Some(0)),
        "TIMESTAMP" => TypeEntry::of(Timestamp).scale(Some(precision.clamp(0, 9) as u32)),
        "TIMESTAMP WITH TIME ZONE" | "TIMESTAMP WITH LOCAL TIME ZONE" => {
            TypeEntry::of(TimestampTz).scale(Some(precision.clamp(0, 9) as u32))
        }
        "RAW" | "BLOB" | "LONG RAW" => TypeEntry::of(Binary),
        "JSON" => TypeEntry::of(Json),
        // intervals, ROWID, XMLTYPE, objects, collections, BFILE, vectors, …
        _ => TypeEntry::OTHER,
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Oracle;

/// The explicit NLS parameter of every number conversion.
const NLS_NUMBER: &str = "'NLS_NUMERIC_CHARACTERS = ''.,'''";

/// `YYYY-MM-DDTHH:MI:SS[.f…]` of a TIMESTAMP (or DATE) expression at `p` digits: nine
/// digits cut, never rounded, to `p`. A BC instant is marked so its text equals no
/// canonical text (it is reported as a difference, never as a match).
fn timestamp(x: &str, p: u32, suffix: &str) -> String {
    // a DATE has no fractional seconds for FF to format: every value is cast first
    let full = format!(
        "TO_CHAR(CAST({x} AS TIMESTAMP(9)), 'YYYY-MM-DD\"T\"HH24:MI:SS.FF9', 'NLS_CALENDAR = GREGORIAN')"
    );
    let cut = match p {
        0 => format!("SUBSTR({full}, 1, 19)"),
        1..=9 => format!("SUBSTR({full}, 1, {})", 20 + p),
        _ => format!("RPAD({full}, {}, '0')", 20 + p),
    };
    format!(
        "CASE WHEN {x} IS NULL THEN NULL WHEN EXTRACT(YEAR FROM {x}) < 1 THEN 'BC:' || {cut} ELSE {cut}{suffix} END"
    )
}

/// A name as Oracle stores an unquoted one: lower-case names in upper case.
pub fn fold(name: &str) -> String {
    if name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '$' | '#'))
    {
        name.to_ascii_uppercase()
    } else {
        name.to_string()
    }
}

/// A text expression's UTF-8 bytes (the database character set is AL32UTF8).
fn utf8_raw(e: &str) -> String {
    format!("UTL_I18N.STRING_TO_RAW({e}, 'AL32UTF8')")
}

impl Dialect for Oracle {
    fn name(&self) -> &'static str {
        "oracle"
    }

    /// As written: column names come from the driver's describe, spelled as stored.
    fn quote(&self, ident: &str) -> String {
        format!("\"{}\"", ident.replace('"', "\"\""))
    }

    /// Oracle folds unquoted names to upper case: a configured table name written in
    /// lower case (as configs usually are) is quoted in upper case, any other as written.
    fn table_part(&self, part: &str) -> String {
        self.quote(&fold(part))
    }

    fn key_literal(&self, v: &KeyPart, col: &ColumnInfo) -> String {
        match (v, col.class) {
            (KeyPart::Text(_), TypeClass::Text) => utf8_raw(&self.literal(v)),
            _ => self.literal(v),
        }
    }

    /// Bound by position, in order of appearance (each value is bound once per use).
    fn placeholder(&self, n: usize) -> String {
        format!(":p{n}")
    }

    fn literal(&self, v: &KeyPart) -> String {
        match v {
            KeyPart::Int(i) => i.to_string(),
            KeyPart::Text(s) => format!(
                "UTL_I18N.RAW_TO_CHAR(HEXTORAW('{}'), 'AL32UTF8')",
                hex::encode_upper(s)
            ),
        }
    }

    fn key_expr(&self, col: &ColumnInfo) -> String {
        match col.class {
            // CHAR(n) keys compare without their padding, as their canonical text does
            TypeClass::Text if col.fixed_char => utf8_raw(&format!("RTRIM({}, ' ')", self.quote(&col.name))),
            TypeClass::Text => utf8_raw(&self.quote(&col.name)),
            _ => self.quote(&col.name),
        }
    }

    fn key_param(&self, n: usize, col: &ColumnInfo) -> String {
        match col.class {
            TypeClass::Text => utf8_raw(&self.placeholder(n)),
            _ => self.placeholder(n),
        }
    }

    fn bytewise(&self, e: &str) -> String {
        utf8_raw(e)
    }

    fn canonical_expr(&self, col: &BoundColumn) -> Option<String> {
        let x = self.quote(&col.info.name);
        let f = col.spec.format;
        let s = f.scale;
        Some(match f.class {
            TypeClass::Integer => format!("TO_CHAR({x}, 'TM9', {NLS_NUMBER})"),
            // floats, booleans and undeclared scales are made canonical in the agent
            TypeClass::Decimal if col.info.class != TypeClass::Decimal || f.exact => return None,
            TypeClass::Decimal => {
                // 38 integer digits whatever the scale: a declared NUMBER(p,s) (p <= 38,
                // s >= 0) never needs more, so the mask cannot overflow to '####' (an
                // undeclared or negative-scale NUMBER is rendered in the agent)
                let frac = if s == 0 {
                    String::new()
                } else {
                    format!(".{}", "0".repeat(s as usize))
                };
                format!("TO_CHAR({x}, 'FM{}0{frac}', {NLS_NUMBER})", "9".repeat(37))
            }
            TypeClass::Float | TypeClass::Boolean => return None,
            TypeClass::Text if col.info.native != Native::Plain => return None,
            // RTRIM of an all-blank CHAR is NULL in Oracle, not '': rendered in the agent
            TypeClass::Text if f.fixed_char => return None,
            TypeClass::Text if col.info.declared_type.contains("LOB") => return None,
            TypeClass::Text => format!("TO_CHAR({x})"),
            TypeClass::Date => format!("SUBSTR({}, 1, 10)", timestamp(&x, 0, "")),
            TypeClass::Timestamp => timestamp(&x, s, ""),
            TypeClass::TimestampTz => {
                let u = match (&col.zone, col.info.class) {
                    (Some(z), TypeClass::Timestamp) => {
                        format!("SYS_EXTRACT_UTC(FROM_TZ(CAST({x} AS TIMESTAMP(9)), '{z}'))")
                    }
                    (_, TypeClass::Timestamp) => x.clone(),
                    _ => format!("SYS_EXTRACT_UTC({x})"),
                };
                timestamp(&u, s, " || 'Z'")
            }
            TypeClass::Binary if col.info.class == TypeClass::Text => {
                format!("LOWER(RAWTOHEX({}))", utf8_raw(&x))
            }
            TypeClass::Binary if col.info.declared_type.contains("LOB") => return None,
            TypeClass::Binary => format!("LOWER(RAWTOHEX({x}))"),
            TypeClass::Time | TypeClass::Uuid | TypeClass::Json | TypeClass::Other => return None,
        })
    }

    fn field_expr(&self, canonical: &str) -> String {
        // || reads NULL as '': the NULL test comes first
        format!(
            "CASE WHEN {canonical} IS NULL THEN '~' ELSE TO_CHAR(LENGTHB({canonical})) || ':' || {canonical} END"
        )
    }

    fn concat(&self, parts: &[String]) -> String {
        parts.join(" || ")
    }

    fn row_hash_expr(&self, row: &str, method: HashMethod, key: Option<&[u8; 32]>) -> Option<String> {
        let bytes = keyed_bytes(row, key);
        Some(match method.base() {
            HashMethod::Md5_48 => format!(
                "(TO_NUMBER(RAWTOHEX(UTL_RAW.SUBSTR(STANDARD_HASH({bytes}, 'MD5'), 1, 6)), 'XXXXXXXXXXXX') - 140737488355328)"
            ),
            _ => format!(
                "TO_NUMBER(RAWTOHEX(UTL_RAW.SUBSTR(STANDARD_HASH({bytes}, 'SHA256'), 1, 8)), 'XXXXXXXXXXXXXXXX')"
            ),
        })
    }

    fn bucket_hash_expr(&self, key_row: &str, key: Option<&[u8; 32]>) -> Option<String> {
        // the top 60 bits: the first 15 hex digits
        Some(format!(
            "TO_NUMBER(SUBSTR(RAWTOHEX(STANDARD_HASH({}, 'SHA256')), 1, 15), 'XXXXXXXXXXXXXXX')",
            keyed_bytes(key_row, key)
        ))
    }

    fn xor_aggregate(&self, _h: &str) -> Option<String> {
        None
    }

    fn sum_text(&self, h: &str) -> String {
        format!("TO_CHAR(SUM({h}), 'TM9', {NLS_NUMBER})")
    }

    fn watermark_sql(&self, read: &WatermarkRead) -> Option<String> {
        match read {
            WatermarkRead::Query(q) => Some(format!("SELECT CAST(({q}) AS VARCHAR2(4000)) FROM DUAL")),
            _ => None,
        }
    }

    fn int_div(&self, a: &str, b: &str) -> String {
        format!("TRUNC({a} / {b})")
    }

    fn int_mod(&self, a: &str, b: &str) -> String {
        format!("MOD({a}, {b})")
    }

    fn text_int(&self, e: &str) -> String {
        format!("TO_NUMBER({e})")
    }

    fn int_text(&self, e: &str) -> String {
        format!("TO_CHAR({e}, 'TM9', {NLS_NUMBER})")
    }

    fn row_values(&self) -> bool {
        false
    }

    fn substr(&self, e: &str, start: usize, len: usize) -> String {
        format!("SUBSTR({e}, {start}, {len})")
    }

    fn fixed_statements(&self) -> Vec<(&'static str, &'static str)> {
        let mut v: Vec<(&'static str, &'static str)> =
            SESSION_SETTINGS.iter().map(|s| ("session setting", *s)).collect();
        v.extend([
            ("begin a request", BEGIN),
            ("database character set", CHARSET_SQL),
            ("row estimate", ROW_ESTIMATE_SQL),
        ]);
        v
    }
}

/// The bytes a checksum hashes: a sealed method's key, then the row string's UTF-8.
fn keyed_bytes(row: &str, key: Option<&[u8; 32]>) -> String {
    let row = utf8_raw(row);
    match key {
        None => row,
        Some(k) => format!("UTL_RAW.CONCAT(HEXTORAW('{}'), {row})", hex::encode_upper(k)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_type_table_keeps_number_scales_apart() {
        assert_eq!(classify("NUMBER", 10, 0).class, TypeClass::Integer);
        assert_eq!(classify("NUMBER", 0, 0).class, TypeClass::Integer); // INTEGER
        let undeclared = classify("NUMBER", 0, -127);
        assert_eq!((undeclared.class, undeclared.scale), (TypeClass::Decimal, None));
        let money = classify("NUMBER", 12, 2);
        assert_eq!((money.class, money.scale), (TypeClass::Decimal, Some(2)));
        let d = classify("DATE", 0, 0);
        assert_eq!((d.class, d.scale), (TypeClass::Timestamp, Some(0)));
        assert_eq!(classify("TIMESTAMP WITH TIME ZONE", 3, 0).scale, Some(3));
        assert!(classify("CHAR", 0, 0).fixed);
        for other in ["INTERVAL DAY TO SECOND", "ROWID", "XMLTYPE", "BFILE"] {
            assert_eq!(classify(other, 0, 0).class, TypeClass::Other, "{other}");
        }
    }

    #[test]
    fn configured_lower_case_table_names_fold_and_described_columns_do_not() {
        assert_eq!(Oracle.table_part("orders"), "\"ORDERS\"");
        assert_eq!(Oracle.table_part("ORDER_ID"), "\"ORDER_ID\"");
        assert_eq!(Oracle.table_part("Mixed"), "\"Mixed\"");
        // a column is quoted as the describe spelled it: a quoted lower-case column stays
        assert_eq!(Oracle.quote("amount"), "\"amount\"");
        assert_eq!(Oracle.quote("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn float_is_an_exact_decimal_and_char_is_rendered_in_the_agent() {
        use tally_common::canonical::FieldFormat;
        use tally_common::segment::ColumnSpec;
        let f = classify("FLOAT", 126, 0);
        assert_eq!((f.class, f.scale), (TypeClass::Decimal, None));
        let fixed = BoundColumn {
            info: classify("CHAR", 0, 0).column("CODE".into(), "CHAR(3)".into(), true),
            spec: ColumnSpec {
                name: "CODE".into(),
                format: FieldFormat::new(TypeClass::Text).fixed_char(true),
            },
            zone: None,
        };
        assert_eq!(Oracle.canonical_expr(&fixed), None);
        // a resolved scale larger than the column's never overflows the mask
        let money = BoundColumn {
            info: classify("NUMBER", 38, 2).column("AMOUNT".into(), "NUMBER(38,2)".into(), true),
            spec: ColumnSpec {
                name: "AMOUNT".into(),
                format: FieldFormat::new(TypeClass::Decimal).with_scale(10),
            },
            zone: None,
        };
        let e = Oracle.canonical_expr(&money).unwrap();
        assert!(
            e.contains(&format!("'FM{}0.{}'", "9".repeat(37), "0".repeat(10))),
            "{e}"
        );
    }

    #[test]
    fn literals_carry_utf8_hex_only() {
        assert_eq!(
            Oracle.literal(&KeyPart::Text("é'".into())),
            "UTL_I18N.RAW_TO_CHAR(HEXTORAW('C3A927'), 'AL32UTF8')"
        );
    }
}
