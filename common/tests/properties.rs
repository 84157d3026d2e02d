//! Property tests: the row encoding is injective, aggregates do not depend on row
//! order, and the wrapping SUM is associative.

use proptest::prelude::*;
use tally_common::canonical::row_string;
use tally_common::checksum::{Aggregate, Md5_48, Sha256_64};

fn field() -> impl Strategy<Value = Option<String>> {
    // short strings over an alphabet full of the encoding's own delimiters
    prop::option::of(
        prop::collection::vec(
            prop::sample::select(vec!['1', '2', ':', '~', '|', 'a', 'é', '😀', ' ']),
            0..6,
        )
        .prop_map(|cs| cs.into_iter().collect::<String>()),
    )
}

fn row() -> impl Strategy<Value = Vec<Option<String>>> {
    prop::collection::vec(field(), 1..5)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn row_encoding_is_injective(a in row(), b in row()) {
        let ea = row_string(a.iter().map(Option::as_deref));
        let eb = row_string(b.iter().map(Option::as_deref));
        prop_assert_eq!(a == b, ea == eb, "{:?} vs {:?} gave {:?} / {:?}", a, b, ea, eb);
    }

    #[test]
    fn aggregates_are_order_independent(rows in prop::collection::vec(row(), 0..40), seed in any::<u64>()) {
        let strings: Vec<String> = rows.iter().map(|r| row_string(r.iter().map(Option::as_deref))).collect();
        let mut shuffled = strings.clone();
        // a deterministic permutation from the seed
        let n = shuffled.len();
        let mut s = seed;
        for i in (1..n).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            shuffled.swap(i, (s >> 33) as usize % (i + 1));
        }
        let agg = |rs: &[String]| {
            let mut m = Aggregate::<Md5_48>::default();
            let mut h = Aggregate::<Sha256_64>::default();
            for r in rs { m.add_row(r.as_bytes()); h.add_row(r.as_bytes()); }
            (m, h)
        };
        prop_assert_eq!(agg(&strings), agg(&shuffled));
    }

    #[test]
    fn wrapping_sum_is_associative(a in any::<u64>(), b in any::<u64>(), c in any::<u64>(), xs in any::<[u64; 3]>()) {
        let mk = |sum: u64, x: u64| Aggregate::<Sha256_64>::new(1, sum, Some(x));
        let (p, q, r) = (mk(a, xs[0]), mk(b, xs[1]), mk(c, xs[2]));
        prop_assert_eq!(p.merge(q).merge(r), p.merge(q.merge(r)));
        prop_assert_eq!(p.merge(q), q.merge(p));
    }

    #[test]
    fn merging_segments_equals_aggregating_their_union(rows in prop::collection::vec(row(), 0..30), cut in 0usize..30) {
        let strings: Vec<String> = rows.iter().map(|r| row_string(r.iter().map(Option::as_deref))).collect();
        let cut = cut.min(strings.len());
        let agg = |rs: &[String]| {
            let mut h = Aggregate::<Sha256_64>::default();
            for r in rs { h.add_row(r.as_bytes()); }
            h
        };
        prop_assert_eq!(agg(&strings[..cut]).merge(agg(&strings[cut..])), agg(&strings));
    }
}
