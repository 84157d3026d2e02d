//! Row checksums and segment aggregates (DESIGN §4).
//!
//! `md5_48`: first 12 hex digits of MD5(row string) as an integer, minus 2^47.
//! `sha256_64`: first 8 bytes of SHA-256(row string), big-endian, unsigned.
//! A segment aggregate is (COUNT, SUM mod 2^64) and, for sha256_64, XOR where the
//! engine has an XOR aggregate. [`Aggregate`] is generic over the method, so two
//! aggregates of different methods cannot be combined or compared by mistake.

use std::marker::PhantomData;

use md5::{Digest as _, Md5};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The checksum methods of DESIGN §4, as chosen at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HashMethod {
    #[serde(rename = "md5_48")]
    Md5_48,
    #[serde(rename = "sha256_64")]
    Sha256_64,
}

impl HashMethod {
    pub fn name(self) -> &'static str {
        match self {
            HashMethod::Md5_48 => "md5_48",
            HashMethod::Sha256_64 => "sha256_64",
        }
    }

    /// Strongest first: the order `hash: auto` negotiates in.
    pub const BY_STRENGTH: [HashMethod; 2] = [HashMethod::Sha256_64, HashMethod::Md5_48];

    /// The row checksum as the u64 that is summed (md5_48 as its two's complement).
    pub fn row_checksum(self, row: &[u8]) -> u64 {
        match self {
            HashMethod::Md5_48 => md5_48(row) as u64,
            HashMethod::Sha256_64 => sha256_64(row),
        }
    }

    /// Probability that one differing segment is reported equal, for faults that do
    /// not choose their bytes. md5_48: one row's change moves the SUM by a uniform
    /// value of 48-bit width, so ≈ 2^-48. sha256_64: the SUM alone gives ≈ 2^-64;
    /// XOR, where present, is a second aggregate over the same 64 bits and is not
    /// credited further (the two are not independent for every fault).
    pub fn false_match_probability(self) -> f64 {
        match self {
            HashMethod::Md5_48 => 2f64.powi(-48),
            HashMethod::Sha256_64 => 2f64.powi(-64),
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
        match s {
            "md5_48" => Ok(HashMethod::Md5_48),
            "sha256_64" => Ok(HashMethod::Sha256_64),
            _ => Err(format!(
                "unknown hash method {s:?} (expected md5_48 or sha256_64)"
            )),
        }
    }
}

/// Probability that a run reports `match` although some of its `segments` compared
/// segments differ: a union bound over the segments.
pub fn run_false_match_bound(method: HashMethod, segments: u64) -> f64 {
    (segments.max(1) as f64 * method.false_match_probability()).min(1.0)
}

/// The md5_48 row checksum, in [-2^47, 2^47).
pub fn md5_48(row: &[u8]) -> i64 {
    let d = Md5::digest(row);
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

/// An aggregate whose method is known only at run time (from the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnyAggregate {
    Md5_48(Aggregate<Md5_48>),
    Sha256_64(Aggregate<Sha256_64>),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot compare a {0} aggregate with a {1} aggregate")]
pub struct MethodMismatch(pub HashMethod, pub HashMethod);

impl AnyAggregate {
    pub fn new(method: HashMethod, count: u64, sum: u64, xor: Option<u64>) -> Self {
        match method {
            HashMethod::Md5_48 => AnyAggregate::Md5_48(Aggregate::new(count, sum, xor)),
            HashMethod::Sha256_64 => AnyAggregate::Sha256_64(Aggregate::new(count, sum, xor)),
        }
    }

    pub fn method(&self) -> HashMethod {
        match self {
            AnyAggregate::Md5_48(_) => HashMethod::Md5_48,
            AnyAggregate::Sha256_64(_) => HashMethod::Sha256_64,
        }
    }

    pub fn count(&self) -> u64 {
        match self {
            AnyAggregate::Md5_48(a) => a.count,
            AnyAggregate::Sha256_64(a) => a.count,
        }
    }

    pub fn sum(&self) -> u64 {
        match self {
            AnyAggregate::Md5_48(a) => a.sum,
            AnyAggregate::Sha256_64(a) => a.sum,
        }
    }

    pub fn xor(&self) -> Option<u64> {
        match self {
            AnyAggregate::Md5_48(a) => a.xor,
            AnyAggregate::Sha256_64(a) => a.xor,
        }
    }

    /// An empty aggregate of `method`, with XOR where the method has it and `xor` is true.
    pub fn empty(method: HashMethod, xor: bool) -> Self {
        AnyAggregate::new(method, 0, 0, xor.then_some(0))
    }

    /// Adds one row by its checksum (as returned by [`HashMethod::row_checksum`]).
    pub fn add_checksum(&mut self, c: u64) {
        match self {
            AnyAggregate::Md5_48(a) => a.add_checksum(c),
            AnyAggregate::Sha256_64(a) => a.add_checksum(c),
        }
    }

    /// Combines two disjoint segments of the same method (see [`Aggregate::merge`]).
    pub fn merge(self, other: AnyAggregate) -> Result<AnyAggregate, MethodMismatch> {
        match (self, other) {
            (AnyAggregate::Md5_48(a), AnyAggregate::Md5_48(b)) => Ok(AnyAggregate::Md5_48(a.merge(b))),
            (AnyAggregate::Sha256_64(a), AnyAggregate::Sha256_64(b)) => {
                Ok(AnyAggregate::Sha256_64(a.merge(b)))
            }
            (a, b) => Err(MethodMismatch(a.method(), b.method())),
        }
    }

    pub fn matches(&self, other: &AnyAggregate) -> Result<bool, MethodMismatch> {
        match (self, other) {
            (AnyAggregate::Md5_48(a), AnyAggregate::Md5_48(b)) => Ok(a.matches(b)),
            (AnyAggregate::Sha256_64(a), AnyAggregate::Sha256_64(b)) => Ok(a.matches(b)),
            (a, b) => Err(MethodMismatch(a.method(), b.method())),
        }
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
