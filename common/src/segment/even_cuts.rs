//! An even split of a single integer key, as the planner states it: first cut, width
//! and count. It splits a segment exactly as the list of its cut points does; what it
//! adds is that an agent need not look at the list to know the points are evenly
//! spaced, so it finds a row's child with one division (in SQL and in process).
//!
//! On the wire the cut list is always sent beside it (`KeyCuts.cuts` and `.even`): an
//! agent before the even form answers the very same split from the list, and an agent
//! that reads the even form refuses a request whose two forms disagree
//! ([`even_from_pb`]), so neither can answer a split other than the one the list says.

use serde::{Deserialize, Serialize};
use tally_proto::v1 as pb;

use super::{KeyPart, KeyTuple, MAX_CUTS, WireError, wire_err};

/// Cut points `first + i·width` for `i` in `0..count` of a single integer key: children
/// `[lower, first)`, `[first, first + width)`, …, `[last, upper)`. Always valid: a width
/// and count of at least 1, at most [`MAX_CUTS`] cuts, the last one an `i64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "EvenCutsFields", into = "EvenCutsFields")]
pub struct EvenCuts {
    first: i64,
    width: i64,
    count: u32,
}

/// The serde form of [`EvenCuts`], validated on the way in.
#[derive(Serialize, Deserialize)]
struct EvenCutsFields {
    first: i64,
    width: i64,
    count: u32,
}

impl TryFrom<EvenCutsFields> for EvenCuts {
    type Error = String;
    fn try_from(f: EvenCutsFields) -> Result<EvenCuts, String> {
        EvenCuts::new(f.first, f.width, f.count).ok_or_else(|| INVALID.to_string())
    }
}

impl From<EvenCuts> for EvenCutsFields {
    fn from(e: EvenCuts) -> Self {
        EvenCutsFields {
            first: e.first,
            width: e.width,
            count: e.count,
        }
    }
}

const INVALID: &str =
    "an even split needs a width and a count of at least 1, at most 1024 cuts, and its last cut an integer";

impl EvenCuts {
    /// `None` unless `width` and `count` are at least 1, `count` at most [`MAX_CUTS`]
    /// and the last cut, `first + (count - 1)·width`, fits an `i64`.
    pub fn new(first: i64, width: i64, count: u32) -> Option<EvenCuts> {
        if width < 1 || count < 1 || count as usize > MAX_CUTS {
            return None;
        }
        let e = EvenCuts { first, width, count };
        i64::try_from(e.cut(count - 1)).ok()?;
        Some(e)
    }

    /// Cut `i`, in `i128`: `width·i` alone may not fit an `i64` where the cut does.
    fn cut(&self, i: u32) -> i128 {
        i128::from(self.first) + i128::from(self.width) * i128::from(i)
    }

    pub fn first(&self) -> i64 {
        self.first
    }

    pub fn width(&self) -> i64 {
        self.width
    }

    /// The number of cut points (the split has one child more).
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The last cut point.
    pub fn last(&self) -> i64 {
        self.cut(self.count - 1) as i64
    }

    /// The cut points as key tuples, ascending: what `KeyCuts.cuts` carries.
    pub fn cuts(&self) -> Vec<KeyTuple> {
        (0..self.count)
            .map(|i| vec![KeyPart::Int(self.cut(i) as i64)])
            .collect()
    }

    /// The child a key falls in: the number of cut points at or below it, by one
    /// division.
    pub fn child_of(&self, key: i64) -> usize {
        if key < self.first {
            return 0;
        }
        // in i128, key - first cannot overflow
        let above = (i128::from(key) - i128::from(self.first)) / i128::from(self.width);
        (above + 1).min(i128::from(self.count)) as usize
    }

    pub fn to_pb(&self) -> pb::EvenCuts {
        pb::EvenCuts {
            first: self.first,
            width: self.width,
            count: self.count,
        }
    }
}

/// A `KeyCuts.even` (at `field`) read against the cut list it came with (already
/// parsed): the even split, or a refusal naming the field when it is not a valid even
/// split or does not restate `cuts` exactly, point for point.
pub(super) fn even_from_pb(e: pb::EvenCuts, cuts: &[KeyTuple], field: &str) -> Result<EvenCuts, WireError> {
    let even = EvenCuts::new(e.first, e.width, e.count).ok_or_else(|| wire_err(field, INVALID))?;
    if even.count as usize != cuts.len() {
        return Err(wire_err(
            field,
            format!(
                "states {} cut points, the cut list has {}: the two forms of one split must agree",
                even.count,
                cuts.len()
            ),
        ));
    }
    if let Some((i, (said, listed))) = even
        .cuts()
        .into_iter()
        .zip(cuts)
        .enumerate()
        .find(|(_, (said, listed))| said != *listed)
    {
        return Err(wire_err(
            field,
            format!(
                "states cut {i} as {}, the cut list has {}: the two forms of one split must agree",
                super::format_tuple(&said),
                super::format_tuple(listed)
            ),
        ));
    }
    Ok(even)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_even_split_is_valid_by_construction() {
        assert!(EvenCuts::new(10, 0, 3).is_none(), "width 0");
        assert!(EvenCuts::new(10, -5, 3).is_none(), "negative width");
        assert!(EvenCuts::new(10, 5, 0).is_none(), "no cut");
        assert!(EvenCuts::new(0, 1, 1025).is_none(), "more than 1024 cuts");
        assert!(
            EvenCuts::new(i64::MAX - 9, 5, 3).is_none(),
            "the last cut overflows"
        );
        let e = EvenCuts::new(i64::MAX - 10, 5, 3).expect("the last cut is i64::MAX");
        assert_eq!(e.last(), i64::MAX);
        let e = EvenCuts::new(-20, 15, 4).unwrap();
        assert_eq!(e.last(), 25);
        let ints = |c: Vec<KeyTuple>| {
            c.into_iter()
                .map(|t| match t.as_slice() {
                    [KeyPart::Int(i)] => *i,
                    _ => unreachable!(),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(ints(e.cuts()), vec![-20, -5, 10, 25]);
        // serde checks what it reads
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(json, r#"{"first":-20,"width":15,"count":4}"#);
        assert_eq!(serde_json::from_str::<EvenCuts>(&json).unwrap(), e);
        assert!(serde_json::from_str::<EvenCuts>(r#"{"first":0,"width":0,"count":4}"#).is_err());
    }

    #[test]
    fn a_key_falls_in_the_child_its_cut_points_give() {
        for e in [
            EvenCuts::new(-20, 15, 4).unwrap(),
            EvenCuts::new(7, 1, 1).unwrap(),
            EvenCuts::new(i64::MIN, 1 << 62, 4).unwrap(),
            EvenCuts::new(i64::MAX - 10, 5, 3).unwrap(),
            EvenCuts::new(0, 3, 1024).unwrap(),
        ] {
            let cuts = e.cuts();
            let mut keys = vec![i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX - 1, i64::MAX];
            for c in [e.first(), e.last(), e.first() + e.width() / 2] {
                keys.extend([c.saturating_sub(1), c, c.saturating_add(1)]);
            }
            for k in keys {
                let key = vec![KeyPart::Int(k)];
                assert_eq!(e.child_of(k), cuts.partition_point(|c| c <= &key), "{e:?} {k}");
            }
        }
    }

    #[test]
    fn the_even_form_must_restate_the_cut_list() {
        let e = EvenCuts::new(100, 50, 3).unwrap();
        let pb = e.to_pb();
        assert_eq!(even_from_pb(pb, &e.cuts(), "f").unwrap(), e);
        let int = |i: i64| vec![KeyPart::Int(i)];
        let refused = |cuts: Vec<KeyTuple>| even_from_pb(pb, &cuts, "s.even").unwrap_err();
        let fewer = refused(vec![int(100), int(150)]);
        assert_eq!(fewer.field, "s.even");
        assert!(
            fewer.message.contains("states 3 cut points, the cut list has 2"),
            "{fewer}"
        );
        let other = refused(vec![int(100), int(151), int(200)]);
        assert!(
            other
                .message
                .contains("states cut 1 as 150, the cut list has 151"),
            "{other}"
        );
        let text = refused(vec![int(100), vec![KeyPart::Text("150".into())], int(200)]);
        assert_eq!(text.field, "s.even");
        let composite = refused(vec![int(100), vec![KeyPart::Int(150), KeyPart::Int(0)], int(200)]);
        assert_eq!(composite.field, "s.even");
        let zero = pb::EvenCuts { width: 0, ..pb };
        assert_eq!(
            even_from_pb(zero, &e.cuts(), "s.even").unwrap_err().field,
            "s.even"
        );
    }
}
