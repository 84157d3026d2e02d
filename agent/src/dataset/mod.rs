//! One configured dataset and what the agent computes over it: bucketed aggregates
//! (pushed down where the engine can, in-process otherwise), row digests, reveals of
//! named rows, and investigation SQL. Policy is checked by the service before and
//! after these run; nothing here decides what may leave the zone.

mod aggregate;
mod rows;
pub mod watermark;

use std::sync::Arc;

use tally_common::checksum::AnyAggregate;
use tally_common::segment::{ColumnSpec, Segment};
use tally_common::types::TypeClass;

use crate::config::{DatasetConfig, Hashing, Source};
use crate::connector::throttle::Throttle;
use crate::connector::{Connector, Session};
use crate::dialect::{self};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, ColumnInfo, DatasetInfo};

pub struct Dataset {
    pub name: String,
    pub config: DatasetConfig,
    pub source: Source,
    /// Shared by every dataset on the same database URL (`server::open_datasets`).
    pub connector: Arc<Connector>,
    /// The dataset's `throttle:` and its shared row budget; every row read for it goes
    /// through it.
    pub throttle: Option<Throttle>,
    /// Whether in-process levels hash on a second thread ([`crate::hash_pipe`]).
    pub hash_thread: bool,
}

impl Dataset {
    pub fn new(
        name: String,
        config: DatasetConfig,
        source: Source,
        connector: impl Into<Arc<Connector>>,
    ) -> Dataset {
        Dataset {
            name,
            throttle: config.throttle.clone().map(Throttle::new),
            hash_thread: crate::hash_pipe::enabled(config.hash_thread),
            config,
            source,
            connector: connector.into(),
        }
    }
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
    /// Opens one request's session: every statement of the request reads one
    /// snapshot of this side (see [`Session`]).
    pub async fn session(&self) -> Result<Session> {
        self.connector.session(&self.name).await
    }

    pub async fn describe(&self, s: &mut Session) -> Result<DatasetInfo> {
        if let Some(f) = &self.config.file {
            check_csv_headers(&self.name, f, HeaderReader::Session(s)).await?;
        }
        s.describe(&self.source, &self.config.key).await
    }

    /// The engine's histogram bounds of a table's single integer key (its statistics,
    /// not a scan); empty where the engine keeps none, the key is not one integer
    /// column, or the read fails (statistics are optional: a missing privilege or a
    /// table never analysed costs the run nothing but even level-1 cuts).
    pub async fn key_histogram(&self, s: &mut Session, info: &DatasetInfo) -> Vec<i64> {
        /// More bounds than any statistics target gives (PostgreSQL's maximum is 10,000).
        const MAX_BOUNDS: usize = 10_001;
        let key = info.key_columns();
        let Source::Table(parts) = &self.source else {
            return Vec::new();
        };
        if key.len() != 1 || key[0].class != TypeClass::Integer {
            return Vec::new();
        }
        let Some(sql) = self.connector.dialect().key_histogram_sql(parts, key[0]) else {
            return Vec::new();
        };
        let text = match s.query_text(&sql).await {
            Ok(t) => t.unwrap_or_default(),
            Err(e) => {
                tracing::info!(dataset = %self.name, error = %e, "no key histogram");
                return Vec::new();
            }
        };
        let bounds: Option<Vec<i64>> = text
            .trim_matches(|c| c == '{' || c == '}')
            .split(',')
            .filter(|v| !v.is_empty())
            .map(|v| v.trim().parse().ok())
            .collect();
        match bounds {
            Some(b) if b.len() <= MAX_BOUNDS && b.windows(2).all(|w| w[0] < w[1]) => b,
            _ => Vec::new(),
        }
    }

    /// The smallest and largest key of a table keyed by one integer column (an index
    /// lookup on an indexed key); `None` for other keys and for query datasets.
    pub async fn key_min_max(&self, s: &mut Session, info: &DatasetInfo) -> Result<Option<(i64, i64)>> {
        let key = info.key_columns();
        if key.len() != 1 || key[0].class != TypeClass::Integer || !matches!(self.source, Source::Table(_)) {
            return Ok(None);
        }
        let (min_sql, max_sql) = dialect::key_min_max(self.connector.dialect(), &self.source, key[0]);
        let min = s.query_text(&min_sql).await?;
        let max = s.query_text(&max_sql).await?;
        Ok(
            match (min.and_then(|v| v.parse().ok()), max.and_then(|v| v.parse().ok())) {
                (Some(a), Some(b)) => Some((a, b)),
                _ => None,
            },
        )
    }

    pub async fn bind(&self, s: &mut Session, columns: Vec<ColumnSpec>, key_len: usize) -> Result<Bound> {
        let info = self.describe(s).await?;
        let zone = crate::config::zone_offset(&self.config.time_zone).ok_or_else(|| {
            AgentError::Config(format!(
                "datasets.{}.time_zone is not UTC or an offset",
                self.name
            ))
        })?;
        let mut cols = info.bind(&self.name, columns, key_len, &zone)?;
        if self.config.empty_string_is_null {
            // the setting follows the stored class: a text column asked as binary or
            // JSON (which do not apply it) would compare '' apart from NULL
            for c in cols.iter_mut().filter(|c| c.info.class == TypeClass::Text) {
                if c.spec.format.class != TypeClass::Text {
                    return Err(AgentError::InvalidArgument(format!(
                        "dataset {} compares its empty strings as NULL (empty_string_is_null): text column {} is compared as text only, not as {}",
                        self.name, c.info.name, c.spec.format.class
                    )));
                }
                c.spec.format.empty_is_null = true;
            }
        }
        Ok(Bound { info, cols, key_len })
    }

    /// Whether the engine can compute this request itself.
    fn can_push_down(&self, b: &Bound) -> bool {
        self.connector.supports_pushdown()
            && dialect::row_string_expr(self.connector.dialect_for(&b.info), &b.cols).is_some()
    }

    /// Where aggregates are computed by the dataset's `hashing` setting and its engine
    /// (a request may still need the in-process path for a column SQL cannot render).
    pub fn configured_path(&self) -> Path {
        // a throttle paces the agent's own reads: hashing in SQL cannot be paced
        let in_process = self.throttle.is_some()
            || !self.connector.supports_pushdown()
            || match self.config.hashing {
                Hashing::Auto => self.connector.prefers_in_process(),
                Hashing::Pushdown => false,
                Hashing::InProcess => true,
            };
        if in_process {
            Path::InProcess
        } else {
            Path::Pushdown
        }
    }

    /// Where an aggregate is computed: the dataset's `hashing` setting, unless the
    /// request forces the in-process path or the engine cannot push it down.
    fn choose_path(&self, b: &Bound, force_in_process: bool) -> Path {
        let in_process =
            force_in_process || !self.can_push_down(b) || self.configured_path() == Path::InProcess;
        if in_process {
            Path::InProcess
        } else {
            Path::Pushdown
        }
    }
}

/// What [`check_csv_headers`] reads through: a request's session, or (`tally-agent
/// check`) the connector.
pub enum HeaderReader<'a> {
    Session(&'a mut Session),
    Connector(&'a Connector),
}

impl HeaderReader<'_> {
    async fn text(&mut self, dataset: &str, sql: &str) -> Result<Option<String>> {
        match self {
            HeaderReader::Session(s) => s.query_text(sql).await,
            HeaderReader::Connector(c) => c.query_text(dataset, sql).await,
        }
    }
}

/// A CSV dataset with a header: every file's first line must name the declared columns
/// in order (files.rs, `header_files_sql`). What a wrong first line holds is written to
/// the agent's log only: on a file without a header it is a row of data, which the
/// coordinator may not see.
pub async fn check_csv_headers(
    dataset: &str,
    f: &crate::files::FileConfig,
    mut reader: HeaderReader<'_>,
) -> Result<()> {
    use crate::files::{FileConfig, HEADER_FILES_PER_QUERY};
    let Some(list) = f.header_files_sql() else {
        return Ok(());
    };
    let listed = reader.text(dataset, &list).await?.unwrap_or_default();
    let files = FileConfig::listed_files(&listed);
    let mut bad = 0usize;
    for chunk in files.chunks(HEADER_FILES_PER_QUERY) {
        let Some(sql) = f.header_lines_sql(chunk) else {
            continue;
        };
        let answer = reader.text(dataset, &sql).await?.unwrap_or_default();
        for (file, found) in f.header_mismatches(&answer) {
            tracing::warn!(dataset, file = %file, first_line = ?found, declared = ?f.declared_names(),
                "a CSV file's first line is not the declared header");
            bad += 1;
        }
    }
    if bad == 0 {
        return Ok(());
    }
    Err(AgentError::Config(format!(
        "dataset {dataset}: {bad} of its {} CSV files do not start with the declared header ({}); \
         the agent's log names them and what they hold. Declare csv.columns in the files' order, \
         or set csv.header: false if their first line is data",
        files.len(),
        f.declared_names().join(", ")
    )))
}
