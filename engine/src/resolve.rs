//! The resolve phase (DESIGN §5 step 1): match columns by name (case-insensitive),
//! resolve each column's type class and scale, negotiate the hash method, and report
//! schema drift before anything is scanned.

use tally_common::TypeClass;
use tally_common::canonical::{DEFAULT_FLOAT_SCALE, DEFAULT_TIME_PRECISION, FieldFormat};
use tally_common::checksum::HashMethod;
use tally_common::segment::ColumnSpec;
use tally_common::wire::{Column, Describe};

use crate::error::RunError;
use crate::fidelity::{ColumnFidelity, ColumnInput, Fidelity, empties_are_null};
use crate::spec::{HashChoice, Override, Spec, Strategy};

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResolvedColumn {
    pub source_name: String,
    pub target_name: String,
    pub format: FieldFormat,
    pub masked: bool,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Resolved {
    /// Key columns first, then compared columns.
    pub columns: Vec<ResolvedColumn>,
    pub key_len: usize,
    pub method: HashMethod,
    /// Both sides compute XOR (otherwise SUM only is compared).
    pub xor: bool,
    /// Not fatal: columns present on one side only, and every rule applied across
    /// classes or to a scale (exact decimals, zone conversions, overrides).
    pub warnings: Vec<String>,
    /// Each column compared below what a side stores, and why (`None` only in the
    /// state of a run checkpointed before fidelity was resolved).
    #[serde(default)]
    pub fidelity: Option<Fidelity>,
    /// `bisection.strategy: auto` bisects by key hash, not by quantiles, because a key
    /// column is neither an integer nor a text on some side (quantile cuts order keys by
    /// integer value or text bytes); `false` also in the state of older runs.
    #[serde(default)]
    pub hash_bisection: bool,
}

impl Resolved {
    pub fn source_columns(&self) -> Vec<ColumnSpec> {
        self.columns
            .iter()
            .map(|c| ColumnSpec {
                name: c.source_name.clone(),
                format: c.format,
            })
            .collect()
    }

    pub fn target_columns(&self) -> Vec<ColumnSpec> {
        self.columns
            .iter()
            .map(|c| ColumnSpec {
                name: c.target_name.clone(),
                format: c.format,
            })
            .collect()
    }

    pub fn compared_names(&self) -> Vec<String> {
        self.columns[self.key_len..]
            .iter()
            .map(|c| c.source_name.clone())
            .collect()
    }
}

fn find<'a>(d: &'a Describe, name: &str) -> Option<&'a Column> {
    d.column(name)
}

/// Why a column cannot be compared as the spec asks.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refusal {
    /// The two sides' types do not compare (schema drift).
    Drift(String),
    /// A side's type has no canonical form (arrays, intervals, geometry, …).
    NoCanonicalForm(String),
    /// The spec asks for something that does not fit the column (an override).
    Spec(String),
}

/// What resolving one column needs besides its two descriptions.
struct ColumnContext<'a> {
    name: &'a str,
    is_key: bool,
    overrides: Option<(&'a str, &'a Override)>,
    /// The zones each side reads its zone-less timestamps in ("" = UTC).
    zones: (&'a str, &'a str),
}

const SIDES: [&str; 2] = ["source", "target"];

/// The zone a dataset reads its zone-less timestamps in.
fn zone(z: &str) -> &str {
    if z.is_empty() { "UTC" } else { z }
}

/// The class both sides render a column as, its scale, and the rules applied (stated
/// in the run's warnings), or why it cannot be compared.
fn resolve_format(
    cx: &ColumnContext<'_>,
    s: &Column,
    t: &Column,
) -> Result<(FieldFormat, Vec<String>), Refusal> {
    use TypeClass::*;
    let name = cx.name;
    let (a, b) = (s.class, t.class);
    let declared = [&s.declared_type, &t.declared_type];
    let mut notes = Vec::new();
    if a == Other || b == Other {
        return Err(Refusal::NoCanonicalForm(if cx.is_key {
            format!(
                "key column {name} ({} / {}) has no canonical form; key the comparison on other columns",
                s.declared_type, t.declared_type
            )
        } else {
            format!(
                "column {name} ({} / {}) has no canonical form; compare it some other way or exclude it: exclude: [{name}]",
                s.declared_type, t.declared_type
            )
        }));
    }
    // which side (0 source, 1 target) has class `c`, for the rules across classes
    let side_of = |c: TypeClass| usize::from(a != c);
    let across = |x: TypeClass, y: TypeClass| (a, b) == (x, y) || (a, b) == (y, x);
    let cross_class = a != b && !across(Boolean, Integer) && !across(Integer, Decimal);
    if cross_class && cx.is_key {
        // key bounds and ordering are compared within one class only: a zone
        // conversion or a hex rendering would order the two sides' keys differently
        return Err(Refusal::Drift(format!(
            "key column {name} is {a} ({}) on the source and {b} ({}) on the target; key columns compare within one type class",
            s.declared_type, t.declared_type
        )));
    }
    let mut fixed_char = s.fixed_char || t.fixed_char;
    let resolved = match (a, b) {
        (x, y) if x == y => x,
        (Boolean, Integer) | (Integer, Boolean) => Boolean,
        (Integer, Decimal) | (Decimal, Integer) => Decimal,
        // MariaDB stores JSON as LONGTEXT
        (Json, Text) | (Text, Json) => {
            let text = side_of(Text);
            notes.push(format!(
                "column {name}: the {}'s text ({}) is parsed as JSON and compared with the {}'s json ({}) in RFC 8785 form",
                SIDES[text],
                declared[text],
                SIDES[1 - text],
                declared[1 - text]
            ));
            // CHAR(n) padding is no part of a JSON document
            fixed_char = false;
            Json
        }
        (Timestamp, TimestampTz) | (TimestampTz, Timestamp) => {
            let local = side_of(Timestamp);
            let z = zone(if local == 0 { cx.zones.0 } else { cx.zones.1 });
            notes.push(format!(
                "column {name}: the {}'s timestamp without time zone ({}) is read in {z} (its agent's time_zone) and \
                 compared in UTC with the {}'s timestamp with time zone ({})",
                SIDES[local],
                declared[local],
                SIDES[1 - local],
                declared[1 - local]
            ));
            TimestampTz
        }
        (Decimal, Float) | (Float, Decimal) => Decimal,
        (Text, Binary) | (Binary, Text) => {
            let text = side_of(Text);
            notes.push(format!(
                "column {name}: the {}'s text ({}) is compared with the {}'s binary ({}) by its UTF-8 bytes, in lowercase hex",
                SIDES[text],
                declared[text],
                SIDES[1 - text],
                declared[1 - text]
            ));
            // trailing 0x00 bytes are insignificant only where the binary side is fixed
            // BINARY(n); a CHAR(n) text side never makes them so
            fixed_char = if text == 0 { t.fixed_char } else { s.fixed_char };
            Binary
        }
        _ => {
            return Err(Refusal::Drift(format!(
                "column {name} is {a} ({}) on the source and {b} ({}) on the target",
                s.declared_type, t.declared_type
            )));
        }
    };
    let (scale_override, precision_override) = match cx.overrides {
        Some((key, o)) => {
            let scaled = matches!(resolved, Decimal | Float);
            let timed = matches!(resolved, Timestamp | TimestampTz | Time);
            if o.scale.is_some() && !scaled {
                return Err(Refusal::Spec(format!(
                    "overrides.{key}.scale: column {name} is compared as {resolved}, which has no scale \
                     (scale applies to decimal and float columns, precision to timestamp and time columns)"
                )));
            }
            if o.precision.is_some() && !timed {
                return Err(Refusal::Spec(format!(
                    "overrides.{key}.precision: column {name} is compared as {resolved}, which has no precision \
                     (precision applies to timestamp and time columns, scale to decimal and float columns)"
                )));
            }
            (o.scale.map(|n| (key, n)), o.precision.map(|n| (key, n)))
        }
        None => (None, None),
    };
    let mut exact = false;
    let scale = match resolved {
        Decimal => {
            // per side: the declared scale of its decimal (an integer declares 0); the
            // float side of a decimal/float pair follows the decimal
            let declared_scale = |c: &Column, k: TypeClass| match k {
                Integer => Some(Some(0)),
                Decimal => Some(c.scale),
                _ => None,
            };
            let scales = [declared_scale(s, a), declared_scale(t, b)];
            let undeclared: Vec<usize> = (0..2).filter(|i| scales[*i] == Some(None)).collect();
            let fixed = scales.iter().flatten().flatten().copied().max().unwrap_or(0);
            let float_side = across(Decimal, Float).then(|| side_of(Float));
            let decimal_side = float_side.map(|f| 1 - f);
            let scale = if let Some((key, n)) = scale_override {
                notes.push(format!(
                    "column {name}: compared at scale {n}, set by overrides.{key} (declared {} / {})",
                    s.declared_type, t.declared_type
                ));
                n
            } else if !undeclared.is_empty() {
                exact = true;
                let (where_, types) = match undeclared.as_slice() {
                    [i] => (format!("on the {}", SIDES[*i]), declared[*i].to_string()),
                    _ => (
                        "on both sides".to_string(),
                        format!("{} / {}", s.declared_type, t.declared_type),
                    ),
                };
                notes.push(format!(
                    "column {name}: scale undeclared {where_} ({types}), compared exactly"
                ));
                0
            } else {
                fixed
            };
            if let (Some(f), Some(d)) = (float_side, decimal_side) {
                let how = if exact {
                    "exactly".to_string()
                } else {
                    format!("at scale {scale}")
                };
                notes.push(format!(
                    "column {name}: the {}'s float ({}) is compared with the {}'s decimal ({}) {how}",
                    SIDES[f], declared[f], SIDES[d], declared[d]
                ));
            }
            scale
        }
        Float => match scale_override {
            Some((key, n)) => {
                notes.push(format!(
                    "column {name}: floats compared at scale {n}, set by overrides.{key}"
                ));
                n
            }
            None => DEFAULT_FLOAT_SCALE,
        },
        Timestamp | TimestampTz | Time => match precision_override {
            Some((key, n)) => {
                notes.push(format!(
                    "column {name}: compared at precision {n}, set by overrides.{key} (declared {} / {})",
                    s.declared_type, t.declared_type
                ));
                n
            }
            // an undeclared precision counts as 6, the finest PostgreSQL and MySQL store
            None => s
                .scale
                .unwrap_or(DEFAULT_TIME_PRECISION)
                .max(t.scale.unwrap_or(DEFAULT_TIME_PRECISION)),
        },
        _ => 0,
    };
    Ok((
        FieldFormat::new(resolved)
            .with_scale(scale)
            .fixed_char(fixed_char)
            .exact(exact),
        notes,
    ))
}

pub fn resolve(spec: &Spec, src: &Describe, tgt: &Describe) -> Result<Resolved, RunError> {
    let mut drift = Vec::new();
    let mut uncomparable = Vec::new();
    let mut warnings = Vec::new();
    // what an agent says of its engine (SQL no test here has run live) goes with the run
    for (side, d) in [("source", src), ("target", tgt)] {
        for w in &d.engine_warnings {
            warnings.push(format!("{side} dataset {} ({}): {w}", d.dataset, d.engine));
        }
    }
    // the key: the spec's, or the source agent's configured key; both agents must agree
    let key: Vec<String> = if spec.key.is_empty() {
        src.key.clone()
    } else {
        spec.key.clone()
    };
    let is_key = |name: &str| key.iter().any(|k| k.eq_ignore_ascii_case(name));
    for (side, d) in [("source", src), ("target", tgt)] {
        let same = d.key.len() == key.len() && d.key.iter().zip(&key).all(|(a, b)| a.eq_ignore_ascii_case(b));
        if !same {
            drift.push(format!(
                "key mismatch: the spec compares on ({}) but the {side} dataset {} is keyed on ({})",
                key.join(", "),
                d.dataset,
                d.key.join(", ")
            ));
        }
    }
    for c in &spec.exclude {
        if is_key(c) {
            return Err(RunError::Config(format!(
                "exclude: {c} is a key column and cannot be excluded"
            )));
        }
        if find(src, c).is_none() && find(tgt, c).is_none() {
            return Err(RunError::Config(format!(
                "exclude: column {c} is in neither the source dataset {} nor the target dataset {}",
                src.dataset, tgt.dataset
            )));
        }
    }
    let names: Vec<String> = if spec.columns.is_empty() {
        // every column both sides have; one on one side only is not requested, so it
        // is a warning rather than drift (naming it in `columns:` makes it drift)
        let mut v = Vec::new();
        for c in &src.columns {
            if is_key(&c.name) || spec.excludes(&c.name) {
                continue;
            }
            match find(tgt, &c.name) {
                None => warnings.push(format!(
                    "column {} exists on the source only: not compared",
                    c.name
                )),
                Some(_) => v.push(c.name.clone()),
            }
        }
        for c in &tgt.columns {
            if find(src, &c.name).is_none() && !spec.excludes(&c.name) {
                warnings.push(format!(
                    "column {} exists on the target only: not compared",
                    c.name
                ));
            }
        }
        v
    } else {
        spec.columns.clone()
    };
    let all: Vec<&String> = key.iter().chain(&names).collect();
    for k in spec.overrides.keys() {
        if !all.iter().any(|n| n.eq_ignore_ascii_case(k)) {
            return Err(RunError::Config(format!(
                "overrides.{k}: column {k} is not compared (the compared columns are {})",
                all.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ")
            )));
        }
    }
    let mut columns = Vec::new();
    let mut fidelity = Vec::new();
    for (i, name) in all.into_iter().enumerate() {
        let (s, t) = (find(src, name), find(tgt, name));
        match (s, t) {
            (Some(s), Some(t)) => {
                let cx = ColumnContext {
                    name,
                    is_key: i < key.len(),
                    overrides: spec.override_of(name),
                    zones: (&src.time_zone, &tgt.time_zone),
                };
                match resolve_format(&cx, s, t) {
                    // a side that reads '' as NULL does so for text compared as text only;
                    // its agent refuses the text asked as binary or JSON (the rule would
                    // not hold there), so the run is refused here, before any scan
                    Ok((format, _))
                        if format.class != TypeClass::Text
                            && [(src, s), (tgt, t)]
                                .iter()
                                .any(|(d, c)| c.class == TypeClass::Text && empties_are_null(d)) =>
                    {
                        uncomparable.push(format!(
                            "column {name} is text on a side whose dataset has empty_string_is_null: true, \
                             which holds for text compared as text only, not as {}; exclude it (exclude: [{name}]) \
                             or compare it through a query: dataset",
                            format.class
                        ));
                    }
                    Ok((format, notes)) => {
                        if i < key.len() && s.nullable && t.nullable {
                            warnings.push(format!("key column {name} is nullable on both sides"));
                        }
                        warnings.extend(notes);
                        // mode count compares no value: only the keys' rendering counts
                        let compared = i < key.len() || spec.mode != crate::spec::Mode::Count;
                        fidelity.extend(compared.then(|| ColumnFidelity {
                            column: s.name.clone(),
                            reasons: crate::fidelity::reasons(&ColumnInput {
                                is_key: i < key.len(),
                                source: s,
                                target: t,
                                format,
                                zones: (&src.time_zone, &tgt.time_zone),
                                empty_is_null: (empties_are_null(src), empties_are_null(tgt)),
                            }),
                        }));
                        columns.push(ResolvedColumn {
                            source_name: s.name.clone(),
                            target_name: t.name.clone(),
                            format,
                            masked: s.masked || t.masked,
                        })
                    }
                    Err(Refusal::Drift(e)) => drift.push(format!("incompatible types: {e}")),
                    Err(Refusal::NoCanonicalForm(e)) => uncomparable.push(e),
                    Err(Refusal::Spec(e)) => return Err(RunError::Config(e)),
                }
            }
            (None, _) => drift.push(format!(
                "missing column: {name} is not in the source dataset {}",
                src.dataset
            )),
            (_, None) => drift.push(format!(
                "missing column: {name} is not in the target dataset {}",
                tgt.dataset
            )),
        }
    }
    if !drift.is_empty() {
        drift.extend(uncomparable);
        return Err(RunError::SchemaDrift(drift.join("; ")));
    }
    if !uncomparable.is_empty() {
        return Err(RunError::NoCanonicalForm(uncomparable.join("; ")));
    }
    let supports =
        |d: &Describe, m: HashMethod| d.hash_methods.contains(&m) && (!m.is_sealed() || d.zone_key.is_some());
    let offers = |d: &Describe| {
        let m: Vec<&str> = HashMethod::BY_STRENGTH
            .into_iter()
            .filter(|m| supports(d, *m))
            .map(|m| m.name())
            .collect();
        if m.is_empty() {
            "nothing".to_string()
        } else {
            m.join(", ")
        }
    };
    const WHY: &str = "an agent offers sealed methods when it has a zone key (tls.zone_key), and unsealed \
                       ones only for datasets whose policy says allow_unsealed";
    let method = match spec.hash {
        HashChoice::Auto => HashMethod::BY_STRENGTH
            .into_iter()
            .find(|m| supports(src, *m) && supports(tgt, *m))
            .ok_or_else(|| {
                RunError::Config(format!(
                    "the two agents share no hash method (source offers {}, target offers {}): {WHY}",
                    offers(src),
                    offers(tgt)
                ))
            })?,
        HashChoice::Md5_48 => HashMethod::Md5_48,
        HashChoice::Sha256_64 => HashMethod::Sha256_64,
        HashChoice::SealedMd5_48 => HashMethod::SealedMd5_48,
        HashChoice::SealedSha256_64 => HashMethod::SealedSha256_64,
    };
    for (side, d) in [("source", src), ("target", tgt)] {
        if !supports(d, method) {
            return Err(RunError::Config(format!(
                "hash: the {side} agent does not offer {method} for dataset {} (it offers {}): {WHY}",
                d.dataset,
                offers(d)
            )));
        }
    }
    // quantile cuts (strategies quantile and time, and auto's default) order keys by
    // integer value or text bytes: another key class is refused here, before any scan,
    // rather than by an agent half-way (issue 31), and auto bisects by hash instead
    let cuts_keys = spec.mode != crate::spec::Mode::Measures && spec.bisection.strategy != Strategy::Hash;
    let uncuttable = columns[..key.len()].iter().find_map(|c| {
        let (s, t) = (find(src, &c.source_name)?, find(tgt, &c.target_name)?);
        let cuttable = |x: &Column| matches!(x.class, TypeClass::Integer | TypeClass::Text);
        let same = s.class == t.class && matches!(c.format.class, TypeClass::Integer | TypeClass::Text);
        (!(cuttable(s) && cuttable(t) && same)).then(|| {
            format!(
                "key column {} is {} ({}) on the source and {} ({}) on the target",
                c.source_name, s.class, s.declared_type, t.class, t.declared_type
            )
        })
    });
    // a dataset whose policy keeps its key values in its zone: auto bisects by hash
    // (quantile and time were refused by check_policies, naming the policy key)
    let hidden = [src, tgt].into_iter().find(|d| !d.expose_key_bounds).map(|d| {
        format!(
            "dataset {} keeps its key values in its zone (expose_key_bounds: false)",
            d.dataset
        )
    });
    let mut hash_bisection = false;
    if let (true, Some(why)) = (cuts_keys, uncuttable.or(hidden)) {
        if spec.bisection.strategy != Strategy::Auto {
            return Err(RunError::Config(format!(
                "bisection.strategy {}: {why}; quantile cuts need integer or text keys of one class on both sides: \
                 use bisection.strategy: hash",
                spec.bisection.strategy.name()
            )));
        }
        warnings.push(format!(
            "bisection.strategy auto: {why}, which quantile cuts cannot order: bisected by key hash"
        ));
        hash_bisection = true;
    }
    Ok(Resolved {
        key_len: key.len(),
        columns,
        method,
        xor: method.has_xor() && src.xor_supported && tgt.xor_supported,
        warnings,
        fidelity: Some(Fidelity::of(fidelity)),
        hash_bisection,
    })
}

/// Checks the spec against what each agent's policy releases, before any scan, so a
/// run that would be refused half-way is refused at once (the agents enforce it anyway).
pub fn check_policies(spec: &Spec, sides: [(&str, &Describe); 2]) -> Result<(), RunError> {
    for (agent, d) in sides {
        let max = d.max_level;
        if spec.reporting.level > max {
            return Err(RunError::PolicyRefused {
                agent: agent.to_string(),
                rpc: "run".into(),
                message: format!(
                    "refused by policy max_level of dataset {}: it releases at most {max}, the spec asks for reporting.level {}",
                    d.dataset, spec.reporting.level
                ),
            });
        }
        for g in &spec.group_by {
            let (key, listed) = match g.granularity() {
                Some(_) => ("time_columns", &d.time_columns),
                None => ("group_columns", &d.group_columns),
            };
            if !listed.iter().any(|c| c.eq_ignore_ascii_case(g.column())) {
                return Err(RunError::PolicyRefused {
                    agent: agent.to_string(),
                    rpc: "run".into(),
                    message: format!(
                        "refused by policy {key} of dataset {}: grouping by {} would release its values as group labels; list it in the agent's policy {key}",
                        d.dataset,
                        g.column()
                    ),
                });
            }
        }
        // mode measures sends no key bound
        // auto bisects such a dataset by hash (resolve)
        if !d.expose_key_bounds
            && matches!(spec.bisection.strategy, Strategy::Quantile | Strategy::Time)
            && spec.mode != crate::spec::Mode::Measures
        {
            return Err(RunError::PolicyRefused {
                agent: agent.to_string(),
                rpc: "run".into(),
                message: format!(
                    "refused by policy expose_key_bounds of dataset {}: key values may not leave its zone; use bisection.strategy: hash",
                    d.dataset
                ),
            });
        }
        if let (Strategy::Time, Some(column)) = (spec.bisection.strategy, &spec.bisection.time_column)
            && !d.time_columns.iter().any(|t| t.eq_ignore_ascii_case(column))
        {
            return Err(RunError::PolicyRefused {
                agent: agent.to_string(),
                rpc: "run".into(),
                message: format!(
                    "refused by policy time_columns of dataset {}: period splits on {column} are not allowed; list it in the agent's policy time_columns or use another strategy",
                    d.dataset
                ),
            });
        }
        if let Some((column, _)) = spec.column_window()
            && !d.time_columns.iter().any(|t| t.eq_ignore_ascii_case(column))
        {
            return Err(RunError::PolicyRefused {
                agent: agent.to_string(),
                rpc: "run".into(),
                message: format!(
                    "refused by policy time_columns of dataset {}: a window on {} is not allowed (counts under a \
                     window tell when rows were written); list it in the agent's policy time_columns or drop the window",
                    d.dataset, column
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use tally_common::PrivacyLevel;

    use super::*;
    use crate::fidelity::{Code, Reason};

    fn col(name: &str, class: TypeClass, declared: &str, scale: Option<u32>) -> Column {
        Column {
            name: name.into(),
            class,
            declared_type: declared.into(),
            nullable: true,
            scale,
            fixed_char: false,
            masked: false,
        }
    }

    fn describe(dataset: &str, cols: Vec<Column>) -> Describe {
        Describe {
            dataset: dataset.into(),
            columns: cols,
            key: vec!["id".into()],
            hash_methods: vec![HashMethod::Sha256_64, HashMethod::Md5_48],
            xor_supported: true,
            // an agent's default policy
            expose_key_bounds: true,
            ..Default::default()
        }
    }

    fn spec() -> Spec {
        tally_common::config_file::parse_yaml(
            std::path::Path::new("s.yaml"),
            "name: t\nsource: { agent: a, dataset: x }\ntarget: { agent: b, dataset: y }\n",
        )
        .unwrap()
    }

    #[test]
    fn columns_match_case_insensitively_and_scales_widen() {
        let s = describe(
            "x",
            vec![
                col("id", TypeClass::Integer, "bigint", None),
                col("Amount", TypeClass::Decimal, "numeric(12,2)", Some(2)),
                col("only_src", TypeClass::Text, "text", None),
            ],
        );
        let t = describe(
            "y",
            vec![
                col("ID", TypeClass::Integer, "int", None),
                col("amount", TypeClass::Decimal, "decimal(14,4)", Some(4)),
                col("flag", TypeClass::Boolean, "tinyint(1)", None),
            ],
        );
        let r = resolve(&spec(), &s, &t).unwrap();
        assert_eq!(r.key_len, 1);
        assert_eq!(r.columns.len(), 2);
        assert_eq!(r.columns[1].source_name, "Amount");
        assert_eq!(r.columns[1].target_name, "amount");
        assert_eq!(r.columns[1].format.scale, 4);
        assert_eq!(r.method, HashMethod::Sha256_64);
        assert!(r.xor);
        assert_eq!(r.warnings.len(), 3, "{:?}", r.warnings);
        assert!(r.warnings[2].contains("key column id is nullable"));
    }

    #[test]
    fn text_of_a_side_reading_empty_strings_as_null_is_refused_as_binary_or_json() {
        let mut s = describe(
            "x",
            vec![
                col("id", TypeClass::Integer, "bigint", None),
                col("doc", TypeClass::Text, "longtext", None),
                col("name", TypeClass::Text, "text", None),
            ],
        );
        s.empty_string_is_null = true;
        let t = describe(
            "y",
            vec![
                col("id", TypeClass::Integer, "bigint", None),
                col("doc", TypeClass::Json, "jsonb", None),
                col("name", TypeClass::Text, "text", None),
            ],
        );
        let e = resolve(&spec(), &s, &t).unwrap_err().to_string();
        assert!(
            e.contains("column doc") && e.contains("empty_string_is_null"),
            "{e}"
        );
        assert!(!e.contains("column name"), "text compared as text is fine: {e}");
        // without the setting the pair is compared as JSON
        s.empty_string_is_null = false;
        assert!(resolve(&spec(), &s, &t).is_ok());
    }

    #[test]
    fn keys_quantile_cuts_cannot_order_are_refused_at_resolve_or_bisected_by_hash_under_auto() {
        let with_key = |class, declared: &str, scale| describe("x", vec![col("id", class, declared, scale)]);
        let int = with_key(TypeClass::Integer, "bigint", None);
        let dec = with_key(TypeClass::Decimal, "numeric(20,0)", Some(0));
        let uuid = with_key(TypeClass::Uuid, "uuid", None);
        let text = with_key(TypeClass::Text, "text", None);
        let with = |strategy| {
            let mut sp = spec();
            sp.bisection.strategy = strategy;
            sp
        };
        for (s, t) in [(&int, &dec), (&dec, &int), (&uuid, &uuid), (&dec, &dec)] {
            for strategy in [Strategy::Quantile, Strategy::Time] {
                let e = resolve(&with(strategy), s, t).unwrap_err().to_string();
                assert!(
                    e.contains("key column id") && e.contains("use bisection.strategy: hash"),
                    "{strategy:?}: {e}"
                );
            }
            let r = resolve(&with(Strategy::Auto), s, t).unwrap();
            assert!(
                r.hash_bisection,
                "auto bisects {:?} / {:?} keys by hash",
                s.columns[0].class, t.columns[0].class
            );
            assert!(
                r.warnings.iter().any(|w| w.contains("bisected by key hash")),
                "{:?}",
                r.warnings
            );
            let r = resolve(&with(Strategy::Hash), s, t).unwrap();
            assert!(!r.hash_bisection);
        }
        // integer and text keys are cut by quantiles as asked
        for k in [&int, &text] {
            let r = resolve(&with(Strategy::Quantile), k, k).unwrap();
            assert!(!r.hash_bisection);
            assert!(!resolve(&with(Strategy::Auto), k, k).unwrap().hash_bisection);
        }
        // mode measures sends no key bound
        let mut measures = with(Strategy::Quantile);
        measures.mode = crate::spec::Mode::Measures;
        assert!(resolve(&measures, &int, &dec).is_ok());
    }

    #[test]
    fn what_an_agent_says_of_its_engine_goes_into_the_runs_warnings() {
        let cols = || vec![col("id", TypeClass::Integer, "bigint", None)];
        let mut s = describe("orders", cols());
        s.engine = "mssql".into();
        s.engine_warnings = vec!["SQL Server support is not live-verified".into()];
        let mut t = describe("orders_copy", cols());
        t.engine_warnings = vec!["its empty strings are compared as NULL".into()];
        let r = resolve(&spec(), &s, &t).unwrap();
        assert!(
            r.warnings
                .iter()
                .any(|w| w == "source dataset orders (mssql): SQL Server support is not live-verified"),
            "{:?}",
            r.warnings
        );
        assert!(
            r.warnings
                .iter()
                .any(|w| w.starts_with("target dataset orders_copy")
                    && w.ends_with("its empty strings are compared as NULL")),
            "{:?}",
            r.warnings
        );
    }

    #[test]
    fn drift_is_reported_before_any_scan() {
        let s = describe(
            "x",
            vec![
                col("id", TypeClass::Integer, "bigint", None),
                col("at", TypeClass::Timestamp, "timestamp", Some(6)),
            ],
        );
        let t = describe(
            "y",
            vec![
                col("id", TypeClass::Integer, "int", None),
                col("at", TypeClass::Date, "date", None),
            ],
        );
        let e = resolve(&spec(), &s, &t).unwrap_err().to_string();
        assert!(
            e.contains("schema drift") && e.contains("column at is timestamp"),
            "{e}"
        );
        let mut sp = spec();
        sp.columns = vec!["missing".into()];
        let e = resolve(&sp, &s, &t).unwrap_err().to_string();
        assert!(e.contains("missing column: missing"), "{e}");
        let mut t2 = t.clone();
        t2.key = vec!["other".into()];
        assert!(
            resolve(&spec(), &s, &t2)
                .unwrap_err()
                .to_string()
                .contains("key mismatch")
        );
    }

    #[test]
    fn hash_auto_takes_the_strongest_shared_method() {
        let s = describe("x", vec![col("id", TypeClass::Integer, "bigint", None)]);
        let mut t = s.clone();
        t.hash_methods = vec![HashMethod::Md5_48];
        assert_eq!(resolve(&spec(), &s, &t).unwrap().method, HashMethod::Md5_48);
        let mut sp = spec();
        sp.hash = HashChoice::Sha256_64;
        assert!(resolve(&sp, &s, &t).is_err());
    }

    #[test]
    fn hash_auto_seals_whenever_both_agents_can() {
        let zone = tally_common::seal::SignedZoneKey {
            agent: "a".into(),
            public_key: [9; 32],
            signature: vec![1],
            certificates: vec![vec![1]],
        };
        let mut s = describe("x", vec![col("id", TypeClass::Integer, "bigint", None)]);
        s.hash_methods = HashMethod::BY_STRENGTH.to_vec();
        s.zone_key = Some(zone.clone());
        let mut t = s.clone();
        let r = resolve(&spec(), &s, &t).unwrap();
        assert_eq!(r.method, HashMethod::SealedSha256_64);
        assert!(r.xor);
        // a side without a zone key: no sealed method, whatever it lists
        t.zone_key = None;
        assert_eq!(resolve(&spec(), &s, &t).unwrap().method, HashMethod::Sha256_64);
        let mut sp = spec();
        sp.hash = HashChoice::SealedSha256_64;
        let e = resolve(&sp, &s, &t).unwrap_err().to_string();
        assert!(
            e.contains("target agent does not offer sealed_sha256_64") && e.contains("tls.zone_key"),
            "{e}"
        );
        // sealed only on one side, unsealed refused on the other: nothing shared
        t.zone_key = Some(zone);
        s.hash_methods = vec![HashMethod::SealedSha256_64];
        t.hash_methods = vec![HashMethod::Sha256_64];
        let e = resolve(&spec(), &s, &t).unwrap_err().to_string();
        assert!(
            e.contains("share no hash method") && e.contains("allow_unsealed"),
            "{e}"
        );
    }

    fn one(class: TypeClass, declared: &str, scale: Option<u32>) -> Vec<Column> {
        vec![
            col("id", TypeClass::Integer, "bigint", None),
            col("v", class, declared, scale),
        ]
    }

    /// Resolves a column `v` between the two given sides.
    fn pair(
        sp: &Spec,
        s: (TypeClass, &str, Option<u32>),
        t: (TypeClass, &str, Option<u32>),
    ) -> Result<Resolved, RunError> {
        resolve(
            sp,
            &describe("x", one(s.0, s.1, s.2)),
            &describe("y", one(t.0, t.1, t.2)),
        )
    }

    fn format_of(r: &Resolved) -> FieldFormat {
        r.columns[1].format
    }

    fn with_override(scale: Option<u32>, precision: Option<u32>) -> Spec {
        let mut sp = spec();
        sp.overrides.insert("V".into(), Override { scale, precision });
        sp
    }

    /// The warnings about column `v`, the key's nullability left aside.
    fn notes(r: &Resolved) -> Vec<&str> {
        r.warnings
            .iter()
            .map(String::as_str)
            .filter(|w| !w.starts_with("key column"))
            .collect()
    }

    #[test]
    fn a_column_without_canonical_form_refuses_the_run_naming_it_and_the_way_out() {
        let s = describe(
            "x",
            vec![
                col("id", TypeClass::Integer, "bigint", None),
                col("tags", TypeClass::Other, "text[]", None),
                col("geom", TypeClass::Other, "geometry", None),
                col("amount", TypeClass::Integer, "int", None),
            ],
        );
        let t = describe(
            "y",
            vec![
                col("id", TypeClass::Integer, "bigint", None),
                col("tags", TypeClass::Json, "json", None),
                col("geom", TypeClass::Other, "geometry", None),
                col("amount", TypeClass::Integer, "int", None),
            ],
        );
        let e = resolve(&spec(), &s, &t).unwrap_err();
        assert_eq!(e.code(), "no_canonical_form");
        assert_eq!(
            e.to_string(),
            "column tags (text[] / json) has no canonical form; compare it some other way or exclude it: \
             exclude: [tags]; column geom (geometry / geometry) has no canonical form; compare it some other \
             way or exclude it: exclude: [geom]"
        );
        // named explicitly: the same refusal
        let mut sp = spec();
        sp.columns = vec!["geom".into()];
        assert_eq!(resolve(&sp, &s, &t).unwrap_err().code(), "no_canonical_form");
        // excluded: compared without them, and nothing is said about them
        let mut sp = spec();
        sp.exclude = vec!["TAGS".into(), "geom".into()];
        let r = resolve(&sp, &s, &t).unwrap();
        assert_eq!(r.compared_names(), vec!["amount"]);
        assert!(
            r.warnings
                .iter()
                .all(|w| !w.contains("tags") && !w.contains("geom")),
            "{:?}",
            r.warnings
        );
        // a key column cannot be excluded, so it says so
        let mut sp = spec();
        sp.key = vec!["geom".into()];
        let mut s2 = s.clone();
        let mut t2 = t.clone();
        s2.key = vec!["geom".into()];
        t2.key = vec!["geom".into()];
        sp.exclude = vec!["tags".into()];
        let e = resolve(&sp, &s2, &t2).unwrap_err().to_string();
        assert!(
            e.contains("key column geom (geometry / geometry) has no canonical form; key the comparison on other columns"),
            "{e}"
        );
        // drift and a column without canonical form: drift, naming both
        let mut t3 = t.clone();
        t3.columns[3].class = TypeClass::Date;
        let e = resolve(&spec(), &s, &t3).unwrap_err();
        assert_eq!(e.code(), "schema_drift");
        assert!(
            e.to_string().contains("column amount is integer") && e.to_string().contains("exclude: [tags]")
        );
    }

    #[test]
    fn exclude_must_name_an_existing_non_key_column() {
        let s = describe(
            "x",
            vec![
                col("id", TypeClass::Integer, "bigint", None),
                col("only_src", TypeClass::Text, "text", None),
            ],
        );
        let t = describe("y", vec![col("id", TypeClass::Integer, "bigint", None)]);
        // the key comes from the agents here, not the spec
        let mut sp = spec();
        sp.exclude = vec!["ID".into()];
        let e = resolve(&sp, &s, &t).unwrap_err();
        assert_eq!(e.code(), "config");
        assert_eq!(
            e.to_string(),
            "exclude: ID is a key column and cannot be excluded"
        );
        sp.exclude = vec!["nowhere".into()];
        assert_eq!(
            resolve(&sp, &s, &t).unwrap_err().to_string(),
            "exclude: column nowhere is in neither the source dataset x nor the target dataset y"
        );
        // excluding a one-sided column silences its warning
        let r = resolve(&spec(), &s, &t).unwrap();
        assert!(
            notes(&r)
                .iter()
                .any(|w| w.contains("only_src exists on the source only"))
        );
        sp.exclude = vec!["only_src".into()];
        let r = resolve(&sp, &s, &t).unwrap();
        assert!(notes(&r).is_empty(), "{:?}", r.warnings);
    }

    #[test]
    fn a_one_sided_column_is_a_warning_only_when_not_requested() {
        let s = describe(
            "x",
            vec![
                col("id", TypeClass::Integer, "bigint", None),
                col("note", TypeClass::Text, "text", None),
            ],
        );
        let t = describe("y", vec![col("id", TypeClass::Integer, "bigint", None)]);
        let r = resolve(&spec(), &s, &t).unwrap();
        assert_eq!(
            notes(&r),
            vec!["column note exists on the source only: not compared"]
        );
        let mut sp = spec();
        sp.columns = vec!["note".into()];
        let e = resolve(&sp, &s, &t).unwrap_err();
        assert_eq!(e.code(), "schema_drift");
        assert!(
            e.to_string()
                .contains("missing column: note is not in the target dataset y")
        );
    }

    #[test]
    fn overrides_fit_the_class_and_name_a_compared_column() {
        let text = (TypeClass::Text, "text", None);
        let e = pair(&with_override(Some(2), None), text, text).unwrap_err();
        assert_eq!(e.code(), "config");
        assert!(
            e.to_string()
                .starts_with("overrides.V.scale: column v is compared as text, which has no scale"),
            "{e}"
        );
        let dec = (TypeClass::Decimal, "numeric(12,2)", Some(2));
        let e = pair(&with_override(None, Some(3)), dec, dec)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("overrides.V.precision: column v is compared as decimal, which has no precision"),
            "{e}"
        );
        let ts = (TypeClass::Timestamp, "timestamp(3)", Some(3));
        let e = pair(&with_override(Some(3), None), ts, ts)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("overrides.V.scale: column v is compared as timestamp"),
            "{e}"
        );
        // an override of a column that is not compared
        let mut sp = with_override(Some(2), None);
        sp.exclude = vec!["v".into()];
        let e = pair(&sp, dec, dec).unwrap_err().to_string();
        assert_eq!(
            e,
            "overrides.V: column V is not compared (the compared columns are id)"
        );
        let mut sp = spec();
        sp.overrides.insert(
            "gone".into(),
            Override {
                scale: Some(1),
                precision: None,
            },
        );
        let e = pair(&sp, dec, dec).unwrap_err().to_string();
        assert!(
            e.starts_with("overrides.gone: column gone is not compared"),
            "{e}"
        );
    }

    #[test]
    fn undeclared_decimal_scales_compare_exactly_and_are_never_invented() {
        use TypeClass::{Decimal, Integer};
        let numeric = (Decimal, "numeric", None);
        let n12_2 = (Decimal, "numeric(12,2)", Some(2));
        let n14_4 = (Decimal, "decimal(14,4)", Some(4));
        let int = (Integer, "integer", None);
        // either side undeclared: exact on both sides, said in the warnings
        let r = pair(&spec(), numeric, n12_2).unwrap();
        assert!(format_of(&r).exact);
        assert_eq!(
            notes(&r),
            vec!["column v: scale undeclared on the source (numeric), compared exactly"]
        );
        let r = pair(&spec(), n12_2, numeric).unwrap();
        assert!(format_of(&r).exact);
        assert_eq!(
            notes(&r),
            vec!["column v: scale undeclared on the target (numeric), compared exactly"]
        );
        let r = pair(&spec(), numeric, numeric).unwrap();
        assert!(format_of(&r).exact);
        assert!(notes(&r)[0].contains("undeclared on both sides (numeric / numeric)"));
        // both declared: the larger, not exact, nothing to say
        let r = pair(&spec(), n12_2, n14_4).unwrap();
        assert_eq!((format_of(&r).exact, format_of(&r).scale), (false, 4));
        assert!(notes(&r).is_empty());
        // an integer declares scale 0
        let r = pair(&spec(), int, n12_2).unwrap();
        assert_eq!(
            (format_of(&r).class, format_of(&r).exact, format_of(&r).scale),
            (Decimal, false, 2)
        );
        let r = pair(&spec(), numeric, int).unwrap();
        assert!(format_of(&r).exact);
        // the spec's scale wins over exactness
        let r = pair(&with_override(Some(3), None), numeric, n12_2).unwrap();
        assert_eq!((format_of(&r).exact, format_of(&r).scale), (false, 3));
        assert_eq!(
            notes(&r),
            vec!["column v: compared at scale 3, set by overrides.V (declared numeric / numeric(12,2))"]
        );
    }

    #[test]
    fn floats_are_compared_at_scale_6_unless_overridden() {
        let f = (TypeClass::Float, "double precision", None);
        let r = pair(&spec(), f, f).unwrap();
        assert_eq!(
            (format_of(&r).class, format_of(&r).scale, format_of(&r).exact),
            (TypeClass::Float, 6, false)
        );
        let r = pair(&with_override(Some(9), None), f, f).unwrap();
        assert_eq!(format_of(&r).scale, 9);
        assert_eq!(
            notes(&r),
            vec!["column v: floats compared at scale 9, set by overrides.V"]
        );
    }

    #[test]
    fn undeclared_time_precision_counts_as_6() {
        for class in [TypeClass::Timestamp, TypeClass::TimestampTz, TypeClass::Time] {
            let p = |n: Option<u32>| (class, "t", n);
            let scale = |s, t| format_of(&pair(&spec(), p(s), p(t)).unwrap()).scale;
            assert_eq!(scale(Some(3), None), 6, "{class}");
            assert_eq!(scale(None, Some(0)), 6, "{class}");
            assert_eq!(scale(None, None), 6, "{class}");
            assert_eq!(scale(Some(3), Some(0)), 3, "{class}");
            assert_eq!(scale(Some(3), Some(9)), 9, "{class}");
            let r = pair(&with_override(None, Some(2)), p(None), p(Some(6))).unwrap();
            assert_eq!(format_of(&r).scale, 2, "{class}");
            assert!(notes(&r)[0].contains("compared at precision 2, set by overrides.V"));
        }
    }

    #[test]
    fn json_compares_with_json_and_with_mariadb_longtext() {
        let json = (TypeClass::Json, "jsonb", None);
        let longtext = (TypeClass::Text, "longtext", None);
        let r = pair(&spec(), json, json).unwrap();
        assert_eq!(format_of(&r).class, TypeClass::Json);
        assert!(notes(&r).is_empty());
        let r = pair(&spec(), json, longtext).unwrap();
        assert_eq!(format_of(&r).class, TypeClass::Json);
        assert_eq!(
            notes(&r),
            vec![
                "column v: the target's text (longtext) is parsed as JSON and compared with the source's json \
                 (jsonb) in RFC 8785 form"
            ]
        );
        let r = pair(&spec(), longtext, json).unwrap();
        assert_eq!(format_of(&r).class, TypeClass::Json);
        assert!(notes(&r)[0].starts_with("column v: the source's text (longtext) is parsed as JSON"));
        // a JSON column is not a text column
        let e = pair(&spec(), json, (TypeClass::Integer, "int", None)).unwrap_err();
        assert_eq!(e.code(), "schema_drift");
    }

    #[test]
    fn a_timestamp_without_zone_is_read_in_its_datasets_zone_against_one_with_zone() {
        let local = col("v", TypeClass::Timestamp, "datetime(3)", Some(3));
        let utc = col("v", TypeClass::TimestampTz, "timestamptz", Some(6));
        let id = col("id", TypeClass::Integer, "bigint", None);
        let mut s = describe("x", vec![id.clone(), local.clone()]);
        s.time_zone = "Europe/Berlin".into();
        let t = describe("y", vec![id.clone(), utc.clone()]);
        let r = resolve(&spec(), &s, &t).unwrap();
        assert_eq!(
            (format_of(&r).class, format_of(&r).scale),
            (TypeClass::TimestampTz, 6)
        );
        assert_eq!(
            notes(&r),
            vec![
                "column v: the source's timestamp without time zone (datetime(3)) is read in Europe/Berlin (its \
                 agent's time_zone) and compared in UTC with the target's timestamp with time zone (timestamptz)"
            ]
        );
        // the other way round, with the default zone
        let s = describe("x", vec![id.clone(), utc]);
        let t = describe("y", vec![id, local]);
        let r = resolve(&spec(), &s, &t).unwrap();
        assert_eq!(format_of(&r).class, TypeClass::TimestampTz);
        assert!(
            notes(&r)[0].starts_with(
                "column v: the target's timestamp without time zone (datetime(3)) is read in UTC"
            ),
            "{:?}",
            r.warnings
        );
    }

    #[test]
    fn a_decimal_compares_with_a_float_at_the_decimals_scale() {
        let dec = (TypeClass::Decimal, "numeric(12,2)", Some(2));
        let numeric = (TypeClass::Decimal, "numeric", None);
        let double = (TypeClass::Float, "double", None);
        let r = pair(&spec(), dec, double).unwrap();
        assert_eq!(
            (format_of(&r).class, format_of(&r).scale, format_of(&r).exact),
            (TypeClass::Decimal, 2, false)
        );
        assert_eq!(
            notes(&r),
            vec![
                "column v: the target's float (double) is compared with the source's decimal (numeric(12,2)) at scale 2"
            ]
        );
        let r = pair(&spec(), double, numeric).unwrap();
        assert!(format_of(&r).exact);
        assert_eq!(
            notes(&r),
            vec![
                "column v: scale undeclared on the target (numeric), compared exactly",
                "column v: the source's float (double) is compared with the target's decimal (numeric) exactly"
            ]
        );
        let r = pair(&with_override(Some(4), None), double, numeric).unwrap();
        assert_eq!((format_of(&r).scale, format_of(&r).exact), (4, false));
        assert!(notes(&r)[1].ends_with("at scale 4"), "{:?}", r.warnings);
    }

    #[test]
    fn text_compares_with_binary_by_its_utf8_bytes() {
        let mut text = col("v", TypeClass::Text, "char(4)", None);
        text.fixed_char = true;
        let bytea = col("v", TypeClass::Binary, "bytea", None);
        let id = col("id", TypeClass::Integer, "bigint", None);
        let s = describe("x", vec![id.clone(), text.clone()]);
        let t = describe("y", vec![id.clone(), bytea]);
        let r = resolve(&spec(), &s, &t).unwrap();
        assert_eq!(format_of(&r).class, TypeClass::Binary);
        assert!(
            !format_of(&r).fixed_char,
            "a CHAR(n) side never makes 0x00 bytes insignificant"
        );
        assert_eq!(
            notes(&r),
            vec![
                "column v: the source's text (char(4)) is compared with the target's binary (bytea) by its UTF-8 bytes, in lowercase hex"
            ]
        );
        let mut binary4 = col("v", TypeClass::Binary, "binary(4)", None);
        binary4.fixed_char = true;
        let r = resolve(
            &spec(),
            &describe("x", vec![id.clone(), binary4]),
            &describe("y", vec![id, text]),
        )
        .unwrap();
        assert!(format_of(&r).fixed_char, "BINARY(n) padding stays insignificant");
        assert!(notes(&r)[0].starts_with("column v: the target's text (char(4))"));
    }

    #[test]
    fn key_columns_compare_within_one_class_only() {
        let mut s = describe("x", vec![col("id", TypeClass::Timestamp, "timestamp", Some(6))]);
        let mut t = describe(
            "y",
            vec![col("id", TypeClass::TimestampTz, "timestamptz", Some(6))],
        );
        s.key = vec!["id".into()];
        t.key = vec!["id".into()];
        let e = resolve(&spec(), &s, &t).unwrap_err();
        assert_eq!(e.code(), "schema_drift");
        assert!(
            e.to_string()
                .contains("key columns compare within one type class"),
            "{e}"
        );
        // the long-standing pairs still key a comparison
        t.columns[0] = col("id", TypeClass::Timestamp, "datetime", None);
        assert!(resolve(&spec(), &s, &t).is_ok());
        let s = describe("x", vec![col("id", TypeClass::Integer, "bigint", None)]);
        let t = describe("y", vec![col("id", TypeClass::Decimal, "numeric(20,0)", Some(0))]);
        assert!(resolve(&spec(), &s, &t).is_ok());
    }

    /// The fidelity reasons of column `v` (the key `id` is a plain bigint pair).
    fn reasons_of(r: &Resolved) -> Vec<(Code, String)> {
        let f = r.fidelity.as_ref().expect("a resolution states its fidelity");
        assert!(f.consistent(), "{f:?}");
        assert!(f.columns.iter().all(|c| c.column == "v"), "{f:?}");
        f.columns
            .iter()
            .flat_map(|c| c.reasons.iter().map(|x| (x.code, x.text.clone())))
            .collect()
    }

    fn codes(r: &Resolved) -> Vec<Code> {
        reasons_of(r).into_iter().map(|(c, _)| c).collect()
    }

    #[test]
    fn a_plain_same_class_pair_at_full_precision_is_full() {
        use TypeClass::*;
        for (s, t) in [
            ((Integer, "bigint", None), (Integer, "int", None)),
            (
                (Decimal, "numeric(12,2)", Some(2)),
                (Decimal, "decimal(14,4)", Some(4)),
            ),
            ((Decimal, "numeric", None), (Decimal, "numeric(12,2)", Some(2))),
            ((Text, "text", None), (Text, "varchar(40)", None)),
            (
                (Timestamp, "timestamp(6)", Some(6)),
                (Timestamp, "datetime(3)", Some(3)),
            ),
            (
                (TimestampTz, "timestamptz", None),
                (TimestampTz, "timestamp", Some(6)),
            ),
            ((Date, "date", None), (Date, "date", None)),
            ((Json, "jsonb", None), (Json, "json", None)),
            ((Uuid, "uuid", None), (Uuid, "uuid", None)),
            ((Binary, "bytea", None), (Binary, "varbinary(8)", None)),
            ((Boolean, "boolean", None), (Boolean, "bit(1)", None)),
            // every integer is a decimal of scale 0: nothing is lost
            ((Integer, "bigint", None), (Decimal, "numeric(12,2)", Some(2))),
        ] {
            let r = pair(&spec(), s, t).unwrap();
            let f = r.fidelity.clone().unwrap();
            assert_eq!(f, Fidelity::of(Vec::new()), "{s:?} / {t:?}");
            assert_eq!(f.level, crate::fidelity::Level::Full);
            assert_eq!(
                serde_json::to_value(&f).unwrap(),
                serde_json::json!({"level": "full"})
            );
        }
        // both sides CHAR(n): the padding is the type's own
        let mut c = col("v", TypeClass::Text, "char(6)", None);
        c.fixed_char = true;
        let id = col("id", TypeClass::Integer, "bigint", None);
        let r = resolve(
            &spec(),
            &describe("x", vec![id.clone(), c.clone()]),
            &describe("y", vec![id, c]),
        )
        .unwrap();
        assert!(codes(&r).is_empty(), "{:?}", reasons_of(&r));
    }

    #[test]
    fn a_float_at_a_scale_is_reduced_fidelity() {
        let f = (TypeClass::Float, "double precision", None);
        let r = pair(&spec(), f, f).unwrap();
        assert_eq!(
            reasons_of(&r),
            vec![(Code::FloatScale, "float at scale 6".to_string())]
        );
        let json = serde_json::to_value(r.fidelity.as_ref().unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"level": "reduced", "columns": [
                {"column": "v", "reasons": [{"code": "float_scale", "text": "float at scale 6"}]}
            ]})
        );
        // raised, still a finite scale
        let r = pair(&with_override(Some(12), None), f, f).unwrap();
        assert_eq!(reasons_of(&r)[0].1, "float at scale 12");
    }

    #[test]
    fn a_decimal_below_a_sides_scale_is_reduced_fidelity() {
        let n12_2 = (TypeClass::Decimal, "numeric(12,2)", Some(2));
        let numeric = (TypeClass::Decimal, "numeric", None);
        let int = (TypeClass::Integer, "bigint", None);
        // only an override can cut a declared scale
        let r = pair(&with_override(Some(1), None), n12_2, n12_2).unwrap();
        assert_eq!(
            reasons_of(&r),
            vec![(
                Code::DecimalScale,
                "decimal at scale 1 (numeric(12,2) / numeric(12,2))".to_string()
            )]
        );
        // raising it loses nothing
        let r = pair(&with_override(Some(4), None), n12_2, n12_2).unwrap();
        assert!(codes(&r).is_empty());
        // an undeclared scale is unbounded: any scale cuts it; exact does not
        let r = pair(&with_override(Some(8), None), numeric, n12_2).unwrap();
        assert_eq!(codes(&r), vec![Code::DecimalScale]);
        assert!(codes(&pair(&spec(), numeric, n12_2).unwrap()).is_empty());
        // an integer declares 0
        assert!(
            codes(
                &pair(
                    &with_override(Some(0), None),
                    int,
                    (TypeClass::Decimal, "numeric(20,0)", Some(0))
                )
                .unwrap()
            )
            .is_empty()
        );
    }

    #[test]
    fn a_time_cut_below_a_sides_precision_is_reduced_fidelity() {
        for class in [TypeClass::Timestamp, TypeClass::TimestampTz, TypeClass::Time] {
            let p = |n: Option<u32>| (class, "t", n);
            let r = pair(&with_override(None, Some(3)), p(Some(6)), p(Some(3))).unwrap();
            assert_eq!(
                reasons_of(&r),
                vec![(Code::TimePrecision, "cut to precision 3 (t / t)".to_string())],
                "{class}"
            );
            // an undeclared precision counts as 6
            let r = pair(&with_override(None, Some(5)), p(None), p(Some(0))).unwrap();
            assert_eq!(codes(&r), vec![Code::TimePrecision], "{class}");
            // at or above both sides' precision: nothing is cut
            let r = pair(&with_override(None, Some(3)), p(Some(3)), p(Some(0))).unwrap();
            assert!(codes(&r).is_empty(), "{class}");
            assert!(codes(&pair(&spec(), p(Some(3)), p(Some(0))).unwrap()).is_empty());
        }
    }

    #[test]
    fn every_cross_class_pair_is_reduced_fidelity() {
        use TypeClass::*;
        let cases = [
            (
                (Boolean, "boolean", None),
                (Integer, "tinyint(1)", None),
                vec![(
                    Code::CrossClass,
                    "integer compared as boolean (boolean / tinyint(1))",
                )],
            ),
            (
                (Json, "jsonb", None),
                (Text, "longtext", None),
                vec![(Code::CrossClass, "text parsed as json (jsonb / longtext)")],
            ),
            (
                (Decimal, "numeric(12,2)", Some(2)),
                (Float, "double", None),
                vec![
                    (
                        Code::CrossClass,
                        "float compared as decimal (numeric(12,2) / double)",
                    ),
                    (Code::FloatScale, "float at scale 2"),
                ],
            ),
            (
                // exact: the double's shortest decimal, nothing rounded, still two classes
                (Float, "double", None),
                (Decimal, "numeric", None),
                vec![(Code::CrossClass, "float compared as decimal (double / numeric)")],
            ),
            (
                (Text, "text", None),
                (Binary, "bytea", None),
                vec![(
                    Code::CrossClass,
                    "text compared as binary by its UTF-8 bytes (text / bytea)",
                )],
            ),
            (
                (TimestampTz, "timestamptz", Some(6)),
                (Timestamp, "datetime(6)", Some(6)),
                vec![(
                    Code::CrossClass,
                    "the target's timestamp read in UTC as timestamptz (timestamptz / datetime(6))",
                )],
            ),
        ];
        for (s, t, want) in cases {
            let r = pair(&spec(), s, t).unwrap();
            let want: Vec<(Code, String)> = want.into_iter().map(|(c, w)| (c, w.to_string())).collect();
            assert_eq!(reasons_of(&r), want, "{s:?} / {t:?}");
        }
        // the zone named is the zone-less side's dataset's
        let local = col("v", TypeClass::Timestamp, "timestamp", Some(6));
        let utc = col("v", TypeClass::TimestampTz, "timestamp", Some(6));
        let id = col("id", TypeClass::Integer, "bigint", None);
        let mut s = describe("x", vec![id.clone(), local]);
        s.time_zone = "+02:00".into();
        let r = resolve(&spec(), &s, &describe("y", vec![id, utc])).unwrap();
        assert!(
            reasons_of(&r)[0]
                .1
                .starts_with("the source's timestamp read in +02:00")
        );
    }

    #[test]
    fn a_key_through_a_cast_and_an_integer_keyed_as_boolean_are_reduced_fidelity() {
        let mut s = describe("x", vec![col("id", TypeClass::Integer, "bigint unsigned", None)]);
        let mut t = describe("y", vec![col("id", TypeClass::Decimal, "numeric(20,0)", Some(0))]);
        let f = resolve(&spec(), &s, &t).unwrap().fidelity.unwrap();
        assert_eq!(f.columns.len(), 1);
        assert_eq!(f.columns[0].column, "id");
        assert_eq!(
            f.columns[0].reasons,
            vec![Reason {
                code: Code::KeyCast,
                text: "keyed through a cast to decimal (bigint unsigned / numeric(20,0))".into()
            }]
        );
        s.columns[0] = col("id", TypeClass::Integer, "tinyint(1)", None);
        t.columns[0] = col("id", TypeClass::Boolean, "boolean", None);
        let f = resolve(&spec(), &s, &t).unwrap().fidelity.unwrap();
        assert_eq!(f.columns[0].reasons[0].code, Code::CrossClass);
    }

    #[test]
    fn empty_strings_taken_as_null_are_reduced_fidelity() {
        let text = col("v", TypeClass::Text, "varchar(10)", None);
        let id = col("id", TypeClass::Integer, "bigint", None);
        let s = describe("x", vec![id.clone(), text.clone()]);
        let mut t = describe("y", vec![id.clone(), text]);
        t.empty_string_is_null = true;
        let r = resolve(&spec(), &s, &t).unwrap();
        assert_eq!(
            reasons_of(&r),
            vec![(
                Code::EmptyStringAsNull,
                "'' taken as NULL on the target (empty_string_is_null)".to_string()
            )]
        );
        // an agent before the typed field says it in its engine warnings only
        let mut old = describe("x", s.columns.clone());
        old.engine_warnings =
            vec!["its empty strings are compared as NULL (empty_string_is_null: true)".into()];
        let r = resolve(&spec(), &old, &t).unwrap();
        assert!(
            reasons_of(&r)[0].1.contains("on both sides"),
            "{:?}",
            reasons_of(&r)
        );
        // it renders text only: a dataset's other classes keep their fidelity
        let n = col("v", TypeClass::Integer, "int", None);
        let mut t2 = describe("y", vec![id.clone(), n.clone()]);
        t2.empty_string_is_null = true;
        let r = resolve(&spec(), &describe("x", vec![id, n]), &t2).unwrap();
        assert!(codes(&r).is_empty());
    }

    #[test]
    fn padding_removed_from_a_side_without_it_is_reduced_fidelity() {
        let id = col("id", TypeClass::Integer, "bigint", None);
        let mut char6 = col("v", TypeClass::Text, "char(6)", None);
        char6.fixed_char = true;
        let varchar = col("v", TypeClass::Text, "varchar(10)", None);
        let r = resolve(
            &spec(),
            &describe("x", vec![id.clone(), char6]),
            &describe("y", vec![id.clone(), varchar]),
        )
        .unwrap();
        assert_eq!(
            reasons_of(&r),
            vec![(
                Code::Padding,
                "trailing spaces ignored (char(6) / varchar(10))".to_string()
            )]
        );
        let mut binary4 = col("v", TypeClass::Binary, "binary(4)", None);
        binary4.fixed_char = true;
        let bytea = col("v", TypeClass::Binary, "bytea", None);
        let r = resolve(
            &spec(),
            &describe("x", vec![id.clone(), bytea]),
            &describe("y", vec![id, binary4]),
        )
        .unwrap();
        assert_eq!(
            reasons_of(&r),
            vec![(
                Code::Padding,
                "trailing 0x00 bytes ignored (bytea / binary(4))".to_string()
            )]
        );
    }

    #[test]
    fn mode_count_compares_no_value_so_only_its_keys_fidelity_counts() {
        let f = (TypeClass::Float, "double precision", None);
        let mut sp = spec();
        sp.mode = crate::spec::Mode::Count;
        let r = pair(&sp, f, f).unwrap();
        assert_eq!(r.fidelity.unwrap().level, crate::fidelity::Level::Full);
        let s = describe("x", vec![col("id", TypeClass::Integer, "bigint", None)]);
        let t = describe("y", vec![col("id", TypeClass::Decimal, "numeric(20,0)", Some(0))]);
        let f = resolve(&sp, &s, &t).unwrap().fidelity.unwrap();
        assert_eq!(f.columns[0].reasons[0].code, Code::KeyCast);
    }

    #[test]
    fn the_summary_names_every_reduced_column_in_order() {
        let id = col("id", TypeClass::Integer, "bigint", None);
        let s = describe(
            "x",
            vec![
                id.clone(),
                col("amount", TypeClass::Float, "double precision", None),
                col("name", TypeClass::Text, "text", None),
                col("at", TypeClass::Timestamp, "timestamp(6)", Some(6)),
            ],
        );
        let mut t = describe(
            "y",
            vec![
                id,
                col("amount", TypeClass::Decimal, "decimal(12,2)", Some(2)),
                col("name", TypeClass::Text, "varchar(10)", None),
                col("at", TypeClass::Timestamp, "datetime(6)", Some(6)),
            ],
        );
        t.empty_string_is_null = true;
        let mut sp = spec();
        sp.overrides.insert(
            "at".into(),
            Override {
                scale: None,
                precision: Some(3),
            },
        );
        let f = resolve(&sp, &s, &t).unwrap().fidelity.unwrap();
        assert_eq!(
            f.summary(),
            "amount float compared as decimal (double precision / decimal(12,2)) and float at scale 2, \
             name '' taken as NULL on the target (empty_string_is_null), \
             at cut to precision 3 (timestamp(6) / datetime(6))"
        );
    }

    #[test]
    fn policy_precheck_names_the_policy_key() {
        let s = describe("x", vec![]);
        let mut sp = spec();
        sp.reporting.level = PrivacyLevel::WithKeys;
        let e = check_policies(&sp, [("a", &s), ("b", &s)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_level") && e.contains("agent a"), "{e}");
        let mut hidden = s.clone();
        hidden.max_level = PrivacyLevel::WithKeys;
        hidden.expose_key_bounds = false;
        // quantile would send key bounds: refused; auto bisects by hash instead
        let mut quantile = sp.clone();
        quantile.bisection.strategy = Strategy::Quantile;
        let e = check_policies(&quantile, [("a", &hidden), ("b", &hidden)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("expose_key_bounds"), "{e}");
        assert!(check_policies(&sp, [("a", &hidden), ("b", &hidden)]).is_ok());
        let with_id = |d: &Describe| {
            let mut d = d.clone();
            d.columns = vec![col("id", TypeClass::Integer, "bigint", None)];
            d
        };
        let r = resolve(&sp, &with_id(&hidden), &with_id(&s)).unwrap();
        assert!(
            r.hash_bisection,
            "auto bisects a dataset that hides its keys by hash"
        );
        assert!(
            r.warnings.iter().any(|w| w.contains("expose_key_bounds: false")),
            "{:?}",
            r.warnings
        );
        // strategy time: both agents must list the time column
        let mut sp = spec();
        sp.bisection.strategy = Strategy::Time;
        sp.bisection.time_column = Some("placed".into());
        let mut unlisted = s.clone();
        unlisted.expose_key_bounds = true;
        let mut listed = unlisted.clone();
        listed.time_columns = vec!["Placed".into()];
        assert!(check_policies(&sp, [("a", &listed), ("b", &listed)]).is_ok());
        let e = check_policies(&sp, [("a", &listed), ("b", &unlisted)])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("time_columns") && e.contains("agent b") && e.contains("placed"),
            "{e}"
        );
    }
}
