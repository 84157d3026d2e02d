//! RFC 8785 (JSON Canonicalization Scheme) for the `json` type class: the document is
//! parsed and written again with object members sorted by their UTF-16 code units, no
//! insignificant whitespace, the RFC's string escapes, and numbers as IEEE 754 doubles
//! in ECMAScript's `Number.prototype.toString` form. As the RFC says, numbers beyond
//! double precision lose their extra digits (documented in docs/canonical-form.md).

use serde_json::Value;

/// The canonical text of a JSON document, or why it has none.
pub fn canonical_json(text: &str) -> Result<String, &'static str> {
    let v: Value = serde_json::from_str(text).map_err(|_| "not a JSON document")?;
    unique_members(text).map_err(|_| "a JSON object with two members of one name (not I-JSON)")?;
    exact_numbers(text)?;
    let mut out = String::with_capacity(text.len());
    write_value(&mut out, &v)?;
    Ok(out)
}

/// Refuses a JSON text in which an object has two members of one name (compared after
/// unescaping: `"a"` and `"\u0061"` are one name), naming it. RFC 8785 asks for I-JSON
/// (RFC 7493), which excludes them; a parser that keeps the last (or the first) of
/// them would read `{"a":1,"a":2}` as another document's equal. Also refuses text that
/// is not one JSON document.
pub fn unique_members(text: &str) -> Result<(), String> {
    use serde::de::{DeserializeSeed, Error, MapAccess, SeqAccess, Visitor};
    struct Unique;
    impl<'de> DeserializeSeed<'de> for Unique {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Unique {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
            while a.next_element_seed(Unique)?.is_some() {}
            Ok(())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<(), A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(k) = m.next_key::<String>()? {
                m.next_value_seed(Unique)?;
                if !seen.insert(k.clone()) {
                    return Err(A::Error::custom(format!("two members named {k:?}")));
                }
            }
            Ok(())
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    Unique.deserialize(&mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())
}

/// Refuses a document with a number whose written value is neither its double's exact
/// value nor that double's shortest decimal (`12345678901234567890`,
/// `0.10000000000000000001`): RFC 8785 reads numbers as doubles, so two such numbers
/// could compare equal while they differ. RFC 8785 asks
/// for I-JSON input (RFC 7493), which excludes them; refusing them keeps the canonical
/// form injective on what it accepts.
fn exact_numbers(text: &str) -> Result<(), &'static str> {
    let b = text.as_bytes();
    let (mut i, mut in_string) = (0, false);
    while i < b.len() {
        let c = b[i];
        if in_string {
            match c {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if c == b'"' {
            in_string = true;
            i += 1;
            continue;
        }
        if c == b'-' || c.is_ascii_digit() {
            let start = i;
            while i < b.len() && matches!(b[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                i += 1;
            }
            let token = &text[start..i];
            let f: f64 = token.parse().map_err(|_| "a JSON number outside double range")?;
            if !f.is_finite() {
                return Err("a JSON number outside double range");
            }
            // the written value is the double's exact value or its shortest decimal
            let exact = |t: &str| crate::canonical::exact_decimal(t).ok();
            let written = exact(token);
            let shortest = if f == 0.0 {
                "0".to_string()
            } else {
                crate::shortest::shortest_decimal(f)
            };
            let same = written.is_some()
                && (written == exact(&shortest)
                    || crate::shortest::exact_value(f).is_some_and(|v| written == exact(&v)));
            if !same {
                return Err("a JSON number with more precision than a double holds (not I-JSON)");
            }
            continue;
        }
        i += 1;
    }
    Ok(())
}

fn write_value(out: &mut String, v: &Value) -> Result<(), &'static str> {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let f = n.as_f64().ok_or("a JSON number outside double range")?;
            if !f.is_finite() {
                return Err("a JSON number outside double range");
            }
            push_number(out, f);
        }
        Value::String(s) => push_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (k, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_string(out, k);
                out.push(':');
                write_value(out, item)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

fn push_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// ECMAScript's Number::toString for a finite double: the shortest round-trip
/// digits, in fixed notation for exponents -7 < e < 21, otherwise `d.ddde±x`.
pub fn push_number(out: &mut String, f: f64) {
    if f == 0.0 {
        out.push('0'); // also -0
        return;
    }
    let (neg, digits, exp) = crate::shortest::shortest_digits(f);
    let k = digits.len() as i32; // number of significant digits
    let n = exp + 1; // position of the decimal point relative to the digits
    if neg {
        out.push('-');
    }
    if k <= n && n <= 21 {
        out.push_str(&digits);
        for _ in 0..(n - k) {
            out.push('0');
        }
    } else if 0 < n && n <= 21 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        for _ in 0..(-n) {
            out.push('0');
        }
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if n > 0 { '+' } else { '-' });
        out.push_str(&(n - 1).abs().to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_members_of_one_name_are_refused_however_the_name_is_escaped() {
        for text in [
            r#"{"a":1,"a":2}"#,
            r#"{"a":1,"\u0061":1}"#,
            r#"[{"x":{"b":null,"b":null}}]"#,
        ] {
            assert!(unique_members(text).is_err(), "{text}");
            assert!(canonical_json(text).is_err(), "{text}");
        }
        // the same name in two objects, or as a value, is no duplicate
        for text in [
            r#"{"a":{"a":1},"b":[{"a":1},{"a":2}]}"#,
            r#"{"a":"a"}"#,
            "[]",
            "1",
        ] {
            assert_eq!(unique_members(text), Ok(()), "{text}");
            assert!(canonical_json(text).is_ok(), "{text}");
        }
        assert!(unique_members("{} {}").is_err(), "one document");
    }

    fn num(f: f64) -> String {
        let mut s = String::new();
        push_number(&mut s, f);
        s
    }

    #[test]
    fn numbers_follow_ecmascript() {
        // the RFC 8785 appendix B sample values
        assert_eq!(num(0.0), "0");
        assert_eq!(num(-0.0), "0");
        assert_eq!(num(f64::from_bits(0x0000000000000001)), "5e-324");
        assert_eq!(num(f64::from_bits(0x7fefffffffffffff)), "1.7976931348623157e+308");
        assert_eq!(num(f64::from_bits(0x4340000000000000)), "9007199254740992");
        assert_eq!(num(f64::from_bits(0x444b1ae4d6e2ef50)), "1e+21");
        assert_eq!(num(f64::from_bits(0x3eb0c6f7a0b5ed8d)), "0.000001");
        assert_eq!(num(f64::from_bits(0x3eb0c6f7a0b5ed8c)), "9.999999999999997e-7");
        assert_eq!(num(f64::from_bits(0x44b52d02c7e14af5)), "9.999999999999997e+22");
        assert_eq!(num(f64::from_bits(0x44b52d02c7e14af6)), "1e+23");
        assert_eq!(num(f64::from_bits(0x44b52d02c7e14af7)), "1.0000000000000001e+23");
        assert_eq!(num(f64::from_bits(0x4430000000000000)), "295147905179352830000");
        assert_eq!(num(f64::from_bits(0x41b3de4355555554)), "333333333.33333325");
        assert_eq!(
            num(f64::from_bits(0xbecbf647612f3696)),
            "-0.0000033333333333333333"
        );
        assert_eq!(num(f64::from_bits(0x43143ff3c1cb0959)), "1424953923781206.2");
        assert_eq!(num(f64::from_bits(0x8000000000000001)), "-5e-324");
        assert_eq!(num(f64::from_bits(0x41b3de4355555555)), "333333333.3333333");
        assert_eq!(num(f64::from_bits(0xc06e8e6666666666)), "-244.45");
        assert_eq!(num(1e20), "100000000000000000000");
        assert_eq!(num(1.5), "1.5");
    }

    #[test]
    fn documents_are_sorted_compact_and_escaped() {
        let c = |s| canonical_json(s).unwrap();
        assert_eq!(
            c(r#"{ "b": 1, "a": [true, null, 1.50, "x\u0001\n"] }"#),
            r#"{"a":[true,null,1.5,"x\u0001\n"],"b":1}"#
        );
        // UTF-16 order, not code point order: U+1F600 is the pair D83D DE00, below U+E000
        assert_eq!(
            c("{\"\u{e000}\":1,\"\u{1f600}\":2}"),
            "{\"\u{1f600}\":2,\"\u{e000}\":1}"
        );
        assert_eq!(c(r#"{"a":1e2,"b":"é"}"#), r#"{"a":100,"b":"é"}"#);
        assert_eq!(c("[1, 1.0, 10e-1]"), "[1,1,1]");
        assert!(canonical_json("{").is_err());
        // numbers a double does not hold to their digits are refused, never folded
        assert!(canonical_json(r#"{"n":12345678901234567890}"#).is_err());
        assert!(canonical_json(r#"[0.10000000000000000001]"#).is_err());
        // digits inside strings are text, not numbers
        assert_eq!(
            c(r#"["12345678901234567890", "a\"1e999"]"#),
            r#"["12345678901234567890","a\"1e999"]"#
        );
        assert!(canonical_json("[9007199254740993]").is_err());
        assert_eq!(
            c("[9007199254740992, 1e300, 0.1, -0.0, 5e-324]"),
            "[9007199254740992,1e+300,0.1,0,5e-324]"
        );
        assert!(canonical_json("1e400").is_err());
    }
}
