//! Watches over the in-memory store: the HTTP watch handler driven through `AppState::handle`
//! (no sockets, no PostgreSQL) on the same fan-out PostgreSQL's tail feeds, here fed by the
//! memory store's own commits. Events in commit order, resuming from a resourceVersion,
//! bookmarks that advance past changes the watch does not select, 410 for a resume before the
//! ring's start, and a slow watcher cut off rather than skipped.

mod support;

use std::sync::Arc;
use std::time::Duration;

use apiserver::auth::{AllowAuthenticated, TokenFile};
use apiserver::http::{AppState, HttpConfig, HttpMetrics};
use apiserver::store::{MemoryStore, ResourceVersion, Store, StoreError};
use axum::body::{Body, BodyDataStream};
use futures::StreamExt;
use http::{Method, Request, StatusCode};
use prometheus_client::registry::Registry;
use serde_json::{json, Value};

const ADMIN: &str = "admin-token-0123456789";
/// How long a read waits for the next line before the test calls the stream idle.
const WAIT: Duration = Duration::from_secs(10);

fn sessions_path(ns: &str) -> String {
    format!(
        "/apis/{}/{}/namespaces/{ns}/accesssessions",
        apis::GROUP,
        apis::VERSION
    )
}

fn session(name: &str) -> Value {
    let expires = serde_json::to_value(support::in_hours(1)).expect("timestamp encodes");
    json!({
        "apiVersion": format!("{}/{}", apis::GROUP, apis::VERSION),
        "kind": "AccessSession",
        "metadata": {"name": name},
        "spec": {
            "server": {"name": "github", "uid": "srv-1"},
            "teams": ["payments"],
            "expiresAt": expires,
        }
    })
}

struct Api {
    app: AppState<MemoryStore>,
    _shutdown: tokio::sync::watch::Sender<bool>,
}

impl Api {
    /// An API over `store`, sending bookmarks every `bookmarks`.
    fn new(store: MemoryStore, bookmarks: Duration) -> Self {
        let tokens = TokenFile::parse(
            &format!("{ADMIN},admin,admin-uid,\"system:masters\"\n"),
            "test",
        )
        .expect("token file parses");
        let (shutdown_tx, shutdown) = tokio::sync::watch::channel(false);
        let mut registry = Registry::default();
        let app = AppState::new(
            store,
            Arc::new(tokens),
            Arc::new(AllowAuthenticated),
            HttpConfig {
                bookmark_interval: bookmarks,
            },
            HttpMetrics::register(&mut registry),
            shutdown,
        );
        Self {
            app,
            _shutdown: shutdown_tx,
        }
    }

    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> axum::response::Response {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {ADMIN}"));
        if body.is_some() {
            builder = builder.header("content-type", "application/json");
        }
        let body = match body {
            Some(v) => Body::from(serde_json::to_vec(&v).expect("body encodes")),
            None => Body::empty(),
        };
        self.app
            .clone()
            .handle(builder.body(body).expect("request builds"))
            .await
    }

    /// Sends a write and returns the object written, asserting `code`.
    async fn write(&self, method: Method, path: &str, body: Option<Value>, code: u16) -> Value {
        let response = self.request(method, path, body).await;
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body reads");
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        assert_eq!(status.as_u16(), code, "body: {body}");
        body
    }

    async fn create(&self, ns: &str, name: &str) -> String {
        let created = self
            .write(Method::POST, &sessions_path(ns), Some(session(name)), 201)
            .await;
        rv_of(&created)
    }

    async fn delete(&self, ns: &str, name: &str) -> String {
        let path = format!("{}/{name}", sessions_path(ns));
        let deleted = self.write(Method::DELETE, &path, None, 200).await;
        rv_of(&deleted)
    }

    /// The resourceVersion of a list of `ns` now.
    async fn list_rv(&self, ns: &str) -> String {
        let list = self.write(Method::GET, &sessions_path(ns), None, 200).await;
        list["metadata"]["resourceVersion"]
            .as_str()
            .expect("list has a resourceVersion")
            .to_string()
    }

    /// Opens a watch of `ns` with `query` and asserts it starts (200).
    async fn watch(&self, ns: &str, query: &str) -> Watch {
        let path = format!("{}?watch=true&{query}", sessions_path(ns));
        let response = self.request(Method::GET, &path, None).await;
        assert_eq!(response.status(), StatusCode::OK, "watch {path}");
        Watch {
            body: response.into_body().into_data_stream(),
            buf: Vec::new(),
        }
    }
}

fn rv_of(object: &Value) -> String {
    object["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_else(|| panic!("no resourceVersion in {object}"))
        .to_string()
}

/// A watch response read line by line.
struct Watch {
    body: BodyDataStream,
    buf: Vec<u8>,
}

impl Watch {
    /// The next event, `None` when the stream ended. Panics when nothing arrives in [`WAIT`].
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                return Some(serde_json::from_slice(&line).expect("a watch line is JSON"));
            }
            let chunk = tokio::time::timeout(WAIT, self.body.next())
                .await
                .expect("the watch sends within the wait");
            match chunk {
                Some(chunk) => self.buf.extend_from_slice(&chunk.expect("the body reads")),
                None => {
                    assert!(self.buf.is_empty(), "unterminated line at the end");
                    return None;
                }
            }
        }
    }

    /// The next event that is not a bookmark, as (type, name, resourceVersion).
    async fn next_change(&mut self) -> (String, String, String) {
        loop {
            let event = self.next().await.expect("the watch goes on");
            let kind = event["type"].as_str().unwrap_or_default().to_string();
            if kind == "BOOKMARK" {
                continue;
            }
            let object = &event["object"];
            assert!(kind != "ERROR", "unexpected ERROR event: {event}");
            return (
                kind,
                object["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                rv_of(object),
            );
        }
    }
}

fn change(kind: &str, name: &str, rv: &str) -> (String, String, String) {
    (kind.to_string(), name.to_string(), rv.to_string())
}

#[tokio::test]
async fn events_arrive_in_commit_order_and_a_watch_resumes_from_any_resource_version() {
    let api = Api::new(MemoryStore::new(), Duration::from_secs(3600));
    let start = api.list_rv("team-a").await;
    let a = api.create("team-a", "a").await;
    let b = api.create("team-a", "b").await;

    // Started at the list's version: the changes since are replayed from the ring, in order.
    let mut watch = api
        .watch("team-a", &format!("resourceVersion={start}"))
        .await;
    assert_eq!(watch.next_change().await, change("ADDED", "a", &a));
    assert_eq!(watch.next_change().await, change("ADDED", "b", &b));

    // Live changes follow in commit order; another namespace's are not this watch's.
    api.create("team-b", "elsewhere").await;
    let c = api.create("team-a", "c").await;
    let gone = api.delete("team-a", "a").await;
    assert_eq!(watch.next_change().await, change("ADDED", "c", &c));
    assert_eq!(watch.next_change().await, change("DELETED", "a", &gone));
    let versions: Vec<u64> = [&a, &b, &c, &gone]
        .iter()
        .map(|rv| rv.parse().expect("a resourceVersion is a number"))
        .collect();
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");

    // Resumed just after `b`: exactly what came after it, nothing before.
    let mut resumed = api.watch("team-a", &format!("resourceVersion={b}")).await;
    assert_eq!(resumed.next_change().await, change("ADDED", "c", &c));
    assert_eq!(resumed.next_change().await, change("DELETED", "a", &gone));
    // And it stays live.
    let d = api.create("team-a", "d").await;
    assert_eq!(resumed.next_change().await, change("ADDED", "d", &d));
    assert_eq!(watch.next_change().await, change("ADDED", "d", &d));
}

#[tokio::test]
async fn bookmarks_advance_past_changes_the_watch_does_not_select() {
    let api = Api::new(MemoryStore::new(), Duration::from_millis(100));
    let start = api.list_rv("team-a").await;
    let mut watch = api
        .watch(
            "team-a",
            &format!("resourceVersion={start}&allowWatchBookmarks=true"),
        )
        .await;
    // A change this watch does not select still moves its bookmark: the stream is known
    // complete up to it.
    let elsewhere = api.create("team-b", "elsewhere").await;
    let mut last = String::new();
    for _ in 0..50 {
        let event = watch.next().await.expect("the watch goes on");
        assert_eq!(
            event["type"], "BOOKMARK",
            "only bookmarks expected: {event}"
        );
        assert_eq!(event["object"]["kind"], "AccessSession", "{event}");
        last = rv_of(&event["object"]);
        if last == elsewhere {
            break;
        }
    }
    assert_eq!(last, elsewhere, "the bookmark reached the latest change");

    // Without allowWatchBookmarks, a watch sends none: the next line is the change itself.
    let mut plain = api
        .watch("team-a", &format!("resourceVersion={elsewhere}"))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mine = api.create("team-a", "mine").await;
    let event = plain.next().await.expect("the watch goes on");
    assert_eq!(event["type"], "ADDED", "{event}");
    assert_eq!(rv_of(&event["object"]), mine);
}

#[tokio::test]
async fn resuming_before_the_ring_start_is_410_and_at_its_start_is_served() {
    // A ring of two events: after four writes it holds the third and the fourth.
    let api = Api::new(
        MemoryStore::with_watch_limits(2, 16),
        Duration::from_secs(3600),
    );
    let first = api.create("team-a", "one").await;
    let second = api.create("team-a", "two").await;
    let third = api.create("team-a", "three").await;
    let fourth = api.create("team-a", "four").await;

    let mut expired = api
        .watch("team-a", &format!("resourceVersion={first}"))
        .await;
    let event = expired.next().await.expect("one ERROR event");
    assert_eq!(event["type"], "ERROR", "{event}");
    assert_eq!(event["object"]["kind"], "Status", "{event}");
    assert_eq!(event["object"]["code"], 410, "{event}");
    assert_eq!(event["object"]["reason"], "Expired", "{event}");
    assert!(
        expired.next().await.is_none(),
        "the stream ends after the ERROR"
    );

    // The positive control: just after the ring's start is still served, in full.
    let mut served = api
        .watch("team-a", &format!("resourceVersion={second}"))
        .await;
    assert_eq!(served.next_change().await, change("ADDED", "three", &third));
    assert_eq!(served.next_change().await, change("ADDED", "four", &fourth));

    // A version ahead of the store is no more servable than one behind it.
    let ahead: u64 = fourth.parse::<u64>().expect("numeric") + 10;
    let mut future = api
        .watch("team-a", &format!("resourceVersion={ahead}"))
        .await;
    let event = future.next().await.expect("one ERROR event");
    assert_eq!(event["object"]["code"], 410, "{event}");
}

#[tokio::test]
async fn a_watcher_that_falls_behind_its_queue_is_cut_off_not_skipped() {
    // One event queued per watcher.
    let store = MemoryStore::with_watch_limits(64, 1);
    let api = Api::new(store.clone(), Duration::from_secs(3600));
    let start: ResourceVersion = ResourceVersion::parse(&api.list_rv("team-a").await)
        .expect("the list's resourceVersion parses");
    let mut subscription = store.subscribe(start).await.expect("subscribes");
    let one = api.create("team-a", "one").await;
    // The first event comes from the ring and attaches the subscription to the live queue.
    let event = subscription.next().await.expect("the first event");
    assert_eq!(event.rv.to_string(), one);
    assert_eq!(store.live_subscribers(), 1);

    // Two more while it reads nothing: the queue holds one, the second cuts it off.
    let two = api.create("team-a", "two").await;
    api.create("team-a", "three").await;
    assert_eq!(store.live_subscribers(), 0);
    let event = subscription
        .next()
        .await
        .expect("what was queued is delivered");
    assert_eq!(event.rv.to_string(), two);
    match subscription.next().await {
        Err(StoreError::Expired(message)) => {
            assert!(message.contains("fell behind"), "{message}")
        }
        other => panic!("expected Expired, got {other:?}"),
    }
}
