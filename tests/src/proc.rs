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

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> u16 {
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
