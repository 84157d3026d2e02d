//! The payload an agent signs over each Aggregate and RowDigests answer (DESIGN §12,
//! docs/evidence.md): built by the agent, checked against the answer by the
//! coordinator as it arrives, and checked again by `tally verify` from the bundle.
//!
//! The payload is the compact JSON of [`AgentResult`] in field order; the bytes are
//! what the signature covers, so nobody needs to re-serialise it. Counts are JSON
//! numbers; sums and XORs are 16 lowercase hex digits (a u64 does not fit a double).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::dsse::{AGENT_RESULT, DsseError, Envelope};
use crate::seal::TlsSigner;

/// The longest run id a request may carry.
pub const MAX_RUN_ID: usize = 128;

/// Whether `id` is a run id a request may carry: 1 to [`MAX_RUN_ID`] characters of
/// `A-Z a-z 0-9 . _ -`.
pub fn valid_run_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_RUN_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// One bucket as signed: its place in the request and its aggregates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedBucket {
    pub parent: u64,
    pub child: u64,
    pub count: u64,
    /// SUM of the row checksums mod 2^64, 16 lowercase hex digits.
    pub sum: String,
    /// XOR of the row checksums, 16 lowercase hex digits; `null` when not computed.
    pub xor: Option<String>,
}

impl SignedBucket {
    pub fn new(parent: u64, child: u64, count: u64, sum: u64, xor: Option<u64>) -> SignedBucket {
        SignedBucket {
            parent,
            child,
            count,
            sum: hex64(sum),
            xor: xor.map(hex64),
        }
    }
}

/// 16 lowercase hex digits.
pub fn hex64(v: u64) -> String {
    format!("{v:016x}")
}

/// Parses 16 lowercase hex digits.
pub fn parse_hex64(s: &str) -> Option<u64> {
    if s.len() != 16
        || !s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

/// The seal a sealed request carried, as the agent checked it: the peer zone it was
/// paired with and the run nonce. The two sides of a sealed run vouch for each other.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedSeal {
    /// The peer agent's name, as its signed zone key names it.
    pub peer: String,
    pub peer_dataset: String,
    /// The run nonce, lowercase hex.
    pub nonce: String,
}

impl SignedSeal {
    pub fn of(seal: &crate::wire::Seal) -> SignedSeal {
        SignedSeal {
            peer: seal.peer.agent.clone(),
            peer_dataset: seal.peer_dataset.clone(),
            nonce: hex::encode(seal.nonce),
        }
    }
}

/// What an answer covered, as the agent read the request: the method, the columns of
/// the row string (key columns first) and whether it was the whole dataset (one parent,
/// or one segment, with no bound, hash range or period).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scope {
    /// The side of the run the coordinator asked the agent to answer as (`source` or
    /// `target`); absent from agents before it and for a request that named none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side: Option<crate::wire::Side>,
    pub method: String,
    pub columns: Vec<String>,
    pub key_len: usize,
    /// One segment with no key bound, hash range or period: every row of the window.
    pub whole: bool,
    /// `null` for an unsealed method.
    pub seal: Option<SignedSeal>,
    /// The run's window, where it has one (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<crate::segment::Window>,
    /// Measures: the group_by levels asked, `column` or `column:granularity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_by: Option<Vec<String>>,
    /// Measures: the measure columns asked, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measures: Option<Vec<String>>,
}

impl Scope {
    pub fn of(
        side: Option<crate::wire::Side>,
        method: crate::HashMethod,
        columns: &[crate::segment::ColumnSpec],
        key_len: usize,
        segments: &[&crate::segment::Segment],
        seal: Option<&crate::wire::Seal>,
    ) -> Scope {
        Scope {
            side,
            method: method.name().to_string(),
            columns: columns.iter().map(|c| c.name.clone()).collect(),
            key_len,
            whole: matches!(segments, [one] if one.is_whole()),
            seal: seal.map(SignedSeal::of),
            // a request's segments all carry the run's one window
            window: segments.first().and_then(|s| s.window.clone()),
            group_by: None,
            measures: None,
        }
    }
}

/// What an agent signs over one answer (payloadType [`AGENT_RESULT`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentResult {
    pub run_id: String,
    /// The agent's name: the DNS name of its certificate it signs as (the keyid).
    pub agent: String,
    pub dataset: String,
    /// `Aggregate` or `RowDigests`.
    pub rpc: String,
    /// The SHA-256 of the request's canonical JSON, as in the agent's release log.
    pub request_sha256: String,
    /// What the request covered.
    pub scope: Scope,
    /// Aggregate: every bucket of the response, in response order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buckets: Option<Vec<SignedBucket>>,
    /// RowDigests: [`DigestsHash`] of every digest of the stream, in stream order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digests_sha256: Option<String>,
    /// Measures: [`groups_sha256`] of the answer's groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups_sha256: Option<String>,
    /// The agent's release-log head after recording the call.
    pub release_log_head: String,
    /// When the agent signed, by its clock: RFC 3339, UTC, whole seconds.
    pub time: String,
}

/// Now, as an answer's `time`: RFC 3339, UTC, whole seconds.
pub fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc();
    now.replace_nanosecond(0)
        .unwrap_or(now)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

impl AgentResult {
    /// Signs the payload as `self.agent`.
    pub fn sign(&self, signer: &TlsSigner) -> Result<Envelope, DsseError> {
        let bytes = serde_json::to_vec(self).map_err(|e| DsseError::Sign(e.to_string()))?;
        Envelope::sign(AGENT_RESULT, &bytes, &self.agent, signer)
    }

    /// The payload of `env`, unchecked (its signature is checked against the agent's
    /// certificate where that is known: `tally verify`). The payload type must be
    /// [`AGENT_RESULT`] and the keyid the agent the payload names.
    pub fn open(env: &Envelope) -> Result<AgentResult, String> {
        if env.payload_type != AGENT_RESULT {
            return Err(format!("payloadType is {:?}", env.payload_type));
        }
        let bytes = env.payload_bytes().map_err(|e| e.to_string())?;
        let p: AgentResult =
            serde_json::from_slice(&bytes).map_err(|e| format!("the payload does not parse: {e}"))?;
        if env.signatures.len() != 1 || env.signatures[0].keyid != p.agent {
            return Err(format!(
                "the envelope must carry one signature, by {:?}, the agent it names",
                p.agent
            ));
        }
        Ok(p)
    }
}

/// The SHA-256 (hex) of a Measures answer's groups: their JSON (`[{"labels", "count",
/// "measures": [{"clear"?, "digest"}]}]`, fields in that order, digests as 16 hex
/// digits) as serialised by this crate.
pub fn groups_sha256(groups: &[crate::wire::measures::MeasureGroup]) -> String {
    let bytes = serde_json::to_vec(groups).expect("groups serialize");
    hex::encode(Sha256::digest(&bytes))
}

/// The running SHA-256 of a RowDigests stream: each digest's key hash then row hash,
/// 8 bytes big-endian each, in stream order (the agent's release log uses the same).
#[derive(Debug, Clone, Default)]
pub struct DigestsHash {
    hasher: Sha256,
    pub count: u64,
}

impl DigestsHash {
    pub fn add(&mut self, key_hash: u64, row_hash: u64) {
        self.hasher.update(key_hash.to_be_bytes());
        self.hasher.update(row_hash.to_be_bytes());
        self.count += 1;
    }

    pub fn hex(&self) -> String {
        hex::encode(self.hasher.clone().finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{Ca, Role};

    #[test]
    fn run_ids_are_bounded_and_plain() {
        assert!(valid_run_id("19b2c1f-0"));
        assert!(valid_run_id("adhoc.A_b-9"));
        assert!(!valid_run_id(""));
        assert!(!valid_run_id("a b"));
        assert!(!valid_run_id("a/b"));
        assert!(!valid_run_id("é"));
        assert!(!valid_run_id(&"a".repeat(MAX_RUN_ID + 1)));
        assert!(valid_run_id(&"a".repeat(MAX_RUN_ID)));
    }

    #[test]
    fn the_payload_is_compact_json_in_field_order() {
        let ca = Ca::generate("ca").unwrap();
        let pem = ca.issue("agent-a", Role::Server, &[]).unwrap();
        let signer = TlsSigner::from_pem(pem.key.as_bytes()).unwrap();
        let p = AgentResult {
            run_id: "r1".into(),
            agent: "agent-a".into(),
            dataset: "orders".into(),
            rpc: "Aggregate".into(),
            request_sha256: "ab".into(),
            scope: Scope {
                side: Some(crate::wire::Side::Target),
                method: "sha256_64".into(),
                columns: vec!["id".into()],
                key_len: 1,
                whole: true,
                seal: None,
                window: None,
                group_by: None,
                measures: None,
            },
            buckets: Some(vec![SignedBucket::new(0, 1, 2, u64::MAX, None)]),
            digests_sha256: None,
            groups_sha256: None,
            release_log_head: "cd".into(),
            time: "2026-12-01T20:00:00Z".into(),
        };
        let env = p.sign(&signer).unwrap();
        assert_eq!(
            String::from_utf8(env.payload_bytes().unwrap()).unwrap(),
            r#"{"run_id":"r1","agent":"agent-a","dataset":"orders","rpc":"Aggregate","request_sha256":"ab","scope":{"side":"target","method":"sha256_64","columns":["id"],"key_len":1,"whole":true,"seal":null},"buckets":[{"parent":0,"child":1,"count":2,"sum":"ffffffffffffffff","xor":null}],"release_log_head":"cd","time":"2026-12-01T20:00:00Z"}"#
        );
        assert_eq!(AgentResult::open(&env).unwrap(), p);
        let chain = crate::seal::certificates_from_pem(pem.cert.as_bytes()).unwrap();
        env.verify(AGENT_RESULT, "agent-a", &chain[0]).unwrap();
        // a keyid that is not the agent named is refused before any signature check
        let mut other = env.clone();
        other.signatures[0].keyid = "agent-b".into();
        assert!(AgentResult::open(&other).is_err());
        assert_eq!(parse_hex64("ffffffffffffffff"), Some(u64::MAX));
        assert_eq!(parse_hex64("FFFFFFFFFFFFFFFF"), None);
        assert_eq!(parse_hex64("+fffffffffffffff"), None);
    }

    #[test]
    fn the_digests_hash_is_over_big_endian_pairs() {
        let mut h = DigestsHash::default();
        h.add(1, 2);
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&1u64.to_be_bytes());
        bytes.extend_from_slice(&2u64.to_be_bytes());
        assert_eq!(h.hex(), hex::encode(Sha256::digest(&bytes)));
        assert_eq!(h.count, 1);
    }
}
