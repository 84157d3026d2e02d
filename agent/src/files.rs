//! File datasets (`file:` in a dataset's config): Parquet or CSV files, one path or a
//! glob, on local disk or S3-compatible storage, read through DuckDB in the agent's
//! process. A file dataset is a DuckDB query the agent writes itself: its relation is
//! `read_parquet(…)` or `read_csv(…)` over the path, its URL an in-memory DuckDB
//! (`duckdb://`) that carries the storage settings (`s3=1&s3_region=…`, never a
//! credential: those come from the agent's environment when the connection opens,
//! `connector/duckdb.rs`).
//!
//! Types: a Parquet file carries its schema, which DuckDB reads; a CSV file's columns
//! are declared (name and DuckDB type, in the file's order) and nothing is sniffed: a
//! guessed type can turn `00123` into `123` on one side only, a false match.

use std::path::Path;

use serde::Deserialize;
use tally_common::config_file::ConfigError;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// A file, a directory's files by glob (`/lake/orders/*.parquet`,
    /// `s3://bucket/orders/**/*.parquet`), local or `s3://`.
    pub path: String,
    /// `parquet` or `csv`; absent, from the path's extension.
    #[serde(default)]
    pub format: Option<FileFormat>,
    /// CSV only: how the file is written and its columns.
    #[serde(default)]
    pub csv: Option<CsvOptions>,
    /// `s3://` paths only: where the storage is (credentials come from the agent's
    /// environment: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`).
    #[serde(default)]
    pub s3: Option<S3Options>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FileFormat {
    Parquet,
    Csv,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CsvOptions {
    /// The first line names the columns (and is skipped). Default true.
    #[serde(default = "yes")]
    pub header: bool,
    /// One character. Default `,`.
    #[serde(default = "comma")]
    pub delimiter: String,
    /// One character. Default `"`.
    #[serde(default = "double_quote")]
    pub quote: String,
    /// The text that stands for NULL (`null_string: NA`); default the empty unquoted
    /// field.
    #[serde(default)]
    pub null_string: Option<String>,
    /// Every column in the file's order, each with its DuckDB type.
    pub columns: Vec<CsvColumn>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CsvColumn {
    pub name: String,
    /// A DuckDB type: `BIGINT`, `DECIMAL(12,2)`, `VARCHAR`, `DATE`, `TIMESTAMP`, …
    #[serde(rename = "type")]
    pub ty: String,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct S3Options {
    /// `host:port` of an S3-compatible service; absent, AWS's own.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Default `us-east-1`.
    #[serde(default)]
    pub region: Option<String>,
    /// `path` (`endpoint/bucket/key`, what most S3-compatible services want) or
    /// `vhost` (`bucket.endpoint/key`, AWS's default).
    #[serde(default)]
    pub url_style: Option<String>,
    /// HTTPS to the endpoint. Default true; false only for a local test service.
    #[serde(default = "yes")]
    pub use_ssl: bool,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            endpoint: None,
            region: None,
            url_style: None,
            use_ssl: true,
        }
    }
}

fn yes() -> bool {
    true
}

fn comma() -> String {
    ",".into()
}

fn double_quote() -> String {
    "\"".into()
}

/// A SQL string literal: quotes doubled.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl FileConfig {
    /// The format: given, or from the path's extension.
    pub fn format(&self) -> Option<FileFormat> {
        self.format.or_else(|| {
            let lower = self.path.to_ascii_lowercase();
            if lower.ends_with(".parquet") || lower.ends_with(".parq") {
                Some(FileFormat::Parquet)
            } else if lower.ends_with(".csv") || lower.ends_with(".csv.gz") {
                Some(FileFormat::Csv)
            } else {
                None
            }
        })
    }

    pub fn is_s3(&self) -> bool {
        self.path.starts_with("s3://")
    }

    /// Checks the block at `at` (`datasets.NAME.file`), naming the key at fault.
    pub fn validate(&self, file: &Path, at: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("{at}.{k}");
        let bad = |k: String, why: &str| Err(ConfigError::invalid(file, k, why.to_string()));
        if self.path.trim().is_empty() || self.path.contains('\0') {
            return bad(key("path"), "expected a file path, a glob or an s3:// URL");
        }
        if self.path.contains("://") && !self.is_s3() {
            return bad(
                key("path"),
                "only local paths and s3:// URLs are read (for another store, mount it or use its S3-compatible endpoint)",
            );
        }
        let Some(format) = self.format() else {
            return bad(
                key("format"),
                "missing: the path does not end in .parquet or .csv; give format: parquet or format: csv",
            );
        };
        match (format, &self.csv) {
            (FileFormat::Parquet, Some(_)) => {
                return bad(
                    key("csv"),
                    "csv options on a Parquet dataset: remove them or set format: csv",
                );
            }
            (FileFormat::Csv, None) => {
                return bad(
                    key("csv.columns"),
                    "missing: a CSV dataset declares its columns in order, each with a DuckDB type \
                     (csv: { columns: [{ name: id, type: BIGINT }, …] }); types are never guessed",
                );
            }
            (FileFormat::Csv, Some(c)) => c.validate(file, &key("csv"))?,
            (FileFormat::Parquet, None) => {}
        }
        match (&self.s3, self.is_s3()) {
            (Some(_), false) => bad(
                key("s3"),
                "s3 options on a local path: remove them or give an s3:// path",
            ),
            (Some(s), true) => s.validate(file, &key("s3")),
            _ => Ok(()),
        }
    }

    /// The DuckDB query this dataset reads.
    ///
    /// Parquet: the files' rows, once every file of the glob has been checked to have
    /// one schema (names, types, order; DuckDB would otherwise read later files into
    /// the first one's types, `'00123'` into `123`) and no UTC timestamp at nanoseconds
    /// (DuckDB reads those at microseconds: they would compare cut).
    ///
    /// CSV: every column read as text, then each value checked against its declared
    /// type as written and only then cast: DuckDB's own CSV types round (`1.5` into a
    /// `BIGINT` is `2`) and drop offsets. A quoted empty field is `''`, an unquoted one
    /// NULL (PostgreSQL's CSV convention; DuckDB's default would read both as NULL).
    /// No directory name becomes a column (`hive_partitioning = false`).
    pub fn query(&self) -> String {
        let path = literal(&self.path);
        match (self.format(), &self.csv) {
            (Some(FileFormat::Csv), Some(c)) => {
                let select: Vec<String> = c.columns.iter().map(CsvColumn::select).collect();
                format!(
                    "SELECT {} FROM read_csv({path}, {})",
                    select.join(", "),
                    c.read_options(c.header)
                )
            }
            _ => format!(
                "SELECT * FROM read_parquet({path}, hive_partitioning = false) WHERE (SELECT CASE \
                 WHEN count(DISTINCT sig) > 1 THEN error('the files of this dataset do not share one schema (column names, types and order): reconcile them as separate datasets or rewrite them') \
                 WHEN bool_or(nanos) THEN error('a column holds UTC timestamps at nanoseconds, which DuckDB reads at microseconds: write it at microseconds') \
                 ELSE true END FROM (SELECT file_name, string_agg(name || ' ' || coalesce(duckdb_type, ''), ', ' ORDER BY column_id) AS sig, \
                 bool_or(coalesce(logical_type, '') LIKE '%isAdjustedToUTC=1%NANOS=NanoSeconds()%') AS nanos \
                 FROM parquet_schema({path}) WHERE column_id > 0 GROUP BY file_name))"
            ),
        }
    }

    /// The in-memory DuckDB URL this dataset's reads go through: the storage settings
    /// ride in it, so datasets with the same settings share one connector.
    pub fn url(&self) -> String {
        let Some(s3) = self.is_s3().then(|| self.s3.clone().unwrap_or_default()) else {
            return "duckdb://".into();
        };
        let mut q = vec!["s3=1".to_string()];
        if let Some(e) = &s3.endpoint {
            q.push(format!("s3_endpoint={e}"));
        }
        q.push(format!(
            "s3_region={}",
            s3.region.as_deref().unwrap_or("us-east-1")
        ));
        if let Some(u) = &s3.url_style {
            q.push(format!("s3_url_style={u}"));
        }
        q.push(format!("s3_use_ssl={}", s3.use_ssl));
        format!("duckdb://?{}", q.join("&"))
    }
}

impl CsvOptions {
    /// `read_csv`'s options: every declared column as text, nothing sniffed.
    fn read_options(&self, header: bool) -> String {
        let text: Vec<String> = self
            .columns
            .iter()
            .map(|col| format!("{}: 'VARCHAR'", literal(&col.name)))
            .collect();
        let mut opts = vec![
            format!("header = {header}"),
            format!("delim = {}", literal(&self.delimiter)),
            format!("quote = {}", literal(&self.quote)),
            format!("escape = {}", literal(&self.quote)),
            format!("columns = {{{}}}", text.join(", ")),
            "auto_detect = false".to_string(),
            "allow_quoted_nulls = false".to_string(),
            "hive_partitioning = false".to_string(),
        ];
        if let Some(n) = &self.null_string {
            opts.push(format!("nullstr = {}", literal(n)));
        }
        opts.join(", ")
    }
}

/// The separators of [`FileConfig::header_lines_sql`]'s answer: between files, and
/// between a file's name and its fields.
const FILE_SEP: char = '\u{1e}';
const FIELD_SEP: char = '\u{1f}';

/// How many files one header query reads.
pub const HEADER_FILES_PER_QUERY: usize = 100;

impl FileConfig {
    /// A CSV dataset whose files start with a header line: the query listing its files
    /// (one text, the names apart by U+001E). DuckDB skips a header line unread, so
    /// each file's is checked against the declared names first
    /// ([`header_lines_sql`](Self::header_lines_sql)): a file whose columns are in
    /// another order would otherwise be read into the wrong columns, and one without a
    /// header would lose its first row.
    pub fn header_files_sql(&self) -> Option<String> {
        let c = self.csv.as_ref().filter(|c| c.header)?;
        (self.format() == Some(FileFormat::Csv) && !c.columns.is_empty()).then(|| {
            format!(
                "SELECT string_agg(file, chr(30) ORDER BY file) FROM glob({})",
                literal(&self.path)
            )
        })
    }

    /// The first line of each of `files`, read as the declared number of text fields
    /// (a line with more fields is refused by DuckDB): one text, per file its name and
    /// fields apart by U+001F, files apart by U+001E.
    pub fn header_lines_sql(&self, files: &[&str]) -> Option<String> {
        let c = self.csv.as_ref()?;
        let fields: Vec<String> = c
            .columns
            .iter()
            .map(|col| format!("coalesce(\"{}\", '')", col.name.replace('"', "\"\"")))
            .collect();
        let per_file: Vec<String> = files
            .iter()
            .map(|f| {
                format!(
                    "SELECT {} AS tally_file, (SELECT {} FROM read_csv({}, {}) LIMIT 1) AS tally_header",
                    literal(f),
                    fields.join(" || chr(31) || "),
                    literal(f),
                    c.read_options(false)
                )
            })
            .collect();
        (!files.is_empty()).then(|| {
            format!(
                "SELECT string_agg(tally_file || chr(31) || coalesce(tally_header, ''), chr(30)) FROM ({})",
                per_file.join(" UNION ALL ")
            )
        })
    }

    /// Checks [`header_lines_sql`](Self::header_lines_sql)'s answer: the files whose
    /// first line is not the declared names in order (ASCII case and surrounding
    /// blanks aside), each with what its first line holds. An empty file has no line
    /// and passes.
    pub fn header_mismatches(&self, answer: &str) -> Vec<(String, Vec<String>)> {
        let Some(c) = &self.csv else { return Vec::new() };
        answer
            .split(FILE_SEP)
            .filter(|x| !x.is_empty())
            .filter_map(|x| {
                let mut parts = x.split(FIELD_SEP);
                let file = parts.next().unwrap_or_default().to_string();
                let found: Vec<String> = parts.map(str::to_string).collect();
                let empty = found.iter().all(String::is_empty);
                let same = found.len() == c.columns.len()
                    && found
                        .iter()
                        .zip(&c.columns)
                        .all(|(f, col)| f.trim().eq_ignore_ascii_case(col.name.trim()));
                (!same && !empty).then_some((file, found))
            })
            .collect()
    }

    /// The names the dataset declares, for messages.
    pub fn declared_names(&self) -> Vec<String> {
        self.csv
            .as_ref()
            .map(|c| c.columns.iter().map(|col| col.name.clone()).collect())
            .unwrap_or_default()
    }

    /// Splits [`header_files_sql`](Self::header_files_sql)'s answer.
    pub fn listed_files(answer: &str) -> Vec<&str> {
        answer.split(FILE_SEP).filter(|f| !f.is_empty()).collect()
    }
}

/// How a declared CSV column's values must be written, as an RE2 pattern over the whole
/// value (`None`: any text); `Err` for a type CSV columns cannot declare.
fn pattern(ty: &str) -> Result<Option<String>, String> {
    let t = ty.trim().to_ascii_uppercase();
    let t = t.split_whitespace().collect::<Vec<_>>().join(" ");
    const INT: &str = "[+-]?[0-9]+";
    const DATE: &str = "[0-9]{4}-[0-9]{2}-[0-9]{2}";
    const TIME: &str = "[ T][0-9]{2}:[0-9]{2}(:[0-9]{2}(\\.[0-9]{1,6})?)?";
    Ok(Some(match t.as_str() {
        "VARCHAR" | "TEXT" | "STRING" => return Ok(None),
        "BIGINT" | "INTEGER" | "INT" | "SMALLINT" | "TINYINT" | "HUGEINT" | "UBIGINT" | "UINTEGER"
        | "USMALLINT" | "UTINYINT" | "INT8" | "INT4" | "INT2" | "INT1" | "LONG" => INT.to_string(),
        "DOUBLE" | "FLOAT8" => {
            "[+-]?([0-9]+\\.?[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(?i:nan|inf|infinity)".to_string()
        }
        "BOOLEAN" | "BOOL" => "(?i:true|false)".to_string(),
        "DATE" => DATE.to_string(),
        "TIMESTAMP" | "DATETIME" => format!("{DATE}{TIME}"),
        "TIMESTAMPTZ" | "TIMESTAMP WITH TIME ZONE" => {
            format!("{DATE}{TIME}(Z|[+-][0-9]{{2}}(:?[0-9]{{2}})?)")
        }
        "FLOAT" | "REAL" | "FLOAT4" => {
            return Err("a 32-bit float rounds the file's text: declare DOUBLE".into());
        }
        d if d.starts_with("DECIMAL(") || d.starts_with("NUMERIC(") => {
            let inner = d.split_once('(').map(|x| x.1).unwrap_or("").trim_end_matches(')');
            let parts: Vec<&str> = inner.split(',').map(str::trim).collect();
            let (Some(p), Some(s)) = (
                parts.first().and_then(|p| p.parse::<u32>().ok()),
                parts.get(1).and_then(|s| s.parse::<u32>().ok()),
            ) else {
                return Err("expected DECIMAL(precision, scale)".into());
            };
            if parts.len() != 2 || p == 0 || p > 38 || s > p {
                return Err(
                    "expected DECIMAL(precision, scale) with 1 <= precision <= 38 and scale <= precision"
                        .into(),
                );
            }
            if s == 0 {
                format!("{INT}\\.?")
            } else {
                // at most the declared scale: more digits would be rounded
                format!("[+-]?([0-9]+(\\.[0-9]{{0,{s}}})?|\\.[0-9]{{1,{s}}})")
            }
        }
        "DECIMAL" | "NUMERIC" => return Err("give the precision and scale: DECIMAL(18,2)".into()),
        _ => {
            return Err(
                "CSV columns declare VARCHAR, an integer type, DECIMAL(p,s), DOUBLE, BOOLEAN, DATE, TIMESTAMP or TIMESTAMPTZ (read others as VARCHAR)"
                    .into(),
            );
        }
    }))
}

impl CsvColumn {
    /// The column in the dataset's query: its text checked against the declared type
    /// as written (an error names the column, never the value), then cast.
    fn select(&self) -> String {
        let name = format!("\"{}\"", self.name.replace('"', "\"\""));
        match pattern(&self.ty) {
            Ok(Some(p)) => format!(
                "CASE WHEN {name} IS NULL OR regexp_full_match({name}, {}) THEN CAST({name} AS {}) \
                 ELSE error({}) END AS {name}",
                literal(&p),
                self.ty,
                literal(&format!(
                    "column {}: a value is not written as a {} (nothing is rounded or converted: fix the file, or declare the column VARCHAR)",
                    self.name, self.ty
                )),
            ),
            _ => name,
        }
    }
}

/// A URL query value or a DuckDB type name: no character that could leave its place.
fn plain(s: &str, extra: &[char]) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c) || extra.contains(&c))
}

impl CsvOptions {
    fn validate(&self, file: &Path, at: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("{at}.{k}");
        for (k, v) in [("delimiter", &self.delimiter), ("quote", &self.quote)] {
            if v.chars().count() != 1 || v == "\n" || v == "\r" {
                return Err(ConfigError::invalid(file, key(k), "expected one character"));
            }
        }
        if self.delimiter == self.quote {
            return Err(ConfigError::invalid(
                file,
                key("quote"),
                "the quote character is the delimiter",
            ));
        }
        if self.columns.is_empty() {
            return Err(ConfigError::invalid(
                file,
                key("columns"),
                "empty: declare every column in the file's order",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, c) in self.columns.iter().enumerate() {
            if c.name.is_empty() || c.name.contains('\0') {
                return Err(ConfigError::invalid(
                    file,
                    format!("{at}.columns[{i}].name"),
                    "empty column name",
                ));
            }
            if !seen.insert(c.name.to_ascii_lowercase()) {
                return Err(ConfigError::invalid(
                    file,
                    format!("{at}.columns[{i}].name"),
                    format!("{} is declared twice", c.name),
                ));
            }
            if !plain(&c.ty, &['(', ')', ',', ' ']) {
                return Err(ConfigError::invalid(
                    file,
                    format!("{at}.columns[{i}].type"),
                    format!(
                        "{:?} is not a DuckDB type name such as BIGINT, DECIMAL(12,2), VARCHAR or TIMESTAMP",
                        c.ty
                    ),
                ));
            }
            if let Err(why) = pattern(&c.ty) {
                return Err(ConfigError::invalid(
                    file,
                    format!("{at}.columns[{i}].type"),
                    format!("{}: {why}", c.ty),
                ));
            }
        }
        Ok(())
    }
}

impl S3Options {
    fn validate(&self, file: &Path, at: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("{at}.{k}");
        if let Some(e) = &self.endpoint
            && (!plain(e, &[':']) || e.contains("//"))
        {
            return Err(ConfigError::invalid(
                file,
                key("endpoint"),
                "expected host:port, without a scheme (use_ssl chooses HTTPS)",
            ));
        }
        if let Some(r) = &self.region
            && !plain(r, &[])
        {
            return Err(ConfigError::invalid(
                file,
                key("region"),
                "expected a region name such as eu-west-1",
            ));
        }
        if let Some(u) = &self.url_style
            && u != "path"
            && u != "vhost"
        {
            return Err(ConfigError::invalid(
                file,
                key("url_style"),
                "expected path or vhost",
            ));
        }
        Ok(())
    }
}

/// Storage settings of an in-memory DuckDB URL (`duckdb://?s3=1&…`), as
/// [`FileConfig::url`] writes them; `None` without `s3=1`. An unknown parameter is an
/// error, so a typo does not silently read with defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Url {
    pub endpoint: Option<String>,
    pub region: String,
    pub url_style: Option<String>,
    pub use_ssl: bool,
}

pub fn s3_of_url(url: &str) -> Result<Option<S3Url>, String> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(None);
    };
    let mut s3 = S3Url {
        endpoint: None,
        region: "us-east-1".into(),
        url_style: None,
        use_ssl: true,
    };
    let mut on = false;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let ok = match k {
            "s3" => {
                on = v == "1";
                v == "1"
            }
            "s3_endpoint" => {
                s3.endpoint = Some(v.to_string());
                plain(v, &[':'])
            }
            "s3_region" => {
                s3.region = v.to_string();
                plain(v, &[])
            }
            "s3_url_style" => {
                s3.url_style = Some(v.to_string());
                v == "path" || v == "vhost"
            }
            "s3_use_ssl" => {
                s3.use_ssl = v == "true";
                v == "true" || v == "false"
            }
            _ => false,
        };
        if !ok {
            return Err(format!(
                "duckdb URL parameter {pair:?}: expected s3=1, s3_endpoint=host:port, s3_region=NAME, s3_url_style=path|vhost or s3_use_ssl=true|false"
            ));
        }
    }
    Ok(on.then_some(s3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_common::config_file::parse_yaml;

    fn parse(yaml: &str) -> FileConfig {
        parse_yaml(Path::new("agent.yaml"), yaml).unwrap()
    }

    #[test]
    fn a_csv_file_whose_first_line_is_not_the_declared_header_is_found() {
        let f = parse(
            "path: /in/*.csv\ncsv:\n  columns:\n    - { name: id, type: BIGINT }\n    - { name: code, type: VARCHAR }\n",
        );
        let list = f.header_files_sql().unwrap();
        assert!(list.contains("glob('/in/*.csv')"), "{list}");
        let sql = f.header_lines_sql(&["/in/a.csv", "/in/it's.csv"]).unwrap();
        assert!(sql.contains("read_csv('/in/it''s.csv', header = false"), "{sql}");
        assert!(sql.contains("LIMIT 1") && sql.contains(" UNION ALL "), "{sql}");
        let answer = [
            "/in/a.csv\u{1f}id\u{1f}code",
            "/in/b.csv\u{1f} ID \u{1f}Code",
            "/in/swapped.csv\u{1f}code\u{1f}id",
            "/in/data.csv\u{1f}1\u{1f}000001",
            "/in/empty.csv\u{1f}",
        ]
        .join("\u{1e}");
        let bad = f.header_mismatches(&answer);
        let files: Vec<&str> = bad.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(files, ["/in/swapped.csv", "/in/data.csv"]);
        assert_eq!(bad[1].1, ["1", "000001"]);
        assert_eq!(
            FileConfig::listed_files("/in/a.csv\u{1e}/in/b.csv"),
            ["/in/a.csv", "/in/b.csv"]
        );
        // nothing to check without a header, or on Parquet
        assert!(
            parse("path: /in/x.csv\ncsv: { header: false, columns: [{ name: a, type: INT }] }\n")
                .header_files_sql()
                .is_none()
        );
        assert!(parse("path: /in/x.parquet\n").header_files_sql().is_none());
    }

    fn refused(yaml: &str) -> String {
        parse(yaml)
            .validate(Path::new("agent.yaml"), "datasets.lake.file")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_parquet_glob_reads_through_read_parquet_with_its_path_quoted_and_its_schemas_checked() {
        let f = parse("path: /lake/o'rders/*.parquet\n");
        f.validate(Path::new("agent.yaml"), "datasets.lake.file").unwrap();
        let q = f.query();
        assert!(
            q.starts_with(
                "SELECT * FROM read_parquet('/lake/o''rders/*.parquet', hive_partitioning = false) WHERE "
            ),
            "{q}"
        );
        // every file's schema, from the same glob, compared before a row is read
        assert!(
            q.contains("FROM parquet_schema('/lake/o''rders/*.parquet')"),
            "{q}"
        );
        assert!(q.contains("count(DISTINCT sig) > 1 THEN error("), "{q}");
        assert!(q.contains("NANOS=NanoSeconds()"), "{q}");
        assert_eq!(f.url(), "duckdb://");
    }

    #[test]
    fn a_csv_is_read_as_text_and_each_value_checked_against_its_declared_type() {
        let f = parse(
            "path: /in/orders.csv\ncsv:\n  delimiter: ';'\n  null_string: NA\n  columns:\n    - { name: id, type: BIGINT }\n    - { name: code, type: VARCHAR }\n    - { name: amount, type: 'DECIMAL(12,2)' }\n",
        );
        f.validate(Path::new("agent.yaml"), "datasets.lake.file").unwrap();
        let q = f.query();
        for part in [
            "columns = {'id': 'VARCHAR', 'code': 'VARCHAR', 'amount': 'VARCHAR'}",
            "auto_detect = false",
            "allow_quoted_nulls = false",
            "hive_partitioning = false",
            "nullstr = 'NA'",
            "delim = ';'",
            "CASE WHEN \"id\" IS NULL OR regexp_full_match(\"id\", '[+-]?[0-9]+') THEN CAST(\"id\" AS BIGINT) ELSE error(",
            ", \"code\", ",
            "regexp_full_match(\"amount\", '[+-]?([0-9]+(\\.[0-9]{0,2})?|\\.[0-9]{1,2})') THEN CAST(\"amount\" AS DECIMAL(12,2))",
        ] {
            assert!(q.contains(part), "{part}\n{q}");
        }
    }

    /// The patterns as DuckDB's own RE2 reads them (`regexp_full_match`).
    #[cfg(feature = "duckdb")]
    #[test]
    fn each_declared_type_takes_exactly_its_written_form() {
        let db = duckdb::Connection::open_in_memory().unwrap();
        let ok = |ty: &str, v: &str| match pattern(ty).unwrap() {
            None => true,
            Some(p) => db
                .query_row("SELECT regexp_full_match(?, ?)", duckdb::params![v, p], |r| {
                    r.get::<_, bool>(0)
                })
                .unwrap(),
        };
        for (ty, good, bad) in [
            (
                "BIGINT",
                &["7", "-007", "+12"][..],
                &["1.5", "1e3", "", " 7", "0x10"][..],
            ),
            (
                "DECIMAL(12,2)",
                &["1", "1.5", "-1.25", ".5", "10."],
                &["1.004", "1e2", "", "NaN"],
            ),
            ("DECIMAL(5,0)", &["12", "12."], &["12.0", "1.5"]),
            ("DATE", &["2024-03-15"], &["2024-03-15 00:00:00", "15/03/2024"]),
            (
                "TIMESTAMP",
                &[
                    "2024-03-15 14:30:00",
                    "2024-03-15T14:30:00.123456",
                    "2024-03-15 14:30",
                ],
                &["2024-03-15 14:30:00+02", "2024-03-15 14:30:00.1234567"],
            ),
            (
                "TIMESTAMPTZ",
                &[
                    "2024-03-15 14:30:00+00",
                    "2024-03-15T14:30:00.5Z",
                    "2024-03-15 14:30:00+05:30",
                ],
                &["2024-03-15 14:30:00"],
            ),
            ("BOOLEAN", &["true", "FALSE"], &["1", "yes", ""]),
            (
                "DOUBLE",
                &["1.5", "-2e-3", ".5", "NaN", "-inf"],
                &["1,5", "", "e3"],
            ),
        ] {
            for v in good {
                assert!(ok(ty, v), "{ty} should take {v:?}");
            }
            for v in bad {
                assert!(!ok(ty, v), "{ty} should refuse {v:?}");
            }
        }
        assert!(ok("VARCHAR", "anything at all"));
        for ty in [
            "FLOAT",
            "REAL",
            "DECIMAL",
            "DECIMAL(40,2)",
            "BLOB",
            "JSON",
            "INTERVAL",
        ] {
            assert!(pattern(ty).is_err(), "{ty}");
        }
    }

    #[test]
    fn s3_settings_ride_in_the_url_and_come_back_out_of_it() {
        let f = parse(
            "path: s3://lake/orders/*.parquet\ns3: { endpoint: '127.0.0.1:9000', url_style: path, use_ssl: false }\n",
        );
        f.validate(Path::new("agent.yaml"), "datasets.lake.file").unwrap();
        let url = f.url();
        assert_eq!(
            url,
            "duckdb://?s3=1&s3_endpoint=127.0.0.1:9000&s3_region=us-east-1&s3_url_style=path&s3_use_ssl=false"
        );
        assert_eq!(
            s3_of_url(&url).unwrap(),
            Some(S3Url {
                endpoint: Some("127.0.0.1:9000".into()),
                region: "us-east-1".into(),
                url_style: Some("path".into()),
                use_ssl: false,
            })
        );
        // an s3 path without options: AWS, HTTPS
        assert_eq!(
            parse("path: s3://b/k.parquet\n").url(),
            "duckdb://?s3=1&s3_region=us-east-1&s3_use_ssl=true"
        );
        assert_eq!(s3_of_url("duckdb://").unwrap(), None);
        assert_eq!(s3_of_url("duckdb:///data/x.duckdb").unwrap(), None);
        assert!(
            s3_of_url("duckdb://?s3=1&s3_endpoint=a'b")
                .unwrap_err()
                .contains("s3_endpoint")
        );
        assert!(
            s3_of_url("duckdb://?s3=1&key_id=AKIA")
                .unwrap_err()
                .contains("key_id")
        );
    }

    #[test]
    fn bad_blocks_are_refused_naming_the_key() {
        for (yaml, key, why) in [
            (
                "path: /in/orders.txt\n",
                "datasets.lake.file.format",
                "give format",
            ),
            (
                "path: /in/orders.csv\n",
                "datasets.lake.file.csv.columns",
                "never guessed",
            ),
            ("path: gs://b/x.parquet\n", "datasets.lake.file.path", "s3://"),
            (
                "path: /x.parquet\ncsv: { columns: [{ name: a, type: INT }] }\n",
                "datasets.lake.file.csv",
                "Parquet",
            ),
            (
                "path: /x.parquet\ns3: { region: eu-west-1 }\n",
                "datasets.lake.file.s3",
                "local path",
            ),
            (
                "path: s3://b/x.parquet\ns3: { endpoint: 'http://h:1' }\n",
                "datasets.lake.file.s3.endpoint",
                "scheme",
            ),
            (
                "path: s3://b/x.parquet\ns3: { url_style: virtual }\n",
                "datasets.lake.file.s3.url_style",
                "path or vhost",
            ),
            (
                "path: /x.csv\ncsv: { columns: [{ name: a, type: \"INT'); DROP\" }] }\n",
                "datasets.lake.file.csv.columns[0].type",
                "DuckDB type",
            ),
            (
                "path: /x.csv\ncsv: { columns: [{ name: a, type: INT }, { name: A, type: INT }] }\n",
                "datasets.lake.file.csv.columns[1].name",
                "twice",
            ),
            (
                "path: /x.csv\ncsv: { delimiter: ';;', columns: [{ name: a, type: INT }] }\n",
                "datasets.lake.file.csv.delimiter",
                "one character",
            ),
        ] {
            let e = refused(yaml);
            assert!(e.contains(key) && e.contains(why), "{yaml}: {e}");
        }
    }
}
