//! The shared test-vector file `tests/vectors/canonical.json`: its format and a loader.
//! Every dialect's conformance suite and the reference encoder's tests read it.

use serde::Deserialize;

use crate::canonical::{CanonicalError, FieldFormat, canonical_from_text};
use crate::types::TypeClass;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectorFile {
    pub version: u32,
    pub about: String,
    pub vectors: Vec<RowVector>,
    pub aggregates: Vec<AggregateVector>,
    pub sealed: SealedVectors,
    pub period_labels: Vec<PeriodLabelVector>,
    /// Single fields whose rule a reader could take two ways (docs/canonical-form.md):
    /// each with its canonical text, or refused.
    pub single: Vec<SingleVector>,
}

/// One field and its canonical text (`canonical`), or `refused` with why: the value
/// has no canonical form, and a run comparing it is an error naming the column.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SingleVector {
    pub id: String,
    pub about: String,
    pub field: VectorField,
    #[serde(default)]
    pub canonical: Option<String>,
    #[serde(default)]
    pub refused: Option<String>,
}

/// One canonical date/timestamp text and its period label at every granularity
/// (docs/canonical-form.md §9); `canonical: null` is a NULL, whose label is empty.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeriodLabelVector {
    pub id: String,
    pub about: String,
    pub canonical: Option<String>,
    /// Granularity name (`hour` … `year`) → label.
    pub labels: std::collections::BTreeMap<String, String>,
}

/// Sealed checksums (DESIGN §4.1) for two agents with fixed zone keys (hex).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealedVectors {
    pub about: String,
    pub zone_keys: std::collections::BTreeMap<String, ZoneKeyVector>,
    /// Each agent's dataset in the run.
    pub datasets: std::collections::BTreeMap<String, String>,
    pub nonce: String,
    pub shared: String,
    pub run_key: String,
    pub k_row: String,
    pub k_key: String,
    pub rows: Vec<SealedRow>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneKeyVector {
    pub secret: String,
    pub public: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealedRow {
    /// The row vector whose row string is hashed.
    pub id: String,
    /// Signed decimal.
    pub sealed_md5_48: String,
    pub sealed_sha256_64: String,
    /// SHA-256(k_key || row string), first 8 bytes.
    pub sealed_key_hash: String,
}

impl SealedVectors {
    /// The run keys the file states.
    pub fn keys(&self) -> crate::seal::RunKeys {
        let b = |h: &str| -> [u8; 32] {
            hex::decode(h)
                .ok()
                .and_then(|v| v.try_into().ok())
                .unwrap_or_else(|| panic!("32 hex bytes expected: {h}"))
        };
        crate::seal::RunKeys {
            k_row: b(&self.k_row),
            k_key: b(&self.k_key),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RowVector {
    pub id: String,
    pub about: String,
    pub fields: Vec<VectorField>,
    pub row_string: String,
    /// Signed decimal.
    pub md5_48: String,
    /// 16 lowercase hex digits.
    pub sha256_64: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectorField {
    #[serde(rename = "type")]
    pub class: String,
    pub value: Option<String>,
    #[serde(default)]
    pub scale: Option<u32>,
    #[serde(default)]
    pub precision: Option<u32>,
    #[serde(default)]
    pub char: bool,
    /// Decimal: the exact normalised form.
    #[serde(default)]
    pub exact: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AggregateVector {
    pub id: String,
    pub about: String,
    pub rows: Vec<String>,
    pub count: String,
    pub md5_48_sum: String,
    pub sha256_sum: String,
    pub sha256_xor: String,
}

impl VectorField {
    pub fn class(&self) -> TypeClass {
        TypeClass::parse(&self.class).unwrap_or_else(|| panic!("unknown vector type {:?}", self.class))
    }

    pub fn format(&self) -> FieldFormat {
        let f = FieldFormat::new(self.class())
            .fixed_char(self.char)
            .exact(self.exact);
        match self.scale.or(self.precision) {
            Some(s) => f.with_scale(s),
            None => f,
        }
    }

    pub fn canonical(&self) -> Result<Option<String>, CanonicalError> {
        canonical_from_text(&self.format(), self.value.as_deref())
    }
}

impl RowVector {
    /// The row string the reference encoder gives for this vector's fields.
    pub fn encode(&self) -> Result<String, CanonicalError> {
        let fields = self
            .fields
            .iter()
            .map(VectorField::canonical)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(crate::canonical::row_string(fields.iter().map(Option::as_deref)))
    }
}

impl VectorFile {
    /// The vector file of this repository.
    pub fn load_repo() -> VectorFile {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/vectors/canonical.json");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {path}: {e}"))
    }

    pub fn row(&self, id: &str) -> &RowVector {
        self.vectors
            .iter()
            .find(|v| v.id == id)
            .unwrap_or_else(|| panic!("no vector {id}"))
    }
}
