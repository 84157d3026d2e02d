//! The generator's value model: engines, type classes, logical values, and how each
//! engine declares a column and spells a value.
//!
//! Ground truth comes from this model, never from Tally's code: two cells are equal
//! exactly when their logical values are equal ([`V`]'s `==`), and every generated
//! value of a class survives storage in every engine's column type of that class
//! unchanged, at the fidelity Tally compares it (a decimal at its declared scale, a
//! double as the same bits, a timestamp to the microsecond). A [`Cell`]'s `spelling`
//! picks one of several equal ways to write the value (`10.5` or `10.50`, an upper-case
//! UUID, `-0` for a zero double): traps for false differences, never differences.

use std::fmt::Write as _;

use super::rng::Rng;

/// A live engine the generator loads tables into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Engine {
    Pg,
    My,
    Lite,
    Duck,
    /// Spark over Spark Connect (the `spark` feature): Parquet tables in one database
    /// (schema) per batch of the test process's local server
    Spark,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Pg => "postgres",
            Engine::My => "mariadb",
            Engine::Lite => "sqlite",
            Engine::Duck => "duckdb",
            Engine::Spark => "spark",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            Engine::Pg => "pg",
            Engine::My => "my",
            Engine::Lite => "lite",
            Engine::Duck => "duck",
            Engine::Spark => "spark",
        }
    }

    /// The engines this build can run (DuckDB with the `duckdb` feature, Spark with
    /// the `spark` feature), Spark last: adding it leaves the other pairs' seeds as they were.
    pub fn live() -> Vec<Engine> {
        let mut v = vec![Engine::Pg, Engine::My, Engine::Lite];
        if cfg!(feature = "duckdb") {
            v.push(Engine::Duck);
        }
        if cfg!(feature = "spark") {
            v.push(Engine::Spark);
        }
        v
    }

    /// An engine by its short or full name (`pg`, `postgres`, `my`, `mariadb`, ...).
    pub fn parse(s: &str) -> Option<Engine> {
        [Engine::Pg, Engine::My, Engine::Lite, Engine::Duck, Engine::Spark]
            .into_iter()
            .find(|e| e.short() == s || e.name() == s)
    }

    /// Whether `hashing: pushdown` makes a difference (SQLite hashes in the agent).
    /// Spark's `auto` pushes down too (the connector prefers SQL), so on Spark both
    /// paths hash in SQL; the other side of the pair still takes its own two paths.
    pub fn pushes_down(self) -> bool {
        self != Engine::Lite
    }

    /// Whether the engine has a `CHAR(n)` that pads (SQLite has no padding, DuckDB's
    /// `CHAR(n)` is `VARCHAR`; Spark's pads on write and on read).
    pub fn pads_char(self) -> bool {
        matches!(self, Engine::Pg | Engine::My | Engine::Spark)
    }
}

/// A type class, with what the generator keeps fixed across both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// an integer; `narrow` when either side's type is 32-bit
    Int {
        narrow: bool,
    },
    /// a decimal of 12 digits at this declared scale on both sides
    Dec {
        scale: u8,
    },
    Double,
    Text,
    /// text, declared `CHAR(n)` on the sides with [`SideForm::alt`] (only engines that
    /// pad: PostgreSQL and MariaDB) and `VARCHAR`/`text` on the others; at least one
    /// side pads, so trailing spaces are not data on either side (canonical-form.md §1)
    CharText,
    /// a JSON document, compared in RFC 8785 form (json, jsonb, MariaDB's checked
    /// LONGTEXT, SQLite's and DuckDB's JSON)
    Json,
    Bool,
    Date,
    /// a timestamp without zone, microseconds
    Ts,
    Bytes,
    Uuid,
    /// an instant: on each side either a zone-less timestamp read in the dataset's
    /// `time_zone` or a timestamp with zone (at least one side has a zone)
    Instant,
    /// an integer on one side, a decimal at this scale on the other
    IntDec {
        scale: u8,
    },
    /// a decimal at this scale on one side, a double on the other
    DecDbl {
        scale: u8,
    },
}

/// How one side writes a column of a class with two forms ([`Class::Instant`],
/// [`Class::IntDec`], [`Class::DecDbl`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SideForm {
    /// Instant: the column has a zone; IntDec: the side is the decimal; DecDbl: the
    /// side is the double; CharText: the side is `CHAR(n)`
    pub alt: bool,
    /// the dataset's `time_zone` offset in minutes (a zone-less instant's local time)
    pub offset_minutes: i32,
}

impl Class {
    pub fn label(self) -> &'static str {
        match self {
            Class::Int { narrow: true } => "int32",
            Class::Int { narrow: false } => "int64",
            Class::Dec { .. } => "decimal",
            Class::Double => "double",
            Class::Text => "text",
            Class::CharText => "char/text",
            Class::Json => "json",
            Class::Bool => "bool",
            Class::Date => "date",
            Class::Ts => "timestamp",
            Class::Bytes => "bytes",
            Class::Uuid => "uuid",
            Class::Instant => "instant",
            Class::IntDec { .. } => "integer/decimal",
            Class::DecDbl { .. } => "decimal/double",
        }
    }

    pub fn is_time(self) -> bool {
        matches!(self, Class::Date | Class::Ts | Class::Instant)
    }

    /// Every non-key class the generator draws from.
    pub fn value_classes() -> &'static [Class] {
        &[
            Class::Int { narrow: true },
            Class::Int { narrow: false },
            Class::Dec { scale: 0 },
            Class::Dec { scale: 2 },
            Class::Dec { scale: 4 },
            Class::Double,
            Class::Text,
            Class::CharText,
            Class::Json,
            Class::Bool,
            Class::Date,
            Class::Ts,
            Class::Bytes,
            Class::Uuid,
            Class::Instant,
            Class::IntDec { scale: 0 },
            Class::IntDec { scale: 2 },
            Class::DecDbl { scale: 2 },
            Class::DecDbl { scale: 0 },
        ]
    }

    /// The column type on one side of a class with two forms.
    pub fn side_type(self, e: Engine, variant: u8, f: SideForm) -> String {
        match self {
            Class::Instant if f.alt => match e {
                Engine::Pg => "timestamptz".into(),
                Engine::My => "TIMESTAMP(6) NULL DEFAULT NULL".into(),
                Engine::Lite | Engine::Duck => "TIMESTAMPTZ".into(),
                // Spark's TIMESTAMP is an instant (LTZ)
                Engine::Spark => "TIMESTAMP".into(),
            },
            Class::Instant => Class::Ts.sql_type(e, variant),
            Class::CharText if f.alt => match e {
                Engine::Pg => ["char(24)", "character(24)"][variant as usize % 2].into(),
                Engine::My => format!(
                    "CHAR(24) CHARACTER SET utf8mb4 COLLATE {}",
                    MY_COLLATIONS[variant as usize % MY_COLLATIONS.len()]
                ),
                Engine::Spark => "CHAR(24)".into(),
                Engine::Lite | Engine::Duck => unreachable!("{} has no padded CHAR(n)", e.name()),
            },
            Class::CharText => Class::Text.sql_type(e, variant),
            Class::IntDec { scale } if f.alt => Class::Dec { scale }.sql_type(e, variant),
            Class::IntDec { .. } => Class::Int { narrow: false }.sql_type(e, variant),
            Class::DecDbl { .. } if f.alt => Class::Double.sql_type(e, variant),
            Class::DecDbl { scale } => Class::Dec { scale }.sql_type(e, variant),
            c => c.sql_type(e, variant),
        }
    }

    /// The column type on one engine; `variant` picks among equivalent declarations.
    pub fn sql_type(self, e: Engine, variant: u8) -> String {
        use Engine::*;
        let s = match (self, e) {
            (Class::Int { narrow: true }, Pg) => "integer",
            (Class::Int { narrow: true }, My) => "INT",
            (Class::Int { narrow: true }, Duck) => "INTEGER",
            (Class::Int { narrow: true }, Spark) => "INT",
            (Class::Int { .. }, Lite) => "INTEGER",
            (Class::Int { narrow: false }, Pg) => "bigint",
            (Class::Int { narrow: false }, My | Duck | Spark) => "BIGINT",
            (Class::Dec { scale }, Pg) => return format!("numeric(12,{scale})"),
            (Class::Dec { scale }, _) => return format!("DECIMAL(12,{scale})"),
            (Class::Double, Pg) => "double precision",
            (Class::Double, My | Duck | Spark) => "DOUBLE",
            (Class::Double, Lite) => "REAL",
            (Class::Text, Pg) => ["text", "varchar(80)"][variant as usize % 2],
            (Class::Text, My) => {
                return format!(
                    "VARCHAR(80) CHARACTER SET utf8mb4 COLLATE {}",
                    MY_COLLATIONS[variant as usize % MY_COLLATIONS.len()]
                );
            }
            (Class::Text, Lite) => "TEXT",
            (Class::Text, Duck) => "VARCHAR",
            (Class::Text, Spark) => ["STRING", "VARCHAR(80)"][variant as usize % 2],
            // Spark has no JSON or UUID type: a user keeps them as STRING
            (Class::Json | Class::Uuid, Spark) => "STRING",
            (Class::Json, Pg) => ["json", "jsonb"][variant as usize % 2],
            (Class::Json, _) => "JSON",
            (Class::Bool, Pg) => "boolean",
            (Class::Bool, _) => "BOOLEAN",
            (Class::Date, Pg) => "date",
            (Class::Date, _) => "DATE",
            (Class::Ts, Pg) => ["timestamp", "timestamp(6)"][variant as usize % 2],
            (Class::Ts, My) => "DATETIME(6)",
            (Class::Ts, Lite) => "DATETIME",
            (Class::Ts, Duck) => "TIMESTAMP",
            (Class::Ts, Spark) => "TIMESTAMP_NTZ",
            (Class::Bytes, Pg) => "bytea",
            (Class::Bytes, My) => ["VARBINARY(64)", "BLOB"][variant as usize % 2],
            (Class::Bytes, Spark) => "BINARY",
            (Class::Bytes, _) => "BLOB",
            (Class::Uuid, Pg) => "uuid",
            (Class::Uuid, _) => "UUID",
            (Class::Instant | Class::IntDec { .. } | Class::DecDbl { .. } | Class::CharText, _) => {
                return self.side_type(
                    e,
                    variant,
                    SideForm {
                        alt: false,
                        offset_minutes: 0,
                    },
                );
            }
        };
        s.to_string()
    }
}

/// MariaDB collations a text column may have: whatever it is, Tally compares bytes.
const MY_COLLATIONS: &[&str] = &["utf8mb4_bin", "utf8mb4_general_ci", "utf8mb4_unicode_ci"];

/// A logical value. Equal values must compare equal through Tally; unequal ones must
/// be reported (the generator only makes unequal values that differ at the fidelity
/// Tally compares them).
#[derive(Debug, Clone, PartialEq)]
pub enum V {
    Null,
    Int(i64),
    /// unscaled digits at the column's scale
    Dec(i64),
    Dbl(f64),
    Text(String),
    Bool(bool),
    /// days since 1970-01-01
    Date(i32),
    /// microseconds since 1970-01-01 00:00:00
    Ts(i64),
    Bytes(Vec<u8>),
    Uuid(u128),
    /// a JSON document, written in the cell's spelling
    Json(super::json::J),
    /// a value only one engine has, stored alike on both sides of a case between two
    /// databases of that engine: its literal text (MariaDB zero dates)
    Raw(String),
}

/// PostgreSQL's `infinity` and `-infinity` as [`V::Date`] and [`V::Ts`] values.
pub const DATE_INF: i32 = i32::MAX;
pub const TS_INF: i64 = i64::MAX;

/// A value of a class that only `e` stores (a case between two databases of one
/// engine): PostgreSQL's infinities, BC and expanded years; MariaDB's zero dates.
pub fn special_value(r: &mut Rng, class: Class, e: Engine) -> Option<V> {
    let at = |y, m, d, us: i64| days_from_civil(y, m, d) as i64 * MICROS_PER_DAY + us;
    Some(match (class, e) {
        (Class::Date, Engine::Pg) => V::Date(*r.pick(&[
            DATE_INF,
            -DATE_INF,
            days_from_civil(0, 2, 29),
            days_from_civil(-1999, 1, 1),
            days_from_civil(-9, 6, 1),
            days_from_civil(-9, 12, 31),
            days_from_civil(10000, 1, 1),
            days_from_civil(0, 12, 31),
        ])),
        (Class::Ts, Engine::Pg) => V::Ts(*r.pick(&[
            TS_INF,
            -TS_INF,
            at(0, 3, 31, MICROS_PER_DAY - 1),
            at(-43, 3, 15, 12 * 3_600_000_000),
            at(-9, 1, 3, 0),
            at(10000, 1, 1, 1),
        ])),
        (Class::Date, Engine::My) => V::Raw(
            r.pick(&["0000-00-00", "2024-00-15", "2024-05-00", "0000-01-01"])
                .to_string(),
        ),
        (Class::Ts, Engine::My) => V::Raw(
            r.pick(&[
                "0000-00-00 00:00:00.000000",
                "2024-00-15 10:00:00.000000",
                "2024-12-00 23:59:59.999999",
            ])
            .to_string(),
        ),
        _ => return None,
    })
}

/// PostgreSQL's text of a date: BC years as such, infinities by name.
fn pg_date_text(days: i32) -> String {
    match days {
        DATE_INF => "infinity".into(),
        d if d == -DATE_INF => "-infinity".into(),
        d => {
            let (y, m, dd) = civil_from_days(d);
            if y <= 0 {
                format!("{:04}-{m:02}-{dd:02} BC", 1 - y)
            } else {
                format!("{y:04}-{m:02}-{dd:02}")
            }
        }
    }
}

fn pg_ts_text(micros: i64) -> String {
    match micros {
        TS_INF => "infinity".into(),
        t if t == -TS_INF => "-infinity".into(),
        t => {
            let text = ts_text(t);
            let (y, _, _) = civil_from_days(t.div_euclid(MICROS_PER_DAY) as i32);
            if y <= 0 {
                // the time, then the era: '0044-03-15 12:00:00 BC'
                let date = pg_date_text(t.div_euclid(MICROS_PER_DAY) as i32);
                let time = &text[text.find(' ').unwrap() + 1..];
                format!("{} {time} BC", date.trim_end_matches(" BC"))
            } else {
                text
            }
        }
    }
}

/// A value and how one side spells it (0: plainly; others: an equal spelling).
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub v: V,
    pub spelling: u8,
}

impl Cell {
    pub fn plain(v: V) -> Cell {
        Cell { v, spelling: 0 }
    }
}

/// What a value is bound as where the generator writes through a driver (SQLite).
#[derive(Debug, Clone)]
pub enum Bind {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

pub const MICROS_PER_DAY: i64 = 86_400_000_000;

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i32 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe - 719_468) as i32
}

/// The date of a day count.
pub fn civil_from_days(z: i32) -> (i64, u32, u32) {
    let z = z as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m, d)
}

/// The first and last day every live engine stores (0001-01-01, 9999-12-31).
pub fn date_range() -> (i32, i32) {
    (days_from_civil(1, 1, 1), days_from_civil(9999, 12, 31))
}

/// The canonical text (canonical-form.md §1) of a date, timestamp or instant value:
/// ISO 8601 expanded years outside 0001-9999 (astronomical numbering), infinities by
/// name, `T` and six fractional digits, `Z` for an instant; a MariaDB zero date as stored.
pub fn canonical_time(class: Class, v: &V) -> Option<String> {
    let year = |y: i64| match y {
        0..=9999 => format!("{y:04}"),
        y if y < 0 => format!("-{:04}", -y),
        y => format!("+{y}"),
    };
    let date = |d: i32| {
        let (y, m, dd) = civil_from_days(d);
        format!("{}-{m:02}-{dd:02}", year(y))
    };
    let zone = if class == Class::Instant { "Z" } else { "" };
    Some(match v {
        V::Date(DATE_INF) | V::Ts(TS_INF) => "infinity".into(),
        V::Date(d) if *d == -DATE_INF => "-infinity".into(),
        V::Ts(t) if *t == -TS_INF => "-infinity".into(),
        V::Date(d) => date(*d),
        V::Ts(t) => {
            let text = ts_text(*t);
            let time = &text[text.find(' ').unwrap() + 1..];
            format!("{}T{time}{zone}", date(t.div_euclid(MICROS_PER_DAY) as i32))
        }
        V::Raw(text) => text.replace(' ', "T"),
        _ => return None,
    })
}

pub fn date_text(days: i32) -> String {
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

pub fn ts_text(micros: i64) -> String {
    let days = micros.div_euclid(MICROS_PER_DAY) as i32;
    let rem = micros.rem_euclid(MICROS_PER_DAY);
    let (s, us) = (rem / 1_000_000, rem % 1_000_000);
    format!(
        "{} {:02}:{:02}:{:02}.{us:06}",
        date_text(days),
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

fn dec_text(unscaled: i64, scale: u8, extra_zero: bool) -> String {
    let neg = unscaled < 0;
    let digits = unscaled.unsigned_abs().to_string();
    let s = scale as usize;
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if s == 0 {
        out.push_str(&digits);
        if extra_zero {
            out.push_str(".0");
        }
        return out;
    }
    let padded = format!("{digits:0>width$}", width = s + 1);
    let (int, frac) = padded.split_at(padded.len() - s);
    let _ = write!(out, "{int}.{frac}");
    if extra_zero {
        out.push('0');
    }
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn uuid_text(u: u128, upper: bool) -> String {
    let h = format!("{u:032x}");
    let s = format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    );
    if upper { s.to_uppercase() } else { s }
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The shortest text that reads back as `x`, in exponent form (a double literal on
/// every engine).
fn dbl_text(x: f64) -> String {
    format!("{x:e}")
}

/// The SQL literal of a cell on an engine (SQLite's rows are bound instead, but the
/// literal is what a reproduction script shows).
pub fn literal(e: Engine, class: Class, c: &Cell, f: SideForm) -> String {
    use Engine::*;
    let alt = c.spelling != 0;
    match (class, &c.v) {
        (Class::Instant, V::Ts(t)) if f.alt => {
            return match e {
                Pg => format!("TIMESTAMPTZ '{}+00'", ts_text(*t)),
                My => format!("TIMESTAMP '{}'", ts_text(*t)),
                Duck => format!("'{}+00'::TIMESTAMPTZ", ts_text(*t)),
                Lite => quote(&format!("{}+00:00", ts_text(*t))),
                Spark => format!("TIMESTAMP '{}+00:00'", ts_text(*t)),
            };
        }
        (Class::Instant, V::Ts(t)) => {
            let local = t + f.offset_minutes as i64 * 60_000_000;
            return literal(e, Class::Ts, &Cell::plain(V::Ts(local)), f);
        }
        (Class::DecDbl { scale }, V::Dec(u)) if f.alt => {
            let text = dec_text(*u, scale, false);
            return match e {
                Pg => format!("'{text}'::float8"),
                My => format!("{text}e0"),
                Duck => format!("'{text}'::DOUBLE"),
                Lite => text,
                Spark => format!("CAST('{text}' AS DOUBLE)"),
            };
        }
        (Class::DecDbl { scale } | Class::IntDec { scale }, V::Dec(_) | V::Int(_)) => {
            let class = if matches!(c.v, V::Int(_)) {
                Class::Int { narrow: false }
            } else {
                Class::Dec { scale }
            };
            return literal(e, class, c, f);
        }
        _ => {}
    }
    match (&c.v, e) {
        (V::Null, _) => "NULL".into(),
        (V::Int(i), _) => i.to_string(),
        (V::Dec(u), _) => {
            let Class::Dec { scale } = class else {
                unreachable!("decimal value in {class:?}")
            };
            dec_text(*u, scale, alt)
        }
        (V::Dbl(x), Pg) => format!(
            "'{}'::float8",
            if alt && *x == 0.0 {
                "-0".into()
            } else {
                dbl_text(*x)
            }
        ),
        (V::Dbl(x), My) => {
            if alt && *x == 0.0 {
                "-0e0".into()
            } else {
                dbl_text(*x)
            }
        }
        (V::Dbl(x), Duck) => format!(
            "'{}'::DOUBLE",
            if alt && *x == 0.0 {
                "-0.0".into()
            } else {
                dbl_text(*x)
            }
        ),
        (V::Dbl(x), Lite) => dbl_text(if alt && *x == 0.0 { -0.0 } else { *x }),
        // parsed by the JVM's correctly rounded `Double.parseDouble`
        (V::Dbl(x), Spark) => format!(
            "CAST('{}' AS DOUBLE)",
            if alt && *x == 0.0 {
                "-0.0".into()
            } else {
                dbl_text(*x)
            }
        ),
        // Spark's texts are their UTF-8 bytes, decoded in the INSERT's projection
        // (`spark_projection`: an inline table takes constants only); a UUID kept as
        // STRING is the lower-case text a user's application writes
        (V::Text(s), Spark) => format!("X'{}'", hex(s.as_bytes())),
        (V::Json(j), Spark) => format!("X'{}'", hex(j.spelled(c.spelling).as_bytes())),
        (V::Uuid(u), Spark) => format!("X'{}'", hex(uuid_text(*u, false).as_bytes())),
        (V::Text(s), My) => format!("CONVERT(X'{}' USING utf8mb4)", hex(s.as_bytes())),
        (V::Json(j), My) => format!(
            "CONVERT(X'{}' USING utf8mb4)",
            hex(j.spelled(c.spelling).as_bytes())
        ),
        (V::Json(j), _) => quote(&j.spelled(c.spelling)),
        (V::Text(s), _) => quote(s),
        (V::Bool(b), Lite) => (*b as u8).to_string(),
        (V::Bool(b), _) => if *b { "TRUE" } else { "FALSE" }.into(),
        (V::Date(d), Lite) => quote(&date_text(*d)),
        (V::Date(d), Pg) => format!("DATE '{}'", pg_date_text(*d)),
        (V::Date(d), _) => format!("DATE '{}'", date_text(*d)),
        (V::Ts(t), Lite) => quote(&ts_text(*t)),
        (V::Ts(t), Pg) => format!("TIMESTAMP '{}'", pg_ts_text(*t)),
        (V::Ts(t), Spark) => format!("TIMESTAMP_NTZ '{}'", ts_text(*t)),
        (V::Ts(t), _) => format!("TIMESTAMP '{}'", ts_text(*t)),
        (V::Raw(text), _) => quote(text),
        (V::Bytes(b), Pg) => format!("'\\x{}'::bytea", hex(b)),
        (V::Bytes(b), My | Lite | Spark) => format!("X'{}'", hex(b)),
        (V::Bytes(b), Duck) => format!("from_hex('{}')", hex(b)),
        (V::Uuid(u), Pg) => format!("'{}'::uuid", uuid_text(*u, alt)),
        (V::Uuid(u), Duck) => format!("'{}'::UUID", uuid_text(*u, alt)),
        (V::Uuid(u), _) => quote(&uuid_text(*u, alt)),
    }
}

/// Spark's expression for column `name` of a side's inline table of [`literal`]s: a
/// column Spark holds as STRING arrives as its UTF-8 bytes and is decoded here.
pub fn spark_projection(class: Class, name: &str) -> String {
    match class {
        Class::Text | Class::CharText | Class::Json | Class::Uuid => {
            format!("decode(CAST({name} AS BINARY), 'UTF-8')")
        }
        _ => name.to_string(),
    }
}

/// How SQLite's row is bound (exactly the value: no text-to-double parsing).
pub fn bind(class: Class, c: &Cell, f: SideForm) -> Bind {
    let alt = c.spelling != 0;
    match (class, &c.v) {
        (Class::Instant, V::Ts(t)) if f.alt => return Bind::Text(format!("{}+00:00", ts_text(*t))),
        (Class::Instant, V::Ts(t)) => return Bind::Text(ts_text(t + f.offset_minutes as i64 * 60_000_000)),
        (Class::DecDbl { scale }, V::Dec(u)) if f.alt => {
            return Bind::Real(
                dec_text(*u, scale, false)
                    .parse()
                    .expect("a decimal reads as a double"),
            );
        }
        (Class::DecDbl { scale } | Class::IntDec { scale }, V::Dec(_)) => {
            return bind(Class::Dec { scale }, c, f);
        }
        _ => {}
    }
    match &c.v {
        V::Null => Bind::Null,
        V::Int(i) => Bind::Int(*i),
        V::Dec(u) => {
            let Class::Dec { scale } = class else {
                unreachable!()
            };
            // NUMERIC affinity stores what the text says as an integer or a double
            Bind::Text(dec_text(*u, scale, alt))
        }
        V::Dbl(x) => Bind::Real(if alt && *x == 0.0 { -0.0 } else { *x }),
        V::Text(s) => Bind::Text(s.clone()),
        V::Bool(b) => Bind::Int(*b as i64),
        V::Date(d) => Bind::Text(date_text(*d)),
        V::Ts(t) => Bind::Text(ts_text(*t)),
        V::Bytes(b) => Bind::Blob(b.clone()),
        V::Uuid(u) => Bind::Text(uuid_text(*u, alt)),
        V::Raw(text) => Bind::Text(text.clone()),
        V::Json(j) => Bind::Text(j.spelled(c.spelling)),
    }
}

/// Characters text values are made of: letters of both cases, spaces and tabs, NFC and
/// NFD accents, 2-, 3- and 4-byte UTF-8, quotes, backslashes, and the canonical form's
/// own marks (`~`, `:`).
const ALPHABET: &[&str] = &[
    "a", "b", "z", "A", "B", "Z", "0", "7", " ", "\t", "\n", "é", "e\u{301}", "ß", "中", "😀", "~", ":", "'",
    "\\", "%", "_", ",", "\"",
];

pub fn random_text(r: &mut Rng, max_len: usize) -> String {
    let n = r.below(max_len as u64 + 1) as usize;
    (0..n).map(|_| *r.pick(ALPHABET)).collect()
}

const TEXT_EDGES: &[&str] = &[
    "", " ", "a ", " a", "a  ", "a \t", "\t ", "\t", "é", "e\u{301}", "~", "1:~", "0:", "NULL", "\\N", "a\nb",
];

/// A value of a class: often an edge of the class, sometimes NULL.
pub fn random_value(r: &mut Rng, class: Class) -> V {
    if r.chance(0.08) {
        return V::Null;
    }
    let edge = r.chance(0.25);
    match class {
        Class::Int { narrow } => {
            if edge {
                let edges: &[i64] = if narrow {
                    &[0, 1, -1, i32::MIN as i64, i32::MAX as i64]
                } else {
                    &[0, -1, i64::MIN, i64::MAX, (1 << 53) + 1, -(1 << 53) - 1]
                };
                V::Int(*r.pick(edges))
            } else if narrow {
                V::Int(r.range_i64(-100_000, 100_000))
            } else {
                V::Int(r.range_i64(-1 << 40, 1 << 40))
            }
        }
        Class::IntDec { .. } => {
            if edge {
                V::Int(*r.pick(&[0, 1, -1, 9_999_999_999, -9_999_999_999]))
            } else {
                V::Int(r.range_i64(-1_000_000, 1_000_000))
            }
        }
        Class::Instant => {
            // both sides store it: MariaDB's TIMESTAMP holds 1970-2038 only, and a
            // local time at any offset stays within 0001-9999
            let at = |y, m, d, us: i64| days_from_civil(y, m, d) as i64 * MICROS_PER_DAY + us;
            if edge {
                V::Ts(*r.pick(&[
                    at(1970, 1, 2, 0),
                    at(2038, 1, 18, MICROS_PER_DAY - 1),
                    at(2023, 12, 31, 23 * 3_600_000_000 + 30 * 60_000_000),
                    at(2024, 1, 1, 0) - 1,
                    at(2024, 3, 31, 22 * 3_600_000_000),
                    at(2000, 2, 29, 12 * 3_600_000_000),
                ]))
            } else {
                V::Ts(at(2024, 1, 1, 0) + r.range_i64(-400 * MICROS_PER_DAY, 400 * MICROS_PER_DAY))
            }
        }
        Class::Dec { .. } | Class::DecDbl { .. } => {
            let max = 999_999_999_999i64;
            if edge {
                V::Dec(*r.pick(&[0, 1, -1, max, -max, 5, 50]))
            } else {
                V::Dec(r.range_i64(-10_000_000, 10_000_000))
            }
        }
        Class::Double => {
            if edge {
                V::Dbl(*r.pick(&[
                    0.0,
                    1.0,
                    -2.25,
                    0.1 + 0.2,
                    2.675,
                    1e-7,
                    5e-324,
                    1e20,
                    1e20 / 3.0,
                    -1e20 / 3.0,
                    1e37 / 3.0,
                    1e38,
                    1e300,
                    f64::MAX,
                    9007199254740993.0,
                    16777217.0,
                    123456789.12345679,
                ]))
            } else {
                let m = r.range_i64(-1_000_000_000, 1_000_000_000) as f64;
                V::Dbl(m / *r.pick(&[1.0, 3.0, 7.0, 1000.0, 1e6]))
            }
        }
        Class::Text | Class::CharText => {
            if edge {
                V::Text(r.pick(TEXT_EDGES).to_string())
            } else {
                V::Text(random_text(r, 10))
            }
        }
        Class::Json => V::Json(super::json::random(r, 2)),
        Class::Bool => V::Bool(r.chance(0.5)),
        Class::Date => {
            if edge {
                V::Date(*r.pick(&date_edges()))
            } else {
                V::Date(days_from_civil(2024, 1, 1) + r.range_i64(-800, 800) as i32)
            }
        }
        Class::Ts => {
            if edge {
                V::Ts(*r.pick(&ts_edges()))
            } else {
                let base = days_from_civil(2024, 1, 1) as i64 * MICROS_PER_DAY;
                V::Ts(base + r.range_i64(-400 * MICROS_PER_DAY, 400 * MICROS_PER_DAY))
            }
        }
        Class::Bytes => {
            if edge {
                V::Bytes(
                    r.pick(&[&[][..], &[0], &[0, 0], &[0xff], &[0xab, 0], &[0, 0xab]])
                        .to_vec(),
                )
            } else {
                V::Bytes((0..r.below(9)).map(|_| r.below(256) as u8).collect())
            }
        }
        Class::Uuid => {
            // RFC 9562 version 4 layout (MariaDB's UUID refuses other variants), and nil
            let v4 = |u: u128| {
                (u & !(0xf000u128 << 64) & !(0xc000u128 << 48)) | (0x4000u128 << 64) | (0x8000u128 << 48)
            };
            if edge {
                V::Uuid(*r.pick(&[0, v4(u128::MAX), v4(1)]))
            } else {
                V::Uuid(v4(((r.next_u64() as u128) << 64) | r.next_u64() as u128))
            }
        }
    }
}

pub fn date_edges() -> Vec<i32> {
    vec![
        days_from_civil(1, 1, 1),
        days_from_civil(9999, 12, 31),
        days_from_civil(1970, 1, 1),
        days_from_civil(1969, 12, 31),
        days_from_civil(2000, 2, 29),
        days_from_civil(2020, 12, 31),
        days_from_civil(2021, 1, 3),
        days_from_civil(2024, 12, 30),
        days_from_civil(2038, 1, 19),
        days_from_civil(1899, 12, 31),
    ]
}

pub fn ts_edges() -> Vec<i64> {
    let at = |y, m, d, us: i64| days_from_civil(y, m, d) as i64 * MICROS_PER_DAY + us;
    vec![
        at(1970, 1, 1, 0),
        at(1970, 1, 1, 0) - 1,
        at(1, 1, 1, 0),
        at(9999, 12, 31, MICROS_PER_DAY - 1),
        at(2024, 3, 31, MICROS_PER_DAY - 1),
        at(2024, 4, 1, 0),
        at(2038, 1, 19, 3 * 3_600_000_000 + 14 * 60_000_000 + 8_000_000),
        at(2024, 10, 27, 2 * 3_600_000_000 + 30 * 60_000_000),
        at(1900, 1, 1, 123_456),
        at(2021, 1, 3, MICROS_PER_DAY - 1),
    ]
}

/// A value different from `v` at the fidelity Tally compares its class, made the way
/// a replication fault would: re-cased, padded, re-normalised, nudged by one unit,
/// moved across a period edge, or turned NULL (or from NULL).
pub fn changed(r: &mut Rng, class: Class, v: &V) -> (V, &'static str) {
    if *v == V::Null {
        loop {
            let n = random_value(r, class);
            if n != V::Null {
                return (n, "null shift");
            }
        }
    }
    if r.chance(0.12) {
        return (V::Null, "null shift");
    }
    let special = match v {
        V::Raw(_) => true,
        V::Date(d) => d.abs() == DATE_INF || *d < date_range().0 || *d > date_range().1,
        V::Ts(t) => {
            t.abs() == TS_INF
                || *t < date_range().0 as i64 * MICROS_PER_DAY
                || *t > (date_range().1 as i64 + 1) * MICROS_PER_DAY
        }
        _ => false,
    };
    if special {
        loop {
            let n = random_value(r, class);
            if n != V::Null && n != *v {
                return (n, "off an edge");
            }
        }
    }
    match (class, v) {
        (Class::Int { narrow }, V::Int(i)) => {
            let max = if narrow { i32::MAX as i64 } else { i64::MAX };
            (V::Int(if *i == max { i - 1 } else { i + 1 }), "off by one")
        }
        // the decimal side holds 10 integer digits at scale 2 (numeric(12,2))
        (Class::IntDec { .. }, V::Int(i)) => (
            V::Int(if *i >= 9_999_999_999 { i - 1 } else { i + 1 }),
            "off by one",
        ),
        (Class::Instant, V::Ts(t)) => {
            let step = *r.pick(&[1, -1, 3_600_000_000, -MICROS_PER_DAY]);
            let lo = days_from_civil(1970, 1, 2) as i64 * MICROS_PER_DAY;
            (V::Ts(if t + step < lo { t - step } else { t + step }), "moved")
        }
        (Class::Dec { .. } | Class::DecDbl { .. }, V::Dec(u)) => (
            V::Dec(if *u >= 999_999_999_999 { u - 1 } else { u + 1 }),
            "last digit",
        ),
        (Class::Double, V::Dbl(x)) => {
            let y = if x.abs() >= 1e15 {
                x * (1.0 + 1e-9)
            } else {
                x + 1.0
            };
            let y = if y.is_finite() { y } else { x * (1.0 - 1e-9) };
            (V::Dbl(y), "nudged")
        }
        (Class::Text | Class::CharText, V::Text(s)) => {
            let (t, why) = text_changed(r, s);
            (V::Text(t), why)
        }
        (Class::Json, V::Json(j)) => (V::Json(j.changed()), "json changed"),
        (Class::Bool, V::Bool(b)) => (V::Bool(!b), "flipped"),
        (Class::Date, V::Date(d)) => {
            let (lo, hi) = date_range();
            let step = *r.pick(&[1, -1, 7, 31, 92, 366]);
            let n = d + step;
            (V::Date(if n < lo || n > hi { d - step } else { n }), "moved")
        }
        (Class::Ts, V::Ts(t)) => {
            let (lo, hi) = date_range();
            let (lo, hi) = (
                lo as i64 * MICROS_PER_DAY,
                hi as i64 * MICROS_PER_DAY + MICROS_PER_DAY - 1,
            );
            let step = *r.pick(&[1, -1, 1_000, 3_600_000_000, MICROS_PER_DAY, 31 * MICROS_PER_DAY]);
            let n = t + step;
            (V::Ts(if n < lo || n > hi { t - step } else { n }), "moved")
        }
        (Class::Bytes, V::Bytes(b)) => {
            let mut b = b.clone();
            match r.below(3) {
                0 => b.push(0),
                1 if !b.is_empty() => b[0] ^= 1,
                _ => b.insert(0, 0),
            }
            (V::Bytes(b), "byte changed")
        }
        (Class::Uuid, V::Uuid(u)) => (V::Uuid(u ^ 1), "bit flipped"),
        (c, v) => unreachable!("{v:?} is not of class {c:?}"),
    }
}

/// A different text: re-cased, padded, re-normalised, or with a character replaced.
fn text_changed(r: &mut Rng, s: &str) -> (String, &'static str) {
    let out = match r.below(4) {
        0 if s
            .chars()
            .any(|c| c.is_alphabetic() && (c.is_lowercase() || c.is_uppercase())) =>
        {
            let mut done = false;
            let t: String = s
                .chars()
                .map(|c| {
                    if !done && c.is_lowercase() && c.to_uppercase().count() == 1 {
                        done = true;
                        c.to_uppercase().next().unwrap()
                    } else if !done && c.is_uppercase() && c.to_lowercase().count() == 1 {
                        done = true;
                        c.to_lowercase().next().unwrap()
                    } else {
                        c
                    }
                })
                .collect();
            (t, "re-cased")
        }
        1 => (format!("{s} "), "padded"),
        2 if s.contains('é') => (s.replacen('é', "e\u{301}", 1), "re-normalised"),
        2 if s.contains("e\u{301}") => (s.replacen("e\u{301}", "é", 1), "re-normalised"),
        _ => (format!("{s}x"), "appended"),
    };
    if out.0 == s {
        (format!("{s}x"), "appended")
    } else {
        out
    }
}

/// An equal spelling of a value on one side, where the class has one.
pub fn spelling(r: &mut Rng, v: &V) -> u8 {
    match v {
        V::Dec(_) | V::Uuid(_) => r.chance(0.3) as u8,
        V::Dbl(x) if *x == 0.0 => r.chance(0.5) as u8,
        V::Json(_) => r.below(3) as u8,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days_round_trip_over_every_live_year() {
        let (lo, hi) = date_range();
        for d in (lo..=hi).step_by(997).chain([lo, hi, 0, -1]) {
            let (y, m, dd) = civil_from_days(d);
            assert_eq!(days_from_civil(y, m, dd), d, "{y}-{m}-{dd}");
        }
        assert_eq!(date_text(0), "1970-01-01");
        assert_eq!(date_text(lo), "0001-01-01");
        assert_eq!(ts_text(-1), "1969-12-31 23:59:59.999999");
    }

    #[test]
    fn decimal_spellings_are_equal_values() {
        assert_eq!(dec_text(1050, 2, false), "10.50");
        assert_eq!(dec_text(1050, 2, true), "10.500");
        assert_eq!(dec_text(-5, 2, false), "-0.05");
        assert_eq!(dec_text(7, 0, true), "7.0");
    }

    #[test]
    fn a_changed_value_is_never_equal() {
        let mut r = Rng::new(7);
        for class in Class::value_classes() {
            for _ in 0..500 {
                let v = random_value(&mut r, *class);
                let (n, why) = changed(&mut r, *class, &v);
                assert_ne!(v, n, "{class:?} {why}");
                if let (V::Dbl(a), V::Dbl(b)) = (&v, &n) {
                    assert!((a - b).abs() >= 1e-5, "{a} {b}: equal at scale 6");
                }
            }
        }
    }
}
