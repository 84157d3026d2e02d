//! The reference encoder reproduces every vector of tests/vectors/canonical.json,
//! which an independent Python implementation (tests/vectors/generate.py) wrote.

use tally_common::checksum::{Aggregate, HashMethod, Md5_48, Sha256_64, md5_48, sha256_64};
use tally_common::types::TypeClass;
use tally_common::vectors::VectorFile;

#[test]
fn every_row_vector_reproduces_bit_for_bit() {
    let file = VectorFile::load_repo();
    assert_eq!(file.version, 1);
    assert!(
        file.vectors.len() >= 60,
        "at least 60 row vectors, got {}",
        file.vectors.len()
    );
    for v in &file.vectors {
        let rs = v.encode().unwrap_or_else(|e| panic!("{}: {e}", v.id));
        assert_eq!(rs, v.row_string, "{} ({}): row string", v.id, v.about);
        assert_eq!(md5_48(rs.as_bytes()).to_string(), v.md5_48, "{}: md5_48", v.id);
        assert_eq!(
            format!("{:016x}", sha256_64(rs.as_bytes())),
            v.sha256_64,
            "{}: sha256_64",
            v.id
        );
    }
}

/// The rules a reader could take two ways, each pinned by the Python reference: which
/// of several equally short decimals a float takes, a negative duration cut to zero,
/// and JSON that is not I-JSON (refused, never folded into another document).
#[test]
fn every_single_field_vector_reproduces_or_is_refused() {
    let file = VectorFile::load_repo();
    assert!(
        file.single.len() >= 7,
        "{} single-field vectors",
        file.single.len()
    );
    for v in &file.single {
        match (&v.canonical, &v.refused, v.field.canonical()) {
            (Some(want), None, Ok(Some(got))) => assert_eq!(&got, want, "{} ({})", v.id, v.about),
            (None, Some(_), Err(_)) => {}
            (_, _, got) => panic!("{} ({}): the reference gives {got:?}", v.id, v.about),
        }
    }
    assert!(file.single.iter().any(|v| v.refused.is_some()));
}

#[test]
fn vectors_cover_every_type_class() {
    let file = VectorFile::load_repo();
    for class in TypeClass::ALL {
        if class == TypeClass::Other {
            continue;
        }
        let n = file
            .vectors
            .iter()
            .flat_map(|v| &v.fields)
            .filter(|f| f.class() == class)
            .count();
        assert!(n >= 2, "type class {class} has {n} fields in the vectors");
    }
    assert!(
        file.vectors.iter().any(|v| v.fields.len() >= 20),
        "a wide row of 20+ columns"
    );
}

#[test]
fn every_aggregate_vector_reproduces() {
    let file = VectorFile::load_repo();
    assert!(file.aggregates.len() >= 6);
    for a in &file.aggregates {
        let mut md5 = Aggregate::<Md5_48>::default();
        let mut sha = Aggregate::<Sha256_64>::default();
        for id in &a.rows {
            let rs = file.row(id).encode().unwrap();
            md5.add_row(rs.as_bytes());
            sha.add_row(rs.as_bytes());
        }
        assert_eq!(md5.count.to_string(), a.count, "{}", a.id);
        assert_eq!(
            format!("{:016x}", md5.sum),
            a.md5_48_sum,
            "{} ({}): md5_48 sum",
            a.id,
            a.about
        );
        assert_eq!(
            format!("{:016x}", sha.sum),
            a.sha256_sum,
            "{} ({}): sha256 sum",
            a.id,
            a.about
        );
        assert_eq!(
            format!("{:016x}", sha.xor.unwrap()),
            a.sha256_xor,
            "{} ({}): sha256 xor",
            a.id,
            a.about
        );
    }
}

#[test]
fn xor_cancellation_is_caught_by_sum() {
    let file = VectorFile::load_repo();
    let dup = file
        .aggregates
        .iter()
        .find(|a| a.rows == ["tv002", "tv002", "tv003"])
        .unwrap();
    let single = file.aggregates.iter().find(|a| a.rows == ["tv003"]).unwrap();
    assert_eq!(
        dup.sha256_xor, single.sha256_xor,
        "a duplicated row cancels in XOR"
    );
    assert_ne!(dup.sha256_sum, single.sha256_sum, "but not in SUM");
    assert_eq!(HashMethod::Sha256_64.name(), "sha256_64");
}

#[test]
fn sealed_vectors_reproduce_from_the_zone_keys() {
    use tally_common::checksum::Hasher;
    use tally_common::seal::{Party, ZoneSecret, derive_run_keys, keys_of_run_key, run_key};
    let file = VectorFile::load_repo();
    let s = &file.sealed;
    let secret = |name: &str| {
        let h: [u8; 32] = hex::decode(&s.zone_keys[name].secret)
            .unwrap()
            .try_into()
            .unwrap();
        ZoneSecret::from_bytes(h)
    };
    let (dc1, vpc2) = (secret("dc1"), secret("vpc2"));
    assert_eq!(hex::encode(dc1.public()), s.zone_keys["dc1"].public);
    assert_eq!(hex::encode(vpc2.public()), s.zone_keys["vpc2"].public);
    let nonce = hex::decode(&s.nonce).unwrap();
    // each side from its own secret and the other's public key
    let party = |agent: &'static str| Party {
        agent,
        dataset: s.datasets[agent].as_str(),
    };
    let rk = run_key(&dc1, party("dc1"), party("vpc2"), &vpc2.public(), &nonce).unwrap();
    assert_eq!(hex::encode(rk), s.run_key);
    assert_eq!(
        run_key(&vpc2, party("vpc2"), party("dc1"), &dc1.public(), &nonce).unwrap(),
        rk
    );
    let keys = derive_run_keys(&dc1, party("dc1"), party("vpc2"), &vpc2.public(), &nonce).unwrap();
    assert_eq!(keys, keys_of_run_key(&rk));
    assert_eq!(keys, s.keys());
    assert!(s.rows.len() >= 10);
    for (m, get) in [(HashMethod::SealedSha256_64, 0), (HashMethod::SealedMd5_48, 1)] {
        let h = Hasher::sealed(m, &keys);
        for r in &s.rows {
            let rs = file.row(&r.id).encode().unwrap();
            let got = h.row(rs.as_bytes());
            if get == 0 {
                assert_eq!(format!("{got:016x}"), r.sealed_sha256_64, "{}", r.id);
            } else {
                assert_eq!((got as i64).to_string(), r.sealed_md5_48, "{}", r.id);
            }
            assert_eq!(
                format!("{:016x}", h.key(rs.as_bytes())),
                r.sealed_key_hash,
                "{}",
                r.id
            );
        }
    }
}

#[test]
fn the_vector_file_is_the_canonical_form_version_evidence_states() {
    // evidence bundles state CANONICAL_FORM_VERSION: a rule change regenerates the
    // vectors with a new version, and this fails until the constant follows
    assert_eq!(
        VectorFile::load_repo().version,
        tally_common::canonical::CANONICAL_FORM_VERSION
    );
}

#[test]
fn every_period_label_vector_reproduces() {
    use tally_common::period::{Granularity, period_label};
    let file = VectorFile::load_repo();
    assert!(file.period_labels.len() >= 40);
    let all = [
        Granularity::Hour,
        Granularity::Day,
        Granularity::Week,
        Granularity::Month,
        Granularity::Quarter,
        Granularity::Year,
    ];
    for v in &file.period_labels {
        assert_eq!(v.labels.len(), all.len(), "{}: a label per granularity", v.id);
        for g in all {
            let want = v
                .labels
                .get(g.name())
                .unwrap_or_else(|| panic!("{}: no {} label", v.id, g.name()));
            // NULL has no label in Rust; every path groups it under the empty label
            let got = period_label(v.canonical.as_deref(), g).unwrap_or_default();
            assert_eq!(
                &got,
                want,
                "{} ({}): {:?} at {}",
                v.id,
                v.about,
                v.canonical,
                g.name()
            );
        }
    }
    // the edges the vectors must keep covering
    for c in [
        "infinity",
        "-infinity",
        "0000-02-29",
        "-0009-06-01",
        "+10000-01-01",
        "0000-00-00",
        "2024-00-15",
        "2024-05-00",
        "0001-01-01",
        "9999-12-31",
    ] {
        assert!(
            file.period_labels
                .iter()
                .any(|v| v.canonical.as_deref() == Some(c)),
            "no period-label vector for {c}"
        );
    }
    assert!(file.period_labels.iter().any(|v| v.canonical.is_none()));
}
