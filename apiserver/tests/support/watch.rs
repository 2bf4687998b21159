//! A raw HTTP watch response read event by event: what the suites that speak the watch
//! protocol without a client library share.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

/// What reading a watch stream gave.
#[derive(Debug)]
pub enum Next {
    Event(Value),
    /// The server ended the stream.
    End,
    /// Nothing arrived in time.
    Idle,
}

/// A watch response read line by line.
pub struct WatchStream {
    resp: reqwest::Response,
    buf: Vec<u8>,
    ended: bool,
    strict: bool,
}

impl WatchStream {
    /// A stream held to the wire format: every line is exactly one `{type, object}` JSON
    /// object, and the stream ends cleanly (no transport error, no unterminated line).
    pub fn strict(resp: reqwest::Response) -> Self {
        Self::new(resp, true)
    }

    /// A stream whose transport failing counts as its end (for tests that stop the server's
    /// feed or connections under it).
    pub fn lenient(resp: reqwest::Response) -> Self {
        Self::new(resp, false)
    }

    fn new(resp: reqwest::Response, strict: bool) -> Self {
        assert_eq!(resp.status(), 200, "watch {}", resp.url());
        Self {
            resp,
            buf: Vec::new(),
            ended: false,
            strict,
        }
    }

    /// The next newline-terminated event, the end of the stream, or `Idle` after `within`.
    pub async fn next(&mut self, within: Duration) -> Next {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Next::Event(self.parse(&line[..line.len() - 1]));
            }
            if self.ended {
                if self.strict {
                    assert!(
                        self.buf.is_empty(),
                        "stream ended inside an unterminated line: {}",
                        String::from_utf8_lossy(&self.buf)
                    );
                }
                return Next::End;
            }
            match tokio::time::timeout_at(deadline, self.resp.chunk()).await {
                Ok(Ok(Some(chunk))) => self.buf.extend_from_slice(&chunk),
                Ok(Ok(None)) => self.ended = true,
                Ok(Err(e)) if self.strict => panic!("watch stream failed: {e}"),
                Ok(Err(_)) => self.ended = true,
                Err(_) => return Next::Idle,
            }
        }
    }

    fn parse(&self, text: &[u8]) -> Value {
        let v: Value = serde_json::from_slice(text).unwrap_or_else(|e| {
            panic!(
                "watch line is not one JSON value ({e}): {}",
                String::from_utf8_lossy(text)
            )
        });
        if self.strict {
            assert!(v.is_object(), "{v}");
            let keys: BTreeSet<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(keys, BTreeSet::from(["object", "type"]), "{v}");
        }
        v
    }

    /// The next event, within 10 s.
    pub async fn event(&mut self) -> Value {
        match self.next(Duration::from_secs(10)).await {
            Next::Event(v) => v,
            other => panic!("expected an event, got {other:?}"),
        }
    }
}
