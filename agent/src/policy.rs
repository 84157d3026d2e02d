//! Enforcement of a dataset's policy (DESIGN §2). Every check names the policy key it
//! applies, so a refusal tells the operator exactly which line of agent.yaml to change.

use tally_common::PrivacyLevel;
use tally_common::segment::{Segment, Split};

use crate::config::Policy;
use crate::error::AgentError;

/// The most rows one reveal call releases, whatever the request's limit.
pub const MAX_REVEAL_ROWS: usize = 1000;

fn deny(dataset: &str, key: &'static str, message: impl Into<String>) -> AgentError {
    AgentError::Policy {
        dataset: dataset.to_string(),
        key,
        message: message.into(),
    }
}

/// Before an aggregate: may these segments and splits be computed at all?
pub fn check_aggregate(p: &Policy, dataset: &str, parents: &[(Segment, Split)]) -> Result<(), AgentError> {
    if !p.expose_key_bounds {
        for (seg, split) in parents {
            if seg.has_key_bounds() || matches!(split, Split::Quantile(_) | Split::Cuts(_)) {
                return Err(deny(
                    dataset,
                    "expose_key_bounds",
                    "key values may not leave this zone; use bisection strategy hash",
                ));
            }
        }
    }
    Ok(())
}

/// After an aggregate: refuses results with a non-empty bucket below `min_segment_rows`.
pub fn check_bucket_counts(
    p: &Policy,
    dataset: &str,
    counts: impl IntoIterator<Item = u64>,
) -> Result<(), AgentError> {
    if p.min_segment_rows > 0
        && let Some(n) = counts.into_iter().find(|&n| n > 0 && n < p.min_segment_rows)
    {
        return Err(deny(
            dataset,
            "min_segment_rows",
            format!(
                "a segment of {n} rows is below the floor of {}; use a smaller factor or a larger threshold",
                p.min_segment_rows
            ),
        ));
    }
    Ok(())
}

/// Row-level requests: digests and key reveals need `with_keys`, value reveals
/// `detailed` plus the spec's consent.
pub fn check_level(p: &Policy, dataset: &str, needed: PrivacyLevel, consent: bool) -> Result<(), AgentError> {
    if p.max_level < needed {
        return Err(deny(
            dataset,
            "max_level",
            format!(
                "this dataset releases at most {}, the request needs {needed}",
                p.max_level
            ),
        ));
    }
    if needed == PrivacyLevel::Detailed && !consent {
        return Err(AgentError::InvalidArgument(
            "detailed reveals need consent_acknowledged: true in the spec".into(),
        ));
    }
    Ok(())
}

/// Whether a column's values are masked.
pub fn is_masked(p: &Policy, column: &str) -> bool {
    p.mask_columns.iter().any(|m| m.eq_ignore_ascii_case(column))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_common::segment::KeyPart;

    #[test]
    fn hidden_key_bounds_allow_only_hash_splits() {
        let p = Policy {
            expose_key_bounds: false,
            ..Policy::default()
        };
        assert!(check_aggregate(&p, "d", &[(Segment::whole(), Split::Hash(32))]).is_ok());
        let e = check_aggregate(&p, "d", &[(Segment::whole(), Split::Quantile(32))]).unwrap_err();
        assert!(
            e.to_string().contains("expose_key_bounds") && e.to_string().contains("dataset d"),
            "{e}"
        );
        let bounded = Segment {
            lower: Some(vec![KeyPart::Int(1)]),
            ..Segment::default()
        };
        assert!(check_aggregate(&p, "d", &[(bounded, Split::Whole)]).is_err());
    }

    #[test]
    fn levels_and_floors() {
        let p = Policy::default();
        assert!(
            check_level(&p, "d", PrivacyLevel::WithKeys, false)
                .unwrap_err()
                .to_string()
                .contains("max_level")
        );
        let p = Policy {
            max_level: PrivacyLevel::Detailed,
            min_segment_rows: 10,
            ..Policy::default()
        };
        assert!(check_level(&p, "d", PrivacyLevel::Detailed, false).is_err());
        assert!(check_level(&p, "d", PrivacyLevel::Detailed, true).is_ok());
        assert!(check_bucket_counts(&p, "d", [0, 10, 50]).is_ok());
        assert!(
            check_bucket_counts(&p, "d", [0, 9])
                .unwrap_err()
                .to_string()
                .contains("min_segment_rows")
        );
    }
}
