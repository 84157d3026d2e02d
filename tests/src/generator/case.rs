//! A generated case: a schema on two engines, rows equal by construction on both
//! sides, and a mutation plan whose ground truth follows from the plan alone.

use std::collections::BTreeMap;

use serde_json::Value;

use super::rng::Rng;
use super::values::{
    Cell, Class, Engine, MICROS_PER_DAY, SideForm, TS_INF, V, canonical_time, changed, date_range, date_text,
    random_text, random_value, special_value, spelling, ts_text,
};

/// A column on both sides.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub class: Class,
    /// the declared type on the source and on the target
    pub types: [String; 2],
    /// each side's form of a class with two ([`SideForm::alt`])
    pub alt: [bool; 2],
}

/// The shape of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyShape {
    Int64,
    Int32,
    Text,
    /// text then a 32-bit integer
    TextInt,
    /// an integer on one side, `decimal(12,0)` on the other: keyed by its decimal text
    /// (canonical-form.md §8), which quantile cuts cannot order
    IntDec,
}

impl KeyShape {
    pub fn label(self) -> &'static str {
        match self {
            KeyShape::Int64 => "key int64",
            KeyShape::Int32 => "key int32",
            KeyShape::Text => "key text",
            KeyShape::TextInt => "key text+int",
            KeyShape::IntDec => "key integer/decimal",
        }
    }

    fn classes(self) -> &'static [Class] {
        match self {
            KeyShape::Int64 => &[Class::Int { narrow: false }],
            KeyShape::Int32 => &[Class::Int { narrow: true }],
            KeyShape::Text => &[Class::Text],
            KeyShape::TextInt => &[Class::Text, Class::Int { narrow: true }],
            KeyShape::IntDec => &[Class::IntDec { scale: 0 }],
        }
    }
}

/// Which side a row or mutation is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Source,
    Target,
}

/// One step of a mutation plan, as a replication fault would leave it.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// one column of the target's row at `key` changed
    Change {
        key: Vec<V>,
        col: usize,
        to: V,
        why: &'static str,
    },
    /// the row at `key` is not on `side`
    Delete { key: Vec<V>, side: Side },
    /// a row on the target only
    Insert { row: Vec<Cell> },
    /// a second row with the key of `key` on the target, optionally with one column changed
    Duplicate { key: Vec<V>, change: Option<(usize, V)> },
    /// the target's key re-cased or padded (a text key): one row missing, one extra
    Rekey { key: Vec<V>, to: Vec<V> },
}

impl Mutation {
    pub fn label(&self) -> &'static str {
        match self {
            Mutation::Change { why, .. } => why,
            Mutation::Delete {
                side: Side::Target, ..
            } => "delete",
            Mutation::Delete {
                side: Side::Source, ..
            } => "delete on source",
            Mutation::Insert { .. } => "insert",
            Mutation::Duplicate { .. } => "duplicate key",
            Mutation::Rekey { .. } => "re-keyed",
        }
    }
}

/// A generated case.
#[derive(Debug, Clone)]
pub struct Case {
    pub seed: u64,
    pub source: Engine,
    pub target: Engine,
    pub key_shape: KeyShape,
    /// key columns first
    pub columns: Vec<Column>,
    pub nkeys: usize,
    /// rows equal on both sides, each side with its own spellings: (source, target)
    pub base: Vec<(Vec<Cell>, Vec<Cell>)>,
    pub mutations: Vec<Mutation>,
    /// non-key columns left out of the comparison
    pub exclude: Vec<usize>,
    /// each dataset's `time_zone` (agent config)
    pub zones: [&'static str; 2],
    /// each dataset's `empty_string_is_null` (agent config)
    pub empty_is_null: [bool; 2],
    /// the spec's `window` (live-data.md §2): only rows whose column is at most the
    /// bound are compared, on both sides
    pub window: Option<Window>,
    /// the spec's `overrides`: a compared decimal's scale or a timestamp's precision
    /// (docs/results.md), by column
    pub overrides: Vec<(usize, u8)>,
}

/// A window over an integer, date, timestamp or instant column.
#[derive(Debug, Clone)]
pub struct Window {
    pub col: usize,
    /// the bound as a value of the column's class
    pub bound: V,
    /// the spec's `as_of`, as written (a timestamp sometimes with digits past the
    /// microsecond, which the agents cut)
    pub as_of: String,
}

impl Window {
    /// Whether a value is inside the window: integers by value, dates and times by
    /// their canonical texts compared bytewise; NULL is outside every window.
    pub fn holds(&self, class: Class, v: &V) -> bool {
        self.holds_at(class, v, &self.bound)
    }

    /// The same with the value and the bound as rendered (cut to an overridden precision).
    fn holds_at(&self, class: Class, v: &V, bound: &V) -> bool {
        match (v, bound) {
            (V::Null, _) => false,
            (V::Int(a), V::Int(b)) => a <= b,
            _ => {
                let text = |v: &V| canonical_time(class, v).expect("a time value");
                text(v).as_bytes() <= text(bound).as_bytes()
            }
        }
    }
}

/// Zones a dataset may be read in (fixed offsets: the agent takes no named zones).
pub const ZONES: &[&str] = &["UTC", "+02:00", "-05:30", "+14:00", "-09:00"];

fn offset_minutes(zone: &str) -> i32 {
    if zone == "UTC" {
        return 0;
    }
    let sign = if zone.starts_with('-') { -1 } else { 1 };
    sign * (zone[1..3].parse::<i32>().unwrap() * 60 + zone[4..6].parse::<i32>().unwrap())
}

impl Case {
    /// A random case between two engines, from `seed` alone.
    pub fn generate(seed: u64, source: Engine, target: Engine) -> Case {
        let mut r = Rng::new(seed);
        let zones = [*r.pick(ZONES), *r.pick(ZONES)];
        let zones = if r.chance(0.5) { zones } else { ["UTC", "UTC"] };
        let empty_is_null = [r.chance(0.15), r.chance(0.15)];
        let no_empty_keys = empty_is_null.contains(&true);
        let special = (source == target).then_some(source);
        let key_shape = *r.pick(&[
            KeyShape::Int64,
            KeyShape::Int32,
            KeyShape::Text,
            KeyShape::TextInt,
            KeyShape::Int64,
            KeyShape::Int32,
            KeyShape::Text,
            KeyShape::TextInt,
            KeyShape::IntDec,
        ]);
        let mut columns = Vec::new();
        for (i, class) in key_shape.classes().iter().enumerate() {
            columns.push(column(&mut r, format!("k{i}"), *class, source, target, true));
        }
        let nkeys = columns.len();
        let ncols = 1 + r.below(6) as usize;
        for i in 0..ncols {
            let class = *r.pick(Class::value_classes());
            columns.push(column(&mut r, format!("c{i}"), class, source, target, false));
        }
        // most cases get a time column, so strategy time applies
        if r.chance(0.7) && !columns.iter().any(|c| c.class.is_time()) {
            let class = *r.pick(&[Class::Date, Class::Ts]);
            columns.push(column(&mut r, format!("c{ncols}"), class, source, target, false));
        }
        let n = *r.pick(&[0usize, 1, 3, 20, 60, 150, 300, 500]);
        let mut keys = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        let mut attempts = 0;
        while keys.len() < n && attempts < n * 20 {
            attempts += 1;
            let k = random_key(&mut r, key_shape, keys.len());
            if no_empty_keys && k.contains(&V::Text(String::new())) {
                continue;
            }
            if seen.insert(key_json(&k)) {
                keys.push(k);
            }
        }
        let base = keys
            .into_iter()
            .map(|k| {
                let vals: Vec<V> = columns[nkeys..]
                    .iter()
                    .map(|c| value(&mut r, c.class, special))
                    .collect();
                let side = |r: &mut Rng| -> Vec<Cell> {
                    k.iter()
                        .chain(&vals)
                        .map(|v| Cell {
                            v: v.clone(),
                            spelling: spelling(r, v),
                        })
                        .collect()
                };
                (side(&mut r), side(&mut r))
            })
            .collect::<Vec<_>>();
        // MariaDB's JSON reads as text in a `query:` (docs/engines.md), Spark keeps JSON
        // as STRING, and text against text compares the spelling: between two such
        // datasets both sides spell a document alike, so the truth is the same whatever
        // the form
        let mut base = base;
        let texts_json = |e: Engine| matches!(e, Engine::My | Engine::Spark);
        if texts_json(source) && texts_json(target) {
            for (s, t) in &mut base {
                for (c, col) in columns.iter().enumerate() {
                    if col.class == Class::Json {
                        t[c].spelling = s[c].spelling;
                    }
                }
            }
        }
        let mut case = Case {
            seed,
            source,
            target,
            key_shape,
            columns,
            nkeys,
            base,
            mutations: Vec::new(),
            exclude: Vec::new(),
            zones,
            empty_is_null,
            window: None,
            overrides: Vec::new(),
        };
        if case.columns.len() > case.nkeys + 1 && r.chance(0.2) {
            let c = case.nkeys + r.below((case.columns.len() - case.nkeys) as u64) as usize;
            case.exclude.push(c);
        }
        if r.chance(0.3) {
            case.window = case.random_window(&mut r);
        }
        if r.chance(0.25) {
            case.overrides = case.random_overrides(&mut r);
        }
        let nmut = if r.chance(0.2) { 0 } else { 1 + r.below(8) as usize };
        for _ in 0..nmut {
            if let Some(m) = case.random_mutation(&mut r) {
                case.mutations.push(m);
            }
        }
        case
    }

    /// A window over a column that can have one (a key or compared integer, date,
    /// timestamp or instant), bounded at one of its values or a unit either side.
    fn random_window(&self, r: &mut Rng) -> Option<Window> {
        let cols: Vec<usize> = (0..self.columns.len())
            .filter(|c| *c < self.nkeys || !self.exclude.contains(c))
            .filter(|c| {
                matches!(
                    self.columns[*c].class,
                    Class::Int { .. } | Class::Date | Class::Ts | Class::Instant
                )
            })
            .collect();
        if cols.is_empty() {
            return None;
        }
        let col = *r.pick(&cols);
        let class = self.columns[col].class;
        let (lo, hi) = date_range();
        let finite = |v: &V| match v {
            V::Int(_) => true,
            V::Date(d) => (lo..=hi).contains(d),
            V::Ts(t) => (lo as i64 * MICROS_PER_DAY..(hi as i64 + 1) * MICROS_PER_DAY).contains(t),
            _ => false,
        };
        let held: Vec<&V> = self
            .base
            .iter()
            .map(|(s, _)| &s[col].v)
            .filter(|v| finite(v))
            .collect();
        let at = if held.is_empty() || r.chance(0.1) {
            loop {
                let v = random_value(r, class);
                if finite(&v) {
                    break v;
                }
            }
        } else {
            (*r.pick(&held)).clone()
        };
        let step = *r.pick(&[0i64, 0, -1, 1]);
        let bound = match at {
            V::Int(i) => V::Int(i.saturating_add(step)),
            V::Date(d) => V::Date((d + step as i32).clamp(lo, hi)),
            V::Ts(t) => V::Ts(t + step),
            v => v,
        };
        if !finite(&bound) {
            return None;
        }
        let as_of = match (&bound, class) {
            (V::Int(i), _) => i.to_string(),
            (V::Date(d), _) => date_text(*d),
            (V::Ts(t), Class::Instant) => format!("{}Z", ts_text(*t).replace(' ', "T")),
            // digits past the microsecond are cut to the column's precision
            (V::Ts(t), _) if r.chance(0.3) => format!("{}999", ts_text(*t)),
            (V::Ts(t), _) => ts_text(*t),
            _ => unreachable!(),
        };
        Some(Window { col, bound, as_of })
    }

    /// Overrides of one or two compared decimals (a scale from 0 to 5: below, at or
    /// above the declared one) or timestamps (a precision from 0 to 6).
    fn random_overrides(&self, r: &mut Rng) -> Vec<(usize, u8)> {
        let cols: Vec<usize> = (self.nkeys..self.columns.len())
            .filter(|c| !self.exclude.contains(c))
            .filter(|c| {
                matches!(
                    self.columns[*c].class,
                    Class::Dec { .. }
                        | Class::DecDbl { .. }
                        | Class::IntDec { .. }
                        | Class::Ts
                        | Class::Instant
                )
            })
            .collect();
        let mut out: Vec<(usize, u8)> = Vec::new();
        for _ in 0..1 + r.below(2) {
            if cols.is_empty() {
                break;
            }
            let c = *r.pick(&cols);
            let n = match self.columns[c].class {
                Class::Ts | Class::Instant => r.below(7) as u8,
                _ => r.below(6) as u8,
            };
            if !out.iter().any(|(o, _)| *o == c) {
                out.push((c, n));
            }
        }
        out
    }

    /// A value as column `col` is rendered: a decimal rounded half away from zero at
    /// an overridden scale, a timestamp's digits past an overridden precision cut.
    pub fn rendered(&self, col: usize, v: &V) -> V {
        let Some(&(_, n)) = self.overrides.iter().find(|(c, _)| *c == col) else {
            return v.clone();
        };
        match (self.columns[col].class, v) {
            (Class::Dec { scale } | Class::DecDbl { scale }, V::Dec(u)) if n < scale => {
                let d = 10i64.pow((scale - n) as u32);
                let (q, rem) = (u / d, u % d);
                V::Dec(if rem.abs() * 2 >= d { q + u.signum() } else { q })
            }
            (Class::Dec { scale } | Class::DecDbl { scale }, V::Dec(u)) => {
                V::Dec(u * 10i64.pow((n - scale) as u32))
            }
            (Class::Ts | Class::Instant, V::Ts(t)) if t.abs() != TS_INF => {
                V::Ts(t - t.rem_euclid(10i64.pow(6 - n as u32)))
            }
            (Class::Ts, V::Raw(text)) => {
                let dot = text.find('.').expect("a fraction");
                let keep = if n == 0 { dot } else { dot + 1 + n as usize };
                V::Raw(text[..keep].to_string())
            }
            _ => v.clone(),
        }
    }

    /// Whether a row of one side is inside the window (every row without one).
    fn in_window(&self, row: &[Cell]) -> bool {
        match &self.window {
            Some(w) => w.holds_at(
                self.columns[w.col].class,
                &self.rendered(w.col, &row[w.col].v),
                &self.rendered(w.col, &w.bound),
            ),
            None => true,
        }
    }

    /// A change that moves a row across the window's edge: one inside to just past
    /// the bound, one outside (or NULL) onto it.
    fn across_window(&self, r: &mut Rng) -> Option<Mutation> {
        let w = self.window.as_ref()?;
        if w.col < self.nkeys || self.base.is_empty() {
            return None;
        }
        let class = self.columns[w.col].class;
        let (row, _) = &self.base[r.below(self.base.len() as u64) as usize];
        let to = if w.holds(class, &row[w.col].v) {
            match (&w.bound, class) {
                (V::Int(i), Class::Int { narrow: true }) if *i < i32::MAX as i64 => V::Int(i + 1),
                (V::Int(i), Class::Int { narrow: false }) if *i < i64::MAX => V::Int(i + 1),
                (V::Date(d), _) if *d < date_range().1 => V::Date(d + 1),
                // never past 9999-12-31 23:59:59.999999, which no engine but PostgreSQL stores
                (V::Ts(t), _) if *t < (date_range().1 as i64 + 1) * MICROS_PER_DAY - 1 => V::Ts(t + 1),
                _ => return None,
            }
        } else {
            match (&w.bound, class) {
                // a bound one below i32::MIN (or above i32::MAX) is no value of the column
                (V::Int(i), Class::Int { narrow: true }) if i32::try_from(*i).is_err() => return None,
                (b, _) => b.clone(),
            }
        };
        Some(Mutation::Change {
            key: key_of(row, self.nkeys),
            col: w.col,
            to,
            why: "across the window",
        })
    }

    fn random_mutation(&self, r: &mut Rng) -> Option<Mutation> {
        if self.window.is_some() && r.chance(0.25) {
            return self.across_window(r);
        }
        let kind = r.below(10);
        if kind == 9 {
            let key = loop {
                let at = r.below(1_000_000) as usize;
                let k = random_key(r, self.key_shape, at);
                let empty = self.empty_is_null.contains(&true) && k.contains(&V::Text(String::new()));
                if !empty && !self.base.iter().any(|(s, _)| key_of(s, self.nkeys) == k) {
                    break k;
                }
            };
            let row = key
                .into_iter()
                .chain(
                    self.columns[self.nkeys..]
                        .iter()
                        .map(|c| value(r, c.class, self.special())),
                )
                .map(Cell::plain)
                .collect();
            return Some(Mutation::Insert { row });
        }
        if self.base.is_empty() {
            return None;
        }
        let (row, _) = &self.base[r.below(self.base.len() as u64) as usize];
        let key = key_of(row, self.nkeys);
        Some(match kind {
            0..=4 if self.columns.len() > self.nkeys => {
                let col = self.nkeys + r.below((self.columns.len() - self.nkeys) as u64) as usize;
                let (to, why) = changed(r, self.columns[col].class, &row[col].v);
                Mutation::Change { key, col, to, why }
            }
            5 => Mutation::Delete {
                key,
                side: Side::Target,
            },
            6 => Mutation::Delete {
                key,
                side: Side::Source,
            },
            7 => {
                let change = (self.columns.len() > self.nkeys && r.chance(0.5)).then(|| {
                    let col = self.nkeys + r.below((self.columns.len() - self.nkeys) as u64) as usize;
                    (col, changed(r, self.columns[col].class, &row[col].v).0)
                });
                Mutation::Duplicate { key, change }
            }
            8 if matches!(self.key_shape, KeyShape::Text | KeyShape::TextInt) => {
                let V::Text(s) = &key[0] else { unreachable!() };
                let t = match r.below(3) {
                    0 => format!("{s} "),
                    1 => s.to_uppercase(),
                    _ => format!("{s}\u{301}"),
                };
                let mut to = key.clone();
                to[0] = V::Text(t);
                if to == key || self.base.iter().any(|(s, _)| key_of(s, self.nkeys) == to) {
                    return None;
                }
                Mutation::Rekey { key, to }
            }
            _ => Mutation::Delete {
                key,
                side: Side::Target,
            },
        })
    }

    /// The two sides' rows after the mutation plan.
    pub fn sides(&self) -> [Vec<Vec<Cell>>; 2] {
        let mut src: Vec<Vec<Cell>> = self.base.iter().map(|(s, _)| s.clone()).collect();
        let mut tgt: Vec<Vec<Cell>> = self.base.iter().map(|(_, t)| t.clone()).collect();
        let k = self.nkeys;
        for m in &self.mutations {
            match m {
                Mutation::Change { key, col, to, .. } => {
                    for row in tgt.iter_mut().filter(|row| key_of(row, k) == *key) {
                        row[*col] = Cell::plain(to.clone());
                    }
                }
                Mutation::Delete { key, side } => {
                    let rows = if *side == Side::Source { &mut src } else { &mut tgt };
                    rows.retain(|row| key_of(row, k) != *key);
                }
                Mutation::Insert { row } => tgt.push(row.clone()),
                Mutation::Duplicate { key, change } => {
                    if let Some(row) = tgt.iter().find(|row| key_of(row, k) == *key) {
                        let mut copy = row.clone();
                        if let Some((col, v)) = change {
                            copy[*col] = Cell::plain(v.clone());
                        }
                        tgt.push(copy);
                    }
                }
                Mutation::Rekey { key, to } => {
                    for row in tgt.iter_mut().filter(|row| key_of(row, k) == *key) {
                        for (i, v) in to.iter().enumerate() {
                            row[i] = Cell::plain(v.clone());
                        }
                    }
                }
            }
        }
        [src, tgt]
    }

    /// The differences Tally must report: `(kind, key as JSON)`.
    pub fn truth(&self) -> Truth {
        let [src, tgt] = self.sides();
        let group = |rows: &[Vec<Cell>], side: usize| {
            let mut m: BTreeMap<String, Vec<Vec<V>>> = BTreeMap::new();
            // a window leaves out each side's rows past its bound
            let inside = |row: &&Vec<Cell>| self.in_window(row);
            for row in rows.iter().filter(inside) {
                m.entry(key_json(&key_of(row, self.nkeys)))
                    .or_default()
                    .push(self.compared(row, side));
            }
            m
        };
        let (s, t) = (group(&src, 0), group(&tgt, 1));
        let mut truth = Truth::default();
        let keys: std::collections::BTreeSet<&String> = s.keys().chain(t.keys()).collect();
        let none = Vec::new();
        for k in keys {
            let (rs, rt) = (s.get(k).unwrap_or(&none), t.get(k).unwrap_or(&none));
            let kind = if rt.is_empty() {
                "missing_in_target"
            } else if rs.is_empty() {
                "extra_in_target"
            } else if same_rows(rs, rt) {
                continue;
            } else {
                "changed"
            };
            let k = self.reported_key(k);
            if rs.len() > 1 || rt.len() > 1 {
                truth.duplicates.insert(k.clone(), (rs.len(), rt.len()));
            }
            truth.diffs.insert((kind.into(), k));
        }
        truth
    }

    /// A key as a result lists it: an integer keyed against a decimal is the decimal's
    /// text (canonical-form.md §8), every other key part as the generator holds it.
    fn reported_key(&self, key_json: &str) -> String {
        if self.key_shape != KeyShape::IntDec {
            return key_json.to_string();
        }
        let parts: Vec<Value> = serde_json::from_str(key_json).expect("a key array");
        Value::Array(
            parts
                .into_iter()
                .map(|p| match p {
                    Value::Number(n) => Value::from(n.to_string()),
                    p => p,
                })
                .collect(),
        )
        .to_string()
    }

    /// A row's compared values (every non-key column not excluded): a text's
    /// trailing spaces (U+0020 only) removed where either side declares it `CHAR(n)`
    /// (canonical-form.md, Padding: on both sides), then an empty text as NULL where
    /// the side's dataset says `empty_string_is_null` (after the padding is removed).
    fn compared(&self, row: &[Cell], side: usize) -> Vec<V> {
        (self.nkeys..self.columns.len())
            .filter(|c| !self.exclude.contains(c))
            .map(|c| {
                let col = &self.columns[c];
                let v = match &self.rendered(c, &row[c].v) {
                    V::Text(t) if col.class == Class::CharText && col.alt.contains(&true) => {
                        V::Text(t.trim_end_matches(' ').to_string())
                    }
                    v => v.clone(),
                };
                match v {
                    V::Text(t) if t.is_empty() && self.empty_is_null[side] => V::Null,
                    v => v,
                }
            })
            .collect()
    }

    /// The engine whose own values (infinities, BC years, zero dates) both sides hold.
    pub fn special(&self) -> Option<Engine> {
        (self.source == self.target).then_some(self.source)
    }

    /// Whether any value of the case is one only its engine has.
    pub fn has_special_values(&self) -> bool {
        let (lo, hi) = super::values::date_range();
        let [s, t] = self.sides();
        s.iter().chain(&t).flatten().any(|c| match &c.v {
            V::Raw(_) => true,
            V::Date(d) => *d < lo || *d > hi,
            V::Ts(x) => {
                *x < lo as i64 * super::values::MICROS_PER_DAY
                    || *x >= (hi as i64 + 1) * super::values::MICROS_PER_DAY
            }
            _ => false,
        })
    }

    /// How side `side` writes column `col`.
    pub fn side_form(&self, side: usize, col: usize) -> SideForm {
        SideForm {
            alt: self.columns[col].alt[side],
            offset_minutes: offset_minutes(self.zones[side]),
        }
    }

    /// The first column of a time class that is compared (strategy time's column).
    pub fn time_column(&self) -> Option<&Column> {
        (self.nkeys..self.columns.len())
            .filter(|c| !self.exclude.contains(c))
            .map(|c| &self.columns[c])
            .find(|c| c.class.is_time())
    }

    /// The non-key columns compared (not excluded), by index.
    pub fn compared_columns(&self) -> impl Iterator<Item = usize> + '_ {
        (self.nkeys..self.columns.len()).filter(|c| !self.exclude.contains(c))
    }

    pub fn has_class(&self, f: impl Fn(Class) -> bool) -> bool {
        self.columns.iter().any(|c| f(c.class))
    }
}

/// What a run must report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Truth {
    pub diffs: std::collections::BTreeSet<(String, String)>,
    /// listed keys that a side holds more than once: (rows on the source, on the target)
    pub duplicates: BTreeMap<String, (usize, usize)>,
}

impl Truth {
    pub fn is_match(&self) -> bool {
        self.diffs.is_empty()
    }
}

/// Whether two sides hold the same rows of a key, as many times each.
fn same_rows(a: &[Vec<V>], b: &[Vec<V>]) -> bool {
    let count = |rows: &[Vec<V>], r: &Vec<V>| rows.iter().filter(|x| *x == r).count();
    a.len() == b.len() && a.iter().all(|r| count(a, r) == count(b, r))
}

/// A value of a class, sometimes one only the case's engine has.
fn value(r: &mut Rng, class: Class, special: Option<Engine>) -> V {
    if let Some(e) = special
        && r.chance(0.12)
        && let Some(v) = special_value(r, class, e)
    {
        return v;
    }
    random_value(r, class)
}

/// A column of a class; a key column keeps its class (the key's values are drawn for it).
fn column(r: &mut Rng, name: String, class: Class, source: Engine, target: Engine, key: bool) -> Column {
    // an integer column narrower on one side holds values both sides store
    let pads = [source.pads_char(), target.pads_char()];
    // Spark keeps a UUID as STRING, and text against a UUID is schema drift: such a
    // column makes the whole run a refusal, so against an engine with a UUID type it
    // is mostly drawn as text instead (a refusal still comes up in a quarter of them)
    let spark = [source, target].contains(&Engine::Spark);
    let class = match class {
        Class::Uuid if spark && source != target && r.chance(0.75) => Class::Text,
        Class::Int { narrow: false } if !key && r.chance(0.2) => Class::Int { narrow: true },
        // padding needs a side that pads
        Class::CharText if key || pads == [false, false] => Class::Text,
        c => c,
    };
    let v = r.below(6) as u8;
    let w = r.below(6) as u8;
    let alt = match class {
        Class::Instant => [[true, false], [false, true], [true, true]][r.below(3) as usize],
        Class::IntDec { .. } | Class::DecDbl { .. } => {
            let a = r.chance(0.5);
            [a, !a]
        }
        Class::CharText => {
            let a = *r.pick(&[[true, false], [false, true], [true, true]]);
            let a = [a[0] && pads[0], a[1] && pads[1]];
            if a == [false, false] { pads } else { a }
        }
        _ => [false, false],
    };
    let form = |alt| SideForm {
        alt,
        offset_minutes: 0,
    };
    let types = [
        class.side_type(source, v, form(alt[0])),
        class.side_type(target, w, form(alt[1])),
    ];
    // a 32-bit column on one side, 64 on the other: values fit the narrower
    let types = match class {
        Class::Int { narrow: true } if r.chance(0.5) => {
            [Class::Int { narrow: false }.sql_type(source, v), types[1].clone()]
        }
        _ => types,
    };
    Column {
        name,
        class,
        types,
        alt,
    }
}

pub fn key_of(row: &[Cell], nkeys: usize) -> Vec<V> {
    row[..nkeys].iter().map(|c| c.v.clone()).collect()
}

/// The key as `tally run --json` prints it.
pub fn key_json(key: &[V]) -> String {
    Value::Array(
        key.iter()
            .map(|v| match v {
                V::Int(i) => Value::from(*i),
                V::Text(s) => Value::from(s.clone()),
                other => unreachable!("key value {other:?}"),
            })
            .collect(),
    )
    .to_string()
}

fn random_key(r: &mut Rng, shape: KeyShape, i: usize) -> Vec<V> {
    let int = |r: &mut Rng, narrow: bool| -> V {
        if r.chance(0.05) {
            let edges: &[i64] = if narrow {
                &[i32::MIN as i64, i32::MAX as i64, 0, -1]
            } else {
                &[i64::MIN, i64::MAX, 0, -1, i64::MIN + 1]
            };
            V::Int(*r.pick(edges))
        } else if r.chance(0.7) {
            V::Int(1000 + 3 * i as i64)
        } else if narrow {
            V::Int(r.range_i64(i32::MIN as i64, i32::MAX as i64))
        } else {
            V::Int(r.next_u64() as i64)
        }
    };
    let text = |r: &mut Rng| -> V {
        if r.chance(0.6) {
            V::Text(format!("k{:05}", i))
        } else {
            V::Text(random_text(r, 6))
        }
    };
    match shape {
        // within the decimal side's 12 digits
        KeyShape::IntDec => vec![match int(r, false) {
            V::Int(i) if i.unsigned_abs() > 999_999_999_999 => V::Int(i % 1_000_000_000_000),
            v => v,
        }],
        KeyShape::Int64 => vec![int(r, false)],
        KeyShape::Int32 => vec![int(r, true)],
        KeyShape::Text => vec![text(r)],
        KeyShape::TextInt => vec![
            V::Text(r.pick(&["", "a", "A", "a ", "b", "é", "e\u{301}"]).to_string()),
            int(r, true),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(name: &str, class: Class) -> Column {
        Column {
            name: name.into(),
            class,
            types: [class.sql_type(Engine::Pg, 0), class.sql_type(Engine::My, 0)],
            alt: [false, false],
        }
    }

    /// A case with a key and one time column, every row at `v`, windowed at `v`.
    fn at_the_edge(class: Class, v: V) -> Case {
        let mut case = Case::generate(1, Engine::Pg, Engine::My);
        case.key_shape = KeyShape::Int64;
        case.nkeys = 1;
        case.columns = vec![column("k0", Class::Int { narrow: false }), column("c0", class)];
        case.base = (0..5)
            .map(|i| {
                let row = vec![Cell::plain(V::Int(i)), Cell::plain(v.clone())];
                (row.clone(), row)
            })
            .collect();
        case.exclude.clear();
        case.overrides.clear();
        case.mutations.clear();
        case.window = Some(Window {
            col: 1,
            bound: v,
            as_of: String::new(),
        });
        case
    }

    /// MariaDB, SQLite, DuckDB and Spark store 0001-01-01 to 9999-12-31 only: a row
    /// inside a window bounded at the last microsecond (or day) is never moved past it.
    #[test]
    fn a_window_at_the_last_instant_moves_no_row_past_9999() {
        let (lo, hi) = date_range();
        let top = (hi as i64 + 1) * MICROS_PER_DAY - 1;
        for (class, v) in [(Class::Ts, V::Ts(top)), (Class::Date, V::Date(hi))] {
            let case = at_the_edge(class, v);
            for seed in 0..200 {
                if let Some(Mutation::Change { to, .. }) = case.across_window(&mut Rng::new(seed)) {
                    match to {
                        V::Ts(t) => {
                            assert!((lo as i64 * MICROS_PER_DAY..=top).contains(&t), "{}", ts_text(t))
                        }
                        V::Date(d) => assert!((lo..=hi).contains(&d), "{}", date_text(d)),
                        v => panic!("{v:?}"),
                    }
                }
            }
        }
    }

    /// Between engines without values of their own, no generated date or timestamp,
    /// base row or mutation, is outside 0001-01-01 to 9999-12-31.
    #[test]
    fn generated_times_stay_within_every_engine_s_range() {
        let (lo, hi) = date_range();
        let (tlo, thi) = (lo as i64 * MICROS_PER_DAY, (hi as i64 + 1) * MICROS_PER_DAY - 1);
        for seed in 0..400 {
            let case = Case::generate(seed, Engine::My, Engine::Lite);
            for row in case.sides().iter().flatten() {
                for c in row {
                    match c.v {
                        V::Date(d) => assert!((lo..=hi).contains(&d), "seed {seed}: {}", date_text(d)),
                        V::Ts(t) => assert!((tlo..=thi).contains(&t), "seed {seed}: {}", ts_text(t)),
                        _ => {}
                    }
                }
            }
        }
    }
}
