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
    pub fixed_char: bool,
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
    pub fn bind(&self, dataset: &str, columns: Vec<ColumnSpec>, key_len: usize) -> Result<Vec<BoundColumn>> {
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
            if !renders_as(info.class, spec.format.class) {
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
            out.push(BoundColumn {
                info: info.clone(),
                spec,
            });
        }
        Ok(out)
    }
}

/// Whether a column of class `have` can be rendered as class `want` without changing
/// its meaning: the same class, integers as booleans (MySQL `TINYINT(1)`), and any
/// exact number as a decimal at a scale.
pub fn renders_as(have: TypeClass, want: TypeClass) -> bool {
    have == want && have != TypeClass::Other && want != TypeClass::Other
        || matches!(
            (have, want),
            (TypeClass::Integer, TypeClass::Boolean)
                | (TypeClass::Boolean, TypeClass::Integer)
                | (TypeClass::Integer, TypeClass::Decimal)
                | (TypeClass::Decimal, TypeClass::Integer)
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

/// The type class of a declared SQL type name, for engines that report names.
/// Returns (class, scale, fixed_char).
pub fn classify_declared(declared: &str) -> (TypeClass, Option<u32>, bool) {
    let t = declared.trim().to_ascii_lowercase();
    let args: Vec<u32> = t
        .split_once('(')
        .map(|(_, rest)| {
            rest.split(')')
                .next()
                .unwrap_or("")
                .split(',')
                .filter_map(|a| a.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let base = t.split('(').next().unwrap_or("").trim();
    let has = |s: &str| base.contains(s);
    if base == "tinyint" && args.first() == Some(&1) || has("bool") {
        return (TypeClass::Boolean, None, false);
    }
    if has("int") || base == "serial" || base == "bigserial" || base == "smallserial" {
        return (TypeClass::Integer, None, false);
    }
    if has("numeric") || has("decimal") || base == "number" || base == "money" {
        return (TypeClass::Decimal, Some(args.get(1).copied().unwrap_or(0)), false);
    }
    if has("real") || has("floa") || has("doub") {
        return (TypeClass::Float, None, false);
    }
    if base == "uuid" {
        return (TypeClass::Uuid, None, false);
    }
    if has("timestamp") && (t.contains("with time zone") || base == "timestamptz") {
        return (TypeClass::TimestampTz, args.first().copied(), false);
    }
    if has("timestamp") || has("datetime") {
        return (TypeClass::Timestamp, args.first().copied(), false);
    }
    if base == "date" {
        return (TypeClass::Date, None, false);
    }
    if base.starts_with("time") {
        return (TypeClass::Time, args.first().copied(), false);
    }
    if base == "char" || base == "character" || base == "bpchar" || base == "nchar" {
        return (TypeClass::Text, None, true);
    }
    if has("char") || has("text") || has("clob") || base == "string" || base == "name" {
        return (TypeClass::Text, None, false);
    }
    if has("blob") || has("binary") || base == "bytea" {
        return (TypeClass::Binary, None, false);
    }
    (TypeClass::Other, None, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_types_classify() {
        assert_eq!(
            classify_declared("NUMERIC(12,2)"),
            (TypeClass::Decimal, Some(2), false)
        );
        assert_eq!(classify_declared("tinyint(1)"), (TypeClass::Boolean, None, false));
        assert_eq!(classify_declared("BIGINT"), (TypeClass::Integer, None, false));
        assert_eq!(classify_declared("character(10)"), (TypeClass::Text, None, true));
        assert_eq!(
            classify_declared("character varying(20)"),
            (TypeClass::Text, None, false)
        );
        assert_eq!(
            classify_declared("timestamp(3) with time zone"),
            (TypeClass::TimestampTz, Some(3), false)
        );
        assert_eq!(
            classify_declared("timestamp(6) without time zone"),
            (TypeClass::Timestamp, Some(6), false)
        );
        assert_eq!(
            classify_declared("DATETIME(6)"),
            (TypeClass::Timestamp, Some(6), false)
        );
        assert_eq!(classify_declared("time"), (TypeClass::Time, None, false));
        assert_eq!(classify_declared("jsonb"), (TypeClass::Other, None, false));
        assert_eq!(classify_declared("BLOB"), (TypeClass::Binary, None, false));
    }

    #[test]
    fn other_never_renders() {
        assert!(!renders_as(TypeClass::Other, TypeClass::Other));
        assert!(renders_as(TypeClass::Integer, TypeClass::Boolean));
        assert!(!renders_as(TypeClass::Text, TypeClass::Integer));
    }
}
