//! Replication positions (DESIGN §5, watermarks): what an agent reads as "how far this
//! database has written" (a source) or "how far it has applied its source's changes"
//! (a target), and the one comparison that says whether a target has reached a source's
//! position. Three kinds, each with a textual form the databases print:
//!
//! - `lsn`: a PostgreSQL WAL position, `X/Y` in hex (a 64-bit number).
//! - `gtid`: a MariaDB GTID position, `domain-server-seq` per replication domain,
//!   comma-separated (`0-1-42,1-2-7`); empty before the first transaction.
//! - `integer`: an offset or sequence a pipeline keeps (a Kafka offset, a CDC sequence,
//!   a heartbeat counter), a signed 64-bit integer.
//!
//! Positions travel as text and are parsed again by whoever compares them, so a value
//! that does not parse is refused, never compared loosely.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PositionKind {
    Lsn,
    Gtid,
    Integer,
}

impl PositionKind {
    pub fn name(self) -> &'static str {
        match self {
            PositionKind::Lsn => "lsn",
            PositionKind::Gtid => "gtid",
            PositionKind::Integer => "integer",
        }
    }

    pub fn from_name(s: &str) -> Option<PositionKind> {
        Some(match s {
            "lsn" => PositionKind::Lsn,
            "gtid" => PositionKind::Gtid,
            "integer" => PositionKind::Integer,
            _ => return None,
        })
    }
}

impl fmt::Display for PositionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A position as read, in its normalised text (see [`Position::parse`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub kind: PositionKind,
    pub value: String,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{} (none yet)", self.kind)
        } else {
            write!(f, "{} {}", self.kind, self.value)
        }
    }
}

/// A parsed position: what comparisons work on.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Parsed {
    Lsn(u64),
    /// domain → sequence number (the server id does not order anything).
    Gtid(BTreeMap<u32, u64>),
    Integer(i64),
}

fn parse_lsn(t: &str) -> Option<u64> {
    let (hi, lo) = t.split_once('/')?;
    let ok = |p: &str| !p.is_empty() && p.len() <= 8 && p.bytes().all(|b| b.is_ascii_hexdigit());
    if !ok(hi) || !ok(lo) {
        return None;
    }
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

fn parse_gtid(t: &str) -> Result<BTreeMap<u32, u64>, String> {
    let mut out = BTreeMap::new();
    for part in t.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let f: Vec<&str> = part.split('-').collect();
        let [d, s, n] = f.as_slice() else {
            return Err(format!("{part:?} is not domain-server-sequence"));
        };
        let num = |x: &str| x.bytes().all(|b| b.is_ascii_digit()) && !x.is_empty();
        if !(num(d) && num(s) && num(n)) {
            return Err(format!("{part:?} is not domain-server-sequence"));
        }
        let domain: u32 = d.parse().map_err(|_| format!("{part:?}: domain out of range"))?;
        let _server: u32 = s
            .parse()
            .map_err(|_| format!("{part:?}: server id out of range"))?;
        let seq: u64 = n
            .parse()
            .map_err(|_| format!("{part:?}: sequence out of range"))?;
        if out.insert(domain, seq).is_some() {
            return Err(format!("domain {domain} appears twice"));
        }
    }
    Ok(out)
}

impl Position {
    /// Parses `text` as a position of `kind`, normalised: an LSN in upper-case hex
    /// without leading zeros (as PostgreSQL prints it), a GTID position with its
    /// domains in order, an integer without sign or zeros it does not need.
    pub fn parse(kind: PositionKind, text: &str) -> Result<Position, String> {
        let t = text.trim();
        let value = match Position::parsed(kind, t)? {
            Parsed::Lsn(n) => format!("{:X}/{:X}", n >> 32, n & 0xFFFF_FFFF),
            Parsed::Integer(n) => n.to_string(),
            Parsed::Gtid(_) => {
                // keep the server ids as read (they say who wrote it), numbers without
                // leading zeros, domains in order
                let mut parts: Vec<(u32, u32, u64)> = t
                    .split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .filter_map(|p| {
                        let mut f = p.split('-');
                        Some((
                            f.next()?.parse().ok()?,
                            f.next()?.parse().ok()?,
                            f.next()?.parse().ok()?,
                        ))
                    })
                    .collect();
                parts.sort();
                parts
                    .iter()
                    .map(|(d, s, n)| format!("{d}-{s}-{n}"))
                    .collect::<Vec<_>>()
                    .join(",")
            }
        };
        Ok(Position { kind, value })
    }

    fn parsed(kind: PositionKind, t: &str) -> Result<Parsed, String> {
        match kind {
            PositionKind::Lsn => parse_lsn(t)
                .map(Parsed::Lsn)
                .ok_or_else(|| format!("{t:?} is not a WAL position (X/Y in hex)")),
            PositionKind::Gtid => parse_gtid(t).map(Parsed::Gtid),
            PositionKind::Integer => t
                .parse::<i64>()
                .map(Parsed::Integer)
                .map_err(|_| format!("{t:?} is not a 64-bit integer")),
        }
    }

    /// Whether `self`, a target's applied position, has reached `wanted`, a source's
    /// position of the same kind: an LSN or integer at least as large; a GTID position
    /// with, for every domain of `wanted`, a sequence number at least as large (as
    /// MariaDB's `MASTER_GTID_WAIT` compares). Positions of different kinds, or text
    /// that does not parse, are an error: never "reached".
    pub fn reached(&self, wanted: &Position) -> Result<bool, String> {
        if self.kind != wanted.kind {
            return Err(format!(
                "a {} position cannot be compared with a {} position",
                self.kind, wanted.kind
            ));
        }
        Ok(
            match (
                Position::parsed(self.kind, &self.value)?,
                Position::parsed(wanted.kind, &wanted.value)?,
            ) {
                (Parsed::Lsn(a), Parsed::Lsn(w)) => a >= w,
                (Parsed::Integer(a), Parsed::Integer(w)) => a >= w,
                (Parsed::Gtid(a), Parsed::Gtid(w)) => w
                    .iter()
                    .all(|(domain, seq)| a.get(domain).is_some_and(|have| have >= seq)),
                _ => unreachable!("same kind, same parse"),
            },
        )
    }

    /// For a GTID position not reached: the domains still behind, as `domain: have <
    /// want` (for error messages).
    pub fn behind(&self, wanted: &Position) -> String {
        if let (Ok(Parsed::Gtid(a)), Ok(Parsed::Gtid(w))) = (
            Position::parsed(self.kind, &self.value),
            Position::parsed(wanted.kind, &wanted.value),
        ) {
            let lagging: Vec<String> = w
                .iter()
                .filter(|(d, s)| a.get(d).is_none_or(|have| have < s))
                .map(|(d, s)| match a.get(d) {
                    Some(have) => format!("domain {d} at {have} of {s}"),
                    None => format!("domain {d} not applied at all (wanted {s})"),
                })
                .collect();
            return lagging.join(", ");
        }
        format!("at {} of {}", self.value, wanted.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(kind: PositionKind, t: &str) -> Position {
        Position::parse(kind, t).unwrap()
    }

    #[test]
    fn lsns_parse_normalise_and_compare_as_numbers() {
        assert_eq!(p(PositionKind::Lsn, " 0/016B3748 ").value, "0/16B3748");
        assert_eq!(p(PositionKind::Lsn, "1/0").value, "1/0");
        // 1/0 is past FFFFFFFF within segment 0: compared as numbers, not as text
        assert!(
            p(PositionKind::Lsn, "1/0")
                .reached(&p(PositionKind::Lsn, "0/FFFFFFFF"))
                .unwrap()
        );
        assert!(
            !p(PositionKind::Lsn, "0/A")
                .reached(&p(PositionKind::Lsn, "0/9A"))
                .unwrap()
        );
        assert!(
            p(PositionKind::Lsn, "0/9A")
                .reached(&p(PositionKind::Lsn, "0/9a"))
                .unwrap()
        );
        for bad in ["", "0", "0/", "/1", "0/G", "123456789/0", "0/1/2", "-1/0"] {
            assert!(Position::parse(PositionKind::Lsn, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn gtid_positions_compare_per_domain_and_every_wanted_domain_counts() {
        let want = p(PositionKind::Gtid, "1-2-7,0-1-42");
        assert_eq!(want.value, "0-1-42,1-2-7");
        assert_eq!(p(PositionKind::Gtid, " 007-01-042 ").value, "7-1-42");
        assert!(p(PositionKind::Gtid, "0-1-42,1-2-7").reached(&want).unwrap());
        // a failover changes the server id, not the order: the sequence counts
        assert!(
            p(PositionKind::Gtid, "0-3-43,1-2-9,5-1-1")
                .reached(&want)
                .unwrap()
        );
        // one domain behind, or missing, is not reached
        let behind = p(PositionKind::Gtid, "0-1-41,1-2-7");
        assert!(!behind.reached(&want).unwrap());
        assert_eq!(behind.behind(&want), "domain 0 at 41 of 42");
        let missing = p(PositionKind::Gtid, "0-1-50");
        assert!(!missing.reached(&want).unwrap());
        assert!(missing.behind(&want).contains("domain 1 not applied"));
        // an empty position is reached by anything: agents refuse to report or wait for one
        assert!(
            p(PositionKind::Gtid, "")
                .reached(&p(PositionKind::Gtid, ""))
                .unwrap()
        );
        for bad in [
            "0-1",
            "0-1-x",
            "a-1-2",
            "0-1-2,0-2-3",
            "0-1-2-3",
            "99999999999-1-1",
        ] {
            assert!(Position::parse(PositionKind::Gtid, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn integers_and_mixed_kinds() {
        assert_eq!(p(PositionKind::Integer, "+0042").value, "42");
        assert!(
            p(PositionKind::Integer, "-1")
                .reached(&p(PositionKind::Integer, "-2"))
                .unwrap()
        );
        assert!(
            !p(PositionKind::Integer, "9")
                .reached(&p(PositionKind::Integer, "10"))
                .unwrap()
        );
        assert!(Position::parse(PositionKind::Integer, "1.5").is_err());
        assert!(Position::parse(PositionKind::Integer, "99999999999999999999").is_err());
        // kinds never compare, whatever the text
        let e = p(PositionKind::Integer, "5")
            .reached(&p(PositionKind::Lsn, "0/5"))
            .unwrap_err();
        assert!(e.contains("integer") && e.contains("lsn"), "{e}");
        // text that is not of its kind never counts as reached
        let forged = Position {
            kind: PositionKind::Lsn,
            value: "zz".into(),
        };
        assert!(forged.reached(&p(PositionKind::Lsn, "0/1")).is_err());
    }
}
