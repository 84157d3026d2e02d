//! ClickHouse (23.3 and later; its SQL is run here on the embedded engine of
//! `chdb-core`, ClickHouse 26.9, by `agent/tests/clickhouse_chdb.rs`). Everything but
//! doubles and JSON renders in SQL:
//!
//! - integers of every width (`Int8`…`Int256`, `UInt8`…`UInt256`) by `toString`;
//! - decimals by `toDecimalString(x, s)` at the resolved scale (exact digits, padded;
//!   `toString` drops trailing zeros under `output_format_decimal_trailing_zeros = 0`,
//!   a setting), a narrower scale through `round`, which rounds a Decimal half away
//!   from zero; a zero is always unsigned;
//! - doubles are NOT rendered in SQL, as on DuckDB and Spark: the connector reads
//!   `toString(toFloat64(x))` (ClickHouse's shortest round-trip text) and the agent
//!   renders it;
//! - `DateTime` and `DateTime64(p[, 'zone'])` are instants (timestamptz): their UTC
//!   reading, `toString(x, 'UTC')`, cut (never rounded) to the resolved precision;
//! - `FixedString(n)` is a fixed binary, its trailing zero bytes removed as a
//!   `BINARY(n)`'s are; `Enum8/16`, `IPv4` and `IPv6` are text by their names;
//!   `LowCardinality(T)` and `Nullable(T)` are `T`;
//! - the row checksums are slices of `MD5`/`SHA256` (raw bytes) read big-endian with
//!   `reinterpretAsUInt64(reverse(..))`: md5_48 as `Int64`, sha256_64 as `UInt64`;
//!   `sum` of 64-bit integers keeps the type and wraps mod 2^64 (no overflow error), so
//!   the SUM arrives already reduced; XOR is `groupBitXor`;
//! - bind values are typed query parameters (`{p1:Int64}`, `{p2:String}`).
//!
//! Strings are bytes in ClickHouse and compare bytewise; a String that is not UTF-8
//! hashes its bytes as they are (it then differs from every UTF-8 text, never matches
//! one loosely). A ReplacingMergeTree (a CDC target) is read through `FINAL` only where
//! the dataset declares it ([`ClickHouse::FINAL`]); nothing infers it from the engine.

use tally_common::checksum::HashMethod;
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;

use super::Dialect;
use crate::schema::{BoundColumn, ColumnInfo, Declared, Native, TypeEntry};

/// The oldest server the dialect's SQL is written for: `toDecimalString` is in 23.3.
pub const MIN_VERSION: (u32, u32) = (23, 3);

/// Settings every statement of the dialect runs under (the connector sends them with
/// each query): `MIN` and `MAX` over no rows are NULL, as on every other engine (the
/// default answers 0, which a key range would take for a key). The rest undo what a
/// user's settings profile could do to a result while the server still answers 200
/// (found in review, checked on chdb and on 18.16): a limit reached in `break` mode
/// stops reading and answers what it has, `limit`/`offset` and the additional filters
/// cut or filter rows, the query cache answers from the past, unavailable shards are
/// skipped, and the TabSeparated NULL and line ending can be changed. Every limit then
/// throws instead; a setting the administrator locked makes the statement fail.
pub const SETTINGS: &[(&str, &str)] = &[
    ("aggregate_functions_null_for_empty", "1"),
    ("read_overflow_mode", "throw"),
    ("read_overflow_mode_leaf", "throw"),
    ("result_overflow_mode", "throw"),
    ("group_by_overflow_mode", "throw"),
    ("sort_overflow_mode", "throw"),
    ("set_overflow_mode", "throw"),
    ("join_overflow_mode", "throw"),
    ("distinct_overflow_mode", "throw"),
    ("transfer_overflow_mode", "throw"),
    ("timeout_overflow_mode", "throw"),
    ("timeout_overflow_mode_leaf", "throw"),
    ("limit", "0"),
    ("offset", "0"),
    ("additional_table_filters", "{}"),
    ("additional_result_filter", ""),
    ("skip_unavailable_shards", "0"),
    ("use_query_cache", "0"),
    ("format_tsv_null_representation", "\\N"),
    ("output_format_tsv_crlf_end_of_line", "0"),
];

/// `Nullable(T)` and `LowCardinality(T)` unwrapped, in any nesting: `T`.
fn unwrap(declared: &str) -> &str {
    let mut t = declared.trim();
    loop {
        let inner = ["Nullable(", "LowCardinality("]
            .iter()
            .find_map(|w| t.strip_prefix(w).and_then(|r| r.strip_suffix(')')));
        match inner {
            Some(i) => t = i.trim(),
            None => return t,
        }
    }
}

/// ClickHouse's type table, over the names `system.columns` and `DESCRIBE` report
/// (`Decimal(12, 2)`, `LowCardinality(Nullable(String))`, `DateTime64(3, 'UTC')`).
/// Array, Map, Tuple, Nested, JSON, Object, Variant, Dynamic, the aggregate-function
/// types, Time, Time64, BFloat16, the geo types and intervals are `Other`.
pub fn classify(declared: &str) -> TypeEntry {
    use TypeClass::*;
    let t = unwrap(declared);
    let d = Declared::parse(t);
    match d.base.as_str() {
        "int8" | "int16" | "int32" | "int64" | "int128" | "int256" | "uint8" | "uint16" | "uint32"
        | "uint64" | "uint128" | "uint256" => TypeEntry::of(Integer),
        "decimal" => TypeEntry::of(Decimal).scale(Some(d.arg(1).unwrap_or(0))),
        // `Decimal32(S)`: the argument is the scale
        "decimal32" | "decimal64" | "decimal128" | "decimal256" => TypeEntry::of(Decimal).scale(d.arg(0)),
        "float32" => TypeEntry::of(Float).native(Native::Float32),
        "float64" => TypeEntry::of(Float),
        "bool" => TypeEntry::of(Boolean),
        "string" => TypeEntry::of(Text),
        "enum8" | "enum16" | "ipv4" | "ipv6" => TypeEntry::of(Text).native(Native::Label),
        "fixedstring" => TypeEntry::of(Binary).fixed(),
        "date" | "date32" => TypeEntry::of(Date),
        "datetime" => TypeEntry::of(TimestampTz).scale(Some(0)),
        "datetime64" => TypeEntry::of(TimestampTz).scale(Some(d.arg(0).unwrap_or(3))),
        "uuid" => TypeEntry::of(Uuid),
        _ => TypeEntry::OTHER,
    }
}

/// The ClickHouse dialect; `final_read` puts `FINAL` after a dataset's table.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClickHouse {
    pub final_read: bool,
}

impl ClickHouse {
    /// The dialect of a dataset that declares its table is read through `FINAL`
    /// (a ReplacingMergeTree whose parts are not yet merged).
    pub const FINAL: ClickHouse = ClickHouse { final_read: true };
}

fn zero(s: u32) -> String {
    if s == 0 {
        "0".to_string()
    } else {
        format!("0.{}", "0".repeat(s as usize))
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.f…]` of an instant's UTC reading, cut to `p` digits.
fn utc_timestamp(x: &str, p: u32) -> String {
    // `YYYY-MM-DD hh:mm:ss[.fff…]`, as many digits as the column's own precision
    let t = format!("toString({x}, 'UTC')");
    let fraction = match p {
        0 => String::new(),
        _ => format!(" || '.' || rightPad(substring({t}, 21, {p}), {p}, '0')"),
    };
    format!("substring({t}, 1, 10) || 'T' || substring({t}, 12, 8){fraction}")
}

impl Dialect for ClickHouse {
    fn name(&self) -> &'static str {
        "clickhouse"
    }

    /// Backticks; inside them ClickHouse reads backslash escapes, so a backslash is
    /// doubled as well as a backtick.
    fn quote(&self, ident: &str) -> String {
        format!("`{}`", ident.replace('\\', "\\\\").replace('`', "``"))
    }

    fn placeholder(&self, n: usize) -> String {
        format!("{{p{n}:String}}")
    }

    fn key_param(&self, n: usize, col: &ColumnInfo) -> String {
        match col.class {
            TypeClass::Integer => format!("{{p{n}:Int64}}"),
            _ => self.placeholder(n),
        }
    }

    /// `unhex` gives the bytes as a String, which is bytes in ClickHouse.
    fn literal(&self, v: &KeyPart) -> String {
        match v {
            KeyPart::Int(i) => i.to_string(),
            KeyPart::Text(s) => format!("unhex('{}')", hex::encode(s)),
        }
    }

    /// Strings compare bytewise; an Enum by its name, not its number.
    fn key_expr(&self, col: &ColumnInfo) -> String {
        let x = self.quote(&col.name);
        match (col.class, col.native) {
            (TypeClass::Text, Native::Label) => format!("toString({x})"),
            _ => x,
        }
    }

    fn table_suffix(&self) -> &'static str {
        if self.final_read { " FINAL" } else { "" }
    }

    fn row_value_in(&self) -> bool {
        true
    }

    fn canonical_expr(&self, col: &BoundColumn) -> Option<String> {
        let x = self.quote(&col.info.name);
        let f = col.spec.format;
        let s = f.scale;
        let text = format!("toString({x})");
        let boolean = format!("CASE WHEN {x} THEN '1' WHEN NOT {x} THEN '0' END");
        Some(match f.class {
            TypeClass::Integer | TypeClass::Boolean if col.info.class == TypeClass::Boolean => boolean,
            TypeClass::Integer | TypeClass::Boolean => text,
            // doubles (and doubles compared as decimals) are rendered in the agent
            TypeClass::Decimal if col.info.class == TypeClass::Float => return None,
            TypeClass::Float => return None,
            TypeClass::Decimal if col.info.class != TypeClass::Decimal => {
                // an integer compared as a decimal: its digits and a zero fraction (an
                // exact decimal's normal form has none)
                if s == 0 || f.exact {
                    text
                } else {
                    format!("{text} || '.{}'", "0".repeat(s as usize))
                }
            }
            TypeClass::Decimal if f.exact => {
                let t = format!("toDecimalString({x}, {})", col.info.scale.unwrap_or(0));
                format!(
                    "CASE WHEN {x} = 0 THEN '0' WHEN position({t}, '.') > 0 THEN \
                     trim(TRAILING '.' FROM trim(TRAILING '0' FROM {t})) ELSE {t} END"
                )
            }
            TypeClass::Decimal => {
                // round: half away from zero for a Decimal; exact when s >= the scale
                let r = if s < col.info.scale.unwrap_or(0) {
                    format!("round({x}, {s})")
                } else {
                    x.clone()
                };
                format!(
                    "CASE WHEN {r} = 0 THEN '{}' ELSE toDecimalString({r}, {s}) END",
                    zero(s)
                )
            }
            TypeClass::Text if f.fixed_char => format!("trim(TRAILING ' ' FROM {text})"),
            TypeClass::Text if col.info.native == Native::Label => text,
            TypeClass::Text => x,
            TypeClass::Date => text,
            TypeClass::Timestamp => utc_timestamp(&x, s),
            TypeClass::TimestampTz => format!("{} || 'Z'", utc_timestamp(&x, s)),
            TypeClass::Uuid => format!("lower({text})"),
            // a FixedString (or the other side's BINARY(n)) without its trailing zero
            // bytes (only whole bytes: a match of (00)+ at an odd offset cannot reach
            // the end); a String compared as binary by its bytes
            // a label type (Enum, IPv4, IPv6) compared as binary: the bytes of its text,
            // as every other text (its own storage is a number or packed bytes)
            TypeClass::Binary if col.info.native == Native::Label => format!("lower(hex({text}))"),
            TypeClass::Binary if f.fixed_char || col.info.fixed_char => {
                format!("replaceRegexpOne(lower(hex({x})), '(00)+$', '')")
            }
            TypeClass::Binary => format!("lower(hex({x}))"),
            TypeClass::Time | TypeClass::Json | TypeClass::Other => return None,
        })
    }

    /// A double (a Float32 widened exactly) as ClickHouse's shortest round-trip text,
    /// NaN and the infinities as the reference spells them; JSON as its text.
    fn text_expr(&self, col: &BoundColumn) -> Option<String> {
        let x = self.quote(&col.info.name);
        match (col.info.class, col.spec.format.class) {
            (TypeClass::Float, TypeClass::Float | TypeClass::Decimal) => {
                let v = format!("toFloat64({x})");
                Some(format!(
                    "multiIf(isNaN({v}), 'NaN', isInfinite({v}), if({v} > 0, 'Infinity', '-Infinity'), toString({v}))"
                ))
            }
            (TypeClass::Text | TypeClass::Json, TypeClass::Json) => Some(format!("toString({x})")),
            _ => None,
        }
    }

    /// `length` counts bytes.
    fn field_expr(&self, canonical: &str) -> String {
        format!("COALESCE(toString(length({canonical})) || ':' || {canonical}, '~')")
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
            HashMethod::Md5_48 => format!(
                "(toInt64({}) - 140737488355328)",
                big_endian(&format!("MD5({bytes})"), 6)
            ),
            _ => big_endian(&format!("SHA256({bytes})"), 8),
        })
    }

    fn bucket_hash_expr(&self, key_row: &str, key: Option<&[u8; 32]>) -> Option<String> {
        let bytes = keyed_bytes(key_row, key);
        Some(format!(
            "bitShiftRight({}, 4)",
            big_endian(&format!("SHA256({bytes})"), 8)
        ))
    }

    fn xor_aggregate(&self, h: &str) -> Option<String> {
        Some(format!("toString(groupBitXor({h}))"))
    }

    /// `sum` of `Int64`/`UInt64` wraps mod 2^64 in its own type: the text is the sum
    /// already reduced (signed for md5_48, which the agent reads as two's complement).
    fn sum_text(&self, h: &str) -> String {
        format!("toString(sum({h}))")
    }

    /// ClickHouse's `lag` answers the type's default (0) before the first row, which
    /// a child numbered 0 would take for its own: the previous row of a nullable value.
    /// With its whole frame spelled out: some ClickHouse releases refuse `ntile` over
    /// the default frame.
    fn ntile(&self, n: u32, order: &str) -> String {
        format!("ntile({n}) OVER (ORDER BY {order} ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)")
    }

    fn lag(&self, e: &str, over: &str) -> String {
        format!(
            "lagInFrame(toNullable({e}), 1) OVER ({over} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
        )
    }

    fn watermark_sql(&self, read: &crate::watermark::WatermarkRead) -> Option<String> {
        match read {
            crate::watermark::WatermarkRead::Query(q) => Some(format!("SELECT toString(({q}))")),
            _ => None,
        }
    }

    /// `intDiv` truncates toward zero, as every engine's integer division here.
    fn int_div(&self, a: &str, b: &str) -> String {
        format!("intDiv({a}, {b})")
    }

    /// `CAST(NULL AS Int32)` is an error in ClickHouse; `toInt32` keeps a NULL.
    fn text_int(&self, e: &str) -> String {
        format!("toInt32({e})")
    }

    fn int_text(&self, e: &str) -> String {
        format!("toString({e})")
    }

    fn fixed_statements(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            ("version", VERSION_SQL),
            ("columns", COLUMNS_SQL),
            ("table engine", TABLE_SQL),
        ]
    }
}

/// The server's version (`26.9.2.1`).
pub const VERSION_SQL: &str = "SELECT version()";
/// A table's columns and their type names, in order.
pub const COLUMNS_SQL: &str = "SELECT name, type FROM system.columns WHERE database = {db:String} \
                               AND table = {table:String} ORDER BY position";
/// A table's engine (said, never acted on: `FINAL` is the dataset's choice) and size.
pub const TABLE_SQL: &str = "SELECT engine, sorting_key, toString(total_rows) FROM system.tables \
                             WHERE database = {db:String} AND name = {table:String}";

/// The first `n` bytes of a binary expression as a big-endian unsigned integer
/// (`reinterpretAsUInt64` reads little-endian, and pads a shorter string with zeros).
fn big_endian(bytes: &str, n: usize) -> String {
    format!("reinterpretAsUInt64(reverse(substring({bytes}, 1, {n})))")
}

/// A row-string expression after a sealed method's key, as one String of bytes.
fn keyed_bytes(row: &str, key: Option<&[u8; 32]>) -> String {
    match key {
        None => row.to_string(),
        Some(k) => format!("concat(unhex('{}'), {row})", hex::encode(k)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clickhouse_types_classify_unwrapped_and_nested_ones_are_other() {
        for (t, class, scale) in [
            ("Int8", TypeClass::Integer, None),
            ("UInt256", TypeClass::Integer, None),
            ("Nullable(Int64)", TypeClass::Integer, None),
            ("Decimal(12, 2)", TypeClass::Decimal, Some(2)),
            ("Decimal(76, 30)", TypeClass::Decimal, Some(30)),
            ("Decimal64(4)", TypeClass::Decimal, Some(4)),
            ("Float64", TypeClass::Float, None),
            ("Bool", TypeClass::Boolean, None),
            ("String", TypeClass::Text, None),
            ("LowCardinality(Nullable(String))", TypeClass::Text, None),
            ("Enum8('a' = 1, 'b' = 2)", TypeClass::Text, None),
            ("IPv6", TypeClass::Text, None),
            ("Date32", TypeClass::Date, None),
            ("DateTime", TypeClass::TimestampTz, Some(0)),
            ("DateTime('Europe/Berlin')", TypeClass::TimestampTz, Some(0)),
            (
                "Nullable(DateTime64(6, 'Asia/Tokyo'))",
                TypeClass::TimestampTz,
                Some(6),
            ),
            ("UUID", TypeClass::Uuid, None),
            ("FixedString(16)", TypeClass::Binary, None),
        ] {
            let e = classify(t);
            assert_eq!(
                (e.class, e.scale.filter(|_| scale.is_some())),
                (class, scale),
                "{t}"
            );
        }
        assert!(classify("FixedString(4)").fixed);
        assert_eq!(classify("Enum16('x' = 1)").native, Native::Label);
        assert_eq!(classify("Float32").native, Native::Float32);
        for t in [
            "Array(String)",
            "Map(String, UInt8)",
            "Tuple(a UInt8, b String)",
            "Nullable(Tuple(a UInt8))",
            "JSON",
            "Object('json')",
            "Variant(String, UInt64)",
            "Dynamic",
            "SimpleAggregateFunction(sum, UInt64)",
            "AggregateFunction(uniq, UInt64)",
            "Time",
            "Time64(3)",
            "BFloat16",
            "Nothing",
            "Point",
            "IntervalDay",
        ] {
            assert_eq!(classify(t).class, TypeClass::Other, "{t}");
        }
    }

    #[test]
    fn identifiers_escape_backticks_and_backslashes() {
        assert_eq!(ClickHouse::default().quote("a`b\\c"), "`a``b\\\\c`");
    }

    #[test]
    fn final_follows_the_table_only_where_declared() {
        use crate::config::Source;
        let t = Source::Table(vec!["cdc".into(), "orders".into()]);
        assert_eq!(
            super::super::relation(&ClickHouse::default(), &t),
            "`cdc`.`orders`"
        );
        assert_eq!(
            super::super::relation(&ClickHouse::FINAL, &t),
            "`cdc`.`orders` FINAL"
        );
        let q = Source::Query("SELECT 1".into());
        assert!(!super::super::relation(&ClickHouse::FINAL, &q).contains("FINAL"));
    }
}
