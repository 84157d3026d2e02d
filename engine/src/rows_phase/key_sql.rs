//! After the rows phase, at `with_keys` and above: investigation SQL of exactly the
//! differing keys, per leaf and kind of difference, from both sides, many leaves in one
//! request: across a network each request is a round trip, and each costs the agent a
//! description of its dataset.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};
use tally_common::segment::{KeyTuple, Period, bucket_hash};
use tally_common::wire::{KeySqlItem, MAX_KEY_SQL_BATCH_KEYS, MAX_KEY_SQL_ITEMS, MAX_KEY_SQL_KEYS};

use super::{Pair, next_asks, put, take_both};
use crate::result::{DiffKind, KeySqlOut};
use crate::{Command, Engine, Out, Side, Step};

/// The most items one request carries (the wire allows [`MAX_KEY_SQL_ITEMS`]).
const BATCH_ITEMS: usize = 64;
const _: () = assert!(BATCH_ITEMS <= MAX_KEY_SQL_ITEMS);

/// Investigation SQL of the differing keys (with_keys and detailed): for each leaf
/// that has investigation SQL and each kind of difference in it (an item), both sides'
/// SQL of exactly those keys; items are asked in batches (see [`batches`]), a few
/// batches in flight at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct KeySqlPhase {
    items: Vec<(usize, DiffKind, Vec<KeyTuple>)>,
    /// Batches asked, and batches whose every item arrived from both sides.
    asked: usize,
    done: usize,
    /// Items with one side's SQL so far.
    partial: BTreeMap<usize, Pair<String>>,
    /// Items with both sides' SQL, per batch.
    arrived: BTreeMap<usize, usize>,
}

/// The most bytes of key values one request carries, about (an agent takes messages
/// of 4 MiB).
const BATCH_KEY_BYTES: usize = 1 << 20;

/// About how many bytes a key tuple takes on the wire.
fn key_bytes(k: &KeyTuple) -> usize {
    k.iter()
        .map(|p| match p {
            tally_common::segment::KeyPart::Text(s) => s.len() + 8,
            _ => 16,
        })
        .sum()
}

/// The items of each request: consecutive items, at most [`BATCH_ITEMS`],
/// [`MAX_KEY_SQL_BATCH_KEYS`] keys and about [`BATCH_KEY_BYTES`] bytes of keys in all
/// (each item has at most [`MAX_KEY_SQL_KEYS`] keys; one item alone may be larger).
fn batches(items: &[(usize, DiffKind, Vec<KeyTuple>)]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut keys, mut bytes) = (0, 0, 0);
    for (n, (_, _, k)) in items.iter().enumerate() {
        let b: usize = k.iter().map(key_bytes).sum();
        if n > start
            && (n - start == BATCH_ITEMS
                || keys + k.len() > MAX_KEY_SQL_BATCH_KEYS
                || bytes + b > BATCH_KEY_BYTES)
        {
            out.push(start..n);
            (start, keys, bytes) = (n, 0, 0);
        }
        keys += k.len();
        bytes += b;
    }
    if start < items.len() {
        out.push(start..items.len());
    }
    out
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
            arrived: BTreeMap::new(),
        });
        self.ask_key_sql(out);
    }

    /// Asks for the next batches of per-key SQL while fewer than
    /// [`LEAVES_IN_FLIGHT`](crate::drill::LEAVES_IN_FLIGHT) wait.
    fn ask_key_sql(&mut self, out: &mut Out) {
        let p = self.key_sql.as_ref().expect("key sql phase");
        let batches = batches(&p.items);
        let asks = next_asks(p.asked, p.done, batches.len());
        let leaves = &self.planner.as_ref().expect("drilled").leaves;
        let mut commands = Vec::new();
        for range in &batches[asks.clone()] {
            let items: Vec<KeySqlItem> = p.items[range.clone()]
                .iter()
                .map(|(leaf, _, keys)| KeySqlItem {
                    segment: leaves[*leaf].segment.clone(),
                    keys: keys.clone(),
                })
                .collect();
            for side in [Side::Source, Side::Target] {
                // the first item's segment beside the items: an agent that predates
                // them answers its range SQL and no per-key SQL (shown as such)
                let mut request = self.sql_request(side, &items[0].segment, Vec::new());
                request.items = items.clone();
                commands.push(Command::KeySql {
                    first: range.start,
                    side,
                    request,
                });
            }
        }
        for c in commands {
            self.ask(out, c);
        }
        self.key_sql.as_mut().expect("key sql phase").asked = asks.end;
    }

    /// One side's per-key SQL of the batch that starts at item `first`, one per item.
    pub(crate) fn on_key_sql(&mut self, out: &mut Out, first: usize, side: Side, sqls: Vec<String>) -> Step {
        let p = self.key_sql.as_mut().expect("key sql asked");
        let batches = batches(&p.items);
        let b = batches
            .iter()
            .position(|r| r.start == first)
            .expect("asked for this batch");
        let range = batches[b].clone();
        // one per item (the runtime answers so): a recorded answer of another length is
        // a run log that does not fit this run, never guessed around
        if sqls.len() != range.len() {
            return Err(crate::result::ErrorOut {
                code: "internal".into(),
                message: format!(
                    "key_sql from item {first}: {} answers for {} items",
                    sqls.len(),
                    range.len()
                ),
            });
        }
        for (n, sql) in range.clone().zip(sqls) {
            put(p.partial.entry(n).or_default(), side, sql);
            let Some((source, target)) = take_both(&mut p.partial, n) else {
                continue;
            };
            let (leaf, kind, keys) = &p.items[n];
            let shown = &mut self.res.leaves[*leaf].key_sql;
            shown.push(KeySqlOut {
                kind: *kind,
                keys: keys.len(),
                source,
                target,
            });
            shown.sort_by_key(|k| k.kind);
            *p.arrived.entry(b).or_default() += 1;
        }
        if p.arrived.get(&b) == Some(&range.len()) {
            p.done += 1;
            if p.done == batches.len() {
                out.extend(self.finish());
                return Ok(());
            }
            self.ask_key_sql(out);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_common::segment::KeyPart;

    fn items(sizes: &[usize]) -> Vec<(usize, DiffKind, Vec<KeyTuple>)> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (i, DiffKind::Changed, vec![vec![KeyPart::Int(1)]; n]))
            .collect()
    }

    #[test]
    fn items_are_batched_by_count_and_by_keys_in_all() {
        assert!(batches(&[]).is_empty());
        assert_eq!(batches(&items(&[1; 3])), vec![0..3]);
        assert_eq!(batches(&items(&[1; 130])), vec![0..64, 64..128, 128..130]);
        // 20 items of 1,000 keys fill one request; the 21st starts the next
        let b = batches(&items(&[MAX_KEY_SQL_KEYS; 21]));
        assert_eq!(b, vec![0..20, 20..21]);
        for r in &b {
            let keys: usize = r.clone().map(|_| MAX_KEY_SQL_KEYS).sum();
            assert!(keys <= MAX_KEY_SQL_BATCH_KEYS);
        }
        // long text keys: about a megabyte of them a request
        let long = |n: usize| -> Vec<(usize, DiffKind, Vec<KeyTuple>)> {
            (0..n)
                .map(|i| {
                    (
                        i,
                        DiffKind::Changed,
                        vec![vec![KeyPart::Text("x".repeat(992))]; 100],
                    )
                })
                .collect()
        };
        assert_eq!(batches(&long(25)), vec![0..10, 10..20, 20..25]);
    }
}
