//! PostgreSQL (12 and later). Everything pushes down: the canonical text per type
//! class, MD5 and SHA-256 of the row string (`convert_to(.., 'UTF8')`, never a bytea
//! cast, which would parse backslash escapes), exact `SUM` over `bigint` (numeric) and
//! `bit_xor` (PostgreSQL 14 and later; older servers compare SUM only).

use tally_common::checksum::HashMethod;
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;

use super::Dialect;
use crate::schema::{BoundColumn, ColumnInfo, Declared, Native, TypeEntry};
use crate::watermark::{Builtin, WatermarkRead};

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

/// The dialect of a server of this version (`SHOW server_version`): `bit_xor` exists
/// from PostgreSQL 14. Chosen per request from the request's own describe.
pub fn for_version(version: &str) -> &'static Postgres {
    static WITH_XOR: Postgres = Postgres { has_bit_xor: true };
    static SUM_ONLY: Postgres = Postgres { has_bit_xor: false };
    let major: u32 = version
        .split(['.', ' '])
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major >= 14 { &WITH_XOR } else { &SUM_ONLY }
}

/// PostgreSQL's type table: `format_type` names, with `typtype` (`b` base, `d` domain,
/// `e` enum, …) and, for a domain, its base type's name and typtype. Every type not
/// listed is `Other`: it has no canonical form and a run naming it is refused.
pub fn classify(declared: &str, typtype: &str, domain_base: Option<(&str, &str)>) -> TypeEntry {
    use TypeClass::*;
    if typtype == "d" {
        // a domain compares as its base type (one level; a domain over a domain is Other)
        return match domain_base {
            Some((base, base_typtype)) if base_typtype != "d" => classify(base, base_typtype, None),
            _ => TypeEntry::OTHER,
        };
    }
    if typtype == "e" {
        return TypeEntry::of(Text).native(Native::Label);
    }
    if typtype != "b" && !typtype.is_empty() || declared.ends_with("[]") {
        return TypeEntry::OTHER; // ranges, composites, arrays, pseudo-types
    }
    let d = Declared::parse(declared);
    let time_scale = Some(d.arg(0).unwrap_or(6));
    match d.base.as_str() {
        "smallint" | "integer" | "bigint" | "int2" | "int4" | "int8" => TypeEntry::of(Integer),
        "numeric" | "decimal" => TypeEntry::of(Decimal).scale(d.arg(1).or(d.arg(0).map(|_| 0))),
        "real" | "float4" => TypeEntry::of(Float).native(Native::Float32),
        "double precision" | "float8" => TypeEntry::of(Float),
        "boolean" | "bool" => TypeEntry::of(Boolean),
        "text" | "character varying" | "varchar" | "name" | "citext" => TypeEntry::of(Text),
        "character" | "bpchar" | "char" => TypeEntry::of(Text).fixed(),
        "\"char\"" => TypeEntry::of(Text),
        "date" => TypeEntry::of(Date),
        "timestamp" | "timestamp without time zone" if d.rest != "with time zone" => {
            TypeEntry::of(Timestamp).scale(time_scale)
        }
        "timestamp" | "timestamp with time zone" | "timestamptz" => {
            TypeEntry::of(TimestampTz).scale(time_scale)
        }
        "time" | "time without time zone" if d.rest != "with time zone" => {
            TypeEntry::of(Time).scale(time_scale)
        }
        "uuid" => TypeEntry::of(Uuid),
        "bytea" => TypeEntry::of(Binary),
        "json" | "jsonb" => TypeEntry::of(Json),
        "inet" | "cidr" | "macaddr" | "macaddr8" => TypeEntry::of(Text).native(Native::Label),
        // money (locale text), timetz, interval, bit strings, xml, geometry, tsvector, …
        _ => TypeEntry::OTHER,
    }
}

/// The ISO 8601 year of a date or timestamp expression (astronomical numbering,
/// expanded beyond 0000-9999): PostgreSQL's `extract` counts 1 BC as -1.
fn iso_year(x: &str) -> String {
    let y = format!("extract(year from {x})::bigint");
    let a = format!("(CASE WHEN {y} < 0 THEN {y} + 1 ELSE {y} END)");
    format!(
        "(CASE WHEN {a} < 0 THEN '-' || lpad((-{a})::text, 4, '0') WHEN {a} > 9999 THEN '+' || {a}::text \
         ELSE lpad({a}::text, 4, '0') END)"
    )
}

/// A date or timestamp rendered with `rest_mask` after its year: `to_char` where the
/// year has four digits, the expanded year otherwise, and the infinity tokens.
fn dated(x: &str, rest_mask: &str, fraction_sql: &str, suffix: &str) -> String {
    format!(
        "CASE WHEN {x} = 'infinity' THEN 'infinity' WHEN {x} = '-infinity' THEN '-infinity' \
         WHEN {x} >= '0001-01-01' AND {x} < '10000-01-01' THEN to_char({x}, 'YYYY{rest_mask}'){fraction_sql}{suffix} \
         ELSE {} || to_char({x}, '{rest_mask}'){fraction_sql}{suffix} END",
        iso_year(x)
    )
}

/// The exact normalised form of a numeric text: trailing fractional zeros and point removed.
fn exact_text(t: &str) -> String {
    format!(
        "CASE WHEN {t} ~ '^-?[0-9]*\\.[0-9]*$' THEN CASE WHEN rtrim(rtrim({t}, '0'), '.') IN ('', '-', '-0') THEN '0' \
         ELSE rtrim(rtrim({t}, '0'), '.') END ELSE {t} END"
    )
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

    /// Active client backends of other database users (the agent's own user's sessions
    /// are its reads, of this agent or another: they are not the load to yield to);
    /// -1 where the probe's user cannot see other users' sessions (their state reads as
    /// NULL without pg_read_all_stats, which would count a busy server as idle).
    fn load_probe_sql(&self) -> &'static [&'static str] {
        &["SELECT CASE WHEN pg_has_role('pg_read_all_stats', 'USAGE') THEN \
           (SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND backend_type = 'client backend' \
           AND usename IS DISTINCT FROM current_user)::text ELSE '-1' END"]
    }

    fn key_histogram_sql(&self, table: &[String], key: &ColumnInfo) -> Option<String> {
        let lit = |t: &str| self.literal(&KeyPart::Text(t.to_string()));
        let (schema, name) = match table {
            [t] => ("current_schema()".to_string(), lit(t)),
            [s, t] => (lit(s), lit(t)),
            _ => return None,
        };
        Some(format!(
            "SELECT (SELECT histogram_bounds::text FROM pg_stats WHERE schemaname = {schema} AND tablename = {name} \
             AND attname = {} AND NOT inherited)",
            lit(&key.name)
        ))
    }

    fn literal(&self, v: &KeyPart) -> String {
        // the quoted string holds hex digits only: read the same with
        // standard_conforming_strings on or off (a '\x..'::bytea would not be)
        match v {
            KeyPart::Int(i) => i.to_string(),
            KeyPart::Text(s) => format!("convert_from(decode('{}', 'hex'), 'UTF8')", hex::encode(s)),
        }
    }

    fn bytewise(&self, e: &str) -> String {
        format!("({e}) COLLATE \"C\"")
    }

    fn watermark_sql(&self, read: &WatermarkRead) -> Option<String> {
        Some(match read {
            WatermarkRead::Builtin(Builtin::PgWalLsn) => "SELECT pg_current_wal_insert_lsn()::text".into(),
            WatermarkRead::Builtin(Builtin::PgReplayLsn) => "SELECT pg_last_wal_replay_lsn()::text".into(),
            // The origin's progress is the end of the last publisher commit applied. An
            // idle publisher's WAL (other databases, checkpoints) moves only the
            // publisher's end of WAL its keepalives carry, which the subscription's main
            // apply worker (relid NULL: not a table-sync worker; no leader_pid: not a
            // PG16+ parallel worker) records as latest_end_lsn when it handles one, after
            // every change sent before it. While any table of the subscription is still
            // in its initial copy (not 'r'eady) its rows are not all there: 0/0, never
            // reached. NULL: no such subscription in this database.
            WatermarkRead::Subscription(name) => format!(
                "SELECT (SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_subscription_rel r WHERE r.srsubid = s.oid \
                 AND r.srsubstate <> 'r') THEN '0/0' ELSE \
                 coalesce(greatest(pg_replication_origin_progress('pg_' || s.oid, false), \
                 (SELECT max(st.latest_end_lsn) FROM pg_stat_subscription st WHERE st.subid = s.oid \
                 AND st.relid IS NULL AND to_jsonb(st) ->> 'leader_pid' IS NULL))::text, '0/0') END \
                 FROM pg_subscription s WHERE s.subname = {} \
                 AND s.subdbid = (SELECT oid FROM pg_database WHERE datname = current_database()))",
                self.literal(&KeyPart::Text(name.clone()))
            ),
            WatermarkRead::Builtin(_) => return None,
            WatermarkRead::Query(q) => format!("SELECT (({q}))::text"),
        })
    }

    fn row_value_in(&self) -> bool {
        true
    }

    fn key_expr(&self, col: &ColumnInfo) -> String {
        match col.class {
            // enums and network types take no collation: their text does
            TypeClass::Text if col.native == Native::Label => {
                format!("({}::text) COLLATE \"C\"", self.quote(&col.name))
            }
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
        let zero = if s == 0 {
            "0".to_string()
        } else {
            format!("0.{}", "0".repeat(s as usize))
        };
        // a float (as a float or as a decimal) is made canonical in the agent: its
        // text under extra_float_digits >= 1 reads back as the same double but is not
        // always the shortest decimal that does (`'5.834e21'::float8` shows
        // 5.833999999999999e+21: the output excludes an exact half-way bound), so
        // rounding that text to a scale can give other digits than the reference's
        if col.info.class == TypeClass::Float {
            return None;
        }
        Some(match f.class {
            TypeClass::Integer => match col.info.class {
                TypeClass::Boolean => format!("CASE WHEN {x} THEN '1' WHEN NOT {x} THEN '0' END"),
                _ => format!("{x}::text"),
            },
            TypeClass::Decimal if f.exact => exact_text(&format!("{x}::numeric::text")),
            // NaN and the infinities (PostgreSQL 14) round to themselves: their text is the token
            TypeClass::Decimal => format!(
                "CASE WHEN round({x}::numeric, {s}) = 0 THEN '{zero}' ELSE round({x}::numeric, {s})::text END"
            ),
            TypeClass::Float => return None,
            TypeClass::Boolean => match col.info.class {
                TypeClass::Integer => format!("{x}::text"),
                // NULL matches neither branch and stays NULL
                _ => format!("CASE WHEN {x} THEN '1' WHEN NOT {x} THEN '0' END"),
            },
            TypeClass::Text if f.fixed_char => format!("rtrim({x}::text, ' ')"),
            TypeClass::Text => format!("{x}::text"),
            TypeClass::Binary if col.info.class == TypeClass::Text => {
                format!("encode(convert_to({x}::text, 'UTF8'), 'hex')")
            }
            // only whole zero bytes: a match of (00)+ at an odd offset cannot reach the end
            TypeClass::Binary if f.fixed_char => format!("regexp_replace(encode({x}, 'hex'), '(00)+$', '')"),
            TypeClass::Binary => format!("encode({x}, 'hex')"),
            // past 294276 AD a date has no timestamp, which to_char needs: its parts
            // come from extract, which reads the date itself (PostgreSQL 14 and later)
            TypeClass::Date => format!(
                "CASE WHEN {x} = 'infinity' THEN 'infinity' WHEN {x} = '-infinity' THEN '-infinity' \
                 WHEN {x} >= '0001-01-01' AND {x} < '10000-01-01' THEN to_char({x}, 'YYYY-MM-DD') \
                 ELSE {} || '-' || lpad(extract(month from {x})::text, 2, '0') || '-' || lpad(extract(day from {x})::text, 2, '0') END",
                iso_year(&x)
            ),
            TypeClass::Timestamp => dated(
                &x,
                "-MM-DD\"T\"HH24:MI:SS",
                &fraction(&format!("to_char({x}, 'US')"), s),
                "",
            ),
            TypeClass::TimestampTz => {
                // a zone-less timestamp is read in its dataset's zone (an ISO offset)
                let u = match (&col.zone, col.info.class) {
                    (Some(z), TypeClass::Timestamp) => {
                        format!("(({x} AT TIME ZONE INTERVAL '{z}') AT TIME ZONE 'UTC')")
                    }
                    _ => format!("({x} AT TIME ZONE 'UTC')"),
                };
                dated(
                    &u,
                    "-MM-DD\"T\"HH24:MI:SS",
                    &fraction(&format!("to_char({u}, 'US')"), s),
                    " || 'Z'",
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
            // JSON is made canonical in the agent (RFC 8785), never in SQL
            TypeClass::Json | TypeClass::Other => return None,
        })
    }

    fn text_expr(&self, col: &BoundColumn) -> Option<String> {
        // the output functions under the agent's session settings (DateStyle ISO,
        // TimeZone UTC, extra_float_digits 1): far cheaper than to_char and round
        let x = self.quote(&col.info.name);
        let class = col.spec.format.class;
        match (col.info.class, class) {
            (TypeClass::Text, TypeClass::Json) => return Some(format!("{x}::text")),
            // read back as the double it is (connector::RowBuilder), never as written
            (TypeClass::Float, TypeClass::Decimal) => return Some(format!("{x}::float8::text")),
            _ => {}
        }
        if col.info.class != class {
            return None;
        }
        match class {
            TypeClass::Decimal
            | TypeClass::Date
            | TypeClass::Timestamp
            | TypeClass::TimestampTz
            | TypeClass::Time
            | TypeClass::Json => Some(format!("{x}::text")),
            TypeClass::Float => Some(format!("{x}::float8::text")),
            _ => None,
        }
    }

    fn copy_text_expr(&self, col: &BoundColumn) -> Option<String> {
        // COPY writes each value with its type's output function, which is what the
        // `::text` cast calls (same session settings): the cast only costs the backend
        // (measured: docs/performance.md). Floats keep theirs (a real is widened first).
        let text = self.text_expr(col)?;
        let bare = col.info.class == col.spec.format.class
            && matches!(
                col.spec.format.class,
                TypeClass::Decimal
                    | TypeClass::Date
                    | TypeClass::Timestamp
                    | TypeClass::TimestampTz
                    | TypeClass::Time
            );
        Some(if bare { self.quote(&col.info.name) } else { text })
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

    fn row_hash_expr(&self, row: &str, method: HashMethod, key: Option<&[u8; 32]>) -> Option<String> {
        let bytes = keyed_bytes(row, key);
        Some(match method.base() {
            HashMethod::Md5_48 => {
                format!("(('x' || substr(md5({bytes}), 1, 12))::bit(48)::bigint - 140737488355328)")
            }
            _ => format!("('x' || substr(encode(sha256({bytes}), 'hex'), 1, 16))::bit(64)::bigint"),
        })
    }

    fn bucket_hash_expr(&self, key_row: &str, key: Option<&[u8; 32]>) -> Option<String> {
        let bytes = keyed_bytes(key_row, key);
        Some(format!(
            "('x' || substr(encode(sha256({bytes}), 'hex'), 1, 15))::bit(60)::bigint"
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
}

/// The UTF-8 bytes of a row-string expression, after a sealed method's key. `decode`
/// reads the hex whatever `standard_conforming_strings` says.
fn keyed_bytes(row: &str, key: Option<&[u8; 32]>) -> String {
    match key {
        None => format!("convert_to({row}, 'UTF8')"),
        Some(k) => format!(
            "(decode('{}', 'hex') || convert_to({row}, 'UTF8'))",
            hex::encode(k)
        ),
    }
}
