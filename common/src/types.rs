//! Domain types shared by agent and coordinator, with conversions from the wire
//! types of `tally-proto` that validate and name the offending field.

use serde::{Deserialize, Serialize};
use tally_proto::v1 as pb;

/// The type classes of the canonical form (DESIGN §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TypeClass {
    Integer,
    Decimal,
    Float,
    Boolean,
    Text,
    Date,
    Timestamp,
    TimestampTz,
    Time,
    Uuid,
    Binary,
    /// RFC 8785 canonical JSON of the parsed document, computed in the agent.
    Json,
    /// arrays, intervals, geometry, …: no canonical form, never hashed loosely; a run
    /// that names such a column is an error.
    Other,
}

impl TypeClass {
    pub fn name(self) -> &'static str {
        match self {
            TypeClass::Integer => "integer",
            TypeClass::Decimal => "decimal",
            TypeClass::Float => "float",
            TypeClass::Boolean => "boolean",
            TypeClass::Text => "text",
            TypeClass::Date => "date",
            TypeClass::Timestamp => "timestamp",
            TypeClass::TimestampTz => "timestamptz",
            TypeClass::Time => "time",
            TypeClass::Uuid => "uuid",
            TypeClass::Binary => "binary",
            TypeClass::Json => "json",
            TypeClass::Other => "other",
        }
    }

    pub fn parse(s: &str) -> Option<TypeClass> {
        Self::ALL.into_iter().find(|c| c.name() == s)
    }

    pub const ALL: [TypeClass; 13] = [
        TypeClass::Integer,
        TypeClass::Decimal,
        TypeClass::Float,
        TypeClass::Boolean,
        TypeClass::Text,
        TypeClass::Date,
        TypeClass::Timestamp,
        TypeClass::TimestampTz,
        TypeClass::Time,
        TypeClass::Uuid,
        TypeClass::Binary,
        TypeClass::Json,
        TypeClass::Other,
    ];

    /// Whether a scale (decimal, float) or precision (times) applies.
    pub fn has_scale(self) -> bool {
        matches!(
            self,
            TypeClass::Decimal
                | TypeClass::Float
                | TypeClass::Timestamp
                | TypeClass::TimestampTz
                | TypeClass::Time
        )
    }
}

impl std::fmt::Display for TypeClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<TypeClass> for pb::TypeClass {
    fn from(c: TypeClass) -> Self {
        match c {
            TypeClass::Integer => pb::TypeClass::Integer,
            TypeClass::Decimal => pb::TypeClass::Decimal,
            TypeClass::Float => pb::TypeClass::Float,
            TypeClass::Boolean => pb::TypeClass::Boolean,
            TypeClass::Text => pb::TypeClass::Text,
            TypeClass::Date => pb::TypeClass::Date,
            TypeClass::Timestamp => pb::TypeClass::Timestamp,
            TypeClass::TimestampTz => pb::TypeClass::Timestamptz,
            TypeClass::Time => pb::TypeClass::Time,
            TypeClass::Uuid => pb::TypeClass::Uuid,
            TypeClass::Binary => pb::TypeClass::Binary,
            TypeClass::Json => pb::TypeClass::Json,
            TypeClass::Other => pb::TypeClass::Other,
        }
    }
}

impl TryFrom<i32> for TypeClass {
    type Error = String;
    fn try_from(v: i32) -> Result<Self, String> {
        Ok(
            match pb::TypeClass::try_from(v).map_err(|_| format!("unknown type class {v}"))? {
                pb::TypeClass::Integer => TypeClass::Integer,
                pb::TypeClass::Decimal => TypeClass::Decimal,
                pb::TypeClass::Float => TypeClass::Float,
                pb::TypeClass::Boolean => TypeClass::Boolean,
                pb::TypeClass::Text => TypeClass::Text,
                pb::TypeClass::Date => TypeClass::Date,
                pb::TypeClass::Timestamp => TypeClass::Timestamp,
                pb::TypeClass::Timestamptz => TypeClass::TimestampTz,
                pb::TypeClass::Time => TypeClass::Time,
                pb::TypeClass::Uuid => TypeClass::Uuid,
                pb::TypeClass::Binary => TypeClass::Binary,
                pb::TypeClass::Json => TypeClass::Json,
                pb::TypeClass::Other => TypeClass::Other,
                pb::TypeClass::Unspecified => return Err("type class is unspecified".into()),
            },
        )
    }
}

/// The privacy levels of DESIGN §2, ordered: count_only < with_keys < detailed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PrivacyLevel {
    #[default]
    CountOnly,
    WithKeys,
    Detailed,
}

impl PrivacyLevel {
    pub fn name(self) -> &'static str {
        match self {
            PrivacyLevel::CountOnly => "count_only",
            PrivacyLevel::WithKeys => "with_keys",
            PrivacyLevel::Detailed => "detailed",
        }
    }
}

impl std::fmt::Display for PrivacyLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<PrivacyLevel> for pb::PrivacyLevel {
    fn from(l: PrivacyLevel) -> Self {
        match l {
            PrivacyLevel::CountOnly => pb::PrivacyLevel::CountOnly,
            PrivacyLevel::WithKeys => pb::PrivacyLevel::WithKeys,
            PrivacyLevel::Detailed => pb::PrivacyLevel::Detailed,
        }
    }
}

impl TryFrom<i32> for PrivacyLevel {
    type Error = String;
    fn try_from(v: i32) -> Result<Self, String> {
        match pb::PrivacyLevel::try_from(v) {
            Ok(pb::PrivacyLevel::CountOnly) => Ok(PrivacyLevel::CountOnly),
            Ok(pb::PrivacyLevel::WithKeys) => Ok(PrivacyLevel::WithKeys),
            Ok(pb::PrivacyLevel::Detailed) => Ok(PrivacyLevel::Detailed),
            _ => Err(format!("unknown privacy level {v}")),
        }
    }
}
