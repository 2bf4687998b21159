//! The tool-call audit trail: one JSON line per `tools/call` decision (`--audit-log`), for
//! Loki, a SIEM or a file shipper. A line names the session (namespace, name, uid), its agent
//! and subject, the server generation, the tool and the side effect policies declare for it,
//! the decision (`allow`, `refuse`, or `monitor` for a call a monitor-mode ToolPolicy would
//! have refused), its reason and policy, and the time the gateway took to decide. Never a
//! token, never an argument's value.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use serde_json::{json, Value};

use super::mcp::CallDecision;
use crate::credential::SessionClaims;

/// Where the audit lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuditTarget {
    Stdout,
    File(PathBuf),
}

impl AuditTarget {
    /// `-` is standard output; anything else a file, appended to.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "" => Err("must be a file path or - (standard output)".into()),
            "-" => Ok(Self::Stdout),
            path => Ok(Self::File(PathBuf::from(path))),
        }
    }
}

/// The audit log: lines are written whole, one writer at a time.
pub struct Audit {
    out: Mutex<Box<dyn Write + Send>>,
}

impl Audit {
    /// Opens the target (a file is created if missing and appended to): failing to open it
    /// stops startup, so an audit trail asked for is never silently missing.
    pub fn open(target: &AuditTarget) -> std::io::Result<Self> {
        let out: Box<dyn Write + Send> = match target {
            AuditTarget::Stdout => Box::new(std::io::stdout()),
            AuditTarget::File(path) => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
        };
        Ok(Self {
            out: Mutex::new(out),
        })
    }

    /// Records the decision on `call` for the session of `claims`; `body_refused` when the
    /// body it came in was held back (a batch with another call refused).
    pub fn decision(
        &self,
        claims: &SessionClaims,
        call: &CallDecision,
        body_refused: bool,
        latency: std::time::Duration,
    ) {
        let line = line(claims, call, body_refused, latency);
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        // One write per line: concurrent decisions never interleave within a line.
        let mut bytes = line.to_string().into_bytes();
        bytes.push(b'\n');
        if let Err(e) = out.write_all(&bytes).and_then(|()| out.flush()) {
            tracing::warn!(error = %e, "cannot write the audit log");
        }
    }
}

/// The line: `decision` is `refuse` (with the `reason` and, from a policy, the `policy`),
/// `monitor` (forwarded, though a monitor-mode policy would have refused it: its `reason` and
/// `policy`) or `allow`.
fn line(
    claims: &SessionClaims,
    call: &CallDecision,
    body_refused: bool,
    latency: std::time::Duration,
) -> Value {
    let time = k8s_openapi::jiff::Timestamp::now();
    let access = &claims.access;
    let outcome = &call.outcome;
    let (decision, reason, policy) = match (&outcome.refused, outcome.monitored.first()) {
        (Some(r), _) => ("refuse", Some(r.reason), r.policy.as_deref()),
        (None, _) if body_refused => ("refuse", Some("batch_refused"), None),
        (None, Some(f)) => ("monitor", Some(f.reason.as_str()), Some(f.policy.as_str())),
        (None, None) => ("allow", None, None),
    };
    json!({
        "time": time.to_string(),
        "kind": "tools/call",
        "session": {
            "namespace": access.session.namespace,
            "name": access.session.name,
            "uid": access.session.uid,
        },
        "agent": access.agent,
        "subject": access.subject,
        "server_uid": access.server.uid,
        "tool": call.tool,
        "side_effect": outcome.side_effect.map(|s| s.as_str()),
        "decision": decision,
        "reason": reason,
        "policy": policy,
        "latency_us": latency.as_micros() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(AuditTarget::parse("-"), Ok(AuditTarget::Stdout));
        assert_eq!(
            AuditTarget::parse("/var/log/a.jsonl"),
            Ok(AuditTarget::File("/var/log/a.jsonl".into()))
        );
        assert!(AuditTarget::parse("").is_err());
    }
}
