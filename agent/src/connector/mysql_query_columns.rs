//! The type of a MySQL/MariaDB `query:` dataset's column, from the protocol's column
//! definition, spelled as `information_schema.COLUMNS` spells a table's column, so both
//! forms of a dataset go through the one type table (`dialect::mysql::classify`).
//!
//! sqlx names a definition by its flags alone: every `_bin` collation sets the BINARY
//! flag, so a `VARCHAR ... COLLATE utf8mb4_bin` is named `VARBINARY`; `TINYINT(1)` is
//! `BOOLEAN`; a `BIT(5)` is `BIT`, which the type table reads as `BIT(1)` (issue 31
//! F12). Binary is the definition's character set (63, `binary`); the display width
//! tells `TINYINT(1)` and `BIT(n)`, and the flags ZEROFILL, ENUM and SET. sqlx keeps the
//! width and flags private and shows them in its `Debug` form only: where that form
//! cannot be read, a column whose type depends on them is refused, never guessed.

use sqlx::mysql::{MySql, MySqlTypeInfo};
use sqlx::{Type, TypeInfo};

/// The definition's display width and flags, from sqlx's `Debug` form
/// (`MySqlTypeInfo { type: Bit, flags: ColumnFlags(UNSIGNED | BINARY), collation:
/// Collation(63), max_size: Some(5) }`).
#[derive(Debug, PartialEq, Eq)]
struct Definition {
    flags: Vec<String>,
    max_size: Option<u32>,
}

impl Definition {
    fn of(ty: &MySqlTypeInfo) -> Option<Definition> {
        let d = format!("{ty:?}");
        let flags = d.split_once("flags: ColumnFlags(")?.1.split_once(')')?.0;
        let max_size = match d.split_once("max_size: ")?.1 {
            m if m.starts_with("None") => None,
            m => Some(m.strip_prefix("Some(")?.split_once(')')?.0.parse().ok()?),
        };
        Some(Definition {
            flags: flags.split('|').map(|f| f.trim().to_string()).collect(),
            max_size,
        })
    }

    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
}

/// `(DATA_TYPE, COLUMN_TYPE)` of a query's column as a table's would read, or why the
/// column cannot be compared as the query writes it (naming the column).
pub fn column_type(name: &str, ty: &MySqlTypeInfo) -> Result<(String, String), String> {
    let sqlx_name = ty.name().to_ascii_lowercase();
    let def = Definition::of(ty);
    let unknown = |what: &str, cast: &str| {
        format!(
            "column {name} of the query: its {what} is not known from the query's column description; \
             CAST it in the query ({cast})"
        )
    };
    // the string types: text in any character set but binary (the server sends it in
    // the session's utf8mb4), whatever the BINARY flag a `_bin` collation sets
    if <[u8] as Type<MySql>>::compatible(ty) {
        let text = <str as Type<MySql>>::compatible(ty);
        let flag = |f: &str| def.as_ref().is_some_and(|d| d.has(f));
        let pick = |t: &'static str, b: &'static str| if text { t } else { b };
        let base = match sqlx_name.as_str() {
            _ if text && (sqlx_name == "enum" || flag("ENUM")) => "enum",
            _ if text && flag("SET") => "set",
            "char" | "binary" => pick("char", "binary"),
            "varchar" | "varbinary" => pick("varchar", "varbinary"),
            "tinytext" | "tinyblob" => pick("tinytext", "tinyblob"),
            "text" | "blob" => pick("text", "blob"),
            "mediumtext" | "mediumblob" => pick("mediumtext", "mediumblob"),
            "longtext" | "longblob" => pick("longtext", "longblob"),
            // a text-or-binary type the table does not know of is refused there too
            _ => return Ok((sqlx_name.clone(), sqlx_name)),
        };
        return Ok((base.into(), base.into()));
    }
    let data_type = sqlx_name.split_whitespace().next().unwrap_or("").to_string();
    match data_type.as_str() {
        // sqlx's name of a TINYINT of display width 1 (signed or not)
        "boolean" => Ok(("tinyint".into(), "tinyint(1)".into())),
        "bit" => {
            let n = def
                .and_then(|d| d.max_size)
                .ok_or_else(|| unknown("BIT width", "CAST(x AS UNSIGNED), or BIN(x)"))?;
            Ok(("bit".into(), format!("bit({n})")))
        }
        "tinyint" | "smallint" | "mediumint" | "int" | "bigint" | "decimal" | "float" | "double" => {
            let def =
                def.ok_or_else(|| unknown("ZEROFILL flag", "CAST(x AS SIGNED) or CAST(x AS DECIMAL(p, s))"))?;
            let zerofill = if def.has("ZEROFILL") { " zerofill" } else { "" };
            Ok((data_type, format!("{sqlx_name}{zerofill}")))
        }
        _ => Ok((data_type, sqlx_name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_definition_reads_from_sqlxs_debug_form() {
        // the one definition sqlx lets a caller make: an ENUM parameter's
        let d = Definition::of(&MySqlTypeInfo::__enum()).expect("sqlx's Debug form is read");
        assert_eq!(
            d,
            Definition {
                flags: vec!["ENUM".into()],
                max_size: None
            }
        );
        assert_eq!(
            column_type("e", &MySqlTypeInfo::__enum()),
            Ok(("enum".into(), "enum".into()))
        );
    }
}
