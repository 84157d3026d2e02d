//! Reading a segment's rows: the scan every in-process path shares, row digests,
//! reveals of named rows, and investigation SQL.

use std::collections::HashSet;

use tally_common::checksum::Hasher;
use tally_common::period::period_label;
use tally_common::segment::{KeyTuple, Segment, bucket_hash};

use crate::config::{Hashing, Source};
use crate::connector::{CanonRow, Flow, Session, obey};
use crate::dialect::{self, FetchShape};
use crate::error::{AgentError, Result};

use super::{Bound, Dataset};

impl Dataset {
    /// Streams the rows of `seg` (its key range from SQL, its hash range checked
    /// here) in canonical form.
    /// `f` gets each row and, when `key_hashes` is set, its key hash (0 otherwise: the
    /// key hash is a second SHA-256 per row, computed only where it is used).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn scan_segment(
        &self,
        s: &mut Session,
        b: &Bound,
        h: &Hasher,
        seg: &Segment,
        ordered: bool,
        key_hashes: bool,
        f: &mut (dyn FnMut(&CanonRow, u64) -> Result<()> + Send),
    ) -> Result<u64> {
        self.stream_segment(s, b, h, seg, ordered, key_hashes, &mut |row, kh| {
            f(row, kh).map(|()| Flow::Go)
        })
        .await
    }

    /// [`Dataset::scan_segment`] whose `f` answers what the read does next ([`Flow`]).
    #[allow(clippy::too_many_arguments)]
    async fn stream_segment(
        &self,
        s: &mut Session,
        b: &Bound,
        h: &Hasher,
        seg: &Segment,
        ordered: bool,
        key_hashes: bool,
        f: &mut (dyn FnMut(&CanonRow, u64) -> Result<Flow> + Send),
    ) -> Result<u64> {
        let d = self.connector.dialect_for(&b.info);
        let key = b.key_infos();
        let shape = match self.connector.fetch_shape() {
            // `pushdown`: canonical text from SQL (where SQL can render it)
            FetchShape::Text if self.config.hashing == Hashing::Pushdown => FetchShape::Canonical,
            shape => shape,
        };
        let render = if self.connector.copies_out() {
            dialect::fetch_rows_inline
        } else {
            dialect::fetch_rows
        };
        let sql = render(d, &self.source, &b.cols, &key, seg, shape, ordered);
        let key_len = b.key_len;
        // the period is checked here too: SQL may not have filtered it (SQLite)
        let period = match &seg.period {
            Some(p) => Some((self.period_index(b, p)?, p)),
            None => None,
        };
        // and the window, by the same comparison as the SQL's
        let window = match &seg.window {
            Some(w) => Some(dialect::window_bound(&b.cols, w).map_err(AgentError::InvalidArgument)?),
            None => None,
        };
        let mut seen = 0u64;
        s.scan(
            &sql,
            shape,
            &b.cols,
            key_len,
            self.throttle.as_ref(),
            &mut |row: &CanonRow| {
                seen += 1;
                // the engine filtered the key range; filter again with the comparator
                // that assigns children, so a row the two disagree on is in neither
                // (the drill then sees the parent and children not add up)
                if !seg.in_key_range(&row.key) {
                    return Ok(Flow::Go);
                }
                if let Some((i, p)) = period
                    && period_label(row.field(i), p.granularity).unwrap_or_default() != p.label
                {
                    return Ok(Flow::Go);
                }
                if let Some((i, w)) = &window
                    && !w.keeps(row.field(*i))
                {
                    return Ok(Flow::Go);
                }
                if !key_hashes && seg.hash.is_none() {
                    return f(row, 0);
                }
                let kh = h.key(row.key_string(key_len).as_bytes());
                if seg
                    .hash
                    .is_some_and(|(lo, hi)| !(lo..hi).contains(&bucket_hash(kh)))
                {
                    return Ok(Flow::Go);
                }
                f(row, kh)
            },
        )
        .await?;
        Ok(seen)
    }

    /// (key hash, row checksum) of every row of a segment, handed over in batches; the
    /// read does what the sink answers after each batch (waits for its consumer).
    pub async fn digests(
        &self,
        s: &mut Session,
        b: &Bound,
        h: &Hasher,
        seg: &Segment,
        batch: usize,
        sink: &mut (dyn FnMut(Vec<(u64, u64)>) -> Result<Flow> + Send),
    ) -> Result<u64> {
        let mut buf = Vec::with_capacity(batch);
        let mut n = 0;
        self.stream_segment(s, b, h, seg, false, true, &mut |row, kh| {
            buf.push((kh, h.row(row.row_string().as_bytes())));
            n += 1;
            if buf.len() >= batch {
                return sink(std::mem::replace(&mut buf, Vec::with_capacity(batch)));
            }
            Ok(Flow::Go)
        })
        .await?;
        if !buf.is_empty() {
            obey(sink(buf)?).await?;
        }
        Ok(n)
    }

    /// Rows of a segment whose key hash is in `wanted`, up to `limit`: one row per key
    /// hash (of a repeated key, the first; rows sharing a key are compared as one, and
    /// a second row must not take another key's place within `limit`).
    pub async fn rows_by_key_hash(
        &self,
        s: &mut Session,
        b: &Bound,
        h: &Hasher,
        seg: &Segment,
        wanted: &HashSet<u64>,
        limit: usize,
    ) -> Result<(Vec<(u64, CanonRow)>, bool)> {
        let mut out = Vec::new();
        let mut taken = HashSet::new();
        let mut truncated = false;
        self.scan_segment(s, b, h, seg, true, true, &mut |row, kh| {
            if wanted.contains(&kh) && !taken.contains(&kh) {
                if out.len() < limit {
                    taken.insert(kh);
                    out.push((kh, row.clone()));
                } else {
                    truncated = true;
                }
            }
            Ok(())
        })
        .await?;
        Ok((out, truncated))
    }

    /// Investigation SQL of a segment. A `query:` dataset shows its query only where
    /// its policy says `share_query: true`; otherwise the SQL reads from a comment
    /// naming the dataset (names are letters, digits, '-', '_', '.': no `*/`).
    /// A sealed run's hash range is left out: it cannot be written without the run
    /// key, which never leaves the agents.
    pub fn investigation_sql(&self, b: &Bound, seg: &Segment, sealed: bool) -> String {
        dialect::investigation_sql(
            self.connector.dialect_for(&b.info),
            &self.shown_source(),
            &b.cols,
            &b.key_infos(),
            seg,
            sealed,
        )
    }

    /// Investigation SQL of exactly these keys' rows (within the segment's window), as
    /// [`Dataset::investigation_sql`] shows the dataset; the caller checked that the
    /// policy reveals keys. A tuple not of the key's length is refused.
    pub fn key_sql(&self, b: &Bound, seg: &Segment, keys: &[KeyTuple]) -> Result<String> {
        if let Some((i, t)) = keys.iter().enumerate().find(|(_, t)| t.len() != b.key_len) {
            return Err(AgentError::InvalidArgument(format!(
                "keys[{i}] has {} value(s), the key has {}",
                t.len(),
                b.key_len
            )));
        }
        Ok(dialect::key_sql(
            self.connector.dialect_for(&b.info),
            &self.shown_source(),
            &b.cols,
            &b.key_infos(),
            seg,
            keys,
        ))
    }

    /// The source as investigation SQL shows it: a `query:` dataset's query only where
    /// its policy shares it.
    fn shown_source(&self) -> Source {
        match &self.source {
            Source::Query(_) if !self.config.policy.share_query => Source::Query(format!(
                "/* dataset {}: query not shared by its agent's policy */",
                self.name
            )),
            s => s.clone(),
        }
    }
}
