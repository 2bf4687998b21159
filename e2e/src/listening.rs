//! The addresses a process of ours bound, read from its standard error.
//!
//! Every binary of this project binds its listeners once (port 0: any free port) and prints
//! one line per listener, `<binary> listening on <ADDR> (<listener>)` (docs/operations.md).
//! Tests start the binaries on port 0 and learn the ports from these lines, never by binding
//! a port, dropping it and hoping nobody takes it before the child does.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a process may take to bind its listeners on a loaded 2-core machine: expected
/// well under a second (a debug build that connects to PostgreSQL first: a few seconds).
pub const LISTEN_TIMEOUT: Duration = Duration::from_secs(60);

/// The listening lines of one child process, as they arrive.
pub struct Listening {
    binary: String,
    lines: mpsc::Receiver<(String, SocketAddr)>,
    seen: BTreeMap<String, SocketAddr>,
}

/// Copies `from` (a child's stderr) to `log` line by line on a thread of its own, for as long
/// as the child writes (so a chatty child never blocks on a full pipe), and hands every
/// `<binary> listening on <ADDR> (<listener>)` line to the returned [`Listening`].
pub fn follow(
    binary: &str,
    from: impl Read + Send + 'static,
    mut log: impl Write + Send + 'static,
) -> Listening {
    let (tx, rx) = mpsc::channel();
    let marker = format!("{binary} listening on ");
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { return };
            let _ = writeln!(log, "{line}");
            if let Some(found) = parse(&line, &marker) {
                // The receiver may be gone (the test has what it needs): keep draining.
                let _ = tx.send(found);
            }
        }
    });
    Listening {
        binary: binary.to_string(),
        lines: rx,
        seen: BTreeMap::new(),
    }
}

/// `(listener, addr)` from a line that carries `marker` followed by `<ADDR> (<listener>)`.
fn parse(line: &str, marker: &str) -> Option<(String, SocketAddr)> {
    let rest = &line[line.find(marker)? + marker.len()..];
    let (addr, listener) = rest.trim_end().split_once(' ')?;
    let listener = listener.strip_prefix('(')?.strip_suffix(')')?;
    Some((listener.to_string(), addr.parse().ok()?))
}

/// Why [`Listening::take`] has no answer yet.
enum Missing {
    /// Not announced yet: ask again later.
    Yet(String),
    /// The process ended (its stderr closed) before announcing it.
    Ended(String),
}

impl Listening {
    /// The addresses of `listeners`, in that order, once each has been announced; an error
    /// when the process ends (its stderr closes) first or `within` passes.
    pub fn addrs(
        &mut self,
        listeners: &[&str],
        within: Duration,
    ) -> Result<Vec<SocketAddr>, String> {
        match self.take(listeners, Instant::now() + within) {
            Ok(addrs) => Ok(addrs),
            Err(Missing::Yet(l)) => Err(self.not_within(&l, within)),
            Err(Missing::Ended(l)) => Err(self.ended(&l)),
        }
    }

    /// [`Listening::addrs`] for async tests: polls without blocking the runtime's thread.
    pub async fn wait_addrs(
        &mut self,
        listeners: &[&str],
        within: Duration,
    ) -> Result<Vec<SocketAddr>, String> {
        let deadline = Instant::now() + within;
        loop {
            match self.take(listeners, Instant::now()) {
                Ok(addrs) => return Ok(addrs),
                Err(Missing::Ended(l)) => return Err(self.ended(&l)),
                Err(Missing::Yet(l)) if Instant::now() > deadline => {
                    return Err(self.not_within(&l, within))
                }
                Err(Missing::Yet(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// The ports of `listeners`, as [`Listening::addrs`].
    pub fn ports(&mut self, listeners: &[&str], within: Duration) -> Result<Vec<u16>, String> {
        Ok(self
            .addrs(listeners, within)?
            .into_iter()
            .map(|a| a.port())
            .collect())
    }

    /// The ports of `listeners`, as [`Listening::wait_addrs`].
    pub async fn wait_ports(
        &mut self,
        listeners: &[&str],
        within: Duration,
    ) -> Result<Vec<u16>, String> {
        Ok(self
            .wait_addrs(listeners, within)
            .await?
            .into_iter()
            .map(|a| a.port())
            .collect())
    }

    /// Takes the lines that arrived until `deadline` (none past it) and answers from them.
    fn take(&mut self, listeners: &[&str], deadline: Instant) -> Result<Vec<SocketAddr>, Missing> {
        while let Some(missing) = listeners.iter().find(|l| !self.seen.contains_key(**l)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((listener, addr)) => {
                    self.seen.insert(listener, addr);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(Missing::Yet(missing.to_string()))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Missing::Ended(missing.to_string()))
                }
            }
        }
        Ok(listeners.iter().map(|l| self.seen[*l]).collect())
    }

    fn not_within(&self, listener: &str, within: Duration) -> String {
        format!(
            "{} did not announce its {listener} listener within {within:?} (seen: {:?})",
            self.binary, self.seen
        )
    }

    fn ended(&self, listener: &str) -> String {
        format!(
            "{} ended before announcing its {listener} listener (seen: {:?})",
            self.binary, self.seen
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_listener_and_copies_every_line() {
        let stderr = "starting\n\
            mcp-access-apiserver listening on 127.0.0.1:41234 (api)\n\
            other-binary listening on 127.0.0.1:1 (metrics)\n\
            mcp-access-apiserver listening on 127.0.0.1:41235 (metrics)\n";
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        struct Log(mpsc::Sender<Vec<u8>>);
        impl Write for Log {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                let _ = self.0.send(b.to_vec());
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut l = follow(
            "mcp-access-apiserver",
            std::io::Cursor::new(stderr.as_bytes().to_vec()),
            Log(tx),
        );
        assert_eq!(
            l.ports(&["metrics", "api"], Duration::from_secs(5))
                .unwrap(),
            [41235, 41234]
        );
        let err = l.ports(&["sync"], Duration::from_secs(5)).unwrap_err();
        assert!(err.contains("ended before announcing its sync"), "{err}");
        let copied: Vec<u8> = rx.iter().flatten().collect();
        assert_eq!(String::from_utf8(copied).unwrap(), stderr);
    }
}
