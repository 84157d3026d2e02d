//! SQL Server 2019 and later (`mssql://`). NOT LIVE-VERIFIED: no SQL Server can run
//! where this project's tests run; this SQL is golden-tested, parse-checked under
//! sqlglot's `tsql` dialect, and runs against a live server only where
//! `TALLY_TEST_MSSQL_URL` points at one (docs/engines.md).
//!
//! - Text is hashed as UTF-8: a value is cast to `NVARCHAR(MAX)`, given a `_UTF8`
//!   collation and converted to `VARCHAR(MAX)`, whose bytes are then UTF-8 whatever
//!   the column's or the database's code page (SQL Server 2019 brought UTF-8
//!   collations). The row string starts from a `VARCHAR(MAX)`, so `CONCAT` never cuts
//!   it at 8,000 bytes.
//! - Ranges and ordering compare those UTF-8 bytes as `VARBINARY(MAX)`: code point
//!   order like every other engine, where `NVARCHAR` under a `BIN2` collation would
//!   compare UTF-16 code units and ignore trailing spaces.
//! - Checksums: `HASHBYTES('SHA2_256' | 'MD5')`, the 64- or 48-bit slice as a
//!   `BIGINT`, summed as `DECIMAL(38, 0)` and reduced mod 2^64 in the agent (a signed
//!   slice differs from the unsigned one by a multiple of 2^64). SQL Server has no
//!   64-bit XOR aggregate: SUM only, stated in the result.
//! - Canonical text through `CONVERT` with fixed styles (23 date, 108 time, 2 hex),
//!   never `FORMAT`, whose output follows the session's culture.
//! - Requests read under SNAPSHOT isolation (the database needs
//!   `ALLOW_SNAPSHOT_ISOLATION ON`): REPEATABLE READ would hold shared locks on a
//!   production primary.

use tally_common::checksum::HashMethod;
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;

use super::Dialect;
use crate::schema::{BoundColumn, ColumnInfo, Declared, Native, TypeEntry};
use crate::watermark::WatermarkRead;

/// The collation that makes a `VARCHAR` hold UTF-8 (SQL Server 2019+).
pub const UTF8: &str = "Latin1_General_100_BIN2_UTF8";

/// A binary collation for comparing hex texts by their bytes.
const BIN2: &str = "Latin1_General_100_BIN2";

/// The base name of a declared type (`decimal(10,2)` → `decimal`).
fn base_type(declared: &str) -> String {
    declared
        .split('(')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Statements every session runs once, after connecting: settings that decide how
/// the SQL below parses and what its text functions return.
pub const SESSION_SETTINGS: &str = "SET ANSI_NULLS ON; SET QUOTED_IDENTIFIER ON; SET CONCAT_NULL_YIELDS_NULL ON; \
     SET ANSI_WARNINGS ON; SET ARITHABORT ON; SET DATEFORMAT ymd; SET LANGUAGE us_english; SET NOCOUNT ON";

/// A request's transaction: one snapshot for every statement of the request.
pub const BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL SNAPSHOT; BEGIN TRANSACTION";

/// The server's version.
pub const VERSION_SQL: &str = "SELECT CAST(SERVERPROPERTY('ProductVersion') AS NVARCHAR(128))";

/// The columns of a table or a query (`@P1` is `SELECT * FROM <relation>`): name,
/// declared type with its arguments (`decimal(10,2)`, `datetime2(3)`), nullability.
/// The same DMV describes both, so a table and the query over it classify alike.
pub const COLUMNS_SQL: &str = "SELECT name, system_type_name, CAST(is_nullable AS INT), CAST(error_number AS INT) \
     FROM sys.dm_exec_describe_first_result_set(@P1, NULL, 0) ORDER BY column_ordinal";

/// A table's row estimate from its heap or clustered index (`@P1`: the quoted name).
pub const ROW_ESTIMATE_SQL: &str = "SELECT CAST(COALESCE(SUM(p.rows), 0) AS BIGINT) FROM sys.partitions p \
     WHERE p.object_id = OBJECT_ID(@P1) AND p.index_id IN (0, 1)";

/// SQL Server's type table, by `system_type_name` (`decimal(10,2)`, `datetime2(7)`,
/// `nvarchar(max)`). Every type not listed is `Other`: it has no canonical form and a
/// run naming it is refused.
pub fn classify(system_type_name: &str) -> TypeEntry {
    use TypeClass::*;
    let d = Declared::parse(&system_type_name.to_ascii_lowercase().replace("(max)", ""));
    match d.base.as_str() {
        "bigint" | "int" | "smallint" | "tinyint" => TypeEntry::of(Integer),
        "bit" => TypeEntry::of(Boolean),
        "decimal" | "numeric" => TypeEntry::of(Decimal).scale(Some(d.arg(1).unwrap_or(0))),
        "money" | "smallmoney" => TypeEntry::of(Decimal).scale(Some(4)),
        // float(1..24) is real: four bytes
        "real" => TypeEntry::of(Float).native(Native::Float32),
        "float" if d.arg(0).is_some_and(|n| n <= 24) => TypeEntry::of(Float).native(Native::Float32),
        "float" => TypeEntry::of(Float),
        "char" | "nchar" => TypeEntry::of(Text).fixed(),
        "varchar" | "nvarchar" | "text" | "ntext" | "sysname" => TypeEntry::of(Text),
        "date" => TypeEntry::of(Date),
        "datetime2" => TypeEntry::of(Timestamp).scale(Some(d.arg(0).unwrap_or(7))),
        // 1/300 s, shown (and cut) as milliseconds
        "datetime" => TypeEntry::of(Timestamp).scale(Some(3)),
        "smalldatetime" => TypeEntry::of(Timestamp).scale(Some(0)),
        "datetimeoffset" => TypeEntry::of(TimestampTz).scale(Some(d.arg(0).unwrap_or(7))),
        "time" => TypeEntry::of(Time).scale(Some(d.arg(0).unwrap_or(7))),
        "uniqueidentifier" => TypeEntry::of(Uuid),
        "binary" => TypeEntry::of(Binary).fixed(),
        "varbinary" | "image" => TypeEntry::of(Binary),
        // xml, sql_variant, hierarchyid, geometry, geography, rowversion, json, vector, …
        _ => TypeEntry::OTHER,
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct MsSql;

/// A text expression (any character type, or a parameter) as UTF-8 `VARCHAR(MAX)`.
fn utf8(e: &str) -> String {
    format!("CONVERT(VARCHAR(MAX), CAST({e} AS NVARCHAR(MAX)) COLLATE {UTF8})")
}

/// The fraction of a temporal expression at `p` digits (SQL Server keeps 7: 100 ns).
fn fraction(x: &str, p: u32) -> String {
    let digits = format!("RIGHT(CONCAT('000000', DATEPART(NANOSECOND, {x}) / 100), 7)");
    match p {
        0 => String::new(),
        1..=7 => format!(", '.', LEFT({digits}, {p})"),
        _ => format!(", '.', {digits}, REPLICATE('0', {})", p - 7),
    }
}

/// A `datetime` (1/300 s) or `smalldatetime` as the `datetime2` SQL Server displays:
/// rounded to milliseconds (`.187`, where `DATEPART(NANOSECOND, ..)` of the `datetime`
/// reads 186,666,666 from compatibility level 130), as the agent renders the driver's
/// value.
fn as_datetime2(x: &str, declared: &str) -> String {
    match base_type(declared).as_str() {
        "datetime" => format!("CAST({x} AS DATETIME2(3))"),
        "smalldatetime" => format!("CAST({x} AS DATETIME2(0))"),
        _ => x.to_string(),
    }
}

/// `CONCAT(parts)` that stays NULL when `x` is NULL (CONCAT reads NULL as '', which
/// would turn a NULL time into the text `T.`).
fn concat_of(x: &str, parts: &str) -> String {
    format!("CASE WHEN {x} IS NULL THEN NULL ELSE CONCAT({parts}) END")
}

/// `YYYY-MM-DDTHH:MM:SS[.f…]` (and `suffix`) of a `datetime2`-like expression.
fn timestamp(x: &str, p: u32, suffix: &str) -> String {
    concat_of(
        x,
        &format!(
            "CONVERT(VARCHAR(10), {x}, 23), 'T', CONVERT(VARCHAR(8), {x}, 108){}{suffix}",
            fraction(x, p)
        ),
    )
}

impl Dialect for MsSql {
    fn name(&self) -> &'static str {
        "mssql"
    }

    fn quote(&self, ident: &str) -> String {
        format!("[{}]", ident.replace(']', "]]"))
    }

    fn placeholder(&self, n: usize) -> String {
        format!("@P{n}")
    }

    fn literal(&self, v: &KeyPart) -> String {
        match v {
            KeyPart::Int(i) => i.to_string(),
            // UTF-16LE bytes read as NVARCHAR: no collation or code page involved
            KeyPart::Text(s) => {
                let utf16: Vec<u8> = s.encode_utf16().flat_map(u16::to_le_bytes).collect();
                format!("CONVERT(NVARCHAR(MAX), 0x{})", hex::encode(utf16))
            }
        }
    }

    fn key_expr(&self, col: &ColumnInfo) -> String {
        match col.class {
            // CHAR(n) keys compare without their padding, as their canonical text does
            TypeClass::Text if col.fixed_char => self.bytewise(&format!("RTRIM({})", self.quote(&col.name))),
            TypeClass::Text => self.bytewise(&self.quote(&col.name)),
            _ => self.quote(&col.name),
        }
    }

    fn key_param(&self, n: usize, col: &ColumnInfo) -> String {
        match col.class {
            TypeClass::Text => self.bytewise(&self.placeholder(n)),
            _ => self.placeholder(n),
        }
    }

    /// The UTF-8 bytes as uppercase hex under a binary collation: VARBINARY comparisons
    /// ignore trailing zero bytes (`'k'` = `'k' + NCHAR(0)`), hex text does not (a
    /// shorter text is padded with spaces, which sort below every hex digit).
    fn bytewise(&self, e: &str) -> String {
        format!(
            "CONVERT(VARCHAR(MAX), CONVERT(VARBINARY(MAX), {}), 2) COLLATE {BIN2}",
            utf8(e)
        )
    }

    fn key_literal(&self, v: &KeyPart, col: &ColumnInfo) -> String {
        match (v, col.class) {
            (KeyPart::Text(_), TypeClass::Text) => self.bytewise(&self.literal(v)),
            _ => self.literal(v),
        }
    }

    /// Character columns arrive as NVARCHAR (tiberius does not decode `_UTF8` VARCHAR
    /// collations), money as an exact DECIMAL (tiberius reads it through a double).
    fn raw_expr(&self, col: &BoundColumn) -> String {
        let x = self.quote(&col.info.name);
        match base_type(&col.info.declared_type).as_str() {
            "char" | "varchar" | "text" => format!("CAST({x} AS NVARCHAR(MAX))"),
            "money" | "smallmoney" => format!("CAST({x} AS DECIMAL(19, 4))"),
            _ => x,
        }
    }

    /// By length: VARBINARY equality ignores trailing zero bytes, so `NCHAR(0)` would
    /// compare equal to `''`.
    fn is_empty_text(&self, e: &str) -> String {
        format!("DATALENGTH({e}) = 0")
    }

    fn canonical_expr(&self, col: &BoundColumn) -> Option<String> {
        let x = self.quote(&col.info.name);
        let f = col.spec.format;
        let s = f.scale;
        Some(match f.class {
            TypeClass::Integer | TypeClass::Boolean => format!("CONVERT(VARCHAR(48), {x})"),
            // floats (and undeclared scales) are made canonical in the agent
            TypeClass::Decimal if col.info.class == TypeClass::Float || f.exact => return None,
            TypeClass::Decimal => format!("CONVERT(VARCHAR(48), CAST({x} AS DECIMAL(38, {s})))"),
            TypeClass::Float => return None,
            TypeClass::Text if f.fixed_char => utf8(&format!("RTRIM({x})")),
            TypeClass::Text => utf8(&x),
            TypeClass::Date => format!("CONVERT(VARCHAR(10), {x}, 23)"),
            TypeClass::Timestamp => timestamp(&as_datetime2(&x, &col.info.declared_type), s, ""),
            TypeClass::TimestampTz => {
                let t = as_datetime2(&x, &col.info.declared_type);
                let u = match (&col.zone, col.info.class) {
                    (Some(z), TypeClass::Timestamp) => {
                        format!("CAST(SWITCHOFFSET(TODATETIMEOFFSET({t}, '{z}'), '+00:00') AS DATETIME2(7))")
                    }
                    (_, TypeClass::Timestamp) => t,
                    _ => format!("CAST(SWITCHOFFSET({x}, '+00:00') AS DATETIME2(7))"),
                };
                timestamp(&u, s, ", 'Z'")
            }
            TypeClass::Time => concat_of(&x, &format!("CONVERT(VARCHAR(8), {x}, 108){}", fraction(&x, s))),
            TypeClass::Uuid => format!("LOWER(CONVERT(VARCHAR(36), {x}))"),
            TypeClass::Binary if col.info.class == TypeClass::Text => {
                format!(
                    "LOWER(CONVERT(VARCHAR(MAX), CONVERT(VARBINARY(MAX), {}), 2))",
                    utf8(&x)
                )
            }
            // BINARY(n)'s trailing zero bytes are dropped in the agent
            TypeClass::Binary if f.fixed_char => return None,
            TypeClass::Binary => format!("LOWER(CONVERT(VARCHAR(MAX), {x}, 2))"),
            TypeClass::Json | TypeClass::Other => return None,
        })
    }

    fn field_expr(&self, canonical: &str) -> String {
        // CONCAT reads NULL as '': the NULL test comes first
        format!(
            "CASE WHEN {canonical} IS NULL THEN '~' ELSE CONCAT(DATALENGTH({canonical}), ':', {canonical}) END"
        )
    }

    fn concat(&self, parts: &[String]) -> String {
        // a VARCHAR(MAX) first: CONCAT of shorter types stops at 8,000 bytes
        format!("CONCAT(CAST('' AS VARCHAR(MAX)), {})", parts.join(", "))
    }

    fn row_hash_expr(&self, row: &str, method: HashMethod, key: Option<&[u8; 32]>) -> Option<String> {
        let bytes = keyed_bytes(row, key);
        Some(match method.base() {
            HashMethod::Md5_48 => format!(
                "CAST(CONVERT(BIGINT, SUBSTRING(HASHBYTES('MD5', {bytes}), 1, 6)) - 140737488355328 AS DECIMAL(38, 0))"
            ),
            _ => format!(
                "CAST(CONVERT(BIGINT, SUBSTRING(HASHBYTES('SHA2_256', {bytes}), 1, 8)) AS DECIMAL(38, 0))"
            ),
        })
    }

    fn bucket_hash_expr(&self, key_row: &str, key: Option<&[u8; 32]>) -> Option<String> {
        // the top 60 bits: seven bytes, then the high half of the eighth
        let h = format!("HASHBYTES('SHA2_256', {})", keyed_bytes(key_row, key));
        Some(format!(
            "(CONVERT(BIGINT, SUBSTRING({h}, 1, 7)) * 16 + CONVERT(BIGINT, SUBSTRING({h}, 8, 1)) / 16)"
        ))
    }

    fn xor_aggregate(&self, _h: &str) -> Option<String> {
        None
    }

    fn sum_text(&self, h: &str) -> String {
        format!("CONVERT(VARCHAR(48), SUM({h}))")
    }

    fn watermark_sql(&self, read: &WatermarkRead) -> Option<String> {
        match read {
            WatermarkRead::Query(q) => Some(format!("SELECT CAST(({q}) AS NVARCHAR(4000))")),
            _ => None,
        }
    }

    fn int_div(&self, a: &str, b: &str) -> String {
        // BIGINT division truncates (both sides are non-negative here); a literal past
        // 2^31 is a DECIMAL in T-SQL, whose division would keep a fraction
        format!("(CAST({a} AS BIGINT) / CAST({b} AS BIGINT))")
    }

    fn int_text(&self, e: &str) -> String {
        format!("CONVERT(VARCHAR(20), {e})")
    }

    fn row_values(&self) -> bool {
        false
    }

    fn substr(&self, e: &str, start: usize, len: usize) -> String {
        format!("SUBSTRING({e}, {start}, {len})")
    }

    fn count_all(&self) -> &'static str {
        "COUNT_BIG(*)"
    }

    fn fixed_statements(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            ("session settings", SESSION_SETTINGS),
            ("begin a request", BEGIN),
            ("server version", VERSION_SQL),
            ("columns of a table or query", COLUMNS_SQL),
            ("row estimate", ROW_ESTIMATE_SQL),
        ]
    }
}

/// The bytes a checksum hashes: a sealed method's key, then the row string's UTF-8.
fn keyed_bytes(row: &str, key: Option<&[u8; 32]>) -> String {
    let row = format!("CONVERT(VARBINARY(MAX), {row})");
    match key {
        None => row,
        Some(k) => format!("CONVERT(VARBINARY(MAX), 0x{}) + {row}", hex::encode(k)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_type_table_reads_declared_arguments() {
        let e = classify("decimal(12,3)");
        assert_eq!((e.class, e.scale), (TypeClass::Decimal, Some(3)));
        assert_eq!(classify("datetime2(3)").scale, Some(3));
        assert_eq!(classify("datetime2").scale, Some(7));
        assert_eq!(classify("datetimeoffset(0)").class, TypeClass::TimestampTz);
        assert_eq!(classify("nvarchar(max)").class, TypeClass::Text);
        assert!(classify("nchar(10)").fixed);
        assert_eq!(classify("float(24)").native, Native::Float32);
        assert_eq!(classify("float(53)").native, Native::Plain);
        for other in [
            "xml",
            "sql_variant",
            "geography",
            "hierarchyid",
            "timestamp",
            "rowversion",
        ] {
            assert_eq!(classify(other).class, TypeClass::Other, "{other}");
        }
    }

    #[test]
    fn temporal_texts_stay_null_for_null() {
        use tally_common::canonical::FieldFormat;
        use tally_common::segment::ColumnSpec;
        for class in [TypeClass::Timestamp, TypeClass::TimestampTz, TypeClass::Time] {
            let c = BoundColumn {
                info: TypeEntry::of(class)
                    .scale(Some(3))
                    .column("at".into(), String::new(), true),
                spec: ColumnSpec {
                    name: "at".into(),
                    format: FieldFormat::new(class).with_scale(3),
                },
                zone: None,
            };
            let e = MsSql.canonical_expr(&c).unwrap();
            assert!(
                e.starts_with("CASE WHEN ")
                    && e.contains("[at]")
                    && e.contains(" IS NULL THEN NULL ELSE CONCAT("),
                "{class}: {e}"
            );
        }
    }

    fn declared(name: &str, declared: &str, class: TypeClass, scale: u32) -> BoundColumn {
        use tally_common::canonical::FieldFormat;
        use tally_common::segment::ColumnSpec;
        BoundColumn {
            info: classify(declared).column(name.into(), declared.into(), true),
            spec: ColumnSpec {
                name: name.into(),
                format: FieldFormat::new(class).with_scale(scale),
            },
            zone: None,
        }
    }

    // what the review of this dialect found (issue 15): each case pinned
    #[test]
    fn values_the_driver_cannot_decode_exactly_are_cast_before_they_are_read() {
        let money = declared("amount", "money", TypeClass::Decimal, 4);
        assert_eq!(MsSql.raw_expr(&money), "CAST([amount] AS DECIMAL(19, 4))");
        let utf8 = declared("name", "varchar(40)", TypeClass::Text, 0);
        assert_eq!(MsSql.raw_expr(&utf8), "CAST([name] AS NVARCHAR(MAX))");
        let n = declared("name", "nvarchar(40)", TypeClass::Text, 0);
        assert_eq!(MsSql.raw_expr(&n), "[name]");
        // a datetime is read as the datetime2(3) SQL Server shows, not its 1/300 s
        let dt = declared("at", "datetime", TypeClass::Timestamp, 3);
        let e = MsSql.canonical_expr(&dt).unwrap();
        assert!(
            e.contains("DATEPART(NANOSECOND, CAST([at] AS DATETIME2(3)))"),
            "{e}"
        );
        assert!(!e.contains("DATEPART(NANOSECOND, [at])"), "{e}");
    }

    #[test]
    fn hash_children_divide_as_bigints_and_empty_is_a_length() {
        // a literal past 2^31 is a DECIMAL in T-SQL: its division would keep a fraction
        assert_eq!(
            MsSql.int_div("([bh] - 288230376151711744)", "144115188075855872"),
            "(CAST(([bh] - 288230376151711744) AS BIGINT) / CAST(144115188075855872 AS BIGINT))"
        );
        // VARBINARY equality ignores trailing zero bytes: NCHAR(0) is not empty
        assert_eq!(MsSql.is_empty_text("x"), "DATALENGTH(x) = 0");
        // keys compare as hex text, which keeps trailing zero bytes apart
        let key = classify("nvarchar(10)").column("k".into(), "nvarchar(10)".into(), false);
        assert!(
            MsSql
                .key_expr(&key)
                .ends_with(", 2) COLLATE Latin1_General_100_BIN2")
        );
        let fixed = classify("nchar(4)").column("k".into(), "nchar(4)".into(), false);
        assert!(MsSql.key_expr(&fixed).contains("RTRIM([k])"));
    }

    #[test]
    fn composite_bounds_expand_without_row_values() {
        assert!(!MsSql.row_values());
        // literals carry UTF-16LE hex only
        let l = MsSql.literal(&KeyPart::Text("é'".into()));
        assert_eq!(l, "CONVERT(NVARCHAR(MAX), 0xe9002700)");
    }
}
