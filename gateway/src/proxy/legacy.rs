//! The legacy HTTP+SSE transport (MCP 2024-11-05): the client opens `GET /sse`, the server's
//! first event (`event: endpoint`) names the URL to POST messages to, carrying the transport
//! session in its query (`session_id` in the Python SDK, `sessionId` in the TypeScript SDK),
//! and answers arrive on the GET stream. Both requests pass through the gateway like any other;
//! this module lets the gateway hold that transport session to the AccessSession that opened
//! the stream, as [`super::session::Bindings`] does for `Mcp-Session-Id`: a POST naming a
//! stream of another AccessSession is 404, and one naming a stream cut by a revocation is
//! refused with its reason.

/// Query parameters that carry the transport session in the message URL.
pub const SESSION_PARAMS: [&str; 2] = ["session_id", "sessionId"];

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use serde_json::Value;

/// Longest transport session id taken (the SDKs use a UUID).
const MAX_ID_BYTES: usize = 256;

/// How much of a GET stream is read for the `endpoint` event (it is the first event).
pub const SCAN_LIMIT: usize = 64 * 1024;

/// The binding key of a legacy transport session (apart from `Mcp-Session-Id` values).
pub fn binding_key(id: &str) -> String {
    format!("legacy-sse:{id}")
}

/// A message URL names its transport session more than once, or not as a plausible id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the transport session id is named twice, empty, too long or not visible ASCII")]
pub struct MalformedSessionId;

/// The transport session a message URL's query names, if any. `Err` when it is named more
/// than once or is not a plausible id (empty, too long, not visible ASCII).
pub fn session_param(query: Option<&str>) -> Result<Option<&str>, MalformedSessionId> {
    let Some(query) = query else {
        return Ok(None);
    };
    let mut found = None;
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !SESSION_PARAMS.contains(&name) {
            continue;
        }
        if found.is_some()
            || value.is_empty()
            || value.len() > MAX_ID_BYTES
            || !value.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(MalformedSessionId);
        }
        found = Some(value);
    }
    Ok(found)
}

/// The events of `bytes` (whole SSE events): each one's name (`message` when unnamed) and
/// its data lines joined.
fn events(bytes: &[u8]) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(bytes);
    let normalized = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut out = Vec::new();
    for event in normalized.split("\n\n") {
        let mut name = "message";
        let mut data: Vec<&str> = Vec::new();
        for line in event.lines() {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => name = value,
                "data" => data.push(value),
                _ => {}
            }
        }
        if !data.is_empty() {
            out.push((name.to_string(), data.join("\n")));
        }
    }
    out
}

/// Reads the first events of a GET SSE stream for the `endpoint` event.
#[derive(Debug, Default)]
pub struct EndpointScan {
    scanned: usize,
    done: bool,
}

impl EndpointScan {
    /// Takes whole events as they pass (see [`super::sse::SseFramer`]); returns the transport
    /// session id the first `endpoint` event announces. Stops after that event, or after
    /// [`SCAN_LIMIT`] bytes.
    pub fn feed(&mut self, events_bytes: &[u8]) -> Option<String> {
        if self.done {
            return None;
        }
        self.scanned += events_bytes.len();
        if self.scanned > SCAN_LIMIT {
            self.done = true;
        }
        let (_, url) = events(events_bytes)
            .into_iter()
            .find(|(name, _)| name == "endpoint")?;
        self.done = true;
        let query = url
            .split_once('?')
            .map(|(_, q)| q.split('#').next().unwrap_or(q));
        session_param(query).ok().flatten().map(str::to_string)
    }
}

/// Most request ids a legacy stream is held to answer (older ones are forgotten first).
const MAX_OWED: usize = 1024;

/// The JSON-RPC requests posted on a legacy transport session whose answers its GET stream
/// still owes: when the stream is cut, each gets the closing error, so the caller of a
/// pending `tools/call` learns why (the SDKs drop an error with a null id).
#[derive(Debug, Default)]
pub struct Owed {
    ids: Mutex<Vec<Value>>,
    /// Events the gateway itself answers on the stream (a refused call's error), not yet
    /// passed on, and the stream's waker.
    injected: Mutex<(Vec<u8>, Option<std::task::Waker>)>,
    /// Ids of the `tools/list` requests posted on this transport session (their answers on
    /// the stream are filtered to the session's granted tools).
    lists: Mutex<Vec<Value>>,
}

impl Owed {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Value>> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Requests `ids` were accepted for this stream.
    pub fn owe(&self, ids: &[Value]) {
        let mut owed = self.lock();
        owed.extend(ids.iter().cloned());
        let excess = owed.len().saturating_sub(MAX_OWED);
        owed.drain(..excess);
    }

    /// Whole events passed on the stream: the responses among them are no longer owed.
    pub fn passed(&self, events_bytes: &[u8]) {
        if self.lock().is_empty() {
            return;
        }
        for (name, data) in events(events_bytes) {
            if name != "message" {
                continue;
            }
            let Ok(message) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            let messages = match message {
                Value::Array(batch) => batch,
                one => vec![one],
            };
            let mut owed = self.lock();
            for m in messages {
                let is_response = m.get("result").is_some() || m.get("error").is_some();
                if let (true, Some(id)) = (is_response, m.get("id")) {
                    owed.retain(|o| o != id);
                }
            }
        }
    }

    /// `tools/list` requests `ids` are about to be posted on this transport session.
    pub fn owe_lists(&self, ids: &[Value]) {
        let mut lists = self.lists.lock().unwrap_or_else(|e| e.into_inner());
        lists.extend(ids.iter().cloned());
        let excess = lists.len().saturating_sub(MAX_OWED);
        lists.drain(..excess);
    }

    /// The `tools/list` requests whose answers the stream may still carry.
    pub fn list_ids(&self) -> Vec<Value> {
        self.lists.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Queues JSON-RPC `messages` the gateway answers itself, to be passed on the stream
    /// between two of the upstream's events, and wakes the stream.
    pub fn inject(&self, messages: &[Value]) {
        let mut injected = self.injected.lock().unwrap_or_else(|e| e.into_inner());
        for message in messages {
            injected.0.extend_from_slice(b"event: message\ndata: ");
            injected.0.extend_from_slice(message.to_string().as_bytes());
            injected.0.extend_from_slice(b"\n\n");
        }
        if let Some(waker) = injected.1.take() {
            waker.wake();
        }
    }

    /// What was injected since the last call, if anything; `waker` is woken by the next.
    pub fn take_injected(&self, waker: &std::task::Waker) -> Option<bytes::Bytes> {
        let mut injected = self.injected.lock().unwrap_or_else(|e| e.into_inner());
        injected.1 = Some(waker.clone());
        (!injected.0.is_empty()).then(|| bytes::Bytes::from(std::mem::take(&mut injected.0)))
    }

    /// The ids still owed, handed over to the cut.
    pub fn take(&self) -> Vec<Value> {
        std::mem::take(&mut *self.lock())
    }
}

/// The open legacy streams of a gateway, by binding key; an entry lives while its GET stream
/// does.
#[derive(Debug, Default)]
pub struct Streams {
    map: Mutex<HashMap<String, Weak<Owed>>>,
}

impl Streams {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Weak<Owed>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A GET stream announced `key`: what it owes is recorded here until it ends.
    pub fn open(&self, key: String) -> Arc<Owed> {
        let owed = Arc::new(Owed::default());
        let mut map = self.lock();
        // Entries of ended streams go as the map doubles (amortized O(1)).
        if map.len() >= 64 && map.len().is_power_of_two() {
            map.retain(|_, w| w.strong_count() > 0);
        }
        map.insert(key, Arc::downgrade(&owed));
        owed
    }

    /// The open stream of `key`, if any.
    fn stream(&self, key: &str) -> Option<Arc<Owed>> {
        self.lock().get(key).and_then(Weak::upgrade)
    }

    /// Requests `ids` posted to `key` were accepted: its stream owes their answers.
    pub fn owe(&self, key: &str, ids: &[Value]) {
        if let Some(owed) = self.stream(key).filter(|_| !ids.is_empty()) {
            owed.owe(ids);
        }
    }

    /// `tools/list` requests `ids` are about to be posted to `key` (see [`Owed::owe_lists`]).
    pub fn owe_lists(&self, key: &str, ids: &[Value]) {
        if let Some(owed) = self.stream(key).filter(|_| !ids.is_empty()) {
            owed.owe_lists(ids);
        }
    }

    /// Answers `messages` on `key`'s open stream (see [`Owed::inject`]); false when no stream
    /// of `key` is open.
    pub fn inject(&self, key: &str, messages: &[Value]) -> bool {
        self.stream(key).map(|owed| owed.inject(messages)).is_some()
    }

    /// Open streams.
    pub fn len(&self) -> usize {
        self.lock()
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    /// No open stream.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_session_of_a_message_url() {
        assert_eq!(session_param(None), Ok(None));
        assert_eq!(session_param(Some("a=1")), Ok(None));
        assert_eq!(session_param(Some("session_id=abc")), Ok(Some("abc")));
        assert_eq!(session_param(Some("x=1&sessionId=9f-2")), Ok(Some("9f-2")));
        for bad in [
            "session_id=",
            "session_id",
            "session_id=a&sessionId=b",
            "session_id=a&session_id=a",
            "session_id=a%20b c",
        ] {
            assert_eq!(session_param(Some(bad)), Err(MalformedSessionId), "{bad}");
        }
        assert_eq!(
            session_param(Some(&format!("session_id={}", "a".repeat(300)))),
            Err(MalformedSessionId)
        );
    }

    #[test]
    fn the_endpoint_event_names_the_session() {
        let mut scan = EndpointScan::default();
        assert_eq!(scan.feed(b": ping\n\n"), None);
        assert_eq!(
            scan.feed(b"event: endpoint\r\ndata: /messages/?session_id=5e0c\r\n\r\n"),
            Some("5e0c".to_string())
        );
        // Only the first endpoint event counts.
        assert_eq!(
            scan.feed(b"event: endpoint\ndata: /messages/?session_id=other\n\n"),
            None
        );
        let mut scan = EndpointScan::default();
        assert_eq!(
            scan.feed(
                b"event:endpoint\ndata:/message?sessionId=ab-12#x\n\nevent: message\ndata: {}\n\n"
            ),
            Some("ab-12".to_string())
        );
        // An endpoint without a session, or a message event that merely mentions one.
        let mut scan = EndpointScan::default();
        assert_eq!(scan.feed(b"data: /messages/?session_id=zz\n\n"), None);
        assert_eq!(scan.feed(b"event: endpoint\ndata: /messages/\n\n"), None);
        assert_eq!(
            scan.feed(b"event: endpoint\ndata: /m?session_id=late\n\n"),
            None
        );
    }

    #[test]
    fn a_stream_owes_the_answers_to_what_was_posted_on_it() {
        let streams = Streams::default();
        let owed = streams.open(binding_key("s1"));
        streams.owe(&binding_key("s1"), &[json!(1), json!("two"), json!(3)]);
        streams.owe(&binding_key("unknown"), &[json!(9)]);
        owed.passed(b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n");
        // A notification or a request of the server with the same id answers nothing.
        owed.passed(
            b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"two\",\"method\":\"ping\"}\n\n",
        );
        owed.passed(
            b"data: [{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{\"code\":1,\"message\":\"x\"}}]\n\n",
        );
        assert_eq!(owed.take(), vec![json!("two")]);
        assert!(owed.take().is_empty());
        assert_eq!(streams.len(), 1);
        drop(owed);
        assert!(streams.is_empty(), "an entry lives while its stream does");
        streams.owe(&binding_key("s1"), &[json!(1)]);
    }

    #[test]
    fn what_a_stream_owes_is_bounded() {
        let owed = Owed::default();
        let ids: Vec<Value> = (0..MAX_OWED + 10).map(|i| json!(i)).collect();
        owed.owe(&ids);
        let kept = owed.take();
        assert_eq!(kept.len(), MAX_OWED);
        assert_eq!(kept[0], json!(10), "the oldest are forgotten first");
    }

    #[test]
    fn the_scan_is_bounded() {
        let mut scan = EndpointScan::default();
        let filler = format!("data: {}\n\n", "x".repeat(SCAN_LIMIT));
        assert_eq!(scan.feed(filler.as_bytes()), None);
        assert_eq!(
            scan.feed(b"event: endpoint\ndata: /m?session_id=a\n\n"),
            None
        );
    }
}
