//! Network zones made of Linux network namespaces, for tests that need real network
//! separation: a hub (the coordinator's network) linked by a veth pair to each of two
//! zones. The hub does not forward, so the zones cannot reach each other, and each
//! zone's databases listen on its own loopback only. Everything is removed when the
//! topology is dropped, and by a reaper if the test process dies first.

use std::process::{Command, Stdio};

#[derive(Debug)]
pub struct Zone {
    /// Namespace name.
    pub ns: String,
    /// The zone's address on its link to the hub.
    pub addr: String,
    /// The hub-side interface of the link (for byte counters and cutting the link).
    pub hub_if: String,
}

#[derive(Debug)]
pub struct Topology {
    pub hub: String,
    pub a: Zone,
    pub b: Zone,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("running ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Topology {
    pub fn new() -> Topology {
        let id = std::process::id() % 100_000;
        let hub = format!("tz{id}h");
        let zone = |tag: &str, n: u8| Zone {
            ns: format!("tz{id}{tag}"),
            addr: format!("10.213.{n}.2"),
            hub_if: format!("th{id}{tag}"),
        };
        let (a, b) = (zone("a", 1), zone("b", 2));
        // the reaper first: whatever happens next, the namespaces go away
        let names = [&hub, &a.ns, &b.ns].map(|s| s.as_str()).join(" ");
        crate::db::reaper(&format!(
            "for n in {names}; do ip netns pids $n 2>/dev/null | xargs -r kill -9; ip netns del $n 2>/dev/null; done"
        ));
        for n in [&hub, &a.ns, &b.ns] {
            ip(&["netns", "add", n]);
            ip(&["-n", n, "link", "set", "lo", "up"]);
        }
        for (z, n) in [(&a, 1), (&b, 2)] {
            let zone_if = format!("{}z", z.hub_if);
            ip(&[
                "link", "add", &z.hub_if, "netns", &hub, "type", "veth", "peer", "name", &zone_if, "netns",
                &z.ns,
            ]);
            ip(&[
                "-n",
                &hub,
                "addr",
                "add",
                &format!("10.213.{n}.1/24"),
                "dev",
                &z.hub_if,
            ]);
            ip(&[
                "-n",
                &z.ns,
                "addr",
                "add",
                &format!("{}/24", z.addr),
                "dev",
                &zone_if,
            ]);
            ip(&["-n", &hub, "link", "set", &z.hub_if, "up"]);
            ip(&["-n", &z.ns, "link", "set", &zone_if, "up"]);
        }
        Topology { hub, a, b }
    }

    /// Bytes both ways on the hub's link to a zone.
    pub fn link_bytes(&self, z: &Zone) -> u64 {
        let read = |dir: &str| {
            let out = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &self.hub,
                    "cat",
                    &format!("/sys/class/net/{}/statistics/{dir}_bytes", z.hub_if),
                ])
                .output()
                .expect("reading link counters");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u64>()
                .unwrap_or(0)
        };
        read("rx") + read("tx")
    }

    /// Takes the hub's link to a zone down.
    pub fn cut(&self, z: &Zone) {
        ip(&["-n", &self.hub, "link", "set", &z.hub_if, "down"]);
    }

    /// Whether a TCP connection from namespace `from` to `addr:port` succeeds.
    pub fn can_connect(from: &str, addr: &str, port: u16) -> bool {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                from,
                "timeout",
                "3",
                "bash",
                "-c",
                &format!("exec 3<>/dev/tcp/{addr}/{port}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for n in [&self.hub, &self.a.ns, &self.b.ns] {
            if let Ok(out) = Command::new("ip").args(["netns", "pids", n]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

impl Default for Topology {
    fn default() -> Self {
        Topology::new()
    }
}
