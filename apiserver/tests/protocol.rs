//! The wire protocol at its edges, over raw HTTP: watch framing, bookmarks, streaming lists,
//! Expired handling, parameter validation, media types, body limits, Status shapes, the Table
//! and metadata renderings, dryRun, fieldValidation, authentication, timeouts and selector
//! watches.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use support::StoreExt;

use apis::{AccessSession, SessionPhase};
use apiserver::http::HttpConfig;
use apiserver::store::{PgStore, Preconditions, ResourceVersion, Store, StoreError};
use serde_json::{json, Value};
use support::server::{short_log, TestServer, ADMIN_TOKEN};
use support::watch::{Next, WatchStream};
use support::*;

const TABLE_ACCEPT: &str =
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
const META_ACCEPT: &str =
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";
const META_LIST_ACCEPT: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
const STREAMING: &str =
    "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";

fn collection(server: &TestServer, ns: &str) -> String {
    server.sessions_url(ns)
}

fn item(server: &TestServer, ns: &str, name: &str) -> String {
    format!("{}/{name}", collection(server, ns))
}

async fn create(server: &TestServer, ns: &str, name: &str) -> AccessSession {
    server
        .store
        .create_session(mk_session(ns, name, "srv-1"), false)
        .await
        .unwrap()
        .object
}

fn rv(o: &AccessSession) -> String {
    o.metadata.resource_version.clone().unwrap()
}

async fn get(server: &TestServer, url: &str, accept: Option<&str>) -> reqwest::Response {
    let mut req = server.http().get(url).bearer_auth(ADMIN_TOKEN);
    if let Some(a) = accept {
        req = req.header("Accept", a);
    }
    req.send().await.unwrap()
}

async fn get_json(server: &TestServer, url: &str, accept: Option<&str>) -> Value {
    let resp = get(server, url, accept).await;
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert_eq!(status, 200, "GET {url}: {text}");
    serde_json::from_str(&text).unwrap()
}

async fn merge_patch(server: &TestServer, url: &str, patch: Value) -> reqwest::Response {
    server
        .http()
        .patch(url)
        .bearer_auth(ADMIN_TOKEN)
        .header("Content-Type", "application/merge-patch+json")
        .body(patch.to_string())
        .send()
        .await
        .unwrap()
}

/// The current resourceVersion, from a list.
async fn list_rv(server: &TestServer, ns: &str) -> String {
    get_json(server, &collection(server, ns), None).await["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Asserts a `metav1.Status` failure response and returns it.
async fn expect_status(resp: reqwest::Response, code: u16, reason: &str) -> Value {
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.unwrap();
    assert_eq!(status, code, "{text}");
    assert_eq!(content_type.as_deref(), Some("application/json"));
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_status_object(&v, code, reason);
    v
}

fn assert_status_object(v: &Value, code: u16, reason: &str) {
    assert_eq!(v["kind"], "Status", "{v}");
    assert_eq!(v["apiVersion"], "v1", "{v}");
    assert_eq!(v["metadata"], json!({}), "{v}");
    assert_eq!(v["status"], "Failure", "{v}");
    assert_eq!(v["reason"], reason, "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
}

/// A watch of the server, held to the wire format ([`WatchStream::strict`]).
struct Watch(WatchStream);

impl Watch {
    async fn open(server: &TestServer, url: &str, accept: Option<&str>) -> Self {
        let resp = get(server, url, accept).await;
        assert_eq!(resp.status(), 200, "watch {url}");
        assert_eq!(
            resp.headers().get("content-type").unwrap(),
            "application/json"
        );
        Self(WatchStream::strict(resp))
    }

    async fn next(&mut self, within: Duration) -> Next {
        self.0.next(within).await
    }

    async fn event(&mut self) -> Value {
        self.0.event().await
    }

    /// The next event that is not a periodic bookmark.
    async fn change(&mut self) -> Value {
        loop {
            let e = self.event().await;
            let initial_events_end =
                !e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"].is_null();
            if e["type"] != "BOOKMARK" || initial_events_end {
                return e;
            }
        }
    }

    async fn end(&mut self, within: Duration) {
        match self.next(within).await {
            Next::End => {}
            other => panic!("expected the end of the stream, got {other:?}"),
        }
    }
}

fn assert_event(e: &Value, kind: &str, name: &str) {
    assert_eq!(e["type"], kind, "{e}");
    assert_eq!(e["object"]["kind"], "AccessSession", "{e}");
    assert_eq!(e["object"]["apiVersion"], apis::API_VERSION, "{e}");
    assert_eq!(e["object"]["metadata"]["name"], name, "{e}");
}

fn event_rv(e: &Value) -> String {
    e["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_events_are_json_lines_with_type_meta() {
    let server = TestServer::start().await;
    let first = create(&server, "w", "first").await;

    // No resourceVersion: synthetic ADDED for the current state, then changes.
    let mut initial = Watch::open(
        &server,
        &format!("{}?watch=1", collection(&server, "w")),
        None,
    )
    .await;
    let e = initial.event().await;
    assert_event(&e, "ADDED", "first");
    assert_eq!(event_rv(&e), rv(&first));

    let from = list_rv(&server, "w").await;
    let mut w = Watch::open(
        &server,
        &format!(
            "{}?watch=true&resourceVersion={from}",
            collection(&server, "w")
        ),
        None,
    )
    .await;
    let resp = server
        .http()
        .post(collection(&server, "w"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&session_body("w", "second"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let created: Value = resp.json().await.unwrap();
    let added = w.event().await;
    assert_event(&added, "ADDED", "second");
    assert_eq!(
        added["object"]["metadata"]["uid"],
        created["metadata"]["uid"]
    );
    assert_eq!(added["object"]["spec"]["server"]["uid"], "srv-1");

    let resp = merge_patch(
        &server,
        &item(&server, "w", "second"),
        json!({"metadata": {"labels": {"color": "blue"}}}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let modified = w.event().await;
    assert_event(&modified, "MODIFIED", "second");
    assert_eq!(
        modified["object"]["metadata"]["labels"],
        json!({"color": "blue"})
    );

    let resp = server
        .http()
        .delete(item(&server, "w", "second"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let deleted = w.event().await;
    assert_event(&deleted, "DELETED", "second");
    // The last state: labels and spec as they were, at the deletion's resourceVersion.
    assert_eq!(
        deleted["object"]["metadata"]["labels"],
        json!({"color": "blue"})
    );
    assert_eq!(deleted["object"]["spec"], modified["object"]["spec"]);
    let (m, d) = (
        ResourceVersion::parse(&event_rv(&modified)).unwrap(),
        ResourceVersion::parse(&event_rv(&deleted)).unwrap(),
    );
    assert!(d > m, "DELETED at {d:?} not after MODIFIED at {m:?}");
    // The same changes reach the first watch, in order.
    assert_event(&initial.event().await, "ADDED", "second");
    assert_event(&initial.event().await, "MODIFIED", "second");
    assert_event(&initial.event().await, "DELETED", "second");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_only_when_asked_for() {
    let server = TestServer::start_with(
        |_| {},
        HttpConfig {
            bookmark_interval: Duration::from_millis(200),
        },
    )
    .await;
    create(&server, "b", "one").await;
    let from = list_rv(&server, "b").await;
    let url = format!(
        "{}?watch=1&resourceVersion={from}",
        collection(&server, "b")
    );

    let mut plain = Watch::open(&server, &url, None).await;
    let mut bookmarked =
        Watch::open(&server, &format!("{url}&allowWatchBookmarks=true"), None).await;
    let e = bookmarked.event().await;
    assert_eq!(e["type"], "BOOKMARK");
    assert_eq!(
        e["object"],
        json!({"kind": "AccessSession", "apiVersion": apis::API_VERSION, "metadata": {
            "resourceVersion": from,
            "annotations": {
                apis::feed::HEAD_ANNOTATION: from,
                apis::feed::BOOKMARK_INTERVAL_ANNOTATION: "200",
            },
        }}),
        "a bookmark is the kind with only metadata: its resourceVersion, and the head and \
         interval an idle watch is at"
    );
    // Several intervals without a change: the plain watch stays silent.
    match plain.next(Duration::from_millis(1000)).await {
        Next::Idle => {}
        other => panic!("a watch without allowWatchBookmarks got {other:?}"),
    }

    let two = create(&server, "b", "two").await;
    assert_event(&plain.event().await, "ADDED", "two");
    let added = bookmarked.change().await;
    assert_event(&added, "ADDED", "two");
    // Bookmarks after the change are at least as new as it.
    let e = bookmarked.event().await;
    assert_eq!(e["type"], "BOOKMARK");
    assert!(
        ResourceVersion::parse(&event_rv(&e)).unwrap()
            >= ResourceVersion::parse(&rv(&two)).unwrap()
    );
    match plain.next(Duration::from_millis(600)).await {
        Next::Idle => {}
        other => panic!("a watch without allowWatchBookmarks got {other:?}"),
    }

    // In the metadata rendering, a bookmark is a PartialObjectMetadata.
    let mut meta = Watch::open(
        &server,
        &format!("{url}&allowWatchBookmarks=true"),
        Some(META_ACCEPT),
    )
    .await;
    let e = meta.change().await;
    assert_eq!(e["type"], "ADDED");
    let e = meta.event().await;
    assert_eq!(e["type"], "BOOKMARK");
    assert_eq!(e["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(e["object"]["apiVersion"], "meta.k8s.io/v1");
    let keys: BTreeSet<&str> = e["object"]["metadata"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        BTreeSet::from(["annotations", "resourceVersion"]),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_list_ends_with_the_initial_events_bookmark() {
    let server = TestServer::start().await;
    for name in ["a", "b", "c"] {
        create(&server, "s", name).await;
    }
    create(&server, "other", "elsewhere").await;
    let current = list_rv(&server, "s").await;

    for from in ["", "&resourceVersion=0"] {
        let mut w = Watch::open(
            &server,
            &format!("{}?{STREAMING}{from}", collection(&server, "s")),
            None,
        )
        .await;
        let mut names = BTreeSet::new();
        for _ in 0..3 {
            let e = w.event().await;
            assert_eq!(e["type"], "ADDED", "{e}");
            assert_eq!(e["object"]["kind"], "AccessSession");
            assert_eq!(e["object"]["apiVersion"], apis::API_VERSION);
            names.insert(
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
        assert_eq!(names, ["a", "b", "c"].map(String::from).into());
        let end = w.event().await;
        assert_eq!(end["type"], "BOOKMARK", "{end}");
        assert_eq!(
            end["object"],
            json!({
                "kind": "AccessSession",
                "apiVersion": apis::API_VERSION,
                "metadata": {"resourceVersion": current, "annotations": {"k8s.io/initial-events-end": "true"}}
            })
        );
    }

    // Live events follow the end bookmark.
    let mut w = Watch::open(
        &server,
        &format!("{}?{STREAMING}", collection(&server, "s")),
        None,
    )
    .await;
    for _ in 0..3 {
        assert_eq!(w.event().await["type"], "ADDED");
    }
    assert_eq!(
        w.event().await["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    create(&server, "s", "d").await;
    create(&server, "other", "not-mine").await;
    support::revoke(&server.store, "s", "a", "manual").await;
    assert_event(&w.change().await, "ADDED", "d");
    let e = w.change().await;
    assert_event(&e, "MODIFIED", "a");
    assert_eq!(e["object"]["status"]["phase"], "Revoked");

    // The metadata rendering streams PartialObjectMetadata and ends with one as the bookmark.
    let mut w = Watch::open(
        &server,
        &format!("{}?{STREAMING}", collection(&server, "s")),
        Some(META_LIST_ACCEPT),
    )
    .await;
    for _ in 0..4 {
        let e = w.event().await;
        assert_eq!(e["type"], "ADDED");
        assert_eq!(e["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(e["object"]["apiVersion"], "meta.k8s.io/v1");
        assert!(e["object"].get("spec").is_none());
    }
    let end = w.event().await;
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(end["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(end["object"]["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
}

/// An Expired watch: HTTP 200, exactly one ERROR event carrying a Status, then the end.
async fn expect_expired_watch(server: &TestServer, url: &str) {
    let mut w = Watch::open(server, url, None).await;
    let e = w.event().await;
    assert_eq!(e["type"], "ERROR", "{url}: {e}");
    let status = &e["object"];
    assert_status_object(status, 410, "Expired");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .starts_with("too old resource version"),
        "{status}"
    );
    let keys: BTreeSet<&str> = status
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected = BTreeSet::from([
        "apiVersion",
        "code",
        "kind",
        "message",
        "metadata",
        "reason",
        "status",
    ]);
    // A cursor of another epoch names the cause, so a cache knows its history is gone.
    if status["message"]
        .as_str()
        .unwrap()
        .contains("the change history was reset")
    {
        expected.insert("details");
        assert_eq!(
            status["details"],
            json!({"causes": [{"reason": apis::feed::EPOCH_CHANGED_CAUSE,
                               "message": "the change history was reset (a new epoch)"}]}),
            "{status}"
        );
    }
    assert_eq!(keys, expected, "{status}");
    w.end(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_watches_are_one_error_event() {
    let server = TestServer::start_with(short_log, HttpConfig::default()).await;
    let oldest = rv(&create(&server, "e", "s-0").await);
    for i in 1..100 {
        create(&server, "e", &format!("s-{i}")).await;
    }
    assert!(server.store.trim_log().await.unwrap() >= 49);
    let head = ResourceVersion::parse(&list_rv(&server, "e").await).unwrap();
    let foreign = ResourceVersion::new(if head.epoch == 1 { 2 } else { head.epoch - 1 }, head.seq);
    let ahead = ResourceVersion::new(head.epoch, head.seq + 1000);
    let base = format!("{}?watch=1", collection(&server, "e"));
    for bad in [
        oldest.clone(),
        foreign.to_string(),
        ahead.to_string(),
        "abc".into(),
        "-5".into(),
        "0042".into(),
    ] {
        expect_expired_watch(&server, &format!("{base}&resourceVersion={bad}")).await;
        expect_expired_watch(
            &server,
            &format!("{base}&resourceVersion={bad}&allowWatchBookmarks=true"),
        )
        .await;
    }
    // The metadata and Table renderings answer the same way.
    for accept in [META_ACCEPT, TABLE_ACCEPT] {
        let mut w = Watch::open(
            &server,
            &format!("{base}&resourceVersion={oldest}"),
            Some(accept),
        )
        .await;
        assert_status_object(&w.event().await["object"], 410, "Expired");
        w.end(Duration::from_secs(5)).await;
    }
    // A streaming list at an old resourceVersion is "not older than": the current state.
    let mut w = Watch::open(
        &server,
        &format!(
            "{}?{STREAMING}&resourceVersion={oldest}",
            collection(&server, "e")
        ),
        None,
    )
    .await;
    for _ in 0..100 {
        assert_eq!(w.event().await["type"], "ADDED");
    }
    assert_eq!(event_rv(&w.event().await), head.to_string());

    // A restart elsewhere that rotates the epoch (an operator's --rotate-epoch): open watches
    // end with one Expired ERROR.
    let mut live = Watch::open(
        &server,
        &format!("{base}&resourceVersion={head}&allowWatchBookmarks=true"),
        None,
    )
    .await;
    let _restarted = PgStore::start(apiserver::store::StoreConfig {
        rotate_epoch: true,
        ..server.db.store_config()
    })
    .await
    .unwrap();
    let e = live.change().await;
    assert_eq!(e["type"], "ERROR", "{e}");
    assert_status_object(&e["object"], 410, "Expired");
    live.end(Duration::from_secs(5)).await;
    expect_expired_watch(&server, &format!("{base}&resourceVersion={head}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_continue_token_is_410() {
    let server = TestServer::start_with(|c| c.retained_events = 50, HttpConfig::default()).await;
    for i in 0..10 {
        create(&server, "c", &format!("s-{i}")).await;
    }
    let page = get_json(
        &server,
        &format!("{}?limit=2", collection(&server, "c")),
        None,
    )
    .await;
    let token = page["metadata"]["continue"].as_str().unwrap().to_string();
    let snapshot = page["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    // Still retained: the next page is served at the same version.
    let next = get_json(
        &server,
        &format!("{}?limit=2&continue={token}", collection(&server, "c")),
        None,
    )
    .await;
    assert_eq!(next["metadata"]["resourceVersion"], snapshot);
    assert_eq!(next["items"][0]["metadata"]["name"], "s-2");

    // The token decides the version: resourceVersion=0 beside it is tolerated, any other is 400.
    let next = get_json(
        &server,
        &format!(
            "{}?limit=2&resourceVersion=0&continue={token}",
            collection(&server, "c")
        ),
        None,
    )
    .await;
    assert_eq!(next["metadata"]["resourceVersion"], snapshot);
    assert_eq!(next["items"][0]["metadata"]["name"], "s-2");
    let resp = get(
        &server,
        &format!(
            "{}?limit=2&resourceVersion={snapshot}&continue={token}",
            collection(&server, "c")
        ),
        None,
    )
    .await;
    expect_status(resp, 400, "BadRequest").await;

    for i in 0..60 {
        support::revoke(
            &server.store,
            "c",
            &format!("s-{}", i % 10),
            if i < 10 { "manual" } else { "again" },
        )
        .await;
        create(&server, "c", &format!("t-{i}")).await;
    }
    assert!(server.store.trim_log().await.unwrap() > 0);
    let resp = get(
        &server,
        &format!("{}?limit=2&continue={token}", collection(&server, "c")),
        None,
    )
    .await;
    expect_status(resp, 410, "Expired").await;
    // Exact list at an expired resourceVersion: 410 too.
    let resp = get(
        &server,
        &format!(
            "{}?resourceVersion={snapshot}&resourceVersionMatch=Exact",
            collection(&server, "c")
        ),
        None,
    )
    .await;
    expect_status(resp, 410, "Expired").await;
    // "Not older than" an expired resourceVersion is the current state, never 410.
    let relist = get_json(
        &server,
        &format!("{}?resourceVersion={snapshot}", collection(&server, "c")),
        None,
    )
    .await;
    assert_eq!(relist["items"].as_array().unwrap().len(), 70);
    let relist = get_json(
        &server,
        &format!(
            "{}?resourceVersion={snapshot}&resourceVersionMatch=NotOlderThan",
            collection(&server, "c")
        ),
        None,
    )
    .await;
    assert_eq!(relist["items"].as_array().unwrap().len(), 70);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_resource_version_match_is_422() {
    let server = TestServer::start().await;
    let base = collection(&server, "v");
    for (query, field) in [
        ("resourceVersionMatch=NotOlderThan", "resourceVersionMatch"),
        (
            "resourceVersion=0&resourceVersionMatch=Exact",
            "resourceVersionMatch",
        ),
        (
            "watch=1&resourceVersionMatch=NotOlderThan",
            "resourceVersionMatch",
        ),
        ("sendInitialEvents=true", "sendInitialEvents"),
        (
            "watch=1&sendInitialEvents=true&resourceVersionMatch=Exact&allowWatchBookmarks=true",
            "resourceVersionMatch",
        ),
        (
            "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
            "allowWatchBookmarks",
        ),
        (
            "resourceVersion=1&resourceVersionMatch=Sometimes",
            "resourceVersionMatch",
        ),
    ] {
        let v = expect_status(
            get(&server, &format!("{base}?{query}"), None).await,
            422,
            "Invalid",
        )
        .await;
        assert!(cause_fields(&v).contains(&field), "{query}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_media_types_are_415() {
    let server = TestServer::start().await;
    let before = create(&server, "m", "one").await;
    for content_type in ["text/plain", "application/yaml"] {
        let resp = server
            .http()
            .patch(item(&server, "m", "one"))
            .bearer_auth(ADMIN_TOKEN)
            .header("Content-Type", content_type)
            .body(r#"{"metadata":{"labels":{"x":"y"}}}"#)
            .send()
            .await
            .unwrap();
        expect_status(resp, 415, "UnsupportedMediaType").await;
    }
    let resp = server
        .http()
        .post(collection(&server, "m"))
        .bearer_auth(ADMIN_TOKEN)
        .header("Content-Type", "text/plain")
        .body(session_body("m", "two").to_string())
        .send()
        .await
        .unwrap();
    expect_status(resp, 415, "UnsupportedMediaType").await;
    let now = get_json(&server, &item(&server, "m", "one"), None).await;
    assert_eq!(now["metadata"]["resourceVersion"], rv(&before));
    expect_status(
        get(&server, &item(&server, "m", "two"), None).await,
        404,
        "NotFound",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_are_413_and_store_nothing() {
    let server = TestServer::start().await;
    let existing = create(&server, "big", "existing").await;
    let before = list_rv(&server, "big").await;
    let mut huge = session_body("big", "huge");
    huge["metadata"]["annotations"] = json!({"blob": "x".repeat(3 * 1024 * 1024 + 1024)});
    let bytes = huge.to_string().into_bytes();
    assert!(bytes.len() > apiserver::http::MAX_BODY_BYTES);

    // With a Content-Length.
    let resp = server
        .http()
        .post(collection(&server, "big"))
        .bearer_auth(ADMIN_TOKEN)
        .header("Content-Type", "application/json")
        .body(bytes.clone())
        .send()
        .await
        .unwrap();
    expect_status(resp, 413, "RequestEntityTooLarge").await;
    // Chunked, without a Content-Length.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        bytes.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    let resp = server
        .http()
        .post(collection(&server, "big"))
        .bearer_auth(ADMIN_TOKEN)
        .header("Content-Type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    expect_status(resp, 413, "RequestEntityTooLarge").await;
    // An oversized patch.
    let patch = json!({"metadata": {"annotations": {"blob": "y".repeat(3 * 1024 * 1024 + 1024)}}});
    let resp = merge_patch(&server, &item(&server, "big", "existing"), patch).await;
    expect_status(resp, 413, "RequestEntityTooLarge").await;

    expect_status(
        get(&server, &item(&server, "big", "huge"), None).await,
        404,
        "NotFound",
    )
    .await;
    assert_eq!(list_rv(&server, "big").await, before, "nothing was written");
    let now = get_json(&server, &item(&server, "big", "existing"), None).await;
    assert_eq!(now["metadata"]["resourceVersion"], rv(&existing));
    // A body just under the limit is fine.
    let mut ok = session_body("big", "large");
    ok["metadata"]["annotations"] = json!({"blob": "z".repeat(200 * 1024)});
    let resp = server
        .http()
        .post(collection(&server, "big"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&ok)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_kubernetes_statuses() {
    let server = TestServer::start().await;
    let http = server.http();

    // 404 with details.
    let v = expect_status(
        get(&server, &item(&server, "st", "missing"), None).await,
        404,
        "NotFound",
    )
    .await;
    assert_eq!(v["details"]["name"], "missing");
    assert_eq!(v["details"]["kind"], "accesssessions");
    assert_eq!(v["details"]["group"], apis::GROUP);

    // 409 AlreadyExists.
    let resp = http
        .post(collection(&server, "st"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&session_body("st", "dup"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let created: Value = resp.json().await.unwrap();
    let resp = http
        .post(collection(&server, "st"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&session_body("st", "dup"))
        .send()
        .await
        .unwrap();
    let v = expect_status(resp, 409, "AlreadyExists").await;
    assert_eq!(v["details"]["name"], "dup");
    assert_eq!(v["details"]["kind"], "accesssessions");

    // 409 Conflict: an update at a stale resourceVersion.
    let resp = merge_patch(
        &server,
        &item(&server, "st", "dup"),
        json!({"metadata": {"labels": {"a": "1"}}}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut stale = created.clone();
    stale["metadata"]["labels"] = json!({"b": "2"});
    let resp = http
        .put(item(&server, "st", "dup"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&stale)
        .send()
        .await
        .unwrap();
    let v = expect_status(resp, 409, "Conflict").await;
    assert_eq!(v["details"]["name"], "dup");
    // A merge patch pinning the stale resourceVersion conflicts too.
    let resp = merge_patch(
        &server,
        &item(&server, "st", "dup"),
        json!({"metadata": {"resourceVersion": created["metadata"]["resourceVersion"], "labels": {"c": "3"}}}),
    )
    .await;
    expect_status(resp, 409, "Conflict").await;

    // 409 Conflict: DeleteOptions preconditions that do not hold.
    for preconditions in [
        json!({"uid": "00000000-0000-0000-0000-000000000000"}),
        json!({"resourceVersion": created["metadata"]["resourceVersion"]}),
    ] {
        let resp = http
            .delete(item(&server, "st", "dup"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": preconditions}))
            .send()
            .await
            .unwrap();
        expect_status(resp, 409, "Conflict").await;
    }
    get_json(&server, &item(&server, "st", "dup"), None).await;
    // The right uid deletes.
    let resp = http
        .delete(item(&server, "st", "dup"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": created["metadata"]["uid"]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Deleted names stay reserved.
    let resp = http
        .post(collection(&server, "st"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&session_body("st", "dup"))
        .send()
        .await
        .unwrap();
    expect_status(resp, 409, "AlreadyExists").await;

    // 422 Invalid with causes naming the fields.
    let mut invalid = session_body("st", "bad");
    invalid["spec"]["server"]["uid"] = json!("");
    invalid["spec"].as_object_mut().unwrap().remove("expiresAt");
    let resp = http
        .post(collection(&server, "st"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&invalid)
        .send()
        .await
        .unwrap();
    let v = expect_status(resp, 422, "Invalid").await;
    assert_eq!(v["details"]["name"], "bad");
    assert_eq!(v["details"]["kind"], "AccessSession");
    assert_eq!(v["details"]["group"], apis::GROUP);
    let fields: BTreeSet<&str> = cause_fields(&v).into_iter().collect();
    assert!(
        fields.contains("spec.server.uid") && fields.contains("spec.expiresAt"),
        "{v}"
    );
    let resp = http
        .post(collection(&server, "st"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&session_body("st", "Bad_Name"))
        .send()
        .await
        .unwrap();
    let v = expect_status(resp, 422, "Invalid").await;
    assert!(cause_fields(&v).contains(&"metadata.name"), "{v}");
}

fn assert_table(t: &Value, rows: usize, with_columns: bool) {
    assert_eq!(t["kind"], "Table", "{t}");
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1", "{t}");
    assert_eq!(t["rows"].as_array().unwrap().len(), rows, "{t}");
    let columns = t.get("columnDefinitions").filter(|c| !c.is_null());
    if with_columns {
        let columns = columns
            .and_then(Value::as_array)
            .expect("columnDefinitions");
        assert!(!columns.is_empty());
        for c in columns {
            for k in ["name", "type", "format", "description", "priority"] {
                assert!(c.get(k).is_some(), "column without {k}: {c}");
            }
        }
        for row in t["rows"].as_array().unwrap() {
            assert_eq!(
                row["cells"].as_array().unwrap().len(),
                columns.len(),
                "{row}"
            );
        }
    } else {
        assert!(
            columns.is_none_or(|c| c.as_array().is_some_and(Vec::is_empty)),
            "{t}"
        );
    }
    for row in t["rows"].as_array().unwrap() {
        let o = &row["object"];
        assert_eq!(o["kind"], "PartialObjectMetadata", "{row}");
        assert_eq!(o["apiVersion"], "meta.k8s.io/v1", "{row}");
        assert!(
            o["metadata"]["name"].is_string() && o["metadata"]["namespace"].is_string(),
            "{row}"
        );
        assert!(o.get("spec").is_none(), "{row}");
    }
}

fn row_name(t: &Value) -> &str {
    t["rows"][0]["object"]["metadata"]["name"].as_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_rendering_for_get_list_and_watch() {
    let server = TestServer::start().await;
    let mut labelled = mk_session("t", "one", "srv-1");
    labelled.metadata.labels = Some([("tier".to_string(), "gold".to_string())].into());
    server.store.create_session(labelled, false).await.unwrap();
    create(&server, "t", "two").await;

    let t = get_json(&server, &item(&server, "t", "one"), Some(TABLE_ACCEPT)).await;
    assert_table(&t, 1, true);
    assert_eq!(row_name(&t), "one");
    assert_eq!(
        t["rows"][0]["object"]["metadata"]["labels"],
        json!({"tier": "gold"})
    );

    let t = get_json(&server, &collection(&server, "t"), Some(TABLE_ACCEPT)).await;
    assert_table(&t, 2, true);
    assert!(t["metadata"]["resourceVersion"].is_string());
    let t = get_json(
        &server,
        &format!("{}?limit=1", collection(&server, "t")),
        Some(TABLE_ACCEPT),
    )
    .await;
    assert_table(&t, 1, true);
    assert!(t["metadata"]["continue"].is_string(), "{t}");
    let t = get_json(
        &server,
        &format!("{}?includeObject=Object", collection(&server, "t")),
        Some(TABLE_ACCEPT),
    )
    .await;
    assert_eq!(t["rows"][0]["object"]["kind"], "AccessSession");
    assert!(t["rows"][0]["object"]["spec"].is_object());
    let t = get_json(
        &server,
        &format!("{}?includeObject=None", collection(&server, "t")),
        Some(TABLE_ACCEPT),
    )
    .await;
    assert!(t["rows"][0].get("object").is_none_or(Value::is_null), "{t}");

    // kubectl get -w: synthetic ADDED rows, column definitions only on the first event.
    let mut w = Watch::open(
        &server,
        &format!("{}?watch=1&resourceVersion=0", collection(&server, "t")),
        Some(TABLE_ACCEPT),
    )
    .await;
    let first = w.event().await;
    assert_eq!(first["type"], "ADDED");
    assert_table(&first["object"], 1, true);
    let second = w.event().await;
    assert_eq!(second["type"], "ADDED");
    assert_table(&second["object"], 1, false);
    let names: BTreeSet<&str> = [row_name(&first["object"]), row_name(&second["object"])].into();
    assert_eq!(names, BTreeSet::from(["one", "two"]));
    let three = create(&server, "t", "three").await;
    let e = w.event().await;
    assert_eq!(e["type"], "ADDED");
    assert_table(&e["object"], 1, false);
    assert_eq!(row_name(&e["object"]), "three");
    assert_eq!(
        e["object"]["rows"][0]["object"]["metadata"]["resourceVersion"],
        rv(&three)
    );
    server
        .store
        .remove::<AccessSession>("t", "two", &Preconditions::default(), false)
        .await
        .unwrap();
    let e = w.event().await;
    assert_eq!(e["type"], "DELETED");
    assert_table(&e["object"], 1, false);
    assert_eq!(row_name(&e["object"]), "two");

    // Without initial events, the first live event carries the column definitions.
    let from = list_rv(&server, "t").await;
    let mut w = Watch::open(
        &server,
        &format!(
            "{}?watch=1&resourceVersion={from}",
            collection(&server, "t")
        ),
        Some(TABLE_ACCEPT),
    )
    .await;
    create(&server, "t", "four").await;
    create(&server, "t", "five").await;
    let e = w.event().await;
    assert_table(&e["object"], 1, true);
    assert_eq!(row_name(&e["object"]), "four");
    let e = w.event().await;
    assert_table(&e["object"], 1, false);
    assert_eq!(row_name(&e["object"]), "five");

    // kubectl get NAME -w.
    let mut w = Watch::open(
        &server,
        &format!(
            "{}?watch=1&resourceVersion=0&fieldSelector=metadata.name%3Dthree",
            collection(&server, "t")
        ),
        Some(TABLE_ACCEPT),
    )
    .await;
    let e = w.event().await;
    assert_table(&e["object"], 1, true);
    assert_eq!(row_name(&e["object"]), "three");
    merge_patch(
        &server,
        &item(&server, "t", "one"),
        json!({"metadata": {"labels": {"x": "1"}}}),
    )
    .await;
    merge_patch(
        &server,
        &item(&server, "t", "three"),
        json!({"metadata": {"labels": {"x": "1"}}}),
    )
    .await;
    let e = w.event().await;
    assert_eq!(e["type"], "MODIFIED");
    assert_eq!(row_name(&e["object"]), "three");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_object_metadata_for_get_list_and_watch() {
    let server = TestServer::start().await;
    let one = create(&server, "pm", "one").await;
    create(&server, "pm", "two").await;

    let m = get_json(&server, &item(&server, "pm", "one"), Some(META_ACCEPT)).await;
    assert_eq!(m["kind"], "PartialObjectMetadata");
    assert_eq!(m["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(m["metadata"]["uid"], json!(one.metadata.uid));
    assert_eq!(m["metadata"]["resourceVersion"], rv(&one));
    assert!(m.get("spec").is_none() && m.get("status").is_none(), "{m}");

    let l = get_json(&server, &collection(&server, "pm"), Some(META_LIST_ACCEPT)).await;
    assert_eq!(l["kind"], "PartialObjectMetadataList");
    assert_eq!(l["apiVersion"], "meta.k8s.io/v1");
    assert!(l["metadata"]["resourceVersion"].is_string());
    let items = l["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    for i in items {
        assert_eq!(i["kind"], "PartialObjectMetadata");
        assert_eq!(i["apiVersion"], "meta.k8s.io/v1");
        assert!(
            i["metadata"]["name"].is_string() && i.get("spec").is_none(),
            "{i}"
        );
    }

    for accept in [META_ACCEPT, META_LIST_ACCEPT] {
        let from = list_rv(&server, "pm").await;
        let mut w = Watch::open(
            &server,
            &format!(
                "{}?watch=1&resourceVersion={from}",
                collection(&server, "pm")
            ),
            Some(accept),
        )
        .await;
        let label = format!("l{}", accept.len());
        merge_patch(
            &server,
            &item(&server, "pm", "two"),
            json!({"metadata": {"labels": {"k": label}}}),
        )
        .await;
        let e = w.event().await;
        assert_eq!(e["type"], "MODIFIED");
        assert_eq!(e["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(e["object"]["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(e["object"]["metadata"]["labels"]["k"], label);
        assert!(e["object"].get("spec").is_none());
    }
    let mut w = Watch::open(
        &server,
        &format!("{}?watch=1&resourceVersion=0", collection(&server, "pm")),
        Some(META_LIST_ACCEPT),
    )
    .await;
    for _ in 0..2 {
        let e = w.event().await;
        assert_eq!(e["type"], "ADDED");
        assert_eq!(e["object"]["kind"], "PartialObjectMetadata");
    }
    server
        .store
        .remove::<AccessSession>("pm", "one", &Preconditions::default(), false)
        .await
        .unwrap();
    let e = w.event().await;
    assert_eq!(e["type"], "DELETED");
    assert_eq!(e["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(e["object"]["metadata"]["name"], "one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_writes_nothing() {
    let server = TestServer::start().await;
    let http = server.http();
    let existing = create(&server, "d", "existing").await;
    let before = list_rv(&server, "d").await;

    let resp = http
        .post(format!("{}?dryRun=All", collection(&server, "d")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&session_body("d", "ghost"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let ghost: Value = resp.json().await.unwrap();
    assert_eq!(ghost["metadata"]["name"], "ghost");
    assert_eq!(ghost["status"]["phase"], "Active");
    expect_status(
        get(&server, &item(&server, "d", "ghost"), None).await,
        404,
        "NotFound",
    )
    .await;

    let mut updated = serde_json::to_value(&existing).unwrap();
    updated["apiVersion"] = json!(apis::API_VERSION);
    updated["kind"] = json!("AccessSession");
    updated["metadata"]["labels"] = json!({"dry": "run"});
    let resp = http
        .put(format!("{}?dryRun=All", item(&server, "d", "existing")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&updated)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let answered: Value = resp.json().await.unwrap();
    assert_eq!(answered["metadata"]["labels"], json!({"dry": "run"}));
    let resp = server
        .http()
        .patch(format!("{}?dryRun=All", item(&server, "d", "existing")))
        .bearer_auth(ADMIN_TOKEN)
        .header("Content-Type", "application/merge-patch+json")
        .body(r#"{"metadata":{"labels":{"dry":"patch"}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    let resp = http
        .delete(format!("{}?dryRun=All", item(&server, "d", "existing")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = http
        .delete(item(&server, "d", "existing"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    let now = get_json(&server, &item(&server, "d", "existing"), None).await;
    assert_eq!(now["metadata"]["resourceVersion"], rv(&existing));
    assert!(now["metadata"].get("labels").is_none(), "{now}");
    assert_eq!(
        list_rv(&server, "d").await,
        before,
        "a dry run moved the resourceVersion"
    );
    // The dry-run create reserved nothing: the name can be used for real.
    let resp = http
        .post(collection(&server, "d"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&session_body("d", "ghost"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_validation_warns_rejects_or_ignores() {
    let server = TestServer::start().await;
    let http = server.http();
    let with_unknown = |name: &str| {
        let mut b = session_body("fv", name);
        b["spec"]["bogus"] = json!(1);
        b
    };
    let post = |query: &str, b: Value| {
        http.post(format!("{}{query}", collection(&server, "fv")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&b)
            .send()
    };
    let warnings = |resp: &reqwest::Response| -> Vec<String> {
        resp.headers()
            .get_all("warning")
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect()
    };

    let resp = post("?fieldValidation=Warn", with_unknown("warned"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(
        warnings(&resp),
        vec![r#"299 - "unknown field \"spec.bogus\"""#.to_string()]
    );
    let stored: Value = resp.json().await.unwrap();
    assert!(stored["spec"].get("bogus").is_none());

    let resp = post("", with_unknown("default")).await.unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(warnings(&resp).len(), 1, "Warn is the default");

    let resp = post("?fieldValidation=Ignore", with_unknown("ignored"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    assert!(warnings(&resp).is_empty());

    let resp = post("?fieldValidation=Strict", with_unknown("strict"))
        .await
        .unwrap();
    let v = expect_status(resp, 400, "BadRequest").await;
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains(r#"unknown field "spec.bogus""#),
        "{v}"
    );
    expect_status(
        get(&server, &item(&server, "fv", "strict"), None).await,
        404,
        "NotFound",
    )
    .await;
    let mut b = session_body("fv", "strict-meta");
    b["metadata"]["bogus"] = json!("x");
    let v = expect_status(
        post("?fieldValidation=Strict", b).await.unwrap(),
        400,
        "BadRequest",
    )
    .await;
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains(r#"unknown field "metadata.bogus""#),
        "{v}"
    );
    // A clean body passes Strict.
    let resp = post("?fieldValidation=Strict", session_body("fv", "clean"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    // Patches are checked the same way.
    let resp = http
        .patch(format!(
            "{}?fieldValidation=Strict",
            item(&server, "fv", "clean")
        ))
        .bearer_auth(ADMIN_TOKEN)
        .header("Content-Type", "application/merge-patch+json")
        .body(r#"{"spec":{"nope":true}}"#)
        .send()
        .await
        .unwrap();
    expect_status(resp, 400, "BadRequest").await;
    let resp = merge_patch(
        &server,
        &item(&server, "fv", "clean"),
        json!({"spec": {"nope": true}}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        warnings(&resp),
        vec![r#"299 - "unknown field \"spec.nope\"""#.to_string()]
    );

    let resp = post("?fieldValidation=Loose", session_body("fv", "x"))
        .await
        .unwrap();
    expect_status(resp, 400, "BadRequest").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_requests_are_401() {
    let server = TestServer::start().await;
    create(&server, "a", "one").await;
    for url in [
        item(&server, "a", "one"),
        collection(&server, "a"),
        format!("{}?watch=1", collection(&server, "a")),
    ] {
        let resp = server.http().get(&url).send().await.unwrap();
        expect_status(resp, 401, "Unauthorized").await;
        let resp = server
            .http()
            .get(&url)
            .bearer_auth("not-a-token")
            .send()
            .await
            .unwrap();
        expect_status(resp, 401, "Unauthorized").await;
    }
    let resp = server
        .http()
        .post(collection(&server, "a"))
        .json(&session_body("a", "two"))
        .send()
        .await
        .unwrap();
    expect_status(resp, 401, "Unauthorized").await;
    expect_status(
        get(&server, &item(&server, "a", "two"), None).await,
        404,
        "NotFound",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_seconds_closes_the_watch_cleanly() {
    let server = TestServer::start().await;
    create(&server, "to", "one").await;
    for query in [
        "watch=1&timeoutSeconds=1",
        &format!("{STREAMING}&timeoutSeconds=1"),
    ] {
        let started = Instant::now();
        let mut w = Watch::open(
            &server,
            &format!("{}?{query}", collection(&server, "to")),
            None,
        )
        .await;
        let mut events = Vec::new();
        loop {
            match w.next(Duration::from_secs(6)).await {
                Next::Event(e) => events.push(e),
                Next::End => break,
                Next::Idle => panic!("{query}: the watch did not close within 6s"),
            }
        }
        let took = started.elapsed();
        // Expected 1 s (timeoutSeconds=1); the upper bound keeps a 5x margin.
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(5),
            "{query}: closed after {took:?}"
        );
        assert!(events.iter().all(|e| e["type"] != "ERROR"), "{events:?}");
        assert_eq!(events[0]["type"], "ADDED");
    }
    // timeoutSeconds=0 means "not set" (kube-rs sends it for `Config::timeout(0)`): the watch
    // stays open and keeps delivering.
    let from = list_rv(&server, "to").await;
    let mut w = Watch::open(
        &server,
        &format!(
            "{}?watch=1&timeoutSeconds=0&resourceVersion={from}",
            collection(&server, "to")
        ),
        None,
    )
    .await;
    match w.next(Duration::from_secs(2)).await {
        Next::Idle => {}
        other => panic!("timeoutSeconds=0 closed the watch: {other:?}"),
    }
    create(&server, "to", "two").await;
    assert_event(&w.event().await, "ADDED", "two");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selector_watches_see_objects_enter_and_leave() {
    let server = TestServer::start().await;
    let from = list_rv(&server, "sel").await;
    let base = format!(
        "{}?watch=1&resourceVersion={from}",
        collection(&server, "sel")
    );
    let mut active = Watch::open(
        &server,
        &format!("{base}&fieldSelector=status.phase%3DActive"),
        None,
    )
    .await;
    let mut gold = Watch::open(&server, &format!("{base}&labelSelector=tier%3Dgold"), None).await;

    // Field selector: revoking leaves the selection, restoring enters it again.
    let a = create(&server, "sel", "a").await;
    let e = active.event().await;
    assert_event(&e, "ADDED", "a");
    // Revoking and restoring go through a Revocation of the session (created, then deleted);
    // the session's own resourceVersion after each is the one its change was written at.
    let revocation = support::revoke(&server.store, "sel", "a", "manual").await;
    let revoked: AccessSession = server.store.get("sel", "a").await.unwrap();
    let e = active.event().await;
    assert_event(&e, "DELETED", "a");
    assert_eq!(
        e["object"]["status"]["phase"], "Active",
        "DELETED carries the last matching state"
    );
    assert_eq!(
        event_rv(&e),
        rv(&revoked),
        "…at the resourceVersion of the change"
    );
    assert_ne!(rv(&revoked), rv(&a));
    support::withdraw(&server.store, "sel", &revocation)
        .await
        .unwrap();
    let restored: AccessSession = server.store.get("sel", "a").await.unwrap();
    assert_eq!(restored.phase(), SessionPhase::Active);
    let e = active.event().await;
    assert_event(&e, "ADDED", "a");
    assert_eq!(event_rv(&e), rv(&restored));

    // Label selector: ADDED when the label arrives, MODIFIED while it stays, DELETED when it
    // goes; changes outside the selection are not sent.
    let url = item(&server, "sel", "a");
    assert_eq!(
        merge_patch(
            &server,
            &url,
            json!({"metadata": {"labels": {"tier": "gold"}}})
        )
        .await
        .status(),
        200
    );
    let e = gold.event().await;
    assert_event(&e, "ADDED", "a");
    assert_eq!(e["object"]["metadata"]["labels"]["tier"], "gold");
    assert_eq!(
        merge_patch(
            &server,
            &url,
            json!({"metadata": {"labels": {"extra": "1"}}})
        )
        .await
        .status(),
        200
    );
    let e = gold.event().await;
    assert_event(&e, "MODIFIED", "a");
    assert_eq!(e["object"]["metadata"]["labels"]["extra"], "1");
    let resp = merge_patch(
        &server,
        &url,
        json!({"metadata": {"labels": {"tier": "silver"}}}),
    )
    .await;
    let silver: Value = resp.json().await.unwrap();
    let e = gold.event().await;
    assert_event(&e, "DELETED", "a");
    assert_eq!(e["object"]["metadata"]["labels"]["tier"], "gold");
    assert_eq!(
        e["object"]["metadata"]["resourceVersion"],
        silver["metadata"]["resourceVersion"]
    );
    assert_eq!(
        merge_patch(
            &server,
            &url,
            json!({"metadata": {"labels": {"extra": "2"}}})
        )
        .await
        .status(),
        200
    );
    server
        .store
        .remove::<AccessSession>("sel", "a", &Preconditions::default(), false)
        .await
        .unwrap();
    let mut z = mk_session("sel", "z", "srv-1");
    z.metadata.labels = Some([("tier".to_string(), "gold".to_string())].into());
    server.store.create_session(z, false).await.unwrap();
    // The sentinel comes next: nothing was sent for the changes outside the selection.
    assert_event(&gold.event().await, "ADDED", "z");
    // The field-selector watch saw every label change of `a` (it stayed Active) and its deletion.
    for expected in ["MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED"] {
        assert_event(&active.event().await, expected, "a");
    }
    assert_event(&active.event().await, "ADDED", "z");
}

/// A watcher cut off for being slow must not get a bookmark past the events it missed:
/// drained of what it did receive, its position stays at the last delivered event and the
/// next step is Expired. (Over HTTP the race is between the bookmark tick and the next event
/// in the watch loop, so it is checked on the subscription the watch runs on.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_never_skip_events_a_cut_off_watcher_missed() {
    let server = TestServer::start_with(|c| c.watcher_buffer = 8, HttpConfig::default()).await;
    let from = server.store.current_version().await.unwrap();
    let mut sub = server.store.subscribe(from).await.unwrap();
    // Attach to the live fan-out, then stop reading.
    assert!(tokio::time::timeout(Duration::from_millis(200), sub.next())
        .await
        .is_err());
    assert_eq!(server.store.live_subscribers(), 1);
    for i in 0..20 {
        create(&server, "cut", &format!("s-{i}")).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.store.live_subscribers() > 0 {
        assert!(
            Instant::now() < deadline,
            "the slow subscriber was not cut off"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut last = from;
    for _ in 0..8 {
        let e = sub.next().await.unwrap();
        assert!(e.rv > last);
        last = e.rv;
    }
    let mark = sub.bookmark().expect("the feed is live");
    assert_eq!(
        (sub.cursor(), mark.at),
        (last, last),
        "a bookmark would claim events this watcher never received"
    );
    assert!(mark.head > last, "the head shows what it missed: {mark:?}");
    assert!(matches!(sub.next().await, Err(StoreError::Expired(_))));
}

/// Kubernetes decodes a duplicated field "last one wins", reporting it like an unknown field:
/// a Warning under Warn, nothing under Ignore, 400 only under Strict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_validation_handles_duplicate_fields() {
    let server = TestServer::start().await;
    let post = |mode: &str, name: &str| {
        let b = session_body("dup", name).to_string();
        let duplicated = b.replacen("\"spec\":{", "\"spec\":{\"teams\":[\"first\"],", 1);
        assert_ne!(duplicated, b);
        server
            .http()
            .post(format!(
                "{}?fieldValidation={mode}",
                collection(&server, "dup")
            ))
            .bearer_auth(ADMIN_TOKEN)
            .header("Content-Type", "application/json")
            .body(duplicated)
            .send()
    };
    let resp = post("Warn", "warned").await.unwrap();
    assert_eq!(resp.status(), 201);
    let warnings: Vec<String> = resp
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("duplicate field") && w.contains("teams")),
        "{warnings:?}"
    );
    let stored: Value = resp.json().await.unwrap();
    assert_eq!(
        stored["spec"]["teams"],
        json!(["payments"]),
        "the last occurrence wins"
    );
    let resp = post("Ignore", "ignored").await.unwrap();
    assert_eq!(resp.status(), 201);
    assert!(resp.headers().get("warning").is_none());
    let v = expect_status(post("Strict", "strict").await.unwrap(), 400, "BadRequest").await;
    assert!(
        v["message"].as_str().unwrap().contains("duplicate field"),
        "{v}"
    );
}
