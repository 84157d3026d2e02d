//! Child processes tied to the test: killed on drop.

use std::process::{Child, Command, Stdio};

#[derive(Debug)]
pub struct ChildGuard {
    pub child: Child,
    pub name: String,
}

impl ChildGuard {
    pub fn spawn(name: &str, cmd: &mut Command) -> std::io::Result<ChildGuard> {
        let child = cmd.stdin(Stdio::null()).spawn()?;
        Ok(ChildGuard {
            child,
            name: name.to_string(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A free TCP port on 127.0.0.1 (bound, then released), for a server a test starts
/// later. It comes from below the kernel's ephemeral range, so an outgoing connection made
/// meanwhile (an agent to its database, a replica to a peer) cannot take it, and it is
/// never the same twice in one test process (a port bound by port 0 could be both).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    // 10000..low, starting at a place that differs between test processes
    let (start, span) = (10_000u32, low.saturating_sub(10_000).max(1000));
    let offset = std::process::id().wrapping_mul(2654435761) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = start + (offset + n) % span;
        let Ok(port) = u16::try_from(port) else { continue };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

/// Waits until something accepts TCP connections on `port`.
pub fn wait_for_port(port: u16, timeout: std::time::Duration) -> bool {
    let until = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < until {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}
