//! The agent's config file (DESIGN §11): where it listens, its TLS material, and the
//! datasets it serves with a privacy policy each. Database URLs live here (or in the
//! environment) and nowhere else in Tally.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tally_common::PrivacyLevel;
use tally_common::config_file::{ConfigError, load_yaml, relative_to};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    pub listen: SocketAddr,
    pub tls: TlsConfig,
    /// Append-only, hash-chained JSON lines of every request and what it released.
    /// Without it, release records go to the agent's log (stderr).
    #[serde(default)]
    pub release_log: Option<PathBuf>,
    /// Limits of the connection pools: one pool per database URL, shared by every
    /// dataset whose URL resolves to the same string.
    #[serde(default)]
    pub connections: ConnectionsConfig,
    pub datasets: BTreeMap<String, DatasetConfig>,
}

/// `connections:` — applies to each database URL's pool on its own.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionsConfig {
    /// Connections the agent opens to one database URL at most. Calls beyond it wait
    /// for a free connection rather than fail.
    pub max_connections: u32,
    /// An idle connection is closed after this many seconds.
    pub idle_timeout_secs: u64,
    /// How long a call waits for a free connection while all are busy before it fails
    /// as unavailable. Connecting itself has its own, short timeout.
    pub acquire_timeout_secs: u64,
}

impl Default for ConnectionsConfig {
    fn default() -> Self {
        ConnectionsConfig {
            max_connections: 8,
            idle_timeout_secs: 300,
            acquire_timeout_secs: 600,
        }
    }
}

impl ConnectionsConfig {
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.idle_timeout_secs)
    }

    pub fn acquire_timeout(&self) -> Duration {
        Duration::from_secs(self.acquire_timeout_secs)
    }

    fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        for (key, value) in [
            ("max_connections", u64::from(self.max_connections)),
            ("idle_timeout_secs", self.idle_timeout_secs),
            ("acquire_timeout_secs", self.acquire_timeout_secs),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(
                    file,
                    format!("connections.{key}"),
                    "must be at least 1",
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Client certificate names allowed to call (DESIGN §2): `[coordinator]` unless
    /// set; `any` admits every client certificate issued by `ca`.
    #[serde(default)]
    pub allowed_clients: AllowedClients,
    /// The agent's static X25519 zone key (DESIGN §4.1), a PKCS#8 PEM file beside its
    /// TLS key (`tally certs init` writes `NAME-zone.key`). Without it the agent offers
    /// no sealed method and serves only datasets whose policy says `allow_unsealed`.
    #[serde(default)]
    pub zone_key: Option<PathBuf>,
    /// The agent's name in sealed runs: a DNS name of its certificate (default: the
    /// certificate's first DNS name). Its peer derives the run key with it.
    #[serde(default)]
    pub name: Option<String>,
    /// The CA that peer agents' certificates chain to (default: `ca`). Any ServerAuth
    /// certificate of this CA can act as a peer zone: keep it for agents, or set each
    /// dataset's `peers`.
    #[serde(default)]
    pub peer_ca: Option<PathBuf>,
}

impl TlsConfig {
    pub fn peer_ca(&self) -> &Path {
        self.peer_ca.as_deref().unwrap_or(&self.ca)
    }
}

/// `tls.allowed_clients`: a list of names, matched against a client certificate's DNS
/// SANs (its common name only when it has no DNS SAN), or the word `any`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "AllowedClientsText")]
pub enum AllowedClients {
    Any,
    Names(Vec<String>),
}

impl Default for AllowedClients {
    fn default() -> Self {
        AllowedClients::Names(vec!["coordinator".to_string()])
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum AllowedClientsText {
    Word(String),
    Names(Vec<String>),
}

impl TryFrom<AllowedClientsText> for AllowedClients {
    type Error = String;

    fn try_from(t: AllowedClientsText) -> Result<Self, String> {
        match t {
            AllowedClientsText::Word(w) if w == "any" => Ok(AllowedClients::Any),
            AllowedClientsText::Word(w) => Err(format!(
                "tls.allowed_clients: expected a list of certificate names or `any`, found {w:?}"
            )),
            AllowedClientsText::Names(n) => Ok(AllowedClients::Names(n)),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetConfig {
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub url_env: Option<String>,
    #[serde(default)]
    pub table: Option<String>,
    #[serde(default)]
    pub query: Option<String>,
    /// Parquet or CSV files, local or on S3-compatible storage, read through DuckDB
    /// (`crate::files`): instead of `url` and `table` or `query`.
    #[serde(default)]
    pub file: Option<crate::files::FileConfig>,
    pub key: Vec<String>,
    #[serde(default)]
    pub hashing: Hashing,
    /// Whether levels hashed in the agent hash row strings on a second thread while
    /// the first reads (`hash_thread: true/false`); absent, on where the host has more
    /// than one core. The sums are the same either way.
    #[serde(default)]
    pub hash_thread: Option<bool>,
    /// The zone this dataset's timestamps without time zone are in, for comparing them
    /// with timestamps with zone (in UTC): `UTC` or a fixed offset such as `+02:00`.
    #[serde(default = "default_time_zone")]
    pub time_zone: String,
    /// Compare this dataset's empty strings as NULL, as Oracle stores them: set it on
    /// the side reconciled with an Oracle dataset (stated in every run's warnings).
    #[serde(default)]
    pub empty_string_is_null: bool,
    #[serde(default)]
    pub policy: Policy,
    /// How the agent reads this dataset's replication position, for runs that wait
    /// for a target to apply its source's position (DESIGN §5, watermarks).
    #[serde(default)]
    pub watermark: Option<crate::watermark::WatermarkConfig>,
    /// How fast the agent may read this dataset, and when it pauses for a busy
    /// database ([`crate::connector::throttle`]).
    #[serde(default)]
    pub throttle: Option<ThrottleConfig>,
}

/// A dataset's `throttle:` block: how fast its rows may be read, and when reading
/// pauses for a busy database ([`crate::connector::throttle`]).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ThrottleConfig {
    /// At most this many rows read per second, over every request on the dataset.
    #[serde(default)]
    pub max_rows_per_second: Option<u64>,
    /// Pause reads while the database runs more than this many statements of other
    /// database users than the agent's.
    #[serde(default)]
    pub max_load: Option<u32>,
    /// How often the load is read while throttled reads run.
    #[serde(default = "default_probe_interval_ms")]
    pub probe_interval_ms: u64,
    /// A read paused longer than this (in total) fails with `UNAVAILABLE`.
    #[serde(default = "default_max_pause_secs")]
    pub max_pause_secs: u64,
}

fn default_probe_interval_ms() -> u64 {
    1000
}

fn default_max_pause_secs() -> u64 {
    600
}

impl ThrottleConfig {
    pub fn validate(&self, file: &Path, at: &str) -> std::result::Result<(), ConfigError> {
        let key = |k: &str| format!("{at}.{k}");
        if self.max_rows_per_second.is_none() && self.max_load.is_none() {
            return Err(ConfigError::invalid(
                file,
                at,
                "set max_rows_per_second, max_load or both (or remove the block)",
            ));
        }
        if self.max_rows_per_second == Some(0) {
            return Err(ConfigError::invalid(
                file,
                key("max_rows_per_second"),
                "must be at least 1",
            ));
        }
        if self.probe_interval_ms < 50 {
            return Err(ConfigError::invalid(
                file,
                key("probe_interval_ms"),
                "must be at least 50 (each probe is a query on the database)",
            ));
        }
        if self.max_pause_secs == 0 || self.max_pause_secs > 7 * 86_400 {
            return Err(ConfigError::invalid(
                file,
                key("max_pause_secs"),
                "must be between 1 and 604800 (7 days)",
            ));
        }
        if self.probe_interval_ms > 60_000 {
            return Err(ConfigError::invalid(
                file,
                key("probe_interval_ms"),
                "must be at most 60000",
            ));
        }
        Ok(())
    }

    pub(crate) fn probe_interval(&self) -> Duration {
        Duration::from_millis(self.probe_interval_ms)
    }

    pub(crate) fn max_pause(&self) -> Duration {
        Duration::from_secs(self.max_pause_secs)
    }
}

fn default_time_zone() -> String {
    "UTC".to_string()
}

/// The ISO offset (`+02:00`) of a dataset's `time_zone`: `UTC`, `Z`, or a fixed
/// offset `±HH:MM` (named zones with daylight saving are not supported: their offset
/// changes within a dataset). `None` when malformed.
pub fn zone_offset(tz: &str) -> Option<String> {
    let t = tz.trim();
    if t.eq_ignore_ascii_case("utc") || t == "Z" {
        return Some("+00:00".to_string());
    }
    let b = t.as_bytes();
    let ok = b.len() == 6
        && matches!(b[0], b'+' | b'-')
        && b[3] == b':'
        && [1, 2, 4, 5].iter().all(|&i| b[i].is_ascii_digit())
        && t[1..3].parse::<u32>().ok()? <= 14
        && t[4..6].parse::<u32>().ok()? < 60;
    ok.then(|| {
        if t == "-00:00" {
            "+00:00".to_string()
        } else {
            t.to_string()
        }
    })
}

/// Where the agent computes canonical text and checksums for aggregates. Either way
/// rows stay in the agent's zone; only counts and sums leave it.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Hashing {
    /// The agent reads the rows (beside the database) and hashes them itself where that
    /// was measured faster than the engine's own SQL hashing (PostgreSQL, MySQL/MariaDB,
    /// SQLite); DuckDB hashes in SQL. A value the agent cannot render falls back to SQL.
    #[default]
    Auto,
    /// The engine computes the checksum sums in SQL.
    Pushdown,
    /// The agent reads the rows and hashes them.
    InProcess,
}

/// Per-dataset privacy policy (DESIGN §2). The agent enforces it whatever the
/// coordinator asks. Every key is optional; its default is in `Default` below, and
/// nowhere else.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    pub max_level: PrivacyLevel,
    pub expose_key_bounds: bool,
    pub min_segment_rows: u64,
    pub mask_columns: Vec<String>,
    /// Whether investigation SQL of a `query:` dataset shows the query's text. Off,
    /// it names the dataset instead: the query may name tables, columns or literal
    /// values the zone does not release.
    pub share_query: bool,
    /// The only columns a period split (strategy time) or a period filter may use: a
    /// period label is a value of its column, so any other date column (a date of
    /// birth) stays in the zone.
    pub time_columns: Vec<String>,
    /// The most rows one RowDigests range may hold; a larger range is refused before
    /// any digest is sent.
    pub max_digest_rows: u64,
    /// The most rows RevealKeys and RevealRows release for this dataset in one run (its
    /// nonce), across calls (counted per agent process: each replica has its own budget).
    pub max_reveal_rows: u64,
    /// The most rows RevealKeys and RevealRows release for this dataset in any rolling
    /// hour, across runs (per agent process: each replica has its own budget); unset,
    /// `max_reveal_rows`, so a coordinator that starts a run per call gains nothing.
    pub max_reveal_rows_per_hour: Option<u64>,
    /// Serve unsealed checksums (`sha256_64`, `md5_48`), which a coordinator can
    /// brute-force for low-entropy columns (DESIGN §4.1). Off: only sealed requests.
    pub allow_unsealed: bool,
    /// The peers this dataset may be reconciled with in a sealed run: an agent name (of
    /// its certificate), any of its datasets, or `agent/dataset`, that one only; unset:
    /// any dataset of any agent certificate of `tls.peer_ca`.
    pub peers: Option<Vec<String>>,
    /// Columns whose canonical values may leave as group labels of comparison mode
    /// `measures` (`group_by`); a period of a date/timestamp column needs it in
    /// `time_columns` instead. Default none: mode measures is refused.
    pub group_columns: Vec<String>,
    /// Numeric columns whose per-group SUM, MIN and MAX leave in clear in mode
    /// `measures`; for any other measure column only a sealed digest leaves (equality
    /// without the value).
    pub measures: Vec<String>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_level: PrivacyLevel::CountOnly,
            expose_key_bounds: true,
            min_segment_rows: 0,
            mask_columns: Vec::new(),
            share_query: false,
            time_columns: Vec::new(),
            max_digest_rows: 100_000,
            max_reveal_rows: 1000,
            max_reveal_rows_per_hour: None,
            allow_unsealed: false,
            peers: None,
            group_columns: Vec::new(),
            measures: Vec::new(),
        }
    }
}

impl Policy {
    /// `max_reveal_rows_per_hour`, or `max_reveal_rows` when unset.
    pub fn reveal_rows_per_hour(&self) -> u64 {
        self.max_reveal_rows_per_hour.unwrap_or(self.max_reveal_rows)
    }

    /// Whether mode measures may group by this column's values.
    pub fn allows_group_column(&self, column: &str) -> bool {
        self.group_columns.iter().any(|t| t.eq_ignore_ascii_case(column))
    }

    /// Whether this measure column's values leave in clear.
    pub fn releases_measure(&self, column: &str) -> bool {
        self.measures.iter().any(|t| t.eq_ignore_ascii_case(column))
            && !self.mask_columns.iter().any(|m| m.eq_ignore_ascii_case(column))
    }

    /// Whether a period split or filter may use this column.
    pub fn allows_time_column(&self, column: &str) -> bool {
        self.time_columns.iter().any(|t| t.eq_ignore_ascii_case(column))
    }

    fn validate(&self, file: &Path, at: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("{at}.{k}");
        for (k, v) in [
            ("max_digest_rows", self.max_digest_rows),
            ("max_reveal_rows", self.max_reveal_rows),
            ("max_reveal_rows_per_hour", self.reveal_rows_per_hour()),
        ] {
            if v == 0 {
                return Err(ConfigError::invalid(
                    file,
                    key(k),
                    "must be at least 1 (to release no rows, set max_level: count_only)",
                ));
            }
        }
        for (i, p) in self.peers.iter().flatten().enumerate() {
            if p.is_empty() {
                return Err(ConfigError::invalid(
                    file,
                    format!("{at}.peers[{i}]"),
                    "empty agent name",
                ));
            }
        }
        if self.peers.as_ref().is_some_and(|p| p.is_empty()) {
            return Err(ConfigError::invalid(
                file,
                key("peers"),
                "empty: no peer could reconcile with this dataset; list peer agent names or remove the key",
            ));
        }
        for (list, name) in [
            (&self.group_columns, "group_columns"),
            (&self.measures, "measures"),
        ] {
            for (i, t) in list.iter().enumerate() {
                if t.is_empty() {
                    return Err(ConfigError::invalid(
                        file,
                        format!("{at}.{name}[{i}]"),
                        "empty column name",
                    ));
                }
                if self.mask_columns.iter().any(|m| m.eq_ignore_ascii_case(t)) {
                    return Err(ConfigError::invalid(
                        file,
                        format!("{at}.{name}[{i}]"),
                        format!("{t} is masked: its values never leave the zone"),
                    ));
                }
            }
        }
        for (i, t) in self.time_columns.iter().enumerate() {
            if t.is_empty() {
                return Err(ConfigError::invalid(
                    file,
                    format!("{at}.time_columns[{i}]"),
                    "empty column name",
                ));
            }
            if self.mask_columns.iter().any(|m| m.eq_ignore_ascii_case(t)) {
                return Err(ConfigError::invalid(
                    file,
                    format!("{at}.time_columns[{i}]"),
                    format!("{t} is masked: a period label is a value of its column"),
                ));
            }
        }
        Ok(())
    }
}

/// Where a dataset's rows come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `table`, `schema.table`, or on Spark and Databricks `catalog.schema.table`
    /// (Unity Catalog), split on the dots.
    Table(Vec<String>),
    Query(String),
}

/// Whether a database URL's engine names tables with a catalog in front
/// (`catalog.schema.table`): Spark and Databricks (Unity Catalog). On the others a third
/// part would be read as something else (PostgreSQL: a database, which must be the
/// connection's own), so it is refused.
fn takes_catalog(url: &str) -> bool {
    let scheme = url.split("://").next().unwrap_or_default().to_ascii_lowercase();
    matches!(scheme.as_str(), "spark" | "databricks")
}

const THREE_PARTS: &str =
    "catalog.schema.table is taken on Spark and Databricks only: give schema.table, or table";

impl DatasetConfig {
    pub fn source(&self) -> Source {
        match (&self.table, &self.query) {
            (Some(t), _) => Source::Table(t.split('.').map(str::to_string).collect()),
            (None, Some(q)) => Source::Query(q.clone()),
            (None, None) => match &self.file {
                Some(f) => Source::Query(f.query()),
                None => unreachable!("validated: table, query or file"),
            },
        }
    }

    /// The database URL, from `url` or the environment variable `url_env`.
    pub fn resolve_url(&self, file: &Path, name: &str) -> Result<String, ConfigError> {
        if let Some(f) = &self.file {
            return Ok(f.url());
        }
        let url = match (&self.url, &self.url_env) {
            (Some(u), _) => u.clone(),
            (None, Some(var)) => std::env::var(var).map_err(|_| {
                ConfigError::invalid(
                    file,
                    format!("datasets.{name}.url_env"),
                    format!("environment variable {var} is not set; export it with the database URL"),
                )
            })?,
            (None, None) => unreachable!("validated: url or url_env"),
        };
        // a URL from the environment is known only now
        if self.table.as_deref().is_some_and(|t| t.split('.').count() == 3) && !takes_catalog(&url) {
            return Err(ConfigError::invalid(
                file,
                format!("datasets.{name}.table"),
                THREE_PARTS,
            ));
        }
        Ok(url)
    }
}

impl AgentConfig {
    /// Loads and validates; relative TLS and log paths are taken from the file's directory.
    pub fn load(path: &Path) -> Result<AgentConfig, ConfigError> {
        let mut cfg: AgentConfig = load_yaml(path)?;
        cfg.validate(path)?;
        cfg.tls.ca = relative_to(path, &cfg.tls.ca);
        cfg.tls.cert = relative_to(path, &cfg.tls.cert);
        cfg.tls.key = relative_to(path, &cfg.tls.key);
        cfg.tls.zone_key = cfg.tls.zone_key.map(|p| relative_to(path, &p));
        cfg.tls.peer_ca = cfg.tls.peer_ca.map(|p| relative_to(path, &p));
        cfg.release_log = cfg.release_log.map(|p| relative_to(path, &p));
        Ok(cfg)
    }

    pub fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        if self.datasets.is_empty() {
            return Err(ConfigError::invalid(
                file,
                "datasets",
                "at least one dataset is needed",
            ));
        }
        self.connections.validate(file)?;
        for (name, d) in &self.datasets {
            let key = |k: &str| format!("datasets.{name}.{k}");
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(ConfigError::invalid(
                    file,
                    format!("datasets.{name}"),
                    "dataset names use letters, digits, '-', '_', '.'",
                ));
            }
            if let Some(f) = &d.file {
                if d.url.is_some() || d.url_env.is_some() || d.table.is_some() || d.query.is_some() {
                    return Err(ConfigError::invalid(
                        file,
                        key("file"),
                        "a file dataset is read through DuckDB in the agent: give file alone, without url, url_env, table or query",
                    ));
                }
                f.validate(file, &key("file"))?;
            }
            match (&d.url, &d.url_env) {
                _ if d.file.is_some() => {}
                (Some(_), Some(_)) => {
                    return Err(ConfigError::invalid(
                        file,
                        key("url"),
                        "give url or url_env, not both",
                    ));
                }
                (None, None) => {
                    return Err(ConfigError::invalid(
                        file,
                        key("url"),
                        "missing: give url or url_env (or file, for Parquet and CSV files)",
                    ));
                }
                (Some(u), None) if !u.contains("://") && !u.starts_with("sqlite:") => {
                    return Err(ConfigError::invalid(
                        file,
                        key("url"),
                        "expected a URL such as postgres://user@host/db",
                    ));
                }
                _ => {}
            }
            if zone_offset(&d.time_zone).is_none() {
                return Err(ConfigError::invalid(
                    file,
                    key("time_zone"),
                    "expected UTC or a fixed offset such as +02:00 (named zones are not supported)",
                ));
            }
            match (&d.table, &d.query) {
                _ if d.file.is_some() => {}
                (Some(_), Some(_)) => {
                    return Err(ConfigError::invalid(
                        file,
                        key("table"),
                        "give table or query, not both",
                    ));
                }
                (None, None) => {
                    return Err(ConfigError::invalid(
                        file,
                        key("table"),
                        "missing: give table, query or file",
                    ));
                }
                (Some(t), None)
                    if t.is_empty() || t.split('.').count() > 3 || t.split('.').any(str::is_empty) =>
                {
                    return Err(ConfigError::invalid(
                        file,
                        key("table"),
                        "expected table, schema.table, or catalog.schema.table (Spark and Databricks)",
                    ));
                }
                (Some(t), None)
                    if t.split('.').count() == 3 && d.url.as_deref().is_some_and(|u| !takes_catalog(u)) =>
                {
                    return Err(ConfigError::invalid(file, key("table"), THREE_PARTS));
                }
                _ => {}
            }
            if d.key.is_empty() {
                return Err(ConfigError::invalid(
                    file,
                    key("key"),
                    "at least one key column is needed",
                ));
            }
            d.policy.validate(file, &key("policy"))?;
            if let Some(w) = &d.watermark {
                w.validate(file, &key("watermark"))?;
            }
            if let Some(t) = &d.throttle {
                t.validate(file, &key("throttle"))?;
                if d.hashing == Hashing::Pushdown {
                    return Err(ConfigError::invalid(
                        file,
                        key("throttle"),
                        "a throttle paces the rows the agent reads, and with hashing: pushdown the engine reads them: use hashing: auto or in_process with a throttle",
                    ));
                }
            }
            if self.tls.zone_key.is_none() && !d.policy.allow_unsealed {
                return Err(ConfigError::invalid(
                    file,
                    "tls.zone_key",
                    format!(
                        "missing: dataset {name} serves sealed checksums only (the default), which need \
                         this agent's zone key; `tally certs init` writes NAME-zone.key (or run \
                         `openssl genpkey -algorithm X25519 -out zone.key`), or set \
                         datasets.{name}.policy.allow_unsealed: true"
                    ),
                ));
            }
            if let Some(m) = d
                .policy
                .mask_columns
                .iter()
                .find(|m| d.key.iter().any(|k| k.eq_ignore_ascii_case(m)))
            {
                return Err(ConfigError::invalid(
                    file,
                    key("policy.mask_columns"),
                    format!(
                        "key column {m} cannot be masked: use strategy hash with expose_key_bounds: false to keep keys private"
                    ),
                ));
            }
        }
        if let AllowedClients::Names(names) = &self.tls.allowed_clients {
            if names.is_empty() {
                return Err(ConfigError::invalid(
                    file,
                    "tls.allowed_clients",
                    "empty: no client could call; list the coordinator's certificate name, or write `any` to admit every client of the CA",
                ));
            }
            for (i, c) in names.iter().enumerate() {
                if c.is_empty() {
                    return Err(ConfigError::invalid(
                        file,
                        format!("tls.allowed_clients[{i}]"),
                        "empty client name",
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_common::config_file::parse_yaml;

    fn parse(text: &str) -> Result<AgentConfig, ConfigError> {
        let p = Path::new("agent.yaml");
        let c: AgentConfig = parse_yaml(p, text)?;
        c.validate(p)?;
        Ok(c)
    }

    const BASE: &str =
        "listen: 127.0.0.1:7401\ntls: { ca: ca.pem, cert: a.pem, key: a-key.pem, zone_key: a-zone.key }\n";

    #[test]
    fn the_shipped_example_parses() {
        let p = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/examples/agent.yaml"
        ));
        let c = AgentConfig::load(p).unwrap();
        assert!(c.datasets.contains_key("orders"));
        assert_eq!(c.datasets["orders"].policy.max_level, PrivacyLevel::WithKeys);
    }

    #[test]
    fn policy_defaults_are_count_only() {
        let c = parse(&format!(
            "{BASE}datasets:\n  o: {{ url: 'sqlite://x.db', table: t, key: [id] }}\n"
        ))
        .unwrap();
        assert_eq!(c.datasets["o"].policy, Policy::default());
        assert_eq!(c.datasets["o"].policy.max_level, PrivacyLevel::CountOnly);
        assert!(c.datasets["o"].policy.expose_key_bounds);
        assert!(c.datasets["o"].policy.time_columns.is_empty());
        assert_eq!(c.datasets["o"].policy.max_digest_rows, 100_000);
        assert_eq!(c.datasets["o"].policy.max_reveal_rows, 1000);
        assert_eq!(c.datasets["o"].policy.reveal_rows_per_hour(), 1000);
        assert!(!c.datasets["o"].policy.allow_unsealed);
        assert_eq!(c.datasets["o"].policy.peers, None);
    }

    #[test]
    fn sealing_is_the_default_and_needs_a_zone_key() {
        let one = "datasets:\n  o: { url: 'sqlite://x', table: t, key: [id] }\n";
        let e = parse(&format!(
            "listen: 127.0.0.1:7401\ntls: {{ ca: ca.pem, cert: a.pem, key: a-key.pem }}\n{one}"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("tls.zone_key") && e.contains("certs init") && e.contains("allow_unsealed"),
            "{e}"
        );
        // an agent that serves unsealed checksums only, said per dataset, needs none
        parse(
            "listen: 127.0.0.1:7401\ntls: { ca: ca.pem, cert: a.pem, key: a-key.pem }\n\
             datasets:\n  o: { url: 'sqlite://x', table: t, key: [id], policy: { allow_unsealed: true } }\n",
        )
        .unwrap();
        let e = parse(&format!(
            "{BASE}datasets:\n  o: {{ url: 'sqlite://x', table: t, key: [id], policy: {{ peers: [] }} }}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("datasets.o.policy.peers"), "{e}");
    }

    #[test]
    fn allowed_clients_default_to_the_coordinator_and_open_only_with_any() {
        let one = "datasets:\n  o: { url: 'sqlite://x', table: t, key: [id] }\n";
        let c = parse(&format!("{BASE}{one}")).unwrap();
        assert_eq!(
            c.tls.allowed_clients,
            AllowedClients::Names(vec!["coordinator".into()])
        );
        let with = |v: &str| {
            parse(&format!(
                "listen: 127.0.0.1:7401\ntls: {{ ca: ca.pem, cert: a.pem, key: a-key.pem, zone_key: z.key, allowed_clients: {v} }}\n{one}"
            ))
        };
        assert_eq!(with("any").unwrap().tls.allowed_clients, AllowedClients::Any);
        assert_eq!(
            with("[coordinator, ops]").unwrap().tls.allowed_clients,
            AllowedClients::Names(vec!["coordinator".into(), "ops".into()])
        );
        let e = with("[]").unwrap_err().to_string();
        assert!(e.contains("tls.allowed_clients") && e.contains("any"), "{e}");
        let e = with("everyone").unwrap_err().to_string();
        assert!(e.contains("allowed_clients"), "{e}");
    }

    #[test]
    fn hash_thread_parses_as_true_false_or_absent() {
        let with = |ds: &str| {
            parse(&format!(
                "{BASE}datasets:\n  o: {{ url: 'postgres://u@h/db', table: t, key: [id]{ds} }}\n"
            ))
        };
        assert_eq!(
            with(", hash_thread: false").unwrap().datasets["o"].hash_thread,
            Some(false)
        );
        assert_eq!(
            with(", hash_thread: true").unwrap().datasets["o"].hash_thread,
            Some(true)
        );
        assert_eq!(with("").unwrap().datasets["o"].hash_thread, None);
        let e = with(", hash_thread: 2").unwrap_err().to_string();
        assert!(e.contains("hash_thread"), "{e}");
    }

    #[test]
    fn a_throttle_is_refused_with_sql_hashing_and_without_a_limit() {
        let with = |ds: &str| parse(&format!("{BASE}datasets:\n  o: {{ {ds} }}\n"));
        let c = with("url: 'postgres://u@h/db', table: t, key: [id], throttle: { max_rows_per_second: 50000, max_load: 16 }")
            .unwrap();
        let t = c.datasets["o"].throttle.clone().unwrap();
        assert_eq!((t.max_rows_per_second, t.max_load), (Some(50000), Some(16)));
        assert_eq!((t.probe_interval_ms, t.max_pause_secs), (1000, 600), "defaults");
        let e = with("url: 'postgres://u@h/db', table: t, key: [id], hashing: pushdown, throttle: { max_rows_per_second: 10 }")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("datasets.o.throttle") && e.contains("hashing: pushdown"),
            "{e}"
        );
        let e = with("url: 'postgres://u@h/db', table: t, key: [id], throttle: {}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("datasets.o.throttle") && e.contains("max_load"), "{e}");
        let e = with("url: 'postgres://u@h/db', table: t, key: [id], throttle: { max_rows: 10 }")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_rows"), "{e}");
        // where its engine has no load probe: see server.rs
    }

    #[test]
    fn share_query_defaults_to_false() {
        let c = parse(&format!(
            "{BASE}datasets:\n  q: {{ url: 'sqlite://x', query: 'SELECT 1 AS id', key: [id] }}\n  s: {{ url: 'sqlite://x', query: 'SELECT 1 AS id', key: [id], policy: {{ share_query: true }} }}\n"
        ))
        .unwrap();
        assert!(!c.datasets["q"].policy.share_query);
        assert!(c.datasets["s"].policy.share_query);
    }

    #[test]
    fn connections_default_to_eight_per_url_and_take_overrides() {
        let one = "datasets:\n  o: { url: 'sqlite://x', table: t, key: [id] }\n";
        let c = parse(&format!("{BASE}{one}")).unwrap();
        assert_eq!(c.connections, ConnectionsConfig::default());
        assert_eq!(c.connections.max_connections, 8);
        assert_eq!(c.connections.idle_timeout(), Duration::from_secs(300));
        let c = parse(&format!("{BASE}connections: {{ max_connections: 3 }}\n{one}")).unwrap();
        assert_eq!(c.connections.max_connections, 3);
        assert_eq!(
            c.connections.acquire_timeout_secs, 600,
            "the others keep their defaults"
        );
    }

    #[test]
    fn a_catalog_schema_table_name_is_taken_on_spark_and_refused_elsewhere() {
        let one = |url: &str, table: &str| {
            parse(&format!(
                "{BASE}datasets:\n  o: {{ url: '{url}', table: {table}, key: [id] }}\n"
            ))
        };
        let c = one("spark://127.0.0.1:15002", "main.sales.orders").unwrap();
        let Source::Table(parts) = c.datasets["o"].source() else {
            panic!("a table")
        };
        assert_eq!(parts, ["main", "sales", "orders"]);
        assert!(
            one(
                "databricks://dbc-1.cloud.databricks.com?cluster_id=1",
                "main.sales.orders"
            )
            .is_ok()
        );
        for (url, table) in [
            ("postgres://h/db", "db.public.orders"),
            ("spark://127.0.0.1:15002", "a.b.c.d"),
            ("spark://127.0.0.1:15002", "a..c"),
        ] {
            let e = one(url, table).unwrap_err().to_string();
            assert!(e.contains("datasets.o.table"), "{url} {table}: {e}");
        }
        // a URL from the environment is checked when it is read (HOME is set, and no
        // Spark URL)
        let c = parse(&format!(
            "{BASE}datasets:\n  o: {{ url_env: HOME, table: db.public.orders, key: [id] }}\n"
        ))
        .unwrap();
        let e = c.datasets["o"]
            .resolve_url(Path::new("agent.yaml"), "o")
            .unwrap_err()
            .to_string();
        assert!(e.contains("datasets.o.table") && e.contains("Spark"), "{e}");
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("datasets:\n  o: { table: t, key: [id] }\n", "datasets.o.url"),
            (
                "datasets:\n  o: { url: 'sqlite://x', key: [id] }\n",
                "datasets.o.table",
            ),
            (
                "datasets:\n  o: { url: 'sqlite://x', table: t, key: [] }\n",
                "datasets.o.key",
            ),
            (
                "datasets:\n  o: { url: 'sqlite://x', table: t, key: [id], policy: { mask_columns: [ID] } }\n",
                "datasets.o.policy.mask_columns",
            ),
            (
                "datasets:\n  o: { url: 'sqlite://x', table: t, key: [id], policy: { max_level: everything } }\n",
                "max_level",
            ),
            (
                "datasets:\n  o: { url: 'sqlite://x', table: t, key: [id], password: x }\n",
                "password",
            ),
            (
                "datasets:\n  o: { url: 'sqlite://x', table: t, key: [id], policy: { max_digest_rows: 0 } }\n",
                "datasets.o.policy.max_digest_rows",
            ),
            (
                "datasets:\n  o: { url: 'sqlite://x', table: t, key: [id], policy: { max_reveal_rows: 0 } }\n",
                "datasets.o.policy.max_reveal_rows",
            ),
            (
                "datasets:\n  o: { url: 'sqlite://x', table: t, key: [id], policy: { mask_columns: [born], time_columns: [at, born] } }\n",
                "datasets.o.policy.time_columns[1]",
            ),
            (
                "datasets:\n  o: { url: 'sqlite://x', table: t, key: [id], policy: { time_column: [at] } }\n",
                "time_column",
            ),
            (
                "connections: { max_connections: 0 }\ndatasets:\n  o: { url: 'sqlite://x', table: t, key: [id] }\n",
                "connections.max_connections",
            ),
            (
                "connections: { idle_timeout_secs: 0 }\ndatasets:\n  o: { url: 'sqlite://x', table: t, key: [id] }\n",
                "connections.idle_timeout_secs",
            ),
            (
                "connections: { acquire_timeout_secs: 0 }\ndatasets:\n  o: { url: 'sqlite://x', table: t, key: [id] }\n",
                "connections.acquire_timeout_secs",
            ),
            (
                "connections: { max_per_database: 4 }\ndatasets:\n  o: { url: 'sqlite://x', table: t, key: [id] }\n",
                "max_per_database",
            ),
        ];
        for (text, key) in cases {
            let e = parse(&format!("{BASE}{text}")).unwrap_err().to_string();
            assert!(e.contains(key), "{text:?}: {e}");
        }
    }

    #[test]
    fn watermarks_parse_and_bad_ones_name_the_key() {
        use crate::watermark::{Builtin, WatermarkRead};
        use tally_common::position::PositionKind;
        let ds = |w: &str| {
            format!(
                "{BASE}datasets:\n  o: {{ url: 'postgres://h/d', table: t, key: [id], watermark: {w} }}\n"
            )
        };
        let c = parse(&ds("{ builtin: gtid_slave_pos }")).unwrap();
        let w = c.datasets["o"].watermark.clone().unwrap();
        assert_eq!(
            (w.kind(), w.read()),
            (PositionKind::Gtid, WatermarkRead::Builtin(Builtin::GtidSlavePos))
        );
        let c = parse(&ds("{ builtin: pg_subscription, subscription: orders_sub }")).unwrap();
        let w = c.datasets["o"].watermark.clone().unwrap();
        assert_eq!(w.read(), WatermarkRead::Subscription("orders_sub".into()));
        let c = parse(&ds(
            "{ query: 'SELECT applied FROM cdc.offsets WHERE pipe = 1;', kind: integer }",
        ))
        .unwrap();
        let w = c.datasets["o"].watermark.clone().unwrap();
        assert_eq!(w.kind(), PositionKind::Integer);
        assert_eq!(
            w.read(),
            WatermarkRead::Query("SELECT applied FROM cdc.offsets WHERE pipe = 1".into())
        );
        // a builtin of another engine is refused when the datasets open
        assert!(w.check_engine("o", "postgres").is_ok());
        let e = crate::watermark::WatermarkConfig {
            builtin: Some(Builtin::PgWalLsn),
            subscription: None,
            query: None,
            kind: None,
            poll_ms: 200,
        }
        .check_engine("o", "mysql")
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("datasets.o.watermark.builtin") && e.contains("PostgreSQL"),
            "{e}"
        );
        for (w, key) in [
            ("{ }", "datasets.o.watermark"),
            (
                "{ builtin: pg_wal_lsn, query: 'SELECT 1', kind: lsn }",
                "watermark.query",
            ),
            ("{ builtin: binlog }", "watermark"),
            ("{ builtin: pg_subscription }", "watermark.subscription"),
            (
                "{ builtin: pg_wal_lsn, subscription: s }",
                "watermark.subscription",
            ),
            ("{ builtin: pg_wal_lsn, kind: gtid }", "watermark.kind"),
            ("{ query: 'SELECT 1' }", "watermark.kind"),
            (
                "{ query: 'SELECT 1; DROP TABLE t', kind: integer }",
                "watermark.query",
            ),
            ("{ query: ' ', kind: integer }", "watermark.query"),
            ("{ query: 'SELECT 1', kind: float }", "watermark"),
            ("{ builtin: gtid_binlog_pos, poll_ms: 10 }", "watermark.poll_ms"),
            ("{ builtin: gtid_binlog_pos, wait: 1 }", "watermark"),
        ] {
            let e = parse(&ds(w)).unwrap_err().to_string();
            assert!(e.contains("agent.yaml") && e.contains(key), "{w}: {e}");
        }
    }
}
