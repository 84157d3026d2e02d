//! A cross-engine corpus of canonical-form traps: for each, a pair of tables, the
//! source on PostgreSQL and the target on MariaDB, and its ground truth written down
//! beside the rows (DESIGN §3, docs/canonical-form.md). Every case runs at `with_keys`
//! under every strategy that applies (quantile, hash, and time where the table has a
//! time column) and on both hashing paths (`hashing: auto`, the in-process default, and
//! `hashing: pushdown`), and must give exactly the verdict and the keys of its truth.
//!
//! A case has two variants: `same` rows only (ground truth: match, unless a row says
//! otherwise) and `same` plus `diff` rows (ground truth: exactly the rows marked as
//! differing). Every case's tables are loaded into one database per engine, and two
//! agents serve them all, so agents start once. `CORPUS_CASE=name` runs one case.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;
use tally_e2e::db;
use tally_e2e::zones::{Deployment, RunOutput, parse_run};

/// What a row pair is, by the canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum T {
    /// the same value on both sides: must not be reported
    Eq,
    Changed,
    /// on the source only (its `my` tuple is empty)
    Missing,
    /// on the target only (its `pg` tuple is empty)
    Extra,
}

/// `(truth, key as JSON, PostgreSQL tuple, MariaDB tuple)`; an empty tuple is no row.
#[derive(Debug, Clone, Copy)]
struct Row(T, &'static str, &'static str, &'static str);

#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    /// column definitions on each side (the table name is the case's)
    pg: &'static str,
    my: &'static str,
    key: &'static str,
    /// filler rows in both variants: (PostgreSQL select list over `g`, MariaDB's over `seq`, rows)
    fill: Option<(&'static str, &'static str, u32)>,
    same: &'static [Row],
    diff: &'static [Row],
    /// more spec lines (`exclude`, `overrides`)
    spec: &'static str,
    bisection: &'static str,
    time_column: Option<&'static str>,
    /// each needle must appear in some warning
    warnings: &'static [&'static str],
    /// the run must fail: (error code, needles of the message)
    error: Option<(&'static str, &'static [&'static str])>,
    /// the strategies to run, when not every one that applies
    strategies: &'static [&'static str],
}

const BASE: Case = Case {
    name: "",
    pg: "",
    my: "",
    key: "[id]",
    fill: None,
    same: &[],
    diff: &[],
    spec: "",
    bisection: "factor: 4, threshold: 8",
    time_column: None,
    warnings: &[],
    error: None,
    strategies: &[],
};

use T::{Changed as CH, Eq as EQ, Extra as EX, Missing as MI};

const TEXT_KEYS: (&str, &str, u32) = (
    "'k' || lpad(g::text, 5, '0'), g",
    "CONCAT('k', LPAD(seq, 5, '0')), seq",
    20_000,
);

#[rustfmt::skip]
const CASES: &[Case] = &[
    // undeclared scale: compared exactly, never at an invented scale
    Case { name: "numeric_unscaled",
        pg: "id BIGINT PRIMARY KEY, v numeric", my: "id BIGINT PRIMARY KEY, v DECIMAL(12,2)",
        fill: Some(("g, g * 1.25", "seq, seq * 1.25", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, 10.00)", "(1001, 10.00)"),
            Row(EQ, "[1002]", "(1002, 10.5)", "(1002, 10.50)"),
            Row(EQ, "[1003]", "(1003, -0.00)", "(1003, 0)"),
            Row(EQ, "[1004]", "(1004, 9999999999.99)", "(1004, 9999999999.99)"),
            Row(EQ, "[1005]", "(1005, NULL)", "(1005, NULL)"),
        ],
        diff: &[
            Row(CH, "[1006]", "(1006, 10.004)", "(1006, 10.00)"),
            Row(CH, "[1007]", "(1007, 0.001)", "(1007, 0.00)"),
            Row(EQ, "[1008]", "(1008, 10.000)", "(1008, 10)"),
        ],
        warnings: &["scale undeclared on the source"],
        ..BASE },
    // both floats at scale 6; float32 widened exactly (0.1f = 0.1000000015 → 0.100000)
    Case { name: "double_vs_float",
        pg: "id BIGINT PRIMARY KEY, v double precision", my: "id BIGINT PRIMARY KEY, v FLOAT",
        fill: Some(("g, g * 0.5", "seq, seq * 0.5", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, 1234.5)", "(1001, 1234.5)"),
            Row(EQ, "[1002]", "(1002, -2.25)", "(1002, -2.25)"),
            Row(EQ, "[1003]", "(1003, 0.1)", "(1003, 0.1)"),
            Row(EQ, "[1004]", "(1004, 1e10)", "(1004, 1e10)"),
        ],
        diff: &[Row(CH, "[1005]", "(1005, 1234.57)", "(1005, 1234.567)")],
        ..BASE },
    // the same float32 bits on both sides
    Case { name: "real_vs_float",
        pg: "id BIGINT PRIMARY KEY, v real", my: "id BIGINT PRIMARY KEY, v FLOAT",
        fill: Some(("g, g * 0.25", "seq, seq * 0.25", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, 1234.567)", "(1001, 1234.567)"),
            Row(EQ, "[1002]", "(1002, 0.1)", "(1002, 0.1)"),
            Row(EQ, "[1003]", "(1003, 3.4e38)", "(1003, 3.4e38)"),
            Row(EQ, "[1004]", "(1004, 1e-45)", "(1004, 1e-45)"),
            Row(EQ, "[1005]", "(1005, 16777217)", "(1005, 16777217)"),
            Row(EQ, "[1006]", "(1006, -7.1)", "(1006, -7.1)"),
        ],
        diff: &[Row(CH, "[1007]", "(1007, 1234.567)", "(1007, 1234.568)")],
        ..BASE },
    // the label text; MariaDB stores an ENUM's declared label ('Active' → 'active')
    Case { name: "enum_labels",
        pg: "id BIGINT PRIMARY KEY, status text", my: "id BIGINT PRIMARY KEY, status ENUM('active','closed','pending')",
        fill: Some(("g, (ARRAY['active','closed','pending'])[1 + g % 3]", "seq, ELT(1 + seq % 3, 'active','closed','pending')", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, 'pending')", "(1001, 'pending')"),
            Row(EQ, "[1002]", "(1002, NULL)", "(1002, NULL)"),
        ],
        diff: &[
            Row(CH, "[1003]", "(1003, 'closed')", "(1003, 'active')"),
            Row(CH, "[1004]", "(1004, 'Active')", "(1004, 'Active')"),
        ],
        ..BASE },
    Case { name: "boolean_bit1",
        pg: "id BIGINT PRIMARY KEY, b boolean", my: "id BIGINT PRIMARY KEY, b BIT(1)",
        fill: Some(("g, g % 2 = 0", "seq, seq % 2 = 0", 300)),
        same: &[Row(EQ, "[1001]", "(1001, NULL)", "(1001, NULL)")],
        diff: &[
            Row(CH, "[1002]", "(1002, true)", "(1002, b'0')"),
            Row(CH, "[1003]", "(1003, NULL)", "(1003, b'0')"),
        ],
        ..BASE },
    // a SET is its labels in declaration order, comma-joined ('b,a' is stored 'a,b')
    Case { name: "set_labels",
        pg: "id BIGINT PRIMARY KEY, s text", my: "id BIGINT PRIMARY KEY, s SET('a','b','c')",
        fill: Some(("g, 'c'", "seq, 'c'", 300)),
        same: &[Row(EQ, "[1001]", "(1001, 'a,b')", "(1001, 'b,a')"), Row(EQ, "[1002]", "(1002, '')", "(1002, '')")],
        diff: &[Row(CH, "[1003]", "(1003, 'a,c')", "(1003, 'a')"), Row(CH, "[1004]", "(1004, 'b,a')", "(1004, 'b,a')")],
        ..BASE },
    // BIT(n > 1) is binary: lowercase hex of its bytes
    Case { name: "bit8_bytea",
        pg: "id BIGINT PRIMARY KEY, b bytea", my: "id BIGINT PRIMARY KEY, b BIT(8)",
        fill: Some(("g, set_byte('\\x00'::bytea, 0, g % 256)", "seq, seq % 256", 300)),
        same: &[Row(EQ, "[1001]", r"(1001, '\xff')", "(1001, b'11111111')")],
        diff: &[Row(CH, "[1002]", r"(1002, '\x01')", "(1002, b'00000010')")],
        ..BASE },
    // a TINYINT(1) holding 2 is rendered by its value, not as true
    Case { name: "boolean_tinyint1",
        pg: "id BIGINT PRIMARY KEY, b boolean", my: "id BIGINT PRIMARY KEY, b TINYINT(1)",
        fill: Some(("g, g % 3 = 0", "seq, seq % 3 = 0", 300)),
        same: &[Row(EQ, "[1001]", "(1001, NULL)", "(1001, NULL)")],
        diff: &[
            Row(CH, "[1002]", "(1002, true)", "(1002, 2)"),
            Row(CH, "[1003]", "(1003, false)", "(1003, -1)"),
        ],
        ..BASE },
    // RFC 8785: key order, whitespace, number spelling and escapes do not count;
    // JSON null is not SQL NULL
    Case { name: "json_documents",
        pg: "id BIGINT PRIMARY KEY, doc jsonb", my: "id BIGINT PRIMARY KEY, doc JSON",
        fill: Some(("g, jsonb_build_object('n', g, 'tag', 't' || g)", "seq, JSON_OBJECT('tag', CONCAT('t', seq), 'n', seq)", 300)),
        same: &[
            Row(EQ, "[1001]", r#"(1001, '{"b":1,"a":[1,2]}')"#, r#"(1001, '{ "a" : [1, 2], "b" : 1.0 }')"#),
            Row(EQ, "[1002]", r#"(1002, '{"s":"é"}')"#, r#"(1002, '{"s":"\\u00e9"}')"#),
            Row(EQ, "[1003]", "(1003, '100')", "(1003, '1e2')"),
            Row(EQ, "[1004]", "(1004, '[]')", "(1004, '[ ]')"),
            Row(EQ, "[1005]", r#"(1005, '{"n":-0}')"#, r#"(1005, '{"n":0}')"#),
            Row(EQ, "[1006]", "(1006, NULL)", "(1006, NULL)"),
        ],
        diff: &[
            Row(CH, "[1007]", r#"(1007, '{"a":1}')"#, r#"(1007, '{"a":2}')"#),
            Row(CH, "[1008]", r#"(1008, '{"a":1}')"#, r#"(1008, '{"a":"1"}')"#),
            Row(CH, "[1009]", "(1009, 'null')", "(1009, NULL)"),
            Row(CH, "[1010]", "(1010, '[1,2]')", "(1010, '[2,1]')"),
        ],
        ..BASE },
    // RFC 8785 reads numbers as IEEE doubles: a number no double holds to its digits
    // (past 2^53, more than 17 digits) would fold into its neighbour, so it is refused
    Case { name: "json_big_numbers",
        pg: "id BIGINT PRIMARY KEY, doc jsonb", my: "id BIGINT PRIMARY KEY, doc JSON",
        fill: Some(("g, jsonb_build_object('n', g)", "seq, JSON_OBJECT('n', seq)", 100)),
        same: &[
            Row(EQ, "[1001]", r#"(1001, '{"n":12345678901234567890}')"#, r#"(1001, '{"n":12345678901234567891}')"#),
            Row(EQ, "[1002]", r#"(1002, '{"n":0.10000000000000000001}')"#, r#"(1002, '{"n":0.1}')"#),
        ],
        error: Some(("agent_error", &["doc"])),
        ..BASE },
    Case { name: "timestamp_infinity",
        pg: "id BIGINT PRIMARY KEY, t timestamp", my: "id BIGINT PRIMARY KEY, t DATETIME(6)",
        fill: Some(("g, timestamp '2024-01-01' + g * interval '7 hours'", "seq, TIMESTAMP'2024-01-01 00:00:00' + INTERVAL (seq * 7) HOUR", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, '0001-01-01 00:00:00')", "(1001, '0001-01-01 00:00:00')"),
            Row(EQ, "[1002]", "(1002, '9999-12-31 23:59:59.999999')", "(1002, '9999-12-31 23:59:59.999999')"),
            Row(EQ, "[1003]", "(1003, NULL)", "(1003, NULL)"),
        ],
        diff: &[
            Row(CH, "[1004]", "(1004, 'infinity')", "(1004, NULL)"),
            Row(CH, "[1005]", "(1005, '-infinity')", "(1005, NULL)"),
        ],
        ..BASE },
    // 2000 BC is astronomical year -1999, never 2000
    Case { name: "date_bc",
        pg: "id BIGINT PRIMARY KEY, d date", my: "id BIGINT PRIMARY KEY, d DATE",
        fill: Some(("g, date '2024-01-01' + g", "seq, DATE'2024-01-01' + INTERVAL seq DAY", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, '0001-01-01')", "(1001, '0001-01-01')"),
            Row(EQ, "[1002]", "(1002, '9999-12-31')", "(1002, '9999-12-31')"),
            Row(EQ, "[1003]", "(1003, '2024-02-29')", "(1003, '2024-02-29')"),
        ],
        diff: &[Row(
            CH,
            "[1004]",
            "(1004, '2000-01-01 BC')",
            "(1004, '2000-01-01')",
        )],
        ..BASE },
    // a MySQL zero date is not NULL and not any real date
    Case { name: "mysql_zero_date",
        pg: "id BIGINT PRIMARY KEY, d date", my: "id BIGINT PRIMARY KEY, d DATE",
        fill: Some(("g, date '2024-01-01' + g", "seq, DATE'2024-01-01' + INTERVAL seq DAY", 300)),
        same: &[Row(EQ, "[1001]", "(1001, NULL)", "(1001, NULL)")],
        diff: &[
            Row(CH, "[1002]", "(1002, NULL)", "(1002, '0000-00-00')"),
            Row(CH, "[1003]", "(1003, '1970-01-01')", "(1003, '0000-00-00')"),
        ],
        ..BASE },
    // the time strategy over edge times (none, the first and the last day); the
    // differences are in another column
    Case { name: "time_column_edges",
        pg: "id BIGINT PRIMARY KEY, t timestamp, v integer", my: "id BIGINT PRIMARY KEY, t DATETIME(6), v INT",
        fill: Some(("g, timestamp '2023-11-01' + g * interval '5 hours', g", "seq, TIMESTAMP'2023-11-01 00:00:00' + INTERVAL (seq * 5) HOUR, seq", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, NULL, 1)", "(1001, NULL, 1)"),
            Row(EQ, "[1002]", "(1002, '0001-01-01 00:00:00', 1)", "(1002, '0001-01-01 00:00:00', 1)"),
            Row(EQ, "[1003]", "(1003, '9999-12-31 23:59:59.999999', 1)", "(1003, '9999-12-31 23:59:59.999999', 1)"),
        ],
        diff: &[
            Row(CH, "[1004]", "(1004, NULL, 1)", "(1004, NULL, 2)"),
            Row(CH, "[1005]", "(1005, '9999-12-31 23:59:59.999999', 1)", "(1005, '9999-12-31 23:59:59.999999', 2)"),
            Row(MI, "[1006]", "(1006, '0001-01-01 00:00:00', 1)", ""),
            Row(EX, "[1007]", "", "(1007, '2023-12-24 00:00:00', 1)"),
        ],
        time_column: Some("t"),
        ..BASE },
    // a row whose time column differs lies in a different period on each side;
    // it is still one row whose value changed
    Case { name: "time_column_value_changed",
        pg: "id BIGINT PRIMARY KEY, t timestamp", my: "id BIGINT PRIMARY KEY, t DATETIME(6)",
        fill: Some(("g, timestamp '2024-01-01' + g * interval '7 hours'", "seq, TIMESTAMP'2024-01-01 00:00:00' + INTERVAL (seq * 7) HOUR", 300)),
        diff: &[
            Row(CH, "[1001]", "(1001, '2024-01-05 00:00:00')", "(1001, '2024-02-05 00:00:00')"),
            Row(CH, "[1002]", "(1002, 'infinity')", "(1002, NULL)"),
            Row(CH, "[1003]", "(1003, '2000-01-01 00:00:00 BC')", "(1003, '2000-01-01 00:00:00')"),
            Row(CH, "[1004]", "(1004, NULL)", "(1004, '0000-00-00 00:00:00')"),
        ],
        time_column: Some("t"),
        strategies: &["time"],
        ..BASE },
    // NO PAD: 'k00020\t' sorts before 'k00020' under PAD SPACE utf8mb4_bin
    Case { name: "text_key_tab_no_pad",
        pg: "k text PRIMARY KEY, v integer", my: "k VARCHAR(20) COLLATE utf8mb4_bin PRIMARY KEY, v INT",
        key: "[k]",
        fill: Some(TEXT_KEYS),
        diff: &[Row(EX, r#"["k00020\t"]"#, "", "(CONCAT('k00020', CHAR(9)), 0)")],
        bisection: "factor: 2, threshold: 16",
        ..BASE },
    // NO PAD: 'k00020 ' is its own key (PAD SPACE would make it 'k00020')
    Case { name: "text_key_space_no_pad",
        pg: "k text PRIMARY KEY, v integer", my: "k VARCHAR(20) COLLATE utf8mb4_bin NOT NULL, v INT, KEY (k)",
        key: "[k]",
        fill: Some(TEXT_KEYS),
        diff: &[Row(EX, r#"["k00020 "]"#, "", "('k00020 ', 0)")],
        bisection: "factor: 2, threshold: 16",
        ..BASE },
    // a case-insensitive key collation cannot hold 'a' and 'A': 'A' is missing;
    // values compare bytewise ('Hello' is not 'hello')
    Case { name: "ci_collation_key",
        pg: "k text PRIMARY KEY, v text",
        my: "k VARCHAR(20) COLLATE utf8mb4_general_ci PRIMARY KEY, v VARCHAR(20) COLLATE utf8mb4_general_ci",
        key: "[k]",
        fill: Some(("'k' || lpad(g::text, 4, '0'), 'v'", "CONCAT('k', LPAD(seq, 4, '0')), 'v'", 300)),
        same: &[
            Row(EQ, r#"["a"]"#, "('a', 'x')", "('a', 'x')"),
            Row(EQ, r#"["B"]"#, "('B', 'x')", "('B', 'x')"),
            Row(EQ, r#"["Ärger"]"#, "('Ärger', 'x')", "('Ärger', 'x')"),
            Row(EQ, r#"["zebra"]"#, "('zebra', 'x')", "('zebra', 'x')"),
        ],
        diff: &[
            Row(MI, r#"["A"]"#, "('A', 'x')", ""),
            Row(CH, r#"["c"]"#, "('c', 'Hello')", "('c', 'hello')"),
        ],
        ..BASE },
    Case { name: "composite_text_int_key",
        pg: "region text, n integer, v integer, PRIMARY KEY (region, n)",
        my: "region VARCHAR(20), n INT, v INT, PRIMARY KEY (region, n)",
        key: "[region, n]",
        fill: Some(("'r' || (g % 7), g, g", "CONCAT('r', seq % 7), seq, seq", 300)),
        same: &[
            Row(EQ, r#"["a",1]"#, "('a', 1, 0)", "('a', 1, 0)"),
            Row(EQ, r#"["a b",1]"#, "('a b', 1, 0)", "('a b', 1, 0)"),
            Row(EQ, r#"["a",-1]"#, "('a', -1, 0)", "('a', -1, 0)"),
            Row(EQ, r#"["",0]"#, "('', 0, 0)", "('', 0, 0)"),
        ],
        diff: &[
            Row(CH, r#"["a",2]"#, "('a', 2, 1)", "('a', 2, 2)"),
            Row(MI, r#"["b",1]"#, "('b', 1, 0)", ""),
            Row(EX, r#"["c",0]"#, "", "('c', 0, 0)"),
        ],
        ..BASE },
    Case { name: "key_extremes_and_gaps",
        pg: "id BIGINT PRIMARY KEY, v integer", my: "id BIGINT PRIMARY KEY, v INT",
        fill: Some(("g * 1000, g", "seq * 1000, seq", 300)),
        same: &[
            Row(EQ, "[-9223372036854775808]", "(-9223372036854775808, 1)", "(-9223372036854775808, 1)"),
            Row(EQ, "[-1]", "(-1, 1)", "(-1, 1)"),
            Row(EQ, "[0]", "(0, 1)", "(0, 1)"),
        ],
        diff: &[
            Row(MI, "[-9223372036854775807]", "(-9223372036854775807, 1)", ""),
            Row(EX, "[9223372036854775806]", "", "(9223372036854775806, 1)"),
            Row(CH, "[9223372036854775807]", "(9223372036854775807, 1)", "(9223372036854775807, 2)"),
        ],
        ..BASE },
    Case { name: "int_zerofill",
        pg: "id BIGINT PRIMARY KEY, n integer", my: "id BIGINT PRIMARY KEY, n INT(5) ZEROFILL",
        fill: Some(("g, g * 7", "seq, seq * 7", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, 0)", "(1001, 0)"),
            Row(EQ, "[1002]", "(1002, 123456)", "(1002, 123456)"),
            Row(EQ, "[1003]", "(1003, 2147483647)", "(1003, 2147483647)"),
        ],
        diff: &[Row(CH, "[1004]", "(1004, 42)", "(1004, 43)")],
        ..BASE },
    // BINARY(4) pads with 0x00; trailing 0x00 are insignificant against bytea
    Case { name: "binary4_bytea",
        pg: "id BIGINT PRIMARY KEY, b bytea", my: "id BIGINT PRIMARY KEY, b BINARY(4)",
        fill: Some(("g, int4send(g::int)", "seq, UNHEX(LPAD(HEX(seq), 8, '0'))", 300)),
        same: &[
            Row(EQ, "[1001]", r"(1001, '\xdeadbeef')", "(1001, 0xdeadbeef)"),
            Row(EQ, "[1002]", r"(1002, '\xab000000')", "(1002, 0xab)"),
            Row(EQ, "[1003]", r"(1003, '\xab')", "(1003, 0xab000000)"),
            Row(EQ, "[1004]", "(1004, NULL)", "(1004, NULL)"),
        ],
        diff: &[
            Row(CH, "[1005]", r"(1005, '\xab')", "(1005, 0xac)"),
            Row(CH, "[1006]", r"(1006, '\x00ab')", "(1006, 0xab)"),
        ],
        ..BASE },
    // past DECIMAL(65,s) and repeating binary fractions, on both paths
    Case { name: "double_extremes",
        pg: "id BIGINT PRIMARY KEY, v double precision", my: "id BIGINT PRIMARY KEY, v DOUBLE",
        fill: Some(("g, g / 3.0::float8", "seq, seq / 3e0", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, 1e300)", "(1001, 1e300)"),
            Row(EQ, "[1002]", "(1002, -1e300)", "(1002, -1e300)"),
            Row(EQ, "[1003]", "(1003, 1e20::float8 / 3)", "(1003, 1e20 / 3e0)"),
            Row(EQ, "[1004]", "(1004, 1e300::float8 / 3)", "(1004, 1e300 / 3e0)"),
            Row(EQ, "[1005]", "(1005, 0.1::float8 + 0.2::float8)", "(1005, 0.1e0 + 0.2e0)"),
            Row(EQ, "[1006]", "(1006, 1.7976931348623157e308)", "(1006, 1.7976931348623157e308)"),
            Row(EQ, "[1007]", "(1007, -1e20::float8 / 3)", "(1007, -1e20 / 3e0)"),
            // documented: floats compare at scale 6 unless overridden, so 1e-7 is 2e-7
            Row(EQ, "[1011]", "(1011, 1e-7)", "(1011, 2e-7)"),
        ],
        diff: &[
            Row(CH, "[1008]", "(1008, 1e300::float8 / 3)", "(1008, 3.33333333333334e299)"),
            Row(CH, "[1009]", "(1009, 1e20::float8 / 3)", "(1009, 1e20 / 3e0 + 65536e0)"),
            Row(CH, "[1010]", "(1010, 1e300)", "(1010, 1.0000000000000002e300)"),
        ],
        ..BASE },
    // a zero is unsigned at any scale; -1e-9 is 0.000000 at scale 6
    Case { name: "negative_zero",
        pg: "id BIGINT PRIMARY KEY, v double precision", my: "id BIGINT PRIMARY KEY, v DOUBLE",
        fill: Some(("g, g * 0.5", "seq, seq * 0.5", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, '-0')", "(1001, 0e0)"),
            Row(EQ, "[1002]", "(1002, 0)", "(1002, -0e0)"),
            Row(EQ, "[1003]", "(1003, -1e-9)", "(1003, 0e0)"),
        ],
        diff: &[Row(CH, "[1004]", "(1004, -6e-7)", "(1004, 0e0)")],
        ..BASE },
    Case { name: "interval_has_no_canonical_form",
        pg: "id BIGINT PRIMARY KEY, v integer, span interval", my: "id BIGINT PRIMARY KEY, v INT, span TIME",
        fill: Some(("g, g, interval '1 hour' * (g % 24)", "seq, seq, SEC_TO_TIME(3600 * (seq % 24))", 100)),
        error: Some(("no_canonical_form", &["span", "exclude: [span]"])),
        ..BASE },
    Case { name: "array_has_no_canonical_form",
        pg: "id BIGINT PRIMARY KEY, tags int[]", my: "id BIGINT PRIMARY KEY, tags TEXT",
        fill: Some(("g, ARRAY[g, g + 1]", "seq, CONCAT('{', seq, ',', seq + 1, '}')", 100)),
        error: Some(("no_canonical_form", &["tags", "exclude: [tags]"])),
        ..BASE },
    // excluded, the interval column does not count; the rest is compared
    Case { name: "interval_excluded",
        pg: "id BIGINT PRIMARY KEY, v integer, span interval", my: "id BIGINT PRIMARY KEY, v INT, span TIME",
        fill: Some(("g, g, interval '1 hour' * (g % 24)", "seq, seq, SEC_TO_TIME(3600 * (seq % 24))", 300)),
        diff: &[
            Row(EQ, "[1001]", "(1001, 1, '1 hour')", "(1001, 1, '02:00:00')"),
            Row(CH, "[1002]", "(1002, 1, '1 hour')", "(1002, 2, '01:00:00')"),
        ],
        spec: "exclude: [span]\n",
        ..BASE },
    // across zones: compared in UTC, the zone-less side read in UTC
    Case { name: "timestamp_vs_instant",
        pg: "id BIGINT PRIMARY KEY, a timestamp(6), b timestamptz(6)",
        my: "id BIGINT PRIMARY KEY, a TIMESTAMP(6) NULL DEFAULT NULL, b DATETIME(6)",
        fill: Some(("g, timestamp '2024-03-01' + g * interval '3601 seconds', timestamptz '2024-03-01 00:00:00+02' + g * interval '1 hour'", "seq, TIMESTAMP'2024-03-01 00:00:00' + INTERVAL (seq * 3601) SECOND, TIMESTAMP'2024-02-29 22:00:00' + INTERVAL seq HOUR", 300)),
        same: &[Row(
            EQ,
            "[1001]",
            "(1001, '1999-12-31 23:59:59.5', '2024-03-15 16:30:00.1+02')",
            "(1001, '1999-12-31 23:59:59.5', '2024-03-15 14:30:00.1')",
        )],
        diff: &[
            Row(CH, "[1002]", "(1002, '2024-01-01 00:00:00.000001', '2024-01-01 12:00:00+00')", "(1002, '2024-01-01 00:00:00.000002', '2024-01-01 12:00:00')"),
            Row(CH, "[1003]", "(1003, '2024-01-01 00:00:00', '2024-01-01 12:00:00+00')", "(1003, '2024-01-01 00:00:00', '2024-01-01 13:00:00')"),
        ],
        time_column: Some("a"),
        warnings: &["column a:", "column b:", "in UTC"],
        ..BASE },
    // the larger declared precision (6): .123 is .123000
    Case { name: "timestamp_precision",
        pg: "id BIGINT PRIMARY KEY, t timestamp(3)", my: "id BIGINT PRIMARY KEY, t DATETIME(6)",
        fill: Some(("g, timestamp '2024-01-01' + g * interval '61.5 seconds'", "seq, TIMESTAMP'2024-01-01 00:00:00' + INTERVAL (seq * 61500) * 1000 MICROSECOND", 300)),
        same: &[Row(
            EQ,
            "[1001]",
            "(1001, '2024-01-01 00:00:00.123')",
            "(1001, '2024-01-01 00:00:00.123000')",
        )],
        diff: &[
            Row(CH, "[1002]", "(1002, '2024-01-01 00:00:00.123')", "(1002, '2024-01-01 00:00:00.123456')"),
            // timestamp(3) rounds on input: .1235 is stored .124
            Row(CH, "[1003]", "(1003, '2024-01-01 00:00:00.1235')", "(1003, '2024-01-01 00:00:00.123500')"),
        ],
        time_column: Some("t"),
        ..BASE },
    // precision 3 by override: digits beyond it are cut, never rounded
    Case { name: "timestamp_precision_override",
        pg: "id BIGINT PRIMARY KEY, t timestamp(3)", my: "id BIGINT PRIMARY KEY, t DATETIME(6)",
        fill: Some(("g, timestamp '2024-01-01' + g * interval '1 minute'", "seq, TIMESTAMP'2024-01-01 00:00:00' + INTERVAL seq MINUTE", 300)),
        diff: &[
            Row(EQ, "[1001]", "(1001, '2024-01-01 00:00:00.123')", "(1001, '2024-01-01 00:00:00.123456')"),
            Row(EQ, "[1002]", "(1002, '2024-01-01 00:00:00.999')", "(1002, '2024-01-01 00:00:00.999999')"),
            Row(CH, "[1003]", "(1003, '2024-01-01 00:00:00.124')", "(1003, '2024-01-01 00:00:00.123999')"),
        ],
        spec: "overrides: { t: { precision: 3 } }\n",
        warnings: &["overrides.t"],
        ..BASE },
    // a decimal with a float: at the decimal's scale, the float's shortest
    // decimal rounded half away from zero (2.675 → 2.68)
    Case { name: "numeric2_vs_double",
        pg: "id BIGINT PRIMARY KEY, v numeric(12,2)", my: "id BIGINT PRIMARY KEY, v DOUBLE",
        fill: Some(("g, g * 0.25", "seq, seq * 0.25", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, 10.25)", "(1001, 10.25)"),
            Row(EQ, "[1002]", "(1002, 0.10)", "(1002, 0.1)"),
            Row(EQ, "[1003]", "(1003, 2.68)", "(1003, 2.675)"),
            Row(EQ, "[1004]", "(1004, 1000000000.00)", "(1004, 1e9)"),
        ],
        diff: &[
            Row(CH, "[1005]", "(1005, 10.25)", "(1005, 10.26)"),
            Row(CH, "[1006]", "(1006, 2.67)", "(1006, 2.675)"),
        ],
        warnings: &["at scale 2"],
        ..BASE },
    // both scales declared: the larger one (3)
    Case { name: "decimal_scale_3_vs_2",
        pg: "id BIGINT PRIMARY KEY, v numeric(12,3)", my: "id BIGINT PRIMARY KEY, v DECIMAL(12,2)",
        fill: Some(("g, g * 0.25", "seq, seq * 0.25", 300)),
        same: &[Row(EQ, "[1001]", "(1001, 10.500)", "(1001, 10.50)")],
        diff: &[Row(CH, "[1002]", "(1002, 10.005)", "(1002, 10.01)")],
        ..BASE },
    Case { name: "bigint_unsigned_vs_numeric20",
        pg: "id BIGINT PRIMARY KEY, n numeric(20,0)", my: "id BIGINT PRIMARY KEY, n BIGINT UNSIGNED",
        fill: Some(("g, g::numeric * 1000000007", "seq, seq * 1000000007", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, 18446744073709551615)", "(1001, 18446744073709551615)"),
            Row(EQ, "[1002]", "(1002, 9223372036854775808)", "(1002, 9223372036854775808)"),
        ],
        diff: &[Row(
            CH,
            "[1003]",
            "(1003, 18446744073709551615)",
            "(1003, 18446744073709551614)",
        )],
        ..BASE },
    Case { name: "year_vs_smallint",
        pg: "id BIGINT PRIMARY KEY, y smallint", my: "id BIGINT PRIMARY KEY, y YEAR",
        fill: Some(("g, 1901 + g % 250", "seq, 1901 + seq % 250", 300)),
        same: &[Row(EQ, "[1001]", "(1001, 2155)", "(1001, 2155)")],
        diff: &[Row(CH, "[1002]", "(1002, 2024)", "(1002, 2025)")],
        ..BASE },
    Case { name: "uuid",
        pg: "id BIGINT PRIMARY KEY, u uuid", my: "id BIGINT PRIMARY KEY, u UUID",
        fill: Some(("g, ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid", "seq, CONCAT('00000000-0000-4000-8000-', LPAD(seq, 12, '0'))", 300)),
        same: &[Row(
            EQ,
            "[1001]",
            "(1001, 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11')",
            "(1001, 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11')",
        )],
        diff: &[Row(
            CH,
            "[1002]",
            "(1002, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11')",
            "(1002, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12')",
        )],
        ..BASE },
    // text against binary: by the text's UTF-8 bytes
    Case { name: "text_vs_varbinary",
        pg: "id BIGINT PRIMARY KEY, s text", my: "id BIGINT PRIMARY KEY, s VARBINARY(40)",
        fill: Some(("g, 'row ' || g", "seq, CONCAT('row ', seq)", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, 'héllo')", "(1001, 'héllo')"),
            Row(EQ, "[1002]", "(1002, '日本')", "(1002, '日本')"),
            Row(EQ, "[1003]", "(1003, '')", "(1003, '')"),
            Row(EQ, "[1004]", "(1004, NULL)", "(1004, NULL)"),
        ],
        diff: &[
            Row(CH, "[1005]", "(1005, 'abc')", "(1005, 'abd')"),
            Row(CH, "[1006]", "(1006, 'é')", "(1006, X'65CC81')"),
            Row(CH, "[1007]", "(1007, 'ab')", "(1007, X'616200')"),
        ],
        warnings: &["UTF-8 bytes"],
        ..BASE },
    // characters PostgreSQL's COPY text format escapes; '\N' text is not NULL
    Case { name: "copy_escapes",
        pg: "id BIGINT PRIMARY KEY, s text", my: "id BIGINT PRIMARY KEY, s TEXT",
        fill: Some(("g, 'v' || g", "seq, CONCAT('v', seq)", 300)),
        same: &[
            Row(EQ, "[1001]", r"(1001, E'a\tb')", r"(1001, 'a\tb')"),
            Row(EQ, "[1002]", r"(1002, E'line1\nline2')", r"(1002, 'line1\nline2')"),
            Row(EQ, "[1003]", r"(1003, E'back\\slash')", r"(1003, 'back\\slash')"),
            Row(EQ, "[1004]", r"(1004, E'\\N')", r"(1004, '\\N')"),
            Row(EQ, "[1005]", r"(1005, E'cr\rlf')", r"(1005, 'cr\rlf')"),
            Row(EQ, "[1006]", r"(1006, E'\\t')", r"(1006, '\\t')"),
        ],
        diff: &[
            Row(CH, "[1007]", r"(1007, E'\\N')", "(1007, NULL)"),
            Row(CH, "[1008]", r"(1008, E'a\tb')", "(1008, 'a b')"),
            Row(CH, "[1009]", r"(1009, E'\\t')", r"(1009, '\t')"),
            Row(CH, "[1010]", r"(1010, E'a\\\\b')", r"(1010, 'a\\b')"),
        ],
        ..BASE },
    // no normalisation: NFC 'é' is not NFD 'e' + U+0301
    Case { name: "unicode_normalisation",
        pg: "id BIGINT PRIMARY KEY, s text", my: "id BIGINT PRIMARY KEY, s VARCHAR(20)",
        fill: Some(("g, 'ü' || g", "seq, CONCAT('ü', seq)", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, 'é')", "(1001, 'é')"),
            Row(EQ, "[1002]", "(1002, '😀')", "(1002, '😀')"),
        ],
        diff: &[
            Row(CH, "[1003]", "(1003, 'é')", "(1003, 'e\u{301}')"),
            Row(CH, "[1004]", "(1004, '\u{c5}')", "(1004, '\u{212b}')"),
            Row(CH, "[1005]", "(1005, 'ß')", "(1005, 'ss')"),
        ],
        ..BASE },
    // the length prefix keeps fields apart: swapped or re-split values differ
    Case { name: "swapped_values",
        pg: "id BIGINT PRIMARY KEY, a integer, b integer, s text, t text",
        my: "id BIGINT PRIMARY KEY, a INT, b INT, s TEXT, t TEXT",
        fill: Some(("g, g, g + 1, 'x' || g, 'y'", "seq, seq, seq + 1, CONCAT('x', seq), 'y'", 300)),
        same: &[Row(
            EQ,
            "[1001]",
            "(1001, 1, 2, 'ab', 'c')",
            "(1001, 1, 2, 'ab', 'c')",
        )],
        diff: &[
            Row(CH, "[1002]", "(1002, 1, 2, 'p', 'q')", "(1002, 2, 1, 'p', 'q')"),
            Row(CH, "[1003]", "(1003, 1, 2, 'ab', 'c')", "(1003, 1, 2, 'a', 'bc')"),
            Row(CH, "[1004]", "(1004, 1, 2, NULL, '')", "(1004, 1, 2, '', NULL)"),
        ],
        ..BASE },
    Case { name: "null_vs_empty",
        pg: "id BIGINT PRIMARY KEY, s text", my: "id BIGINT PRIMARY KEY, s TEXT",
        fill: Some(("g, 'v' || g", "seq, CONCAT('v', seq)", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, '')", "(1001, '')"),
            Row(EQ, "[1002]", "(1002, NULL)", "(1002, NULL)"),
            Row(EQ, "[1003]", "(1003, '~')", "(1003, '~')"),
            Row(EQ, "[1004]", "(1004, 'NULL')", "(1004, 'NULL')"),
        ],
        diff: &[
            Row(CH, "[1005]", "(1005, '')", "(1005, NULL)"),
            Row(CH, "[1006]", "(1006, '~')", "(1006, NULL)"),
            Row(CH, "[1007]", "(1007, 'NULL')", "(1007, NULL)"),
            Row(CH, "[1008]", "(1008, ' ')", "(1008, '')"),
        ],
        ..BASE },
    // CHAR(n) loses trailing spaces (only U+0020); once either side is CHAR(n) the
    // padding is insignificant on both (resolve.rs, as for BINARY(n)): a CHAR side
    // cannot tell 'abc' from 'abc  '. Other differences still count.
    Case { name: "char_padding",
        pg: "id BIGINT PRIMARY KEY, c char(6), w varchar(6)", my: "id BIGINT PRIMARY KEY, c VARCHAR(6), w CHAR(6)",
        fill: Some(("g, 'c' || g, 'w' || g", "seq, CONCAT('c', seq), CONCAT('w', seq)", 300)),
        same: &[
            Row(EQ, "[1001]", "(1001, 'abc', 'abc')", "(1001, 'abc', 'abc')"),
            Row(EQ, "[1002]", "(1002, '', '')", "(1002, '', '')"),
            Row(EQ, "[1003]", "(1003, 'a b', 'a b')", "(1003, 'a b', 'a b')"),
            Row(EQ, "[1004]", r"(1004, E'ab\t', 'x')", r"(1004, 'ab\t', 'x')"),
        ],
        diff: &[
            Row(EQ, "[1005]", "(1005, 'abc', 'x')", "(1005, 'abc  ', 'x')"),
            Row(EQ, "[1006]", "(1006, 'x', 'abc ')", "(1006, 'x', 'abc')"),
            Row(CH, "[1007]", "(1007, 'abc', 'x')", "(1007, ' abc', 'x')"),
            Row(CH, "[1008]", r"(1008, E'ab\t', 'x')", "(1008, 'ab', 'x')"),
            Row(CH, "[1009]", "(1009, 'x', 'ab')", "(1009, 'x', 'a b')"),
        ],
        ..BASE },
    Case { name: "empty_source",
        pg: "id BIGINT PRIMARY KEY, v integer", my: "id BIGINT PRIMARY KEY, v INT",
        diff: &[
            Row(EX, "[1]", "", "(1, 1)"),
            Row(EX, "[2]", "", "(2, 1)"),
            Row(EX, "[3]", "", "(3, 1)"),
        ],
        ..BASE },
    Case { name: "empty_target",
        pg: "id BIGINT PRIMARY KEY, v integer", my: "id BIGINT PRIMARY KEY, v INT",
        diff: &[Row(MI, "[1]", "(1, 1)", ""), Row(MI, "[2]", "(2, 1)", "")],
        ..BASE },
    Case { name: "both_empty",
        pg: "id BIGINT PRIMARY KEY, v integer", my: "id BIGINT PRIMARY KEY, v INT",
        ..BASE },
    // a duplicate key on the target: reported in duplicate_keys and a warning; its
    // rows are not the source's one row, so the key is changed (with its `duplicates`)
    Case { name: "duplicate_keys",
        pg: "id BIGINT NOT NULL, v text", my: "id BIGINT NOT NULL, v TEXT",
        fill: Some(("g, 'v' || g", "seq, CONCAT('v', seq)", 300)),
        diff: &[Row(CH, "[77]", "", "(77, 'again')")],
        warnings: &["duplicate keys in the differing segments: 0 on the source, 1 on the target"],
        ..BASE },
];

/// PostgreSQL's or MariaDB's script for one variant of a case.
fn load_sql(c: &Case, table: &str, mariadb: bool, with_diff: bool) -> String {
    let (cols, prefix) = if mariadb {
        (c.my, "SET time_zone = '+00:00';\n")
    } else {
        (c.pg, "SET TIME ZONE 'UTC';\n")
    };
    let mut sql = format!("{prefix}DROP TABLE IF EXISTS {table};\nCREATE TABLE {table} ({cols});\n");
    if let Some((pg, my, n)) = c.fill {
        sql.push_str(&if mariadb {
            format!("INSERT INTO {table} SELECT {my} FROM seq_1_to_{n};\n")
        } else {
            format!("INSERT INTO {table} SELECT {pg} FROM generate_series(1, {n}) g;\n")
        });
    }
    let rows = c.same.iter().chain(if with_diff { c.diff } else { &[] });
    let tuples: Vec<&str> = rows
        .map(|r| if mariadb { r.3 } else { r.2 })
        .filter(|t| !t.is_empty())
        .collect();
    if !tuples.is_empty() {
        sql.push_str(&format!("INSERT INTO {table} VALUES {};\n", tuples.join(", ")));
    }
    if !mariadb {
        sql.push_str(&format!("ANALYZE {table};\n"));
    }
    sql
}

type Diffs = BTreeSet<(String, String)>;

fn truth(rows: &[&Row]) -> Diffs {
    rows.iter()
        .filter_map(|r| {
            let kind = match r.0 {
                T::Eq => return None,
                T::Changed => "changed",
                T::Missing => "missing_in_target",
                T::Extra => "extra_in_target",
            };
            let key: Value = serde_json::from_str(r.1).expect("key JSON");
            Some((kind.to_string(), key.to_string()))
        })
        .collect()
}

fn reported(j: &Value) -> Diffs {
    j["differences"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|d| {
                    (
                        d["kind"].as_str().unwrap_or("?").to_string(),
                        d["key"].to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn spec(c: &Case, dataset: &str, strategy: &str) -> String {
    let time = match (strategy, c.time_column) {
        ("time", Some(col)) => format!(", time_column: {col}, time_granularity: month"),
        _ => String::new(),
    };
    format!(
        "name: {dataset}\nsource: {{ agent: dc1, dataset: {dataset} }}\ntarget: {{ agent: vpc2, dataset: {dataset} }}\n\
         bisection: {{ strategy: {strategy}, {}{time} }}\nreporting: {{ level: with_keys }}\n{}",
        c.bisection, c.spec
    )
}

/// `tally run --json` on a spec file of its own (runs go in parallel).
fn run(dir: &Path, coordinator: &Path, file: &str, spec: &str) -> RunOutput {
    let path = dir.join(format!("{file}.yaml"));
    std::fs::write(&path, spec).expect("spec");
    let out = Command::new(tally_e2e::bins::tally())
        .arg("run")
        .arg(&path)
        .arg("-c")
        .arg(coordinator)
        .arg("--json")
        .output()
        .expect("tally run");
    parse_run(out)
}

/// Checks one run against its truth; the failure says what Tally said instead.
/// Warnings are checked on the variant with every row (`full`).
fn check(c: &Case, expected: &Diffs, out: &RunOutput, full: bool) -> Result<(), String> {
    let j = &out.json;
    if let Some((code, needles)) = c.error {
        let msg = j["error"]["message"].as_str().unwrap_or("");
        return if out.code == 2 && j["error"]["code"] == code && needles.iter().all(|n| msg.contains(n)) {
            Ok(())
        } else {
            Err(format!(
                "expected error {code} naming {needles:?}, got exit {}: {}",
                out.code, out.stdout
            ))
        };
    }
    let want = if expected.is_empty() {
        (0, "match")
    } else {
        (1, "differ")
    };
    let got = reported(j);
    if out.code != want.0 || j["verdict"] != want.1 || got != *expected {
        let missed: Vec<_> = expected.difference(&got).collect();
        let invented: Vec<_> = got.difference(expected).collect();
        return Err(format!(
            "expected {} {expected:?}; got exit {} {} (not reported: {missed:?}, wrongly reported: {invented:?}) error: {} warnings: {}",
            want.1, out.code, j["verdict"], j["error"], j["warnings"]
        ));
    }
    let warnings = j["warnings"].to_string();
    if let Some(n) = c.warnings.iter().find(|n| full && !warnings.contains(*n)) {
        return Err(format!("no warning contains {n:?}: {warnings}"));
    }
    Ok(())
}

/// Runs every variant, path and strategy of a case; returns a summary line and failures.
fn run_case(c: &Case, dir: &Path, coordinator: &Path) -> (String, Vec<String>) {
    let mut failures = Vec::new();
    let mut paths = BTreeSet::new();
    let strategies: &[&str] = match (c.error, c.time_column) {
        _ if !c.strategies.is_empty() => c.strategies,
        (Some(_), _) => &["quantile"],
        (None, Some(_)) => &["quantile", "hash", "time"],
        (None, None) => &["quantile", "hash"],
    };
    let variants: &[(&str, bool)] = if c.diff.is_empty() {
        &[("m", false)]
    } else {
        &[("m", false), ("d", true)]
    };
    for &(variant, with_diff) in variants {
        let rows: Vec<&Row> = c
            .same
            .iter()
            .chain(if with_diff { c.diff } else { &[] })
            .collect();
        let expected = truth(&rows);
        for hashing in ["auto", "push"] {
            let dataset = format!("{}_{variant}_{hashing}", c.name);
            for strategy in strategies {
                let out = run(
                    dir,
                    coordinator,
                    &format!("{dataset}_{strategy}"),
                    &spec(c, &dataset, strategy),
                );
                paths.insert(format!(
                    "{hashing}={}/{}",
                    out.json["source"]["path"].as_str().unwrap_or("-"),
                    out.json["target"]["path"].as_str().unwrap_or("-")
                ));
                if let Err(e) = check(c, &expected, &out, with_diff || c.diff.is_empty()) {
                    failures.push(format!("{} [{variant} {hashing} {strategy}]: {e}", c.name));
                }
            }
        }
    }
    let status = if failures.is_empty() { "ok" } else { "FAIL" };
    let summary = format!("{status:4} {:32} {} {:?}", c.name, strategies.join(","), paths);
    (summary, failures)
}

#[test]
fn corpus_of_cross_engine_traps() {
    run_corpus("corpus", CASES.iter().collect());
}

fn run_corpus(database: &str, cases: Vec<&Case>) {
    let only = std::env::var("CORPUS_CASE").ok();
    let cases: Vec<&Case> = cases
        .into_iter()
        .filter(|c| only.as_deref().is_none_or(|o| o == c.name))
        .collect();
    assert!(!cases.is_empty(), "no case named {only:?}");
    for c in &cases {
        for r in c.same.iter().chain(c.diff) {
            let ok = match r.0 {
                T::Eq => !r.2.is_empty() && !r.3.is_empty(),
                T::Missing => r.3.is_empty(),
                T::Extra => r.2.is_empty(),
                T::Changed => true,
            };
            assert!(ok, "{}: {r:?}", c.name);
        }
    }
    let (pg, my) = (db::postgres(), db::mariadb());
    let pg_url = pg.create_database(database);
    let my_url = my.create_database(database);
    let mut pg_datasets = Vec::new();
    let mut my_datasets = Vec::new();
    for c in &cases {
        for (variant, with_diff) in [("m", false), ("d", true)] {
            let table = format!("{}_{variant}", c.name);
            pg.exec(Some(database), &load_sql(c, &table, false, with_diff));
            my.exec(Some(database), &load_sql(c, &table, true, with_diff));
            // strategy time needs its column listed in the policy's time_columns
            let time_columns = c.time_column.unwrap_or_default();
            for (hashing, mode) in [("auto", "auto"), ("push", "pushdown")] {
                let body = |url: &str| {
                    format!(
                        "{{ url: '{url}', table: {table}, key: {}, hashing: {mode}, policy: {{ max_level: with_keys, time_columns: [{time_columns}] }} }}",
                        c.key
                    )
                };
                pg_datasets.push((format!("{table}_{hashing}"), body(&pg_url)));
                my_datasets.push((format!("{table}_{hashing}"), body(&my_url)));
            }
        }
    }
    let mut d = Deployment::new(&["dc1", "vpc2"]);
    d.start_agent_datasets("dc1", &pg_datasets);
    d.start_agent_datasets("vpc2", &my_datasets);
    let coordinator = d.coordinator_config();
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while let Some(c) = cases.get(next.fetch_add(1, Ordering::SeqCst)) {
                    let (summary, failures) = run_case(c, d.path(), &coordinator);
                    eprintln!("{summary}");
                    for f in &failures {
                        eprintln!("  {f}");
                    }
                    results.lock().unwrap().push((c.name, failures));
                }
            });
        }
    });
    let mut failures: Vec<_> = results.into_inner().unwrap();
    failures.sort();
    let failed: Vec<String> = failures.into_iter().flat_map(|(_, f)| f).collect();
    assert!(
        failed.is_empty(),
        "{} failing runs:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
