//! A process stopped with SIGSTOP for as long as a test needs it: a database backend that
//! stops answering without closing its connection, a server that hangs.

/// A process stopped with SIGSTOP; continued (SIGCONT) when dropped, whatever the test's
/// outcome.
pub struct Stopped(pub i32);

impl Stopped {
    pub fn new(pid: i32) -> Self {
        signal("-STOP", pid);
        Self(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal("-CONT", self.0);
    }
}

fn signal(sig: &str, pid: i32) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {sig} {pid} failed");
}
