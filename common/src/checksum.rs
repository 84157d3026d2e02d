//! Row checksums and segment aggregates (DESIGN §4).
//!
//! `md5_48`: first 12 hex digits of MD5(row string) as an integer, minus 2^47.
//! `sha256_64`: first 8 bytes of SHA-256(row string), big-endian, unsigned.
//! A segment aggregate is (COUNT, SUM mod 2^64) and, for sha256_64, XOR where the
//! engine has an XOR aggregate. [`Aggregate`] is generic over the method, so two
//! aggregates of different methods cannot be combined or compared by mistake.

use std::marker::PhantomData;

use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The checksum methods of DESIGN §4 and §4.1, as chosen at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HashMethod {
    #[serde(rename = "md5_48")]
    Md5_48,
    #[serde(rename = "sha256_64")]
    Sha256_64,
    #[serde(rename = "sealed_md5_48")]
    SealedMd5_48,
    #[serde(rename = "sealed_sha256_64")]
    SealedSha256_64,
}

impl HashMethod {
    pub fn name(self) -> &'static str {
        match self {
            HashMethod::Md5_48 => "md5_48",
            HashMethod::Sha256_64 => "sha256_64",
            HashMethod::SealedMd5_48 => "sealed_md5_48",
            HashMethod::SealedSha256_64 => "sealed_sha256_64",
        }
    }

    /// Strongest first: the order `hash: auto` negotiates in (sealed before unsealed).
    pub const BY_STRENGTH: [HashMethod; 4] = [
        HashMethod::SealedSha256_64,
        HashMethod::SealedMd5_48,
        HashMethod::Sha256_64,
        HashMethod::Md5_48,
    ];

    /// Keyed with the run key (DESIGN §4.1).
    pub fn is_sealed(self) -> bool {
        matches!(self, HashMethod::SealedMd5_48 | HashMethod::SealedSha256_64)
    }

    /// The digest and arithmetic underneath: sealing only prefixes the key.
    pub fn base(self) -> HashMethod {
        match self {
            HashMethod::Md5_48 | HashMethod::SealedMd5_48 => HashMethod::Md5_48,
            HashMethod::Sha256_64 | HashMethod::SealedSha256_64 => HashMethod::Sha256_64,
        }
    }

    /// The sealed method of the same digest.
    pub fn sealed(self) -> HashMethod {
        match self.base() {
            HashMethod::Md5_48 => HashMethod::SealedMd5_48,
            _ => HashMethod::SealedSha256_64,
        }
    }

    /// Whether the method's aggregate has an XOR part (where the engine has one).
    pub fn has_xor(self) -> bool {
        self.base() == HashMethod::Sha256_64
    }

    /// The unsealed row checksum as the u64 that is summed (md5_48 as its two's
    /// complement). A sealed method needs its key: use [`Hasher`].
    pub fn row_checksum(self, row: &[u8]) -> u64 {
        match self.base() {
            HashMethod::Md5_48 => md5_48(row) as u64,
            _ => sha256_64(row),
        }
    }

    /// Probability that one differing segment is reported equal, for faults that do
    /// not choose their bytes. md5_48: one row's change moves the SUM by a uniform
    /// value of 48-bit width, so ≈ 2^-48. sha256_64: the SUM alone gives ≈ 2^-64;
    /// XOR, where present, is a second aggregate over the same 64 bits and is not
    /// credited further (the two are not independent for every fault). Sealing does
    /// not change the width.
    pub fn false_match_probability(self) -> f64 {
        match self.base() {
            HashMethod::Md5_48 => 2f64.powi(-48),
            _ => 2f64.powi(-64),
        }
    }
}

impl std::fmt::Display for HashMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for HashMethod {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        HashMethod::BY_STRENGTH
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown hash method {s:?} (expected sealed_sha256_64, sealed_md5_48, sha256_64 or md5_48)"
                )
            })
    }
}

impl From<HashMethod> for tally_proto::v1::HashMethod {
    fn from(m: HashMethod) -> Self {
        use tally_proto::v1::HashMethod as P;
        match m {
            HashMethod::Md5_48 => P::Md548,
            HashMethod::Sha256_64 => P::Sha25664,
            HashMethod::SealedMd5_48 => P::SealedMd548,
            HashMethod::SealedSha256_64 => P::SealedSha25664,
        }
    }
}

impl HashMethod {
    /// The one mapping from the wire; `None` for an unknown or unspecified value.
    pub fn from_pb(v: i32) -> Option<HashMethod> {
        use tally_proto::v1::HashMethod as P;
        match P::try_from(v).ok()? {
            P::Md548 => Some(HashMethod::Md5_48),
            P::Sha25664 => Some(HashMethod::Sha256_64),
            P::SealedMd548 => Some(HashMethod::SealedMd5_48),
            P::SealedSha25664 => Some(HashMethod::SealedSha256_64),
            P::Unspecified => None,
        }
    }
}

/// Row and key hashes of one request: the method and, for a sealed method, the run's
/// keys. The hash of a sealed method is the unsealed digest of `key || bytes`.
#[derive(Clone)]
pub struct Hasher {
    method: HashMethod,
    k_row: Option<[u8; 32]>,
    k_key: Option<[u8; 32]>,
    // the digest state after the key: cloned per row instead of re-absorbing it
    row_md5: Md5,
    row_sha: Sha256,
    key_sha: Sha256,
}

impl std::fmt::Debug for Hasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hasher")
            .field("method", &self.method)
            .finish_non_exhaustive()
    }
}

impl Hasher {
    /// An unsealed method's hasher. Panics on a sealed method: that needs keys.
    pub fn unsealed(method: HashMethod) -> Hasher {
        assert!(!method.is_sealed(), "{method} needs the run keys");
        Hasher {
            method,
            k_row: None,
            k_key: None,
            row_md5: Md5::new(),
            row_sha: Sha256::new(),
            key_sha: Sha256::new(),
        }
    }

    /// A sealed method's hasher, keyed with the run's keys.
    pub fn sealed(method: HashMethod, keys: &crate::seal::RunKeys) -> Hasher {
        let method = method.sealed();
        Hasher {
            method,
            k_row: Some(keys.k_row),
            k_key: Some(keys.k_key),
            row_md5: Md5::new_with_prefix(keys.k_row),
            row_sha: Sha256::new_with_prefix(keys.k_row),
            key_sha: Sha256::new_with_prefix(keys.k_key),
        }
    }

    pub fn method(&self) -> HashMethod {
        self.method
    }

    /// The key prefixed to row strings (sealed methods), for SQL inside the zone.
    pub fn row_key(&self) -> Option<&[u8; 32]> {
        self.k_row.as_ref()
    }

    /// The key prefixed to key strings (sealed methods), for SQL inside the zone.
    pub fn key_key(&self) -> Option<&[u8; 32]> {
        self.k_key.as_ref()
    }

    /// The row checksum of a row string, as the u64 that is summed.
    pub fn row(&self, row: &[u8]) -> u64 {
        match self.method.base() {
            HashMethod::Md5_48 => {
                let d = self.row_md5.clone().chain_update(row).finalize();
                md5_48_of_digest(&d) as u64
            }
            _ => {
                let d = self.row_sha.clone().chain_update(row).finalize();
                u64::from_be_bytes(d[..8].try_into().expect("SHA-256 has 32 bytes"))
            }
        }
    }

    /// The key hash of a key's row string (sha256_64, keyed with k_key when sealed),
    /// which matches rows between sides and places them in hash buckets.
    pub fn key(&self, key_row: &[u8]) -> u64 {
        let d = self.key_sha.clone().chain_update(key_row).finalize();
        u64::from_be_bytes(d[..8].try_into().expect("SHA-256 has 32 bytes"))
    }
}

/// Probability that a run reports `match` although some of its `segments` compared
/// segments differ: a union bound over the segments.
pub fn run_false_match_bound(method: HashMethod, segments: u64) -> f64 {
    (segments.max(1) as f64 * method.false_match_probability()).min(1.0)
}

/// The md5_48 row checksum, in [-2^47, 2^47).
pub fn md5_48(row: &[u8]) -> i64 {
    md5_48_of_digest(&Md5::digest(row))
}

fn md5_48_of_digest(d: &[u8]) -> i64 {
    let mut v: i64 = 0;
    for b in &d[..6] {
        v = (v << 8) | i64::from(*b);
    }
    v - (1i64 << 47)
}

/// The sha256_64 row hash.
pub fn sha256_64(row: &[u8]) -> u64 {
    let d = Sha256::digest(row);
    u64::from_be_bytes(d[..8].try_into().expect("SHA-256 has 32 bytes"))
}

/// The hash of a row's key (the row string of its key columns), used to match rows
/// between sides and to place rows in hash buckets.
pub fn key_hash(key_row: &[u8]) -> u64 {
    sha256_64(key_row)
}

/// Compile-time tag of a checksum method.
pub trait Method: Copy + Default + std::fmt::Debug {
    const METHOD: HashMethod;
    /// Whether this method has an XOR component.
    const HAS_XOR: bool;
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Md5_48;
impl Method for Md5_48 {
    const METHOD: HashMethod = HashMethod::Md5_48;
    const HAS_XOR: bool = false;
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sha256_64;
impl Method for Sha256_64 {
    const METHOD: HashMethod = HashMethod::Sha256_64;
    const HAS_XOR: bool = true;
}

/// A segment aggregate of one method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aggregate<M: Method> {
    pub count: u64,
    pub sum: u64,
    /// Absent where the engine has no XOR aggregate (and always for md5_48).
    pub xor: Option<u64>,
    _method: PhantomData<M>,
}

impl<M: Method> Default for Aggregate<M> {
    fn default() -> Self {
        Aggregate {
            count: 0,
            sum: 0,
            xor: M::HAS_XOR.then_some(0),
            _method: PhantomData,
        }
    }
}

impl<M: Method> Aggregate<M> {
    pub fn new(count: u64, sum: u64, xor: Option<u64>) -> Self {
        Aggregate {
            count,
            sum,
            xor: if M::HAS_XOR { xor } else { None },
            _method: PhantomData,
        }
    }

    /// Adds one row by its row string.
    pub fn add_row(&mut self, row: &[u8]) {
        self.add_checksum(M::METHOD.row_checksum(row));
    }

    /// Adds one row by its checksum (as returned by [`HashMethod::row_checksum`]).
    pub fn add_checksum(&mut self, c: u64) {
        self.count += 1;
        self.sum = self.sum.wrapping_add(c);
        if let Some(x) = self.xor.as_mut() {
            *x ^= c;
        }
    }

    /// Combines two disjoint segments. XOR stays only if both sides have it.
    pub fn merge(self, other: Self) -> Self {
        Aggregate {
            count: self.count + other.count,
            sum: self.sum.wrapping_add(other.sum),
            xor: match (self.xor, other.xor) {
                (Some(a), Some(b)) => Some(a ^ b),
                _ => None,
            },
            _method: PhantomData,
        }
    }

    /// Equal when COUNT and every aggregate present on both sides are equal.
    pub fn matches(&self, other: &Self) -> bool {
        self.count == other.count
            && self.sum == other.sum
            && match (self.xor, other.xor) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

/// An aggregate whose method is known only at run time (from the wire). Aggregates
/// of two methods (sealed and unsealed included) never combine or compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnyAggregate {
    method: HashMethod,
    count: u64,
    sum: u64,
    xor: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot compare a {0} aggregate with a {1} aggregate")]
pub struct MethodMismatch(pub HashMethod, pub HashMethod);

impl AnyAggregate {
    /// XOR is kept only where the method has it.
    pub fn new(method: HashMethod, count: u64, sum: u64, xor: Option<u64>) -> Self {
        AnyAggregate {
            method,
            count,
            sum,
            xor: if method.has_xor() { xor } else { None },
        }
    }

    pub fn method(&self) -> HashMethod {
        self.method
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn sum(&self) -> u64 {
        self.sum
    }

    pub fn xor(&self) -> Option<u64> {
        self.xor
    }

    /// An empty aggregate of `method`, with XOR where the method has it and `xor` is true.
    pub fn empty(method: HashMethod, xor: bool) -> Self {
        AnyAggregate::new(method, 0, 0, xor.then_some(0))
    }

    /// Adds one row by its checksum (as returned by [`Hasher::row`]).
    pub fn add_checksum(&mut self, c: u64) {
        self.count += 1;
        self.sum = self.sum.wrapping_add(c);
        if let Some(x) = self.xor.as_mut() {
            *x ^= c;
        }
    }

    fn same_method(&self, other: &AnyAggregate) -> Result<(), MethodMismatch> {
        if self.method == other.method {
            Ok(())
        } else {
            Err(MethodMismatch(self.method, other.method))
        }
    }

    /// Combines two disjoint segments of the same method. XOR stays only if both
    /// sides have it.
    pub fn merge(self, other: AnyAggregate) -> Result<AnyAggregate, MethodMismatch> {
        self.same_method(&other)?;
        Ok(AnyAggregate {
            method: self.method,
            count: self.count + other.count,
            sum: self.sum.wrapping_add(other.sum),
            xor: match (self.xor, other.xor) {
                (Some(a), Some(b)) => Some(a ^ b),
                _ => None,
            },
        })
    }

    /// Equal when COUNT and every aggregate present on both sides are equal.
    pub fn matches(&self, other: &AnyAggregate) -> Result<bool, MethodMismatch> {
        self.same_method(other)?;
        Ok(self.count == other.count
            && self.sum == other.sum
            && match (self.xor, other.xor) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            })
    }
}

/// Reduces an exact (arbitrary-size) decimal SUM, as an engine returns it, to u64 mod 2^64.
pub fn wrap_decimal_sum(s: &str) -> Option<u64> {
    let s = s.trim();
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    // engines may render an integral DECIMAL sum with a zero fraction
    let digits = match digits.split_once('.') {
        Some((i, f)) if f.bytes().all(|b| b == b'0') => i,
        Some(_) => return None,
        None => digits,
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut v: u64 = 0;
    for b in digits.bytes() {
        v = v.wrapping_mul(10).wrapping_add(u64::from(b - b'0'));
    }
    Some(if neg { v.wrapping_neg() } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_48_is_centered() {
        // MD5("") = d41d8cd98f00b204e9800998ecf8427e
        assert_eq!(md5_48(b""), 0xd41d8cd98f00i64 - (1 << 47));
        // SHA-256("") = e3b0c44298fc1c14...
        assert_eq!(sha256_64(b""), 0xe3b0c44298fc1c14);
    }

    #[test]
    fn wrap_decimal_sum_reduces_mod_2_64() {
        assert_eq!(wrap_decimal_sum("18446744073709551616"), Some(0));
        assert_eq!(wrap_decimal_sum("18446744073709551617"), Some(1));
        assert_eq!(wrap_decimal_sum("-1"), Some(u64::MAX));
        assert_eq!(wrap_decimal_sum("42.000"), Some(42));
        assert_eq!(wrap_decimal_sum("4.5"), None);
        assert_eq!(wrap_decimal_sum(""), None);
        let big: u128 = 3 * (1u128 << 64) + 7;
        assert_eq!(wrap_decimal_sum(&big.to_string()), Some(7));
    }

    #[test]
    fn aggregates_of_different_methods_do_not_compare() {
        let a = AnyAggregate::new(HashMethod::Md5_48, 1, 2, None);
        let b = AnyAggregate::new(HashMethod::Sha256_64, 1, 2, Some(2));
        assert_eq!(
            a.matches(&b),
            Err(MethodMismatch(HashMethod::Md5_48, HashMethod::Sha256_64))
        );
        assert_eq!(a.matches(&a), Ok(true));
        assert!(a.merge(b).is_err());
    }

    #[test]
    fn sealed_and_unsealed_aggregates_do_not_compare() {
        let a = AnyAggregate::new(HashMethod::Sha256_64, 1, 2, Some(2));
        let b = AnyAggregate::new(HashMethod::SealedSha256_64, 1, 2, Some(2));
        assert!(a.matches(&b).is_err());
        assert!(a.merge(b).is_err());
        assert_eq!(
            AnyAggregate::new(HashMethod::SealedMd5_48, 1, 1, Some(9)).xor(),
            None
        );
    }

    #[test]
    fn a_sealed_hash_is_the_digest_of_key_and_bytes() {
        let keys = crate::seal::RunKeys {
            k_row: [0x11; 32],
            k_key: [0x22; 32],
        };
        let row = b"2:42|5:hello";
        let prefixed = |k: [u8; 32]| {
            let mut v = k.to_vec();
            v.extend_from_slice(row);
            v
        };
        let sha = Hasher::sealed(HashMethod::Sha256_64, &keys);
        assert_eq!(sha.method(), HashMethod::SealedSha256_64);
        assert_eq!(sha.row(row), sha256_64(&prefixed(keys.k_row)));
        assert_eq!(sha.key(row), sha256_64(&prefixed(keys.k_key)));
        assert_ne!(sha.row(row), sha256_64(row));
        let md5 = Hasher::sealed(HashMethod::Md5_48, &keys);
        assert_eq!(md5.row(row), md5_48(&prefixed(keys.k_row)) as u64);
        assert_eq!(md5.key(row), sha.key(row));
        let plain = Hasher::unsealed(HashMethod::Sha256_64);
        assert_eq!(plain.row(row), sha256_64(row));
        assert_eq!(plain.key(row), key_hash(row));
        for m in HashMethod::BY_STRENGTH {
            assert_eq!(m.name().parse::<HashMethod>(), Ok(m));
            assert_eq!(
                HashMethod::from_pb(tally_proto::v1::HashMethod::from(m) as i32),
                Some(m)
            );
        }
    }

    #[test]
    fn merged_aggregates_wrap_and_keep_xor_only_where_both_have_it() {
        let a = AnyAggregate::new(HashMethod::Sha256_64, 2, u64::MAX, Some(0b101));
        let b = AnyAggregate::new(HashMethod::Sha256_64, 3, 2, Some(0b011));
        assert_eq!(
            a.merge(b),
            Ok(AnyAggregate::new(HashMethod::Sha256_64, 5, 1, Some(0b110)))
        );
        let no_xor = AnyAggregate::new(HashMethod::Sha256_64, 1, 1, None);
        assert_eq!(a.merge(no_xor).unwrap().xor(), None);
    }

    #[test]
    fn absent_xor_compares_sum_only() {
        let with = Aggregate::<Sha256_64>::new(2, 10, Some(3));
        let without = Aggregate::<Sha256_64>::new(2, 10, None);
        assert!(with.matches(&without));
        assert!(!with.matches(&Aggregate::new(2, 11, None)));
        assert!(!with.matches(&Aggregate::new(3, 10, Some(3))));
        assert!(!with.matches(&Aggregate::new(2, 10, Some(4))));
        // md5_48 never carries XOR, whatever the wire says
        assert_eq!(Aggregate::<Md5_48>::new(1, 1, Some(9)).xor, None);
        assert_eq!(AnyAggregate::new(HashMethod::Md5_48, 1, 1, Some(9)).xor(), None);
    }

    #[test]
    fn false_match_probabilities() {
        assert_eq!(
            HashMethod::Md5_48.false_match_probability(),
            1.0 / 281_474_976_710_656.0
        );
        assert!(HashMethod::Sha256_64.false_match_probability() < 1e-19);
        assert_eq!(run_false_match_bound(HashMethod::Md5_48, 1 << 48), 1.0);
    }
}
