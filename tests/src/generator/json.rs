//! The generator's JSON documents: a small tree, its RFC 8785 (JCS) text, which is what
//! two documents are compared by (canonical-form.md §1), and equal spellings of it
//! (whitespace, key order, number forms, `\u` escapes): traps for false differences.

use super::rng::Rng;

/// A JSON document. Two are equal exactly when their JCS texts are.
#[derive(Debug, Clone)]
pub enum J {
    Null,
    Bool(bool),
    /// an integer or a decimal whose shortest form has no exponent in ECMAScript
    Num(f64),
    Str(String),
    Arr(Vec<J>),
    /// members in the generated order, keys distinct
    Obj(Vec<(String, J)>),
}

impl PartialEq for J {
    fn eq(&self, other: &J) -> bool {
        self.jcs() == other.jcs()
    }
}

/// Keys whose UTF-16 order differs from their UTF-8 order (`😀` sorts before `ｚ`).
const KEYS: &[&str] = &["a", "b", "B", "id", "é", "😀", "ｚ", "a b"];
const STRS: &[&str] = &[
    "", "x", "é", "e\u{301}", "中", "😀", "a\"b", "a\\b", "a\nb", "~", " ",
];
const NUMS: &[f64] = &[0.0, 1.0, -1.0, 100.0, 0.5, -2.25, 0.1, 1234.5, 9007199254740991.0];

impl J {
    /// The RFC 8785 text: members sorted by UTF-16 code units, no whitespace, numbers
    /// in ECMAScript form (the generator's numbers print alike in Rust), the RFC's
    /// string escapes.
    pub fn jcs(&self) -> String {
        match self {
            J::Null => "null".into(),
            J::Bool(b) => b.to_string(),
            J::Num(x) => num(*x),
            J::Str(s) => jcs_str(s),
            J::Arr(a) => format!("[{}]", a.iter().map(J::jcs).collect::<Vec<_>>().join(",")),
            J::Obj(m) => {
                let mut m: Vec<&(String, J)> = m.iter().collect();
                m.sort_by_key(|(k, _)| k.encode_utf16().collect::<Vec<u16>>());
                let items: Vec<String> = m
                    .iter()
                    .map(|(k, v)| format!("{}:{}", jcs_str(k), v.jcs()))
                    .collect();
                format!("{{{}}}", items.join(","))
            }
        }
    }

    /// An equal spelling: 0 compact in the generated member order; 1 with whitespace
    /// and the members reversed; 2 with numbers as `1.0`, `0.50` or `1e2`-style forms
    /// and non-ASCII characters as `\u` escapes.
    pub fn spelled(&self, how: u8) -> String {
        let (ws, colon) = if how == 1 { (", \n ", " : ") } else { (",", ":") };
        match self {
            J::Null | J::Bool(_) => self.jcs(),
            J::Num(x) if how == 2 => {
                if x.fract() == 0.0 {
                    format!("{}.0", num(*x))
                } else {
                    format!("{}0", num(*x))
                }
            }
            J::Num(x) => num(*x),
            J::Str(s) if how == 2 => escaped_str(s),
            J::Str(s) => jcs_str(s),
            J::Arr(a) => {
                let items: Vec<String> = a.iter().map(|v| v.spelled(how)).collect();
                format!("[{}]", items.join(ws))
            }
            J::Obj(m) => {
                let mut items: Vec<String> = m
                    .iter()
                    .map(|(k, v)| {
                        let k = if how == 2 { escaped_str(k) } else { jcs_str(k) };
                        format!("{k}{colon}{}", v.spelled(how))
                    })
                    .collect();
                if how == 1 {
                    items.reverse();
                }
                format!("{{{}}}", items.join(ws))
            }
        }
    }

    /// The same document with one value changed (a number off by one, a string with
    /// a character appended, a boolean flipped, a member or element added).
    pub fn changed(&self) -> J {
        let mut j = self.clone();
        if !j.change_first() {
            j = match j {
                J::Arr(mut a) => {
                    a.push(J::Num(7.0));
                    J::Arr(a)
                }
                J::Obj(mut m) => {
                    m.push(("new".into(), J::Null));
                    J::Obj(m)
                }
                J::Null => J::Num(0.0),
                other => J::Arr(vec![other]),
            };
        }
        j
    }

    fn change_first(&mut self) -> bool {
        match self {
            J::Num(x) => {
                *x += 1.0;
                true
            }
            J::Str(s) => {
                s.push('x');
                true
            }
            J::Bool(b) => {
                *b = !*b;
                true
            }
            J::Null => false,
            J::Arr(a) => a.iter_mut().any(J::change_first),
            J::Obj(m) => m.iter_mut().any(|(_, v)| v.change_first()),
        }
    }
}

/// A random document of up to `depth` levels.
pub fn random(r: &mut Rng, depth: u32) -> J {
    match r.below(if depth == 0 { 4 } else { 6 }) {
        0 => J::Num(*r.pick(NUMS)),
        1 => J::Str(r.pick(STRS).to_string()),
        2 => r.pick(&[J::Bool(true), J::Bool(false), J::Null]).clone(),
        3 => J::Num(r.range_i64(-1000, 1000) as f64),
        4 => J::Arr((0..r.below(4)).map(|_| random(r, depth - 1)).collect()),
        _ => {
            let mut keys: Vec<&str> = KEYS.to_vec();
            let n = r.below(5) as usize;
            let mut m = Vec::new();
            for _ in 0..n {
                let k = keys.remove(r.below(keys.len() as u64) as usize);
                m.push((k.to_string(), random(r, depth - 1)));
            }
            J::Obj(m)
        }
    }
}

fn num(x: f64) -> String {
    // ECMAScript prints a zero as 0, and Rust's `{}` gives the shortest round trip
    // without an exponent for every number the generator makes
    if x == 0.0 { "0".into() } else { format!("{x}") }
}

fn jcs_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A string with every non-ASCII character as `\u` escapes (UTF-16 surrogate pairs).
fn escaped_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        if c.is_ascii() {
            let t = jcs_str(&c.to_string());
            out.push_str(&t[1..t.len() - 1]);
        } else {
            let mut buf = [0u16; 2];
            for u in c.encode_utf16(&mut buf) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_are_equal_documents_and_changes_are_not() {
        let mut r = Rng::new(3);
        for _ in 0..2000 {
            let j = random(&mut r, 2);
            for how in 0..3 {
                let v: serde_json::Value = serde_json::from_str(&j.spelled(how)).expect("valid JSON");
                let _ = v;
            }
            assert_ne!(j, j.changed());
        }
        let j = J::Obj(vec![
            ("ｚ".into(), J::Num(1.0)),
            ("😀".into(), J::Arr(vec![J::Num(0.5), J::Str("é".into())])),
        ]);
        assert_eq!(j.jcs(), "{\"😀\":[0.5,\"é\"],\"ｚ\":1}");
        assert_eq!(
            j.spelled(2),
            "{\"\\uff5a\":1.0,\"\\ud83d\\ude00\":[0.50,\"\\u00e9\"]}"
        );
    }
}
