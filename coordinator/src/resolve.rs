//! The resolve phase (DESIGN §5 step 1): match columns by name (case-insensitive),
//! resolve each column's type class and scale, negotiate the hash method, and report
//! schema drift before anything is scanned.

use tally_common::canonical::{DEFAULT_FLOAT_SCALE, DEFAULT_TIME_PRECISION, FieldFormat};
use tally_common::checksum::HashMethod;
use tally_common::segment::ColumnSpec;
use tally_common::{PrivacyLevel, TypeClass};
use tally_proto::v1 as pb;

use crate::error::RunError;
use crate::spec::{HashChoice, Spec, Strategy};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedColumn {
    pub source_name: String,
    pub target_name: String,
    pub format: FieldFormat,
    pub masked: bool,
}

#[derive(Debug, Clone)]
pub struct Resolved {
    /// Key columns first, then compared columns.
    pub columns: Vec<ResolvedColumn>,
    pub key_len: usize,
    pub method: HashMethod,
    /// Both sides compute XOR (otherwise SUM only is compared).
    pub xor: bool,
    /// Not fatal: columns present on one side only, columns with no canonical form.
    pub warnings: Vec<String>,
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

fn find<'a>(d: &'a pb::DescribeResponse, name: &str) -> Option<&'a pb::Column> {
    d.columns.iter().find(|c| c.name.eq_ignore_ascii_case(name))
}

fn class(c: &pb::Column) -> TypeClass {
    TypeClass::try_from(c.type_class).unwrap_or(TypeClass::Other)
}

/// The class both sides render a column as, or why they cannot.
fn resolve_format(name: &str, s: &pb::Column, t: &pb::Column) -> Result<FieldFormat, String> {
    use TypeClass::*;
    let (a, b) = (class(s), class(t));
    let resolved = match (a, b) {
        (Other, _) | (_, Other) => {
            return Err(format!(
                "column {name} has no canonical form ({} / {})",
                s.declared_type, t.declared_type
            ));
        }
        (x, y) if x == y => x,
        (Boolean, Integer) | (Integer, Boolean) => Boolean,
        (Integer, Decimal) | (Decimal, Integer) => Decimal,
        _ => {
            return Err(format!(
                "column {name} is {a} ({}) on the source and {b} ({}) on the target",
                s.declared_type, t.declared_type
            ));
        }
    };
    let scale = match resolved {
        // the larger declared scale of the two sides; an unconstrained numeric is read at 6
        Decimal => s
            .scale
            .into_iter()
            .chain(t.scale)
            .max()
            .unwrap_or(DEFAULT_FLOAT_SCALE),
        Float => DEFAULT_FLOAT_SCALE,
        Timestamp | TimestampTz | Time => s
            .scale
            .into_iter()
            .chain(t.scale)
            .max()
            .unwrap_or(DEFAULT_TIME_PRECISION),
        _ => 0,
    };
    Ok(FieldFormat::new(resolved)
        .with_scale(scale)
        .fixed_char(s.fixed_char || t.fixed_char))
}

pub fn resolve(
    spec: &Spec,
    src: &pb::DescribeResponse,
    tgt: &pb::DescribeResponse,
) -> Result<Resolved, RunError> {
    let mut drift = Vec::new();
    let mut warnings = Vec::new();
    // the key: the spec's, or the source agent's configured key; both agents must agree
    let key: Vec<String> = if spec.key.is_empty() {
        src.key.clone()
    } else {
        spec.key.clone()
    };
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
    let names: Vec<String> = if spec.columns.is_empty() {
        let mut v = Vec::new();
        for c in &src.columns {
            if key.iter().any(|k| k.eq_ignore_ascii_case(&c.name)) {
                continue;
            }
            match find(tgt, &c.name) {
                None => warnings.push(format!(
                    "column {} exists on the source only: not compared",
                    c.name
                )),
                Some(t) if class(c) == TypeClass::Other || class(t) == TypeClass::Other => {
                    warnings.push(format!(
                        "column {} ({}) has no canonical form: not compared",
                        c.name, c.declared_type
                    ))
                }
                Some(_) => v.push(c.name.clone()),
            }
        }
        for c in &tgt.columns {
            if find(src, &c.name).is_none() {
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
    let mut columns = Vec::new();
    for (i, name) in key.iter().chain(&names).enumerate() {
        let (s, t) = (find(src, name), find(tgt, name));
        match (s, t) {
            (Some(s), Some(t)) => match resolve_format(name, s, t) {
                Ok(format) => {
                    if i < key.len() && s.nullable && t.nullable {
                        warnings.push(format!("key column {name} is nullable on both sides"));
                    }
                    columns.push(ResolvedColumn {
                        source_name: s.name.clone(),
                        target_name: t.name.clone(),
                        format,
                        masked: s.masked || t.masked,
                    })
                }
                Err(e) => drift.push(format!("incompatible types: {e}")),
            },
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
        return Err(RunError::SchemaDrift(drift.join("; ")));
    }
    let supports = |d: &pb::DescribeResponse, m: HashMethod| {
        let want = match m {
            HashMethod::Md5_48 => pb::HashMethod::Md548,
            HashMethod::Sha256_64 => pb::HashMethod::Sha25664,
        } as i32;
        d.hash_methods.contains(&want)
    };
    let method = match spec.hash {
        HashChoice::Auto => HashMethod::BY_STRENGTH
            .into_iter()
            .find(|m| supports(src, *m) && supports(tgt, *m))
            .ok_or_else(|| RunError::Config("the two agents share no hash method".into()))?,
        HashChoice::Md5_48 => HashMethod::Md5_48,
        HashChoice::Sha256_64 => HashMethod::Sha256_64,
    };
    for (side, d) in [("source", src), ("target", tgt)] {
        if !supports(d, method) {
            return Err(RunError::Config(format!(
                "the {side} agent does not support hash {method}"
            )));
        }
    }
    Ok(Resolved {
        key_len: key.len(),
        columns,
        method,
        xor: method == HashMethod::Sha256_64 && src.xor_supported && tgt.xor_supported,
        warnings,
    })
}

/// Checks the spec against what each agent's policy releases, before any scan, so a
/// run that would be refused half-way is refused at once (the agents enforce it anyway).
pub fn check_policies(spec: &Spec, sides: [(&str, &pb::DescribeResponse); 2]) -> Result<(), RunError> {
    for (agent, d) in sides {
        let max = PrivacyLevel::try_from(d.max_level).unwrap_or(PrivacyLevel::CountOnly);
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
        if !d.expose_key_bounds && spec.bisection.strategy != Strategy::Hash {
            return Err(RunError::PolicyRefused {
                agent: agent.to_string(),
                rpc: "run".into(),
                message: format!(
                    "refused by policy expose_key_bounds of dataset {}: key values may not leave its zone; use bisection.strategy: hash",
                    d.dataset
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, class: TypeClass, declared: &str, scale: Option<u32>) -> pb::Column {
        pb::Column {
            name: name.into(),
            type_class: pb::TypeClass::from(class) as i32,
            declared_type: declared.into(),
            nullable: true,
            scale,
            fixed_char: false,
            masked: false,
        }
    }

    fn describe(dataset: &str, cols: Vec<pb::Column>) -> pb::DescribeResponse {
        pb::DescribeResponse {
            dataset: dataset.into(),
            columns: cols,
            key: vec!["id".into()],
            hash_methods: vec![pb::HashMethod::Sha25664 as i32, pb::HashMethod::Md548 as i32],
            xor_supported: true,
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
        t.hash_methods = vec![pb::HashMethod::Md548 as i32];
        assert_eq!(resolve(&spec(), &s, &t).unwrap().method, HashMethod::Md5_48);
        let mut sp = spec();
        sp.hash = HashChoice::Sha256_64;
        assert!(resolve(&sp, &s, &t).is_err());
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
        hidden.max_level = pb::PrivacyLevel::WithKeys as i32;
        hidden.expose_key_bounds = false;
        let e = check_policies(&sp, [("a", &hidden), ("b", &hidden)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("expose_key_bounds"), "{e}");
    }
}
