//! After the rows phase, at `with_keys` and above: investigation SQL of exactly the
//! differing keys, per leaf and kind of difference, from both sides.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tally_common::segment::{KeyTuple, Period, bucket_hash};
use tally_common::wire::MAX_KEY_SQL_KEYS;

use super::{Pair, next_asks, put, take_both};
use crate::result::{DiffKind, KeySqlOut};
use crate::{Command, Engine, Out, Side, Step};

/// Investigation SQL of the differing keys (with_keys and detailed): for each leaf
/// that has investigation SQL and each kind of difference in it, both sides' SQL of
/// exactly those keys, a few in flight at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct KeySqlPhase {
    items: Vec<(usize, DiffKind, Vec<KeyTuple>)>,
    asked: usize,
    done: usize,
    partial: BTreeMap<usize, Pair<String>>,
}

impl Engine {
    /// After the rows phase: the per-key SQL of each leaf with investigation SQL, one
    /// per kind of difference found in it (at most [`MAX_KEY_SQL_KEYS`] keys each); the
    /// run finishes when every one has arrived (at once when there is none).
    pub(super) fn begin_key_sql(
        &mut self,
        out: &mut Out,
        periods: &[Option<Period>],
        keyed: Vec<(usize, u64, DiffKind, KeyTuple)>,
    ) {
        let leaves = &self.planner.as_ref().expect("drilled").leaves;
        // each key in one leaf: the first with SQL whose bounds hold it, in the period
        // its range read (a key looked up in every period: the one it was found in)
        let mut by_leaf: BTreeMap<(usize, DiffKind), Vec<KeyTuple>> = BTreeMap::new();
        for (range, key_hash, kind, key) in &keyed {
            let period = periods.get(*range).cloned().flatten();
            let leaf = leaves.iter().enumerate().position(|(i, leaf)| {
                let seg = &leaf.segment;
                self.res.leaves.get(i).is_some_and(|l| l.sql.is_some())
                    && seg.contains(key, bucket_hash(*key_hash))
                    && (seg.period.is_none() || period.is_none() || seg.period == period)
            });
            if let Some(leaf) = leaf {
                let keys = by_leaf.entry((leaf, *kind)).or_default();
                if !keys.contains(key) {
                    keys.push(key.clone());
                }
            }
        }
        let mut items: Vec<(usize, DiffKind, Vec<KeyTuple>)> = Vec::new();
        let mut cut = 0usize;
        for ((leaf, kind), mut keys) in by_leaf {
            if keys.len() > MAX_KEY_SQL_KEYS {
                cut += 1;
                keys.truncate(MAX_KEY_SQL_KEYS);
            }
            items.push((leaf, kind, keys));
        }
        if cut > 0 {
            self.res.warnings.push(format!(
                "per-key investigation SQL names the first {MAX_KEY_SQL_KEYS} keys of a kind of difference in a \
                 leaf; {cut} leaf kinds hold more"
            ));
        }
        if items.is_empty() {
            out.extend(self.finish());
            return;
        }
        self.key_sql = Some(KeySqlPhase {
            items,
            asked: 0,
            done: 0,
            partial: BTreeMap::new(),
        });
        self.ask_key_sql(out);
    }

    /// Asks for the next per-key SQL while fewer than
    /// [`LEAVES_IN_FLIGHT`](crate::drill::LEAVES_IN_FLIGHT) wait.
    fn ask_key_sql(&mut self, out: &mut Out) {
        let p = self.key_sql.as_ref().expect("key sql phase");
        let asks = next_asks(p.asked, p.done, p.items.len());
        let items: Vec<(usize, DiffKind, Vec<KeyTuple>)> = p.items[asks.clone()].to_vec();
        for (leaf, kind, keys) in items {
            let segment = self.planner.as_ref().expect("drilled").leaves[leaf]
                .segment
                .clone();
            for side in [Side::Source, Side::Target] {
                let request = self.sql_request(side, &segment, keys.clone());
                self.ask(
                    out,
                    Command::KeySql {
                        leaf,
                        kind,
                        side,
                        request,
                    },
                );
            }
        }
        self.key_sql.as_mut().expect("key sql phase").asked = asks.end;
    }

    pub(crate) fn on_key_sql(
        &mut self,
        out: &mut Out,
        leaf: usize,
        kind: DiffKind,
        side: Side,
        sql: String,
    ) -> Step {
        let p = self.key_sql.as_mut().expect("key sql asked");
        let n = p
            .items
            .iter()
            .position(|(l, k, _)| *l == leaf && *k == kind)
            .expect("asked for this leaf and kind");
        put(p.partial.entry(n).or_default(), side, sql);
        if let Some((source, target)) = take_both(&mut p.partial, n) {
            p.done += 1;
            let keys = p.items[n].2.len();
            let shown = &mut self.res.leaves[leaf].key_sql;
            shown.push(KeySqlOut {
                kind,
                keys,
                source,
                target,
            });
            shown.sort_by_key(|k| k.kind);
            if p.done == p.items.len() {
                out.extend(self.finish());
                return Ok(());
            }
            self.ask_key_sql(out);
        }
        Ok(())
    }
}
