//! SQLite. It has no MD5 or SHA-256 in SQL, and its values are dynamically typed, so
//! the agent reads raw values and renders and hashes them in-process (DESIGN §6);
//! SQL is used only to select the rows of a segment.

use tally_common::checksum::HashMethod;
use tally_common::segment::KeyPart;
use tally_common::types::TypeClass;

use super::Dialect;
use crate::schema::{BoundColumn, ColumnInfo, Declared, TypeEntry};

/// SQLite's type table over the declared type names this agent recognises (SQLite
/// itself accepts any name). Every name not listed is `Other`: a run naming such a
/// column is refused rather than guessed at.
pub fn classify(declared: &str) -> TypeEntry {
    use TypeClass::*;
    let d = Declared::parse(declared);
    match d.base.as_str() {
        "integer" | "int" | "bigint" | "smallint" | "tinyint" | "mediumint" | "int2" | "int4" | "int8"
        | "unsigned big int" => TypeEntry::of(Integer),
        "numeric" | "decimal" => TypeEntry::of(Decimal).scale(d.arg(1).or(d.arg(0).map(|_| 0))),
        "real" | "double" | "double precision" | "float" => TypeEntry::of(Float),
        "boolean" | "bool" => TypeEntry::of(Boolean),
        "text" | "varchar" | "character varying" | "nvarchar" | "varying character" | "clob" | "string" => {
            TypeEntry::of(Text)
        }
        "char" | "character" | "nchar" | "native character" => TypeEntry::of(Text).fixed(),
        "date" => TypeEntry::of(Date),
        "datetime" | "timestamp" => TypeEntry::of(Timestamp).scale(d.arg(0)),
        "timestamptz" => TypeEntry::of(TimestampTz).scale(d.arg(0)),
        "time" => TypeEntry::of(Time).scale(d.arg(0)),
        "uuid" => TypeEntry::of(Uuid),
        "blob" | "binary" | "varbinary" => TypeEntry::of(Binary),
        "json" => TypeEntry::of(Json),
        _ => TypeEntry::OTHER,
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Sqlite;

impl Dialect for Sqlite {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn quote(&self, ident: &str) -> String {
        format!("\"{}\"", ident.replace('"', "\"\""))
    }

    fn placeholder(&self, _n: usize) -> String {
        "?".into()
    }

    fn literal(&self, v: &KeyPart) -> String {
        match v {
            KeyPart::Int(i) => i.to_string(),
            KeyPart::Text(s) => format!("CAST(X'{}' AS TEXT)", hex::encode(s)),
        }
    }

    fn bytewise(&self, e: &str) -> String {
        format!("({e}) COLLATE BINARY")
    }

    fn key_expr(&self, col: &ColumnInfo) -> String {
        match col.class {
            // BINARY is memcmp: bytewise, whatever collation the column declares
            TypeClass::Text => format!("{} COLLATE BINARY", self.quote(&col.name)),
            _ => self.quote(&col.name),
        }
    }

    fn canonical_expr(&self, _col: &BoundColumn) -> Option<String> {
        None
    }

    fn field_expr(&self, canonical: &str) -> String {
        format!("COALESCE(LENGTH(CAST({canonical} AS BLOB)) || ':' || {canonical}, '~')")
    }

    fn concat(&self, parts: &[String]) -> String {
        parts.join(" || ")
    }

    fn row_hash_expr(&self, _row: &str, _method: HashMethod, _key: Option<&[u8; 32]>) -> Option<String> {
        None
    }

    fn bucket_hash_expr(&self, _key_row: &str, _key: Option<&[u8; 32]>) -> Option<String> {
        None
    }

    fn xor_aggregate(&self, _h: &str) -> Option<String> {
        None
    }

    fn sum_text(&self, h: &str) -> String {
        format!("CAST(SUM({h}) AS TEXT)")
    }

    fn int_div(&self, a: &str, b: &str) -> String {
        format!("({a} / {b})")
    }

    fn int_text(&self, e: &str) -> String {
        format!("CAST({e} AS TEXT)")
    }
}

#[cfg(test)]
mod tests {
    use tally_common::canonical::FieldFormat;
    use tally_common::segment::{ColumnSpec, KeyPart, Segment};

    use super::*;
    use crate::config::Source;
    use crate::dialect::{FetchShape, count_rows, fetch_rows, investigation_sql};

    fn col(name: &str, class: TypeClass) -> BoundColumn {
        BoundColumn {
            info: ColumnInfo {
                name: name.into(),
                class,
                declared_type: String::new(),
                nullable: true,
                scale: None,
                fixed_char: false,
                native: Default::default(),
            },
            spec: ColumnSpec {
                name: name.into(),
                format: FieldFormat::new(class),
            },
            zone: None,
        }
    }

    #[test]
    fn golden_fetch_and_count() {
        let cols = [
            col("region", TypeClass::Text),
            col("id", TypeClass::Integer),
            col("amount", TypeClass::Decimal),
        ];
        let key = [&cols[0].info, &cols[1].info];
        let seg = Segment {
            lower: Some(vec![KeyPart::Text("EU".into()), KeyPart::Int(7)]),
            upper: None,
            hash: None,
            period: None,
            window: None,
        };
        let src = Source::Table(vec!["main".into(), "or\"ders".into()]);
        let sql = fetch_rows(&Sqlite, &src, &cols, &key, &seg, FetchShape::Raw, true);
        assert_eq!(
            sql.text,
            "SELECT \"region\" AS \"tally_f0\", \"id\" AS \"tally_f1\", \"amount\" AS \"tally_f2\" FROM \"main\".\"or\"\"ders\" \
             WHERE (\"region\" COLLATE BINARY, \"id\") >= (?, ?) ORDER BY \"region\" COLLATE BINARY, \"id\""
        );
        assert_eq!(sql.binds, vec![KeyPart::Text("EU".into()), KeyPart::Int(7)]);
        let count = count_rows(
            &Sqlite,
            &Source::Query("SELECT * FROM t".into()),
            &key,
            &cols,
            &Segment::whole(),
        )
        .unwrap();
        assert_eq!(count.text, "SELECT COUNT(*) FROM (SELECT * FROM t) \"tally_src\"");
        let inv = investigation_sql(&Sqlite, &src, &cols, &key, &seg, false);
        assert_eq!(
            inv,
            "SELECT \"region\", \"id\", \"amount\" FROM \"main\".\"or\"\"ders\" WHERE (\"region\" COLLATE BINARY, \"id\") >= (CAST(X'4555' AS TEXT), 7) \
             ORDER BY \"region\" COLLATE BINARY, \"id\";"
        );
    }
}
