//! Lists served from the stored JSON (`store/raw.rs`), over the real server and PostgreSQL:
//! a list longer than one chunk of rows streams complete and valid, every item is what a get
//! of it returns (its resourceVersion spliced in), selectors select what the typed path
//! selects, pages keep their snapshot, and an error after the first byte ends the body
//! abnormally instead of looking like a shorter list.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use support::server::{TestServer, ADMIN_TOKEN};
use support::watch::{Next, WatchStream};
use support::*;

/// More than one chunk (1,000 rows) of a streamed list.
const MANY: usize = 1_234;

const TABLE_ACCEPT: &str =
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

fn name(i: usize) -> String {
    format!("s-{i:04}")
}

/// The labels session `i` is created with: `tier` a, b or c, none on every fifth.
fn tier(i: usize) -> Option<&'static str> {
    (!i.is_multiple_of(5)).then(|| ["a", "b", "c"][i % 3])
}

/// The server uid of session `i`.
fn server_uid(i: usize) -> String {
    format!("srv-{}", i % 2)
}

/// Creates sessions `0..n` in `ns` through the store, eight at a time.
async fn seed(server: &TestServer, ns: &str, n: usize) {
    let mut tasks = Vec::new();
    for w in 0..8 {
        let store = server.store.clone();
        let ns = ns.to_string();
        tasks.push(tokio::spawn(async move {
            for i in (w..n).step_by(8) {
                let mut s = mk_session(&ns, &name(i), &server_uid(i));
                if let Some(t) = tier(i) {
                    s.metadata.labels = Some([("tier".to_string(), t.to_string())].into());
                }
                store.create_session(s, false).await.expect("seed");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
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
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {url} is not JSON ({e})"))
}

fn names(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

fn rv_of(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_else(|| panic!("no resourceVersion in {v}"))
        .parse()
        .unwrap()
}

/// Every item of a list, following continue tokens with pages of `limit`; every page must
/// carry the first page's resourceVersion.
async fn paged(server: &TestServer, url: &str, limit: usize, accept: Option<&str>) -> Vec<Value> {
    let sep = if url.contains('?') { '&' } else { '?' };
    let mut items = Vec::new();
    let mut token = String::new();
    let mut rv = None;
    loop {
        let mut page_url = format!("{url}{sep}limit={limit}");
        if !token.is_empty() {
            page_url.push_str(&format!("&continue={token}"));
        }
        let page = get_json(server, &page_url, accept).await;
        let page_rv = page["metadata"]["resourceVersion"].clone();
        assert_eq!(*rv.get_or_insert(page_rv.clone()), page_rv, "{page_url}");
        let key = if accept.is_some() { "rows" } else { "items" };
        let batch = page[key].as_array().unwrap();
        assert!(batch.len() <= limit);
        items.extend(batch.iter().map(|r| {
            if accept.is_some() {
                r["object"].clone()
            } else {
                r.clone()
            }
        }));
        match page["metadata"]["continue"].as_str() {
            Some(c) if !c.is_empty() => token = c.to_string(),
            _ => return items,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_list_longer_than_a_chunk_streams_complete_and_each_item_is_its_get() {
    let server = TestServer::start().await;
    seed(&server, "big", MANY).await;
    // A few items changed since: their resourceVersions differ from their neighbours'.
    for i in [2, 1000, MANY - 1] {
        let resp = server
            .http()
            .patch(format!("{}/{}", server.sessions_url("big"), name(i)))
            .bearer_auth(ADMIN_TOKEN)
            .header("Content-Type", "application/merge-patch+json")
            .body(r#"{"metadata":{"labels":{"touched":"yes"}}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let resp = get(&server, &server.sessions_url("big"), None).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers().get("content-type").unwrap(),
        "application/json"
    );
    assert_eq!(resp.content_length(), None, "a whole list is streamed");
    let list: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).expect("valid JSON");
    assert_eq!(list["kind"], "AccessSessionList");
    assert_eq!(list["apiVersion"], apis::API_VERSION);
    assert!(
        list["metadata"].get("continue").is_none(),
        "{}",
        list["metadata"]
    );
    let list_rv = rv_of(&list);
    let items = list["items"].as_array().unwrap();
    let expected: Vec<String> = (0..MANY).map(name).collect();
    assert_eq!(names(items), expected, "every item once, in order");
    for item in items {
        assert_eq!(item["kind"], "AccessSession");
        assert_eq!(item["apiVersion"], apis::API_VERSION);
        assert!(rv_of(item) <= list_rv);
    }
    for i in [0, 1, 2, 3, 998, 999, 1000, 1001, MANY - 2, MANY - 1] {
        let got = get_json(
            &server,
            &format!("{}/{}", server.sessions_url("big"), name(i)),
            None,
        )
        .await;
        assert_eq!(items[i], got, "list item {i} is what a get returns");
    }
    assert_ne!(rv_of(&items[2]), rv_of(&items[3]));
    assert_eq!(items[1000]["metadata"]["labels"]["touched"], "yes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn selectors_select_what_the_typed_rendering_selects() {
    let server = TestServer::start().await;
    seed(&server, "sel", MANY).await;
    let all: Vec<usize> = (0..MANY).collect();
    let cases: Vec<(&str, Vec<usize>)> = vec![
        ("", all.clone()),
        (
            "labelSelector=tier%3Da",
            all.iter()
                .copied()
                .filter(|i| tier(*i) == Some("a"))
                .collect(),
        ),
        (
            "labelSelector=tier!%3Da",
            all.iter()
                .copied()
                .filter(|i| tier(*i) != Some("a"))
                .collect(),
        ),
        (
            "labelSelector=tier%20in%20(b,c)",
            all.iter()
                .copied()
                .filter(|i| matches!(tier(*i), Some("b" | "c")))
                .collect(),
        ),
        (
            "labelSelector=!tier",
            all.iter().copied().filter(|i| tier(*i).is_none()).collect(),
        ),
        (
            "fieldSelector=spec.server.uid%3Dsrv-1",
            all.iter()
                .copied()
                .filter(|i| server_uid(*i) == "srv-1")
                .collect(),
        ),
        (
            "fieldSelector=metadata.name!%3Ds-0007&labelSelector=tier",
            all.iter()
                .copied()
                .filter(|i| *i != 7 && tier(*i).is_some())
                .collect(),
        ),
        ("labelSelector=tier%3Dnone", vec![]),
    ];
    for (selector, expected) in cases {
        let expected: Vec<String> = expected.into_iter().map(name).collect();
        let url = format!("{}?{selector}", server.sessions_url("sel"));
        let whole = get_json(&server, &url, None).await;
        assert_eq!(
            names(whole["items"].as_array().unwrap()),
            expected,
            "{selector}: streamed"
        );
        let table = get_json(&server, &url, Some(TABLE_ACCEPT)).await;
        let rows: Vec<Value> = table["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["object"].clone())
            .collect();
        assert_eq!(names(&rows), expected, "{selector}: typed (Table)");
        assert_eq!(
            names(&paged(&server, &url, 97, None).await),
            expected,
            "{selector}: pages"
        );
        // A streaming list (watch with initial events) reads the same bytes.
        let watch_url = format!(
            "{url}{}watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
            if selector.is_empty() { "" } else { "&" }
        );
        let resp = get(&server, &watch_url, None).await;
        let mut watch = WatchStream::strict(resp);
        let mut initial = Vec::new();
        loop {
            match watch.next(Duration::from_secs(20)).await {
                Next::Event(e) if e["type"] == "ADDED" => initial.push(e["object"].clone()),
                Next::Event(e) if e["type"] == "BOOKMARK" => {
                    assert_eq!(
                        e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
                        "true"
                    );
                    break;
                }
                other => panic!("{selector}: unexpected {other:?}"),
            }
        }
        assert_eq!(names(&initial), expected, "{selector}: initial events");
        if let Some(first) = initial.first() {
            assert_eq!(*first, whole["items"][0], "{selector}: the same object");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pages_are_served_at_the_first_pages_snapshot() {
    let server = TestServer::start().await;
    seed(&server, "pages", 300).await;
    let url = server.sessions_url("pages");
    let first = get_json(&server, &format!("{url}?limit=100"), None).await;
    let token = first["metadata"]["continue"].as_str().unwrap().to_string();
    let before = get_json(&server, &format!("{url}/{}", name(250)), None).await;
    // Changes after the first page: the later pages do not see them.
    let resp = server
        .http()
        .patch(format!("{url}/{}", name(250)))
        .bearer_auth(ADMIN_TOKEN)
        .header("Content-Type", "application/merge-patch+json")
        .body(r#"{"metadata":{"labels":{"tier":"z"}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = server
        .http()
        .delete(format!("{url}/{}", name(260)))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    server
        .store
        .create_session(mk_session("pages", "s-9999", "srv-0"), false)
        .await
        .unwrap();
    let mut items = first["items"].as_array().unwrap().clone();
    let mut token = token;
    loop {
        let page = get_json(&server, &format!("{url}?limit=100&continue={token}"), None).await;
        assert_eq!(
            page["metadata"]["resourceVersion"],
            first["metadata"]["resourceVersion"]
        );
        items.extend(page["items"].as_array().unwrap().iter().cloned());
        match page["metadata"]["continue"].as_str() {
            Some(c) if !c.is_empty() => token = c.to_string(),
            _ => break,
        }
    }
    assert_eq!(names(&items), (0..300).map(name).collect::<Vec<_>>());
    assert_eq!(
        items[250], before,
        "the state (and resourceVersion) at the snapshot"
    );
    // The current state is what a new list shows.
    let now = get_json(&server, &url, None).await;
    let now = names(now["items"].as_array().unwrap());
    assert!(now.contains(&"s-9999".to_string()) && !now.contains(&name(260)));
    let label = paged(&server, &format!("{url}?labelSelector=tier%3Dz"), 1, None).await;
    assert_eq!(names(&label), vec![name(250)]);
    assert_eq!(label[0]["metadata"]["labels"]["tier"], "z");
    assert!(rv_of(&label[0]) > rv_of(&before));
}

/// A row that cannot be served (not a session: no spec), written behind the server's back.
async fn corrupt_row(server: &TestServer, ns: &str, name: &str) {
    let client = server.db.client().await;
    let body = serde_json::json!({"metadata": {"name": name, "namespace": ns}});
    client
        .execute(
            "INSERT INTO objects (resource, namespace, name, uid, seq, body)
             VALUES ('accesssessions', $1, $2, gen_random_uuid(), 1, $3)",
            &[&ns, &name, &body],
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_error_after_the_first_bytes_ends_the_list_abnormally() {
    let server = TestServer::start().await;
    seed(&server, "big", 1_100).await;
    corrupt_row(&server, "big", "zzz").await;
    corrupt_row(&server, "small", "a").await;

    // Past the first chunk: the answer has started, so the body ends without its end.
    let resp = get(&server, &server.sessions_url("big"), None).await;
    assert_eq!(resp.status(), 200);
    let body = resp.bytes().await;
    assert!(
        body.is_err(),
        "a list that failed after streaming started must not end cleanly: got {} bytes",
        body.map(|b| b.len()).unwrap_or_default()
    );

    // In the first chunk, or in a page (read whole before answering): a Status.
    for url in [
        server.sessions_url("small"),
        format!("{}?limit=2000", server.sessions_url("big")),
    ] {
        let resp = get(&server, &url, None).await;
        assert_eq!(resp.status(), 500, "{url}");
        let status: Value = resp.json().await.unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "InternalError", "{status}");
    }

    // The server is still serving; the rows before the bad one are fine.
    let page = get_json(
        &server,
        &format!("{}?limit=1100", server.sessions_url("big")),
        None,
    )
    .await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1_100);
    let seen: BTreeSet<String> = names(page["items"].as_array().unwrap())
        .into_iter()
        .collect();
    assert_eq!(seen.len(), 1_100);
}

/// Lists of the current state that arrive together share one snapshot read (after a mass
/// cut, thousands of gateways relist the same scope at once), and none of them misses a
/// write acknowledged before it was asked: a shared read only ever starts after every
/// request it answers arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lists_arriving_together_share_a_read_and_miss_no_acknowledged_write() {
    use apis::AccessSession;
    use apiserver::store::{ListQuery, Store};
    use futures::TryStreamExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    const LISTERS: usize = 48;
    const ROUNDS: usize = 15;
    const WRITES: usize = 60;
    let db = TestDb::new().await;
    let store = db.store().await;
    let (lists_before, reads_before) = store.list_metrics().counts();
    let acked = Arc::new(AtomicUsize::new(0));
    let writer = tokio::spawn({
        let (store, acked) = (store.clone(), acked.clone());
        async move {
            for i in 0..WRITES {
                store
                    .create_session(mk_session("team-a", &name(i), "srv-1"), false)
                    .await
                    .unwrap();
                acked.store(i + 1, Ordering::SeqCst);
            }
        }
    });
    let start = Arc::new(tokio::sync::Barrier::new(LISTERS));
    let mut listers = Vec::new();
    for _ in 0..LISTERS {
        let (store, acked, start) = (store.clone(), acked.clone(), start.clone());
        listers.push(tokio::spawn(async move {
            start.wait().await;
            for _ in 0..ROUNDS {
                let before = acked.load(Ordering::SeqCst);
                let query = ListQuery {
                    namespace: Some("team-a".into()),
                    ..Default::default()
                };
                let list = store.list_raw::<AccessSession>(&query).await.unwrap();
                let items: Vec<bytes::Bytes> = list.items.try_collect().await.unwrap();
                let names: BTreeSet<String> = items
                    .iter()
                    .map(|b| {
                        let v: Value = serde_json::from_slice(b).unwrap();
                        v["metadata"]["name"].as_str().unwrap().to_string()
                    })
                    .collect();
                for i in 0..before {
                    assert!(
                        names.contains(&name(i)),
                        "{} was acknowledged before the list was asked, and is missing",
                        name(i)
                    );
                }
            }
        }));
    }
    for l in listers {
        l.await.unwrap();
    }
    writer.await.unwrap();
    let (lists, reads) = store.list_metrics().counts();
    let (lists, reads) = (lists - lists_before, reads - reads_before);
    assert_eq!(lists, (LISTERS * ROUNDS) as u64);
    assert!(
        reads * 4 <= lists,
        "{lists} lists asked together were served by {reads} snapshot reads"
    );
}
