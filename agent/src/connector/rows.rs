//! Rows in canonical form: [`CanonRow`], built field by field by a [`RowBuilder`]
//! from what a driver hands out, and the rows of a pushed-down aggregate.

use tally_common::canonical::{CanonicalError, Value, canonical_from_text_in, canonical_value};
use tally_common::segment::{KeyPart, KeyTuple};
use tally_common::types::TypeClass;

use crate::dialect::{Dialect, FetchShape};
use crate::error::{AgentError, Result};
use crate::schema::{BoundColumn, canonical_error};

use super::AggRow;

/// One row in canonical form: its key, and the canonical row string (every requested
/// column's `LEN:text`, or `~` for NULL, key columns first) with each field's end in it,
/// so the row string and the key string (its prefix) are read without building them.
/// A fetch builds every row in one reused `CanonRow` ([`RowBuilder`]) and lends it to
/// its sink: a sink that keeps a row clones it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CanonRow {
    pub key: KeyTuple,
    line: String,
    ends: Vec<usize>,
}

impl CanonRow {
    /// A row of owned canonical fields (tests, and readers that hand rows over whole).
    pub fn new(key: KeyTuple, fields: &[Option<String>]) -> CanonRow {
        let mut row = CanonRow {
            key,
            ..CanonRow::default()
        };
        for f in fields {
            row.push_field(f.as_deref());
        }
        row
    }

    fn clear(&mut self) {
        self.line.clear();
        self.ends.clear();
    }

    /// Appends one field's canonical text.
    fn push_field(&mut self, canonical: Option<&str>) {
        tally_common::canonical::push_field(&mut self.line, canonical);
        self.ends.push(self.line.len());
    }

    /// The number of fields.
    pub fn width(&self) -> usize {
        self.ends.len()
    }

    /// The canonical text of field `i`, `None` for NULL.
    pub fn field(&self, i: usize) -> Option<&str> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        let enc = &self.line[start..self.ends[i]];
        // `~` or `LEN:text`: the length's digits hold no ':'
        let colon = enc.bytes().position(|b| b == b':')?;
        Some(&enc[colon + 1..])
    }

    /// Every field's canonical text in order.
    pub fn fields(&self) -> impl ExactSizeIterator<Item = Option<&str>> + '_ {
        (0..self.width()).map(|i| self.field(i))
    }

    /// Owned copies of the fields.
    pub fn to_fields(&self) -> Vec<Option<String>> {
        self.fields().map(|f| f.map(str::to_string)).collect()
    }

    /// The row string of every field ([`tally_common::canonical::row_string`]).
    pub fn row_string(&self) -> &str {
        &self.line
    }

    /// The row string of the first `key_len` fields (the key columns).
    pub fn key_string(&self, key_len: usize) -> &str {
        match key_len {
            0 => "",
            n => &self.line[..self.ends[n - 1]],
        }
    }
}

/// Which fields of a fetch arrive as the engine's own text, still to be made canonical
/// in the agent: the cheap texts of a text-shape fetch, and every column SQL cannot
/// render canonically (JSON, a float as a decimal), whatever the shape. This is the
/// one rule [`crate::dialect::fetch_rows`] selects by.
pub fn reread(d: &dyn Dialect, shape: FetchShape, cols: &[BoundColumn]) -> Vec<bool> {
    cols.iter()
        .map(|c| match shape {
            FetchShape::Raw => false,
            FetchShape::Text => d.text_expr(c).is_some() || d.canonical_expr(c).is_none(),
            FetchShape::Canonical => d.canonical_expr(c).is_none(),
        })
        .collect()
}

/// Builds each row of a fetch in one reused [`CanonRow`]: a reader starts a row, pushes
/// its fields as the driver gives them (those marked in `reread` hold the engine's own
/// text and are rendered to canonical form here), and lends the finished row to its sink.
pub struct RowBuilder<'a> {
    dataset: &'a str,
    cols: &'a [BoundColumn],
    key_len: usize,
    reread: &'a [bool],
    row: CanonRow,
    /// Where a re-read value's canonical form is rendered, reused from value to value.
    scratch: String,
}

impl<'a> RowBuilder<'a> {
    pub fn new(dataset: &'a str, cols: &'a [BoundColumn], key_len: usize, reread: &'a [bool]) -> Self {
        RowBuilder {
            dataset,
            cols,
            key_len,
            reread,
            row: CanonRow::default(),
            scratch: String::new(),
        }
    }

    /// Starts the next row.
    pub fn start(&mut self) {
        self.row.clear();
    }

    /// Appends the next field as read. A field past the requested columns is an error
    /// ([`RowBuilder::finish`] checks there were not fewer).
    pub fn push(&mut self, value: Option<&str>) -> Result<()> {
        let i = self.row.width();
        let Some(c) = self.cols.get(i) else {
            return Err(self.shape_error());
        };
        if let Some(text) = value
            && self.reread.get(i).copied().unwrap_or(false)
            && (c.info.class, c.spec.format.class) == (TypeClass::Float, TypeClass::Decimal)
        {
            // a float compared as a decimal: the double its text reads as, at its
            // shortest decimal (an engine's text need not be that: PostgreSQL's is not
            // always), never the digits as written
            let f = text.trim().parse::<f64>().map_err(|_| {
                canonical_error(
                    self.dataset,
                    &c.info.name,
                    CanonicalError::Invalid {
                        class: "float",
                        value: text.to_string(),
                        reason: "not a number",
                    },
                )
            })?;
            let v = canonical_value(&c.spec.format, &Value::Float(f))
                .map_err(|e| canonical_error(self.dataset, &c.info.name, e))?;
            self.row.push_field(v.as_deref());
        } else if value.is_some() && self.reread.get(i).copied().unwrap_or(false) {
            let v = canonical_from_text_in(&c.spec.format, value, &mut self.scratch)
                .map_err(|e| canonical_error(self.dataset, &c.info.name, e))?;
            self.row.push_field(v);
        } else {
            self.row.push_field(value);
        }
        Ok(())
    }

    /// Appends a field already in canonical form (readers that render values themselves).
    pub fn push_canonical(&mut self, value: Option<&str>) -> Result<()> {
        if self.row.width() >= self.cols.len() {
            return Err(self.shape_error());
        }
        self.row.push_field(value);
        Ok(())
    }

    /// The finished row, its key parsed from the key fields.
    pub fn finish(&mut self) -> Result<&CanonRow> {
        if self.row.width() != self.cols.len() {
            return Err(self.shape_error());
        }
        let mut key = std::mem::take(&mut self.row.key);
        key.clear();
        let parsed = key_into(&self.row, self.cols, self.key_len, &mut key);
        self.row.key = key;
        parsed?;
        Ok(&self.row)
    }

    /// A row of owned fields, as [`RowBuilder::push`] would build it field by field.
    pub fn row_of(&mut self, fields: Vec<Option<String>>) -> Result<&CanonRow> {
        self.start();
        for f in &fields {
            self.push(f.as_deref())?;
        }
        self.finish()
    }

    /// A row of owned fields already in canonical form.
    pub fn canonical_row_of(&mut self, fields: &[Option<String>]) -> Result<&CanonRow> {
        self.start();
        for f in fields {
            self.push_canonical(f.as_deref())?;
        }
        self.finish()
    }

    fn shape_error(&self) -> AgentError {
        AgentError::Query {
            dataset: self.dataset.to_string(),
            kind: "unexpected row shape",
        }
    }
}

/// Key parts from a row's canonical key texts. A key is an integer only where it is
/// compared as one: an integer column keyed against the other side's decimal (DESIGN
/// §3) is compared by its decimal text, as that side's is, and may hold what no `i64`
/// does (MySQL `BIGINT UNSIGNED` against PostgreSQL `numeric(20,0)`).
pub(crate) fn key_into(
    row: &CanonRow,
    cols: &[BoundColumn],
    key_len: usize,
    key: &mut KeyTuple,
) -> Result<()> {
    for (i, c) in cols.iter().enumerate().take(key_len) {
        let integer = c.info.class == TypeClass::Integer && c.spec.format.class == TypeClass::Integer;
        key.push(match row.field(i) {
            None => {
                return Err(AgentError::InvalidArgument(format!(
                    "key column {} holds NULL",
                    c.info.name
                )));
            }
            Some(t) if integer => KeyPart::Int(t.parse::<i64>().map_err(|_| {
                AgentError::InvalidArgument(format!("key column {} is not a 64-bit integer", c.info.name))
            })?),
            Some(t) => KeyPart::Text(t.to_string()),
        });
    }
    Ok(())
}

/// One result row of [`crate::dialect::aggregate`] (p, b, n, s, x, first key parts…), read
/// through the driver's accessors: `int` for integer columns, `text` for text ones.
pub fn agg_row(
    dataset: &str,
    key_classes: &[TypeClass],
    int: impl Fn(usize) -> Option<i64>,
    text: impl Fn(usize) -> Result<Option<String>>,
) -> Result<AggRow> {
    let bad = || AgentError::Query {
        dataset: dataset.to_string(),
        kind: "unexpected aggregate row",
    };
    let mut first = Vec::new();
    for (j, class) in key_classes.iter().enumerate() {
        let part = match class {
            TypeClass::Integer => int(5 + j).map(KeyPart::Int),
            _ => text(5 + j).ok().flatten().map(KeyPart::Text),
        };
        match part {
            Some(p) => first.push(p),
            None => break,
        }
    }
    Ok(AggRow {
        parent: int(0).ok_or_else(bad)? as usize,
        child: int(1).ok_or_else(bad)?.max(0) as usize,
        count: int(2).ok_or_else(bad)? as u64,
        sum: parse_sum(dataset, text(3)?)?,
        xor: text(4)?.map(|t| parse_sum(dataset, Some(t))).transpose()?,
        first_key: (first.len() == key_classes.len() && !first.is_empty()).then_some(first),
    })
}

/// Parses the text of an exact SUM or a 64-bit XOR into its u64 bits.
pub fn parse_sum(dataset: &str, s: Option<String>) -> Result<u64> {
    match s {
        None => Ok(0), // SUM over no rows is NULL
        Some(t) => tally_common::checksum::wrap_decimal_sum(&t).ok_or_else(|| AgentError::Query {
            dataset: dataset.to_string(),
            kind: "unparseable checksum sum",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_common::canonical::{FieldFormat, row_string};
    use tally_common::segment::ColumnSpec;

    fn col(name: &str, class: TypeClass, scale: u32) -> BoundColumn {
        BoundColumn {
            info: crate::schema::TypeEntry::of(class).scale(Some(scale)).column(
                name.into(),
                String::new(),
                true,
            ),
            spec: ColumnSpec {
                name: name.into(),
                format: FieldFormat::new(class).with_scale(scale),
            },
            zone: None,
        }
    }

    #[test]
    fn a_reused_row_reads_back_each_row_as_built_alone() {
        let cols = [
            col("id", TypeClass::Integer, 0),
            col("k", TypeClass::Text, 0),
            col("amount", TypeClass::Decimal, 2),
            col("note", TypeClass::Text, 0),
        ];
        // the decimal arrives as the engine's own text and is rendered here
        let reread = [false, false, true, false];
        let mut b = RowBuilder::new("t", &cols, 2, &reread);
        let rows: [[Option<&str>; 4]; 3] = [
            [Some("7"), Some("a:b"), Some("1.5"), None],
            // a text that looks like an encoding, an empty text (not NULL), a longer row
            [Some("-12"), Some("~"), None, Some("")],
            [Some("3"), Some("12:x"), Some("10"), Some("Zoë ~ 3:abc")],
        ];
        let want = [
            [Some("7"), Some("a:b"), Some("1.50"), None],
            [Some("-12"), Some("~"), None, Some("")],
            [Some("3"), Some("12:x"), Some("10.00"), Some("Zoë ~ 3:abc")],
        ];
        for (r, w) in rows.iter().zip(&want) {
            b.start();
            for v in r {
                b.push(*v).unwrap();
            }
            let row = b.finish().unwrap();
            assert_eq!(row.fields().collect::<Vec<_>>(), w.to_vec());
            assert_eq!(row.row_string(), row_string(w.iter().copied()));
            assert_eq!(row.key_string(2), row_string(w[..2].iter().copied()));
            assert_eq!(row.key_string(0), "");
            let key = vec![
                KeyPart::Int(w[0].unwrap().parse().unwrap()),
                KeyPart::Text(w[1].unwrap().to_string()),
            ];
            assert_eq!(row.key, key);
            assert_eq!(*row, CanonRow::new(key, &row.to_fields()));
        }
    }

    #[test]
    fn a_row_of_the_wrong_width_or_a_bad_key_is_refused() {
        let cols = [col("id", TypeClass::Integer, 0), col("v", TypeClass::Text, 0)];
        let mut b = RowBuilder::new("t", &cols, 1, &[]);
        b.start();
        b.push(Some("1")).unwrap();
        assert!(b.finish().is_err(), "a short row");
        b.start();
        for v in [Some("1"), Some("a")] {
            b.push(v).unwrap();
        }
        assert!(b.push(Some("b")).is_err(), "a long row");
        assert!(
            b.canonical_row_of(&[None, Some("a".into())]).is_err(),
            "a NULL key"
        );
        assert!(
            b.canonical_row_of(&[Some("x".into()), Some("a".into())]).is_err(),
            "an integer key that is not one"
        );
        assert_eq!(
            b.canonical_row_of(&[Some("2".into()), None]).unwrap().key,
            vec![KeyPart::Int(2)]
        );
    }

    #[test]
    fn an_integer_key_compared_as_a_decimal_is_its_decimal_text_whatever_its_size() {
        // MySQL BIGINT UNSIGNED keyed against PostgreSQL numeric(20,0): both sides'
        // keys are the decimal's canonical text, beyond i64 too
        let mut id = col("id", TypeClass::Integer, 0);
        id.spec.format = FieldFormat::new(TypeClass::Decimal).with_scale(0);
        let cols = [id, col("v", TypeClass::Text, 0)];
        let mut b = RowBuilder::new("t", &cols, 1, &[]);
        for v in ["18446744073709551615", "77"] {
            let row = b.row_of(vec![Some(v.into()), Some("x".into())]).unwrap();
            assert_eq!(row.key, vec![KeyPart::Text(v.into())]);
        }
    }
}
