//! What the agent knows about a dataset after introspection, and the validation of a
//! request's columns against it: the coordinator may name only columns that exist,
//! rendered in a type class the column can faithfully take.

use tally_common::canonical::CanonicalError;
use tally_common::segment::ColumnSpec;
use tally_common::types::TypeClass;

use crate::error::{AgentError, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnInfo {
    pub name: String,
    pub class: TypeClass,
    pub declared_type: String,
    pub nullable: bool,
    /// Declared decimal scale or fractional-second precision.
    pub scale: Option<u32>,
    /// CHAR(n) or BINARY(n): padded to a fixed length.
    pub fixed_char: bool,
    pub native: Native,
}

#[derive(Debug, Clone)]
pub struct DatasetInfo {
    pub columns: Vec<ColumnInfo>,
    /// Key column names as they are spelled in the database.
    pub key: Vec<String>,
    pub row_estimate: u64,
    pub engine: &'static str,
    pub engine_version: String,
}

/// A request's column bound to the introspected column it names.
#[derive(Debug, Clone)]
pub struct BoundColumn {
    pub info: ColumnInfo,
    pub spec: ColumnSpec,
    /// A timestamp without zone compared as one with zone: the ISO offset (`+02:00`)
    /// of the dataset's `time_zone` it is read in.
    pub zone: Option<String>,
}

impl DatasetInfo {
    pub fn column(&self, name: &str) -> Option<&ColumnInfo> {
        self.columns
            .iter()
            .find(|c| c.name == name)
            .or_else(|| self.columns.iter().find(|c| c.name.eq_ignore_ascii_case(name)))
    }

    pub fn key_columns(&self) -> Vec<&ColumnInfo> {
        self.key.iter().filter_map(|k| self.column(k)).collect()
    }

    /// Binds the request's columns (key columns first, `key_len` of them) to this
    /// dataset, checking names, order of the key and type-class compatibility.
    /// `time_zone` is the dataset's zone as an ISO offset (`+00:00` for UTC).
    pub fn bind(
        &self,
        dataset: &str,
        columns: Vec<ColumnSpec>,
        key_len: usize,
        time_zone: &str,
    ) -> Result<Vec<BoundColumn>> {
        if key_len != self.key.len() {
            return Err(AgentError::InvalidArgument(format!(
                "dataset {dataset} has a key of {} column(s) ({}), the request names {key_len}",
                self.key.len(),
                self.key.join(", ")
            )));
        }
        if columns.len() < key_len {
            return Err(AgentError::InvalidArgument(
                "fewer columns than key columns".into(),
            ));
        }
        let mut out = Vec::with_capacity(columns.len());
        for (i, spec) in columns.into_iter().enumerate() {
            let info = self.column(&spec.name).ok_or_else(|| {
                AgentError::InvalidArgument(format!("dataset {dataset} has no column {:?}", spec.name))
            })?;
            if i < key_len && !info.name.eq_ignore_ascii_case(&self.key[i]) {
                return Err(AgentError::InvalidArgument(format!(
                    "columns[{i}] must be key column {} of dataset {dataset}, got {}",
                    self.key[i], spec.name
                )));
            }
            // a decimal of scale 0 holds integers only: comparing it as one loses nothing
            let whole = info.class == TypeClass::Decimal
                && info.scale == Some(0)
                && spec.format.class == TypeClass::Integer;
            if !whole && !renders_as(info.class, spec.format.class) {
                return Err(AgentError::InvalidArgument(format!(
                    "dataset {dataset} column {} is {} and cannot be compared as {}",
                    info.name, info.class, spec.format.class
                )));
            }
            if out.iter().any(|b: &BoundColumn| b.info.name == info.name) {
                return Err(AgentError::InvalidArgument(format!(
                    "column {} named twice",
                    info.name
                )));
            }
            if spec.format.exact && spec.format.class != TypeClass::Decimal {
                return Err(AgentError::InvalidArgument(format!(
                    "column {} is compared as {}: exact applies to decimals only",
                    info.name, spec.format.class
                )));
            }
            let zone = (info.class == TypeClass::Timestamp && spec.format.class == TypeClass::TimestampTz)
                .then(|| time_zone.to_string());
            out.push(BoundColumn {
                info: info.clone(),
                spec,
                zone,
            });
        }
        Ok(out)
    }
}

/// Whether a column of class `have` can be rendered as class `want` without changing
/// its meaning: the same class, integers as booleans (MySQL `TINYINT(1)`), integers as
/// decimals, and the cross-class rules of DESIGN §3. Never a lossy direction (a decimal
/// as an integer).
pub fn renders_as(have: TypeClass, want: TypeClass) -> bool {
    use TypeClass::*;
    have == want && have != Other && want != Other
        || matches!(
            (have, want),
            (Integer, Boolean)
                | (Boolean, Integer)
                | (Integer, Decimal)
                // across classes (DESIGN §3), each stated in the run's warnings
                | (Timestamp, TimestampTz)
                | (Float, Decimal)
                | (Text, Binary)
                | (Text, Json)
        )
}

/// Maps a canonical-form error to an agent error that does not carry the value.
pub fn canonical_error(dataset: &str, column: &str, e: CanonicalError) -> AgentError {
    tracing::warn!(dataset, column, error = %e, "value has no canonical form");
    let message = match e {
        CanonicalError::Invalid { class, reason, .. } => format!("a value is not a valid {class}: {reason}"),
        CanonicalError::Unsupported(c) => format!("type class {c} has no canonical form"),
    };
    AgentError::Canonical {
        dataset: dataset.to_string(),
        column: column.to_string(),
        message,
    }
}

/// What an engine's type needs beyond its class to render canonically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Native {
    #[default]
    Plain,
    /// float32 (`real`, MySQL `FLOAT`): widened exactly to double before rendering.
    Float32,
    /// MySQL `ZEROFILL`: rendered by value (`42`, not `00042`).
    ZeroFill,
    /// MySQL `BIT(n)`: a boolean at n = 1, otherwise `ceil(n/8)` bytes.
    Bit(u32),
    /// A type whose engine text is its canonical text: enum and set labels, PostgreSQL
    /// `inet`/`cidr`/`macaddr`, MariaDB `INET4`/`INET6`. Rendered through a text cast.
    Label,
    /// JSON stored as text (MariaDB's `JSON` is `LONGTEXT` with a `json_valid` check).
    JsonText,
}

/// A declared type name split into its base name, its numeric arguments and the words
/// after them: `decimal(12,2) unsigned zerofill` → (`decimal`, [12, 2], `unsigned zerofill`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    pub base: String,
    pub args: Vec<u32>,
    pub rest: String,
}

impl Declared {
    pub fn parse(declared: &str) -> Declared {
        let t = declared.trim().to_ascii_lowercase();
        match t.split_once('(') {
            Some((base, tail)) => {
                let (inside, after) = tail.split_once(')').unwrap_or((tail, ""));
                Declared {
                    base: base.trim().to_string(),
                    args: inside.split(',').filter_map(|a| a.trim().parse().ok()).collect(),
                    rest: format!("{} {}", base.trim(), after.trim())
                        .split_whitespace()
                        .skip(1)
                        .collect::<Vec<_>>()
                        .join(" "),
                }
            }
            None => Declared {
                base: t.clone(),
                args: Vec::new(),
                rest: String::new(),
            },
        }
    }

    pub fn arg(&self, i: usize) -> Option<u32> {
        self.args.get(i).copied()
    }
}

/// One entry of an engine's type table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeEntry {
    pub class: TypeClass,
    /// Declared scale (decimals) or fractional-second precision (times); `None` when
    /// the declaration leaves it open.
    pub scale: Option<u32>,
    /// CHAR(n), BINARY(n): padded to a fixed length.
    pub fixed: bool,
    pub native: Native,
}

impl TypeEntry {
    pub const OTHER: TypeEntry = TypeEntry::of(TypeClass::Other);

    pub const fn of(class: TypeClass) -> TypeEntry {
        TypeEntry {
            class,
            scale: None,
            fixed: false,
            native: Native::Plain,
        }
    }

    pub const fn scale(mut self, scale: Option<u32>) -> TypeEntry {
        self.scale = scale;
        self
    }

    pub const fn fixed(mut self) -> TypeEntry {
        self.fixed = true;
        self
    }

    pub const fn native(mut self, native: Native) -> TypeEntry {
        self.native = native;
        self
    }

    pub fn column(self, name: String, declared_type: String, nullable: bool) -> ColumnInfo {
        ColumnInfo {
            name,
            class: self.class,
            declared_type,
            nullable,
            scale: self.scale,
            fixed_char: self.fixed,
            native: self.native,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_types_split_into_base_arguments_and_modifiers() {
        let d = Declared::parse("DECIMAL(12,2) UNSIGNED ZEROFILL");
        assert_eq!(
            (d.base.as_str(), d.args.as_slice(), d.rest.as_str()),
            ("decimal", &[12, 2][..], "unsigned zerofill")
        );
        let d = Declared::parse("timestamp(3) with time zone");
        assert_eq!(
            (d.base.as_str(), d.arg(0), d.rest.as_str()),
            ("timestamp", Some(3), "with time zone")
        );
        let d = Declared::parse("double precision");
        assert_eq!((d.base.as_str(), d.args.len()), ("double precision", 0));
        let d = Declared::parse("enum('a','b')");
        assert_eq!((d.base.as_str(), d.args.len()), ("enum", 0));
    }

    #[test]
    fn other_never_renders() {
        assert!(!renders_as(TypeClass::Other, TypeClass::Other));
        assert!(renders_as(TypeClass::Integer, TypeClass::Boolean));
        assert!(!renders_as(TypeClass::Text, TypeClass::Integer));
    }
}
