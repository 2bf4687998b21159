//! SSE framing for cutting a stream: bytes are passed on whole events at a time (the tail of
//! an event still arriving is held back), so a cut never leaves half an event on the wire and
//! the closing `event: message` with a JSON-RPC error is read as an event of its own.

use bytes::{Bytes, BytesMut};
use serde_json::Value;

/// JSON-RPC error code of a stream ended because its session stopped being usable.
pub const SESSION_ENDED: i64 = -32000;

/// Passes an SSE byte stream on at event boundaries.
#[derive(Debug, Default)]
pub struct SseFramer {
    /// Bytes after the last event boundary.
    pending: BytesMut,
    /// No character since the last line end: the next line end ends an event.
    line_empty: bool,
    /// The last byte scanned was CR (a following LF belongs to the same line end).
    after_cr: bool,
    /// A held tail larger than this is passed on anyway (an upstream that never ends its
    /// events must not grow memory without bound).
    max_pending: usize,
    /// Bytes passed on end mid-event (only after an overflow).
    mid_event: bool,
}

impl SseFramer {
    /// A framer holding back at most `max_pending` bytes.
    pub fn new(max_pending: usize) -> Self {
        Self {
            max_pending,
            ..Self::default()
        }
    }

    /// Takes a chunk from the upstream; returns what may be passed on now (possibly empty).
    pub fn push(&mut self, chunk: &[u8]) -> Bytes {
        let start = self.pending.len();
        self.pending.extend_from_slice(chunk);
        let mut boundary = None;
        for (i, &b) in self.pending[start..].iter().enumerate() {
            let at = start + i;
            match b {
                b'\n' if self.after_cr => {
                    // The LF of a CRLF: an event ended by this line end ends after the LF.
                    self.after_cr = false;
                    if boundary == Some(at) {
                        boundary = Some(at + 1);
                    }
                }
                b'\r' | b'\n' => {
                    self.after_cr = b == b'\r';
                    if self.line_empty {
                        boundary = Some(at + 1);
                    }
                    self.line_empty = true;
                }
                _ => {
                    self.after_cr = false;
                    self.line_empty = false;
                }
            }
        }
        // A CRLF split across chunks: the LF arrives next and is passed on with what follows.
        match boundary {
            Some(end) => {
                self.mid_event = false;
                self.pending.split_to(end).freeze()
            }
            None if self.pending.len() > self.max_pending => {
                self.mid_event = true;
                self.pending.split().freeze()
            }
            None => Bytes::new(),
        }
    }

    /// The upstream ended: whatever is held is passed on as it is.
    pub fn finish(&mut self) -> Bytes {
        self.pending.split().freeze()
    }

    /// The stream is cut for `reason`: the held partial event is dropped and the closing
    /// events are returned, one JSON-RPC error per id owed (or one with a null id).
    pub fn cut(&mut self, reason: &str, ids: &[Value]) -> Bytes {
        self.pending.clear();
        let mut out = String::new();
        if self.mid_event {
            out.push_str("\n\n");
        }
        let null = [Value::Null];
        let ids = if ids.is_empty() { &null[..] } else { ids };
        for id in ids {
            out.push_str("event: message\ndata: ");
            out.push_str(&error_message(reason, id).to_string());
            out.push_str("\n\n");
        }
        Bytes::from(out)
    }
}

/// Rewrites the whole events of `events` (as [`SseFramer::push`] passes them on) whose data is
/// JSON that `rewrite` changes: such an event keeps its other fields and gets its new data on
/// one line; every other byte passes unchanged.
pub fn rewrite_events(events: &[u8], rewrite: &mut dyn FnMut(&mut Value) -> bool) -> Bytes {
    let mut out = Vec::with_capacity(events.len());
    let mut start = 0;
    let mut line_start = 0;
    let mut i = 0;
    let mut emit = |event: &[u8], out: &mut Vec<u8>| match rewritten(event, rewrite) {
        Some(new) => out.extend_from_slice(&new),
        None => out.extend_from_slice(event),
    };
    while i < events.len() {
        let b = events[i];
        if b == b'\r' || b == b'\n' {
            let mut end = i + 1;
            if b == b'\r' && events.get(i + 1) == Some(&b'\n') {
                end += 1;
            }
            if line_start == i {
                // A blank line ends the event.
                emit(&events[start..end], &mut out);
                start = end;
            }
            line_start = end;
            i = end;
        } else {
            i += 1;
        }
    }
    if start < events.len() {
        out.extend_from_slice(&events[start..]);
    }
    Bytes::from(out)
}

/// One event rewritten, or `None` when it stays as it is.
fn rewritten(event: &[u8], rewrite: &mut dyn FnMut(&mut Value) -> bool) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(event).ok()?;
    let mut data = Vec::new();
    let mut others = Vec::new();
    for line in text.split(['\n', '\r']).filter(|l| !l.is_empty()) {
        match line.strip_prefix("data:") {
            Some(value) => data.push(value.strip_prefix(' ').unwrap_or(value)),
            None => others.push(line),
        }
    }
    if data.is_empty() {
        return None;
    }
    let mut message: Value = serde_json::from_str(&data.join("\n")).ok()?;
    if !rewrite(&mut message) {
        return None;
    }
    let mut out = String::new();
    for line in others {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str("data: ");
    out.push_str(&message.to_string());
    out.push_str("\n\n");
    Some(out.into_bytes())
}

/// The JSON-RPC error that ends a stream whose session stopped being usable.
pub fn error_message(reason: &str, id: &Value) -> Value {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": SESSION_ENDED,
            "message": format!("MCP Access: the session is no longer usable ({reason})"),
            "data": {"reason": reason},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_events_pass_and_tails_wait() {
        let mut f = SseFramer::new(1024);
        assert_eq!(
            f.push(b"event: message\ndata: {\"a\":1}\n\n"),
            &b"event: message\ndata: {\"a\":1}\n\n"[..]
        );
        assert_eq!(f.push(b"data: {\"b\""), &b""[..]);
        assert_eq!(f.push(b":2}\n"), &b""[..]);
        assert_eq!(f.push(b"\nid: 3\n"), &b"data: {\"b\":2}\n\n"[..]);
        assert_eq!(f.finish(), &b"id: 3\n"[..]);
    }

    #[test]
    fn crlf_and_cr_line_ends() {
        let mut f = SseFramer::new(1024);
        assert_eq!(f.push(b"data: x\r\n\r\ndata: y"), &b"data: x\r\n\r\n"[..]);
        let mut f = SseFramer::new(1024);
        assert_eq!(f.push(b"data: x\r\r"), &b"data: x\r\r"[..]);
        // CRLF split across chunks: the CR ends the event, the LF travels with the next.
        let mut f = SseFramer::new(1024);
        assert_eq!(f.push(b"data: x\r\n\r"), &b"data: x\r\n\r"[..]);
        assert_eq!(f.push(b"\ndata: y\n\n"), &b"\ndata: y\n\n"[..]);
    }

    #[test]
    fn a_cut_drops_the_partial_event_and_closes_with_errors() {
        let mut f = SseFramer::new(1024);
        f.push(b"data: {\"partial\":");
        let out = f.cut("session_revoked", &[serde_json::json!(7)]);
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.starts_with("event: message\ndata: {"), "{text}");
        assert!(text.ends_with("\n\n"));
        let data: Value =
            serde_json::from_str(text.lines().nth(1).unwrap().strip_prefix("data: ").unwrap())
                .unwrap();
        assert_eq!(data["id"], 7);
        assert_eq!(data["error"]["code"], SESSION_ENDED);
        assert_eq!(data["error"]["data"]["reason"], "session_revoked");
        assert!(!text.contains("partial"));
        let out = f.cut("cache_stale", &[]);
        assert!(std::str::from_utf8(&out).unwrap().contains("\"id\":null"));
    }

    #[test]
    fn an_endless_event_is_bounded() {
        let mut f = SseFramer::new(8);
        assert_eq!(f.push(b"data: 1234567890"), &b"data: 1234567890"[..]);
        let out = f.cut("session_revoked", &[]);
        assert!(
            out.starts_with(b"\n\nevent: message\n"),
            "the overflowed event is ended first"
        );
    }

    #[test]
    fn events_whose_json_changes_are_rewritten_and_the_rest_pass() {
        let input = b"event: message\r\nid: 4\r\ndata: {\"a\":1,\r\ndata: \"b\":2}\r\n\r\n: comment\n\nevent: message\ndata: {\"a\":3}\n\n";
        let out = rewrite_events(input, &mut |v: &mut Value| {
            if v["a"] == 1 {
                v["a"] = serde_json::json!(9);
                true
            } else {
                false
            }
        });
        let out = std::str::from_utf8(&out).unwrap();
        assert_eq!(
            out,
            "event: message\nid: 4\ndata: {\"a\":9,\"b\":2}\n\n: comment\n\nevent: message\ndata: {\"a\":3}\n\n"
        );
    }
}
