//! One configured dataset and what the agent computes over it: bucketed aggregates
//! (pushed down where the engine can, in-process otherwise), row digests, reveals of
//! named rows, and investigation SQL. Policy is checked by the service before and
//! after these run; nothing here decides what may leave the zone.

use std::collections::HashSet;

use tally_common::checksum::{AnyAggregate, HashMethod, key_hash};
use tally_common::segment::{ColumnSpec, KeyTuple, Segment, Split, bucket_hash};
use tally_common::types::TypeClass;

use crate::config::{DatasetConfig, Source};
use crate::connector::{CanonRow, Connector};
use crate::dialect::{self, ChildRule, check_bounds};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, ColumnInfo, DatasetInfo};

pub struct Dataset {
    pub name: String,
    pub config: DatasetConfig,
    pub source: Source,
    pub connector: Connector,
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// One child bucket of an aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketOut {
    pub parent: usize,
    pub child: usize,
    pub segment: Segment,
    pub agg: AnyAggregate,
}

/// How an aggregate was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Pushdown,
    InProcess,
}

impl Path {
    pub fn name(self) -> &'static str {
        match self {
            Path::Pushdown => "pushdown",
            Path::InProcess => "in_process",
        }
    }
}

#[derive(Debug, Clone)]
pub struct AggregateOut {
    pub buckets: Vec<BucketOut>,
    pub path: Path,
    pub rows_scanned: u64,
}

/// A request's columns, bound and checked against the dataset's schema.
#[derive(Debug, Clone)]
pub struct Bound {
    pub info: DatasetInfo,
    pub cols: Vec<BoundColumn>,
    pub key_len: usize,
}

impl Bound {
    pub fn key_infos(&self) -> Vec<&ColumnInfo> {
        self.cols[..self.key_len].iter().map(|c| &c.info).collect()
    }

    fn key_classes(&self) -> Vec<TypeClass> {
        self.cols[..self.key_len].iter().map(|c| c.info.class).collect()
    }
}

impl Dataset {
    pub async fn describe(&self) -> Result<DatasetInfo> {
        self.connector
            .describe(&self.name, &self.source, &self.config.key)
            .await
    }

    pub async fn bind(&self, columns: Vec<ColumnSpec>, key_len: usize) -> Result<Bound> {
        let info = self.describe().await?;
        let cols = info.bind(&self.name, columns, key_len)?;
        Ok(Bound { info, cols, key_len })
    }

    /// Whether the engine can compute this request itself.
    fn can_push_down(&self, b: &Bound) -> bool {
        self.connector.supports_pushdown()
            && dialect::row_string_expr(self.connector.dialect(), &b.cols).is_some()
    }

    pub async fn aggregate(
        &self,
        b: &Bound,
        method: HashMethod,
        parents: &[(Segment, Split)],
        force_in_process: bool,
    ) -> Result<AggregateOut> {
        let key = b.key_infos();
        for (seg, split) in parents {
            let mut probe = seg.clone();
            if let Split::Cuts(c) = split {
                probe.lower = c.first().cloned().or(probe.lower);
                probe.upper = c.last().cloned().or(probe.upper);
            }
            check_bounds(&probe, &key).map_err(AgentError::InvalidArgument)?;
            if let Split::Quantile(_) | Split::Cuts(_) = split
                && let Some(c) = key
                    .iter()
                    .find(|c| !matches!(c.class, TypeClass::Integer | TypeClass::Text))
            {
                return Err(AgentError::InvalidArgument(format!(
                    "key column {} is {}; quantile bisection needs integer or text keys (use strategy hash)",
                    c.name, c.class
                )));
            }
        }
        if !force_in_process && self.can_push_down(b) {
            self.aggregate_pushdown(b, method, parents).await
        } else {
            self.aggregate_in_process(b, method, parents).await
        }
    }

    async fn aggregate_pushdown(
        &self,
        b: &Bound,
        method: HashMethod,
        parents: &[(Segment, Split)],
    ) -> Result<AggregateOut> {
        let d = self.connector.dialect();
        let key = b.key_infos();
        let rules: Vec<(Segment, ChildRule)> = parents
            .iter()
            .map(|(seg, split)| {
                let rule = match split {
                    Split::Whole => ChildRule::Whole,
                    Split::Hash(n) => {
                        let (lo, width) = seg.hash_split(*n);
                        ChildRule::Hash { lo, width }
                    }
                    Split::Cuts(c) => ChildRule::Cuts(c.clone()),
                    Split::Quantile(n) => ChildRule::Quantile(*n),
                };
                (seg.clone(), rule)
            })
            .collect();
        let sql = dialect::aggregate(d, &self.source, &b.cols, &key, method, &rules)
            .ok_or_else(|| AgentError::Unsupported("engine cannot push this aggregate down".into()))?;
        let rows = self
            .connector
            .aggregate(&self.name, &sql, &b.key_classes())
            .await?;
        let xor_real = method == HashMethod::Sha256_64 && d.xor_aggregate("h").is_some();
        let mut buckets = Vec::new();
        let mut scanned = 0;
        for (p, (seg, split)) in parents.iter().enumerate() {
            let mine: Vec<_> = rows.iter().filter(|r| r.parent == p).collect();
            scanned += mine.iter().map(|r| r.count).sum::<u64>();
            let children = match split {
                Split::Whole => vec![seg.clone()],
                Split::Hash(n) => seg.hash_children(*n),
                Split::Cuts(c) => seg.cut_children(c),
                Split::Quantile(_) => {
                    let cuts: Vec<KeyTuple> =
                        mine.iter().skip(1).filter_map(|r| r.first_key.clone()).collect();
                    seg.cut_children(&cuts)
                }
            };
            for (i, child) in children.into_iter().enumerate() {
                // quantile rows are numbered by NTILE; the others by child index
                let row = match split {
                    Split::Quantile(_) => mine.get(i).copied(),
                    _ => mine.iter().find(|r| r.child == i).copied(),
                };
                let agg = match row {
                    Some(r) => AnyAggregate::new(method, r.count, r.sum, if xor_real { r.xor } else { None }),
                    None => AnyAggregate::empty(method, xor_real),
                };
                buckets.push(BucketOut {
                    parent: p,
                    child: i,
                    segment: child,
                    agg,
                });
            }
        }
        Ok(AggregateOut {
            buckets,
            path: Path::Pushdown,
            rows_scanned: scanned,
        })
    }

    /// Streams the rows of `seg` (its key range from SQL, its hash range checked
    /// here) in canonical form.
    async fn scan_segment(
        &self,
        b: &Bound,
        seg: &Segment,
        ordered: bool,
        f: &mut (dyn FnMut(CanonRow, u64) -> Result<()> + Send),
    ) -> Result<u64> {
        let d = self.connector.dialect();
        let key = b.key_infos();
        let sql = dialect::fetch_rows(
            d,
            &self.source,
            &b.cols,
            &key,
            seg,
            self.connector.fetch_shape(),
            ordered,
        );
        let key_len = b.key_len;
        let mut seen = 0u64;
        self.connector
            .scan(&self.name, &sql, &b.cols, key_len, &mut |row: CanonRow| {
                seen += 1;
                let kh = key_hash(row.key_string(key_len).as_bytes());
                if seg
                    .hash
                    .is_some_and(|(lo, hi)| !(lo..hi).contains(&bucket_hash(kh)))
                {
                    return Ok(());
                }
                f(row, kh)
            })
            .await?;
        Ok(seen)
    }

    async fn aggregate_in_process(
        &self,
        b: &Bound,
        method: HashMethod,
        parents: &[(Segment, Split)],
    ) -> Result<AggregateOut> {
        let xor = method == HashMethod::Sha256_64;
        let mut buckets = Vec::new();
        let mut scanned = 0;
        for (p, (seg, split)) in parents.iter().enumerate() {
            let (children, aggs) = match split {
                Split::Quantile(n) => {
                    let total = match seg.hash {
                        None => {
                            let sql = dialect::count_rows(
                                self.connector.dialect(),
                                &self.source,
                                &b.key_infos(),
                                seg,
                            );
                            self.connector.count(&self.name, &sql).await?
                        }
                        Some(_) => {
                            let mut n = 0u64;
                            scanned += self
                                .scan_segment(b, seg, false, &mut |_, _| {
                                    n += 1;
                                    Ok(())
                                })
                                .await?;
                            n
                        }
                    };
                    let n = u64::from(*n).max(1);
                    let chunk = total.div_ceil(n).max(1);
                    let mut cuts: Vec<KeyTuple> = Vec::new();
                    let mut aggs: Vec<AnyAggregate> = vec![AnyAggregate::empty(method, xor)];
                    let mut i = 0u64;
                    scanned += self
                        .scan_segment(b, seg, true, &mut |row, _| {
                            let child = (i / chunk).min(n - 1) as usize;
                            if child == aggs.len() {
                                cuts.push(row.key.clone());
                                aggs.push(AnyAggregate::empty(method, xor));
                            }
                            aggs[child].add_checksum(method.row_checksum(row.row_string().as_bytes()));
                            i += 1;
                            Ok(())
                        })
                        .await?;
                    (seg.cut_children(&cuts), aggs)
                }
                _ => {
                    let children = match split {
                        Split::Hash(n) => seg.hash_children(*n),
                        Split::Cuts(c) => seg.cut_children(c),
                        _ => vec![seg.clone()],
                    };
                    let mut aggs = vec![AnyAggregate::empty(method, xor); children.len()];
                    scanned += self
                        .scan_segment(b, seg, false, &mut |row, kh| {
                            let child = match split {
                                Split::Hash(n) => seg.hash_child_of(*n, bucket_hash(kh)),
                                Split::Cuts(c) => c.partition_point(|cut| cut <= &row.key),
                                _ => 0,
                            };
                            aggs[child].add_checksum(method.row_checksum(row.row_string().as_bytes()));
                            Ok(())
                        })
                        .await?;
                    (children, aggs)
                }
            };
            for (i, (segment, agg)) in children.into_iter().zip(aggs).enumerate() {
                buckets.push(BucketOut {
                    parent: p,
                    child: i,
                    segment,
                    agg,
                });
            }
        }
        Ok(AggregateOut {
            buckets,
            path: Path::InProcess,
            rows_scanned: scanned,
        })
    }

    /// (key hash, row checksum) of every row of a segment, handed over in batches.
    pub async fn digests(
        &self,
        b: &Bound,
        method: HashMethod,
        seg: &Segment,
        batch: usize,
        sink: &mut (dyn FnMut(Vec<(u64, u64)>) -> Result<()> + Send),
    ) -> Result<u64> {
        let mut buf = Vec::with_capacity(batch);
        let mut n = 0;
        self.scan_segment(b, seg, false, &mut |row, kh| {
            buf.push((kh, method.row_checksum(row.row_string().as_bytes())));
            n += 1;
            if buf.len() >= batch {
                sink(std::mem::replace(&mut buf, Vec::with_capacity(batch)))?;
            }
            Ok(())
        })
        .await?;
        if !buf.is_empty() {
            sink(buf)?;
        }
        Ok(n)
    }

    /// Rows of a segment whose key hash is in `wanted`, up to `limit`.
    pub async fn rows_by_key_hash(
        &self,
        b: &Bound,
        seg: &Segment,
        wanted: &HashSet<u64>,
        limit: usize,
    ) -> Result<(Vec<(u64, CanonRow)>, bool)> {
        let mut out = Vec::new();
        let mut truncated = false;
        self.scan_segment(b, seg, true, &mut |row, kh| {
            if wanted.contains(&kh) {
                if out.len() < limit {
                    out.push((kh, row));
                } else {
                    truncated = true;
                }
            }
            Ok(())
        })
        .await?;
        Ok((out, truncated))
    }

    pub fn investigation_sql(&self, b: &Bound, seg: &Segment) -> String {
        dialect::investigation_sql(
            self.connector.dialect(),
            &self.source,
            &b.cols,
            &b.key_infos(),
            seg,
        )
    }
}
