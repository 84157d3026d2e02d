//! Network topologies made of Linux network namespaces, for tests that need real
//! network separation. [`Topology`]: a hub (the coordinator's network) linked by a veth
//! pair to each of two zones; the hub does not forward, so the zones cannot reach each
//! other, and each zone's databases listen on its own loopback only. [`Lan`]: hosts on
//! one Linux bridge, any pair of which can be partitioned and healed. Everything is
//! removed when the topology is dropped, and by a reaper if the test process dies first.

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

/// One host of a [`Lan`].
#[derive(Debug)]
pub struct Host {
    /// Its host name, which every host of the Lan resolves.
    pub name: String,
    /// Namespace name.
    pub ns: String,
    /// The host's address on the bridge.
    pub addr: String,
}

/// Hosts on one Ethernet segment: a hub namespace holding a Linux bridge (with the
/// address [`Lan::HUB_ADDR`] on it, for servers every host reaches) and one namespace
/// per host, each with a veth into the bridge at 10.214.0.11, .12, … Each host resolves
/// every host's name: processes started with `ip netns exec` see the Lan's own
/// `/etc/hosts` (iproute2 mounts `/etc/netns/NS/hosts` over it), which the Lan writes
/// and removes.
///
/// A partition is made of blackhole routes inside the hosts' namespaces ([`Lan::cut`]):
/// packets between the two hosts are dropped by the sender's routing, both ways, while
/// both still reach the hub and every other host. A new connection fails at once, an
/// established one goes silent (its segments are dropped and retransmitted until it
/// times out or the cut is mended).
#[derive(Debug)]
pub struct Lan {
    pub hub: String,
    pub hosts: Vec<Host>,
}

/// iproute2's per-namespace configuration directory.
fn etc_of(ns: &str) -> String {
    format!("/etc/netns/{ns}")
}

impl Lan {
    pub const HUB_ADDR: &'static str = "10.214.0.1";

    /// A Lan of one host per name (at most 9).
    pub fn new(names: &[&str]) -> Lan {
        assert!((1..=9).contains(&names.len()), "a Lan has 1 to 9 hosts");
        // this process's id and its how-many-th Lan: two tests of one binary run at once
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let nth = MADE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let id = format!(
            "{}{}",
            std::process::id() % 100_000,
            (b'a' + (nth % 26) as u8) as char
        );
        let hub = format!("tl{id}h");
        let hosts: Vec<Host> = names
            .iter()
            .enumerate()
            .map(|(i, name)| Host {
                name: name.to_string(),
                ns: format!("tl{id}n{}", i + 1),
                addr: format!("10.214.0.{}", 11 + i),
            })
            .collect();
        let mut all = vec![hub.clone()];
        all.extend(hosts.iter().map(|h| h.ns.clone()));
        // the reaper first: whatever happens next, the namespaces go away
        crate::db::reaper(&format!(
            "for n in {}; do ip netns pids $n 2>/dev/null | xargs -r kill -9; ip netns del $n 2>/dev/null; \
             rm -rf /etc/netns/$n; done",
            all.join(" ")
        ));
        let lan = Lan { hub, hosts };
        for n in &all {
            ip(&["netns", "add", n]);
            ip(&["-n", n, "link", "set", "lo", "up"]);
        }
        ip(&["-n", &lan.hub, "link", "add", "br0", "type", "bridge"]);
        ip(&[
            "-n",
            &lan.hub,
            "addr",
            "add",
            &format!("{}/24", Lan::HUB_ADDR),
            "dev",
            "br0",
        ]);
        ip(&["-n", &lan.hub, "link", "set", "br0", "up"]);
        let mut etc_hosts = String::from("127.0.0.1 localhost\n::1 localhost\n");
        for h in &lan.hosts {
            etc_hosts.push_str(&format!("{} {}\n", h.addr, h.name));
        }
        for (i, h) in lan.hosts.iter().enumerate() {
            let port = format!("tl{id}v{}", i + 1);
            ip(&[
                "link", "add", &port, "netns", &lan.hub, "type", "veth", "peer", "name", "eth0", "netns",
                &h.ns,
            ]);
            ip(&["-n", &lan.hub, "link", "set", &port, "master", "br0", "up"]);
            ip(&[
                "-n",
                &h.ns,
                "addr",
                "add",
                &format!("{}/24", h.addr),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &h.ns, "link", "set", "eth0", "up"]);
            let etc = etc_of(&h.ns);
            std::fs::create_dir_all(&etc).unwrap_or_else(|e| panic!("creating {etc}: {e}"));
            std::fs::write(format!("{etc}/hosts"), &etc_hosts)
                .unwrap_or_else(|e| panic!("writing {etc}/hosts: {e}"));
        }
        lan
    }

    /// Drops every packet between hosts `a` and `b` (indexes into `hosts`), both ways.
    pub fn cut(&self, a: usize, b: usize) {
        for (from, to) in [(a, b), (b, a)] {
            let dst = format!("{}/32", self.hosts[to].addr);
            ip(&["-n", &self.hosts[from].ns, "route", "add", "blackhole", &dst]);
        }
    }

    /// Removes the cut between hosts `a` and `b`.
    pub fn mend(&self, a: usize, b: usize) {
        for (from, to) in [(a, b), (b, a)] {
            let dst = format!("{}/32", self.hosts[to].addr);
            ip(&["-n", &self.hosts[from].ns, "route", "del", "blackhole", &dst]);
        }
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for n in std::iter::once(&self.hub).chain(self.hosts.iter().map(|h| &h.ns)) {
            if let Ok(out) = Command::new("ip").args(["netns", "pids", n]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
            let _ = Command::new("ip").args(["netns", "del", n]).status();
            let _ = std::fs::remove_dir_all(etc_of(n));
        }
    }
}
