//! kube-rs interop: paginated lists, `watcher` (list+watch and streaming lists), a
//! `reflector` that converges under load, and recovery from Expired watches (log trimmed past
//! the watcher, apiserver restart rotating the epoch).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::StoreExt;

use apiserver::http::HttpConfig;
use apiserver::store::{PgStore, Preconditions, ResourceVersion, Store};
use futures::{StreamExt, TryStreamExt};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, PartialObjectMeta, Patch,
    PatchParams, PostParams,
};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher::{self, Event};
use kube::ResourceExt;
use serde_json::json;
use support::server::{short_log, TestServer};
use support::*;

fn sessions() -> ApiResource {
    ApiResource {
        group: apis::GROUP.into(),
        version: apis::VERSION.into(),
        api_version: apis::API_VERSION.into(),
        kind: "AccessSession".into(),
        plural: "accesssessions".into(),
    }
}

/// A team session as a kube-rs dynamic object.
fn dyn_session(ns: &str, name: &str, server_uid: &str, labels: &[(&str, &str)]) -> DynamicObject {
    let mut s = mk_session(ns, name, server_uid);
    if !labels.is_empty() {
        s.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
    }
    let mut v = serde_json::to_value(&s).unwrap();
    v["apiVersion"] = json!(apis::API_VERSION);
    v["kind"] = json!("AccessSession");
    serde_json::from_value(v).unwrap()
}

fn key(o: &DynamicObject) -> String {
    format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())
}

fn rv_of(o: &DynamicObject) -> ResourceVersion {
    ResourceVersion::parse(&o.resource_version().expect("object has a resourceVersion"))
        .expect("resourceVersion parses")
}

/// `namespace/name` → resourceVersion of a fresh, unpaginated list.
async fn server_state(api: &Api<DynamicObject>) -> BTreeMap<String, String> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| (key(o), o.resource_version().unwrap()))
        .collect()
}

fn store_state(store: &reflector::Store<DynamicObject>) -> BTreeMap<String, String> {
    store
        .state()
        .iter()
        .map(|o| (key(o), o.resource_version().unwrap_or_default()))
        .collect()
}

/// Waits until the reflector holds exactly what the server lists (names and resourceVersions).
async fn converge(
    api: &Api<DynamicObject>,
    stores: &[(&str, &reflector::Store<DynamicObject>)],
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let want = server_state(api).await;
        let diverged: Vec<_> = stores
            .iter()
            .filter(|(_, s)| store_state(s) != want)
            .map(|(n, _)| *n)
            .collect();
        if diverged.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            for (name, s) in stores {
                let have = store_state(s);
                let missing: Vec<_> = want
                    .iter()
                    .filter(|(k, v)| have.get(*k) != Some(v))
                    .take(5)
                    .collect();
                let extra: Vec<_> = have
                    .iter()
                    .filter(|(k, v)| want.get(*k) != Some(v))
                    .take(5)
                    .collect();
                eprintln!(
                    "{name}: server {} objects, store {}; missing/stale {missing:?}; extra/stale {extra:?}",
                    want.len(),
                    have.len()
                );
            }
            panic!("reflectors {diverged:?} did not converge within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What a watcher did, for assertions.
#[derive(Default, Debug)]
struct Trace {
    inits: usize,
    init_dones: usize,
    expired: usize,
    other_errors: Vec<String>,
}

/// Runs a reflector fed by `watcher(api, config)` in the background, recording its events.
fn spawn_reflector(
    api: Api<DynamicObject>,
    config: watcher::Config,
) -> (
    reflector::Store<DynamicObject>,
    Arc<Mutex<Trace>>,
    tokio::task::JoinHandle<()>,
) {
    let writer = Writer::<DynamicObject>::new(sessions());
    let reader = writer.as_reader();
    let trace = Arc::new(Mutex::new(Trace::default()));
    let t = trace.clone();
    let stream = watcher::watcher(api, config).inspect(move |e| {
        let mut t = t.lock().unwrap();
        match e {
            Ok(Event::Init) => t.inits += 1,
            Ok(Event::InitDone) => t.init_dones += 1,
            Err(watcher::Error::WatchError(status)) if status.code == 410 => t.expired += 1,
            Err(e) => t.other_errors.push(e.to_string()),
            Ok(_) => {}
        }
    });
    let handle = tokio::spawn(async move {
        let mut stream = std::pin::pin!(reflector::reflector(writer, stream));
        while let Some(e) = stream.next().await {
            if e.is_err() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    (reader, trace, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_paginates_at_one_resource_version() {
    let server = TestServer::start().await;
    let client = server.kube_client().await;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "pages", &sessions());
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &sessions());
    let pp = PostParams::default();
    let mut expected = BTreeSet::new();
    for i in 0..7 {
        let name = format!("s-{i}");
        api.create(&pp, &dyn_session("pages", &name, "srv-1", &[]))
            .await
            .unwrap();
        expected.insert(name);
    }
    Api::<DynamicObject>::namespaced_with(client.clone(), "elsewhere", &sessions())
        .create(&pp, &dyn_session("elsewhere", "x", "srv-1", &[]))
        .await
        .unwrap();
    let before = server_state(&api).await;

    let mut lp = ListParams::default().limit(2);
    let mut seen = Vec::new();
    let mut page_rvs = Vec::new();
    let mut pages = 0;
    loop {
        let page = api.list(&lp).await.unwrap();
        pages += 1;
        assert!(
            page.items.len() <= 2,
            "page {pages} has {} items",
            page.items.len()
        );
        let page_rv = page
            .metadata
            .resource_version
            .clone()
            .expect("every page carries a resourceVersion");
        for item in &page.items {
            assert!(
                rv_of(item) <= ResourceVersion::parse(&page_rv).unwrap(),
                "item newer than its page"
            );
            assert_eq!(
                before.get(&key(item)),
                item.resource_version().as_ref(),
                "item not at the snapshot"
            );
            seen.push(item.name_any());
        }
        page_rvs.push(page_rv);
        if pages == 1 {
            // Writes between pages must not show through: the list stays at the first page's RV.
            server
                .store
                .create_session(mk_session("pages", "s-late", "srv-1"), false)
                .await
                .unwrap();
            api.patch(
                "s-5",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
            )
            .await
            .unwrap();
            api.delete("s-6", &DeleteParams::default()).await.unwrap();
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp.continue_token = Some(c),
            None => break,
        }
    }
    assert_eq!(pages, 4, "7 objects in pages of 2");
    assert_eq!(
        seen.len(),
        expected.len(),
        "every object exactly once: {seen:?}"
    );
    assert_eq!(seen.iter().cloned().collect::<BTreeSet<_>>(), expected);
    assert!(
        page_rvs.iter().all(|rv| rv == &page_rvs[0]),
        "page RVs differ: {page_rvs:?}"
    );

    // A fresh list sees the writes.
    let now = server_state(&api).await;
    assert!(now.contains_key("pages/s-late") && !now.contains_key("pages/s-6"));
    assert_ne!(now["pages/s-5"], before["pages/s-5"]);

    // All namespaces, pages of 3, equals an unpaginated list (names and resourceVersions).
    let mut lp = ListParams::default().limit(3);
    let mut paged = BTreeMap::new();
    let mut rvs = BTreeSet::new();
    loop {
        let page = all.list(&lp).await.unwrap();
        rvs.insert(page.metadata.resource_version.clone().unwrap());
        for item in &page.items {
            assert!(
                paged
                    .insert(key(item), item.resource_version().unwrap())
                    .is_none(),
                "duplicate {}",
                key(item)
            );
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp.continue_token = Some(c),
            None => break,
        }
    }
    assert_eq!(rvs.len(), 1);
    assert_eq!(paged, server_state(&all).await);
    assert_eq!(paged.len(), 8);
}

/// Init, InitApply for each existing object, InitDone, then Apply/Apply/Delete for a create,
/// a patch and a delete made by other clients.
async fn watcher_sees_init_then_changes(config: watcher::Config) {
    let server = TestServer::start().await;
    let ns = "w";
    for i in 0..3 {
        server
            .store
            .create_session(mk_session(ns, &format!("pre-{i}"), "srv-1"), false)
            .await
            .unwrap();
    }
    let api: Api<DynamicObject> = Api::namespaced_with(server.kube_client().await, ns, &sessions());
    let mut stream = watcher::watcher(api, config).boxed();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(15), stream.try_next())
            .await
            .expect("watcher event within 15s")
            .expect("watcher error")
            .expect("watcher stream ended")
    };
    assert!(matches!(next().await, Event::Init));
    let mut initial = BTreeSet::new();
    loop {
        match next().await {
            Event::InitApply(o) => {
                assert_eq!(
                    o.types.as_ref().map(|t| t.kind.as_str()),
                    Some("AccessSession")
                );
                assert!(initial.insert(o.name_any()));
            }
            Event::InitDone => break,
            other => panic!("unexpected during init: {other:?}"),
        }
    }
    assert_eq!(
        initial,
        ["pre-0", "pre-1", "pre-2"].map(String::from).into()
    );

    // Another kube client patches, raw HTTP creates, the store deletes.
    let other: Api<DynamicObject> =
        Api::namespaced_with(server.kube_client().await, ns, &sessions());
    let mut body = serde_json::to_value(dyn_session(ns, "live-0", "srv-1", &[])).unwrap();
    body["metadata"]["labels"] = json!({"via": "http"});
    let resp = server.post_session(ns, &body).await;
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
    match next().await {
        Event::Apply(o) => {
            assert_eq!(o.name_any(), "live-0");
            assert_eq!(o.labels().get("via").map(String::as_str), Some("http"));
        }
        other => panic!("expected Apply(live-0), got {other:?}"),
    }
    let patched = other
        .patch(
            "pre-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"p": "1"}}})),
        )
        .await
        .unwrap();
    match next().await {
        Event::Apply(o) => {
            assert_eq!(o.name_any(), "pre-1");
            assert_eq!(o.labels().get("p").map(String::as_str), Some("1"));
            assert_eq!(o.resource_version(), patched.resource_version());
        }
        other => panic!("expected Apply(pre-1), got {other:?}"),
    }
    server
        .store
        .remove::<apis::AccessSession>(ns, "pre-2", &Preconditions::default(), false)
        .await
        .unwrap();
    match next().await {
        Event::Delete(o) => {
            assert_eq!(o.name_any(), "pre-2");
            // The last state travels with the deletion.
            assert_eq!(o.data["spec"]["server"]["uid"], "srv-1");
            assert!(
                rv_of(&o) > ResourceVersion::parse(&patched.resource_version().unwrap()).unwrap()
            );
        }
        other => panic!("expected Delete(pre-2), got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_list_then_watch() {
    watcher_sees_init_then_changes(watcher::Config::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_streaming_list() {
    watcher_sees_init_then_changes(watcher::Config::default().streaming_lists()).await;
}

/// The metadata client path (`as=PartialObjectMetadata[List]`): `list_metadata` pages and a
/// `metadata_watcher` with either initial-list strategy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_lists_and_watchers() {
    let server = TestServer::start().await;
    for i in 0..5 {
        server
            .store
            .create_session(mk_session("md", &format!("s-{i}"), "srv-1"), false)
            .await
            .unwrap();
    }
    let api: Api<DynamicObject> =
        Api::namespaced_with(server.kube_client().await, "md", &sessions());
    let mut lp = ListParams::default().limit(2);
    let mut names = Vec::new();
    let mut rvs = BTreeSet::new();
    loop {
        let page = api.list_metadata(&lp).await.unwrap();
        rvs.insert(page.metadata.resource_version.clone().unwrap());
        for m in &page.items {
            assert_eq!(
                m.types.as_ref().map(|t| t.kind.as_str()),
                Some("PartialObjectMetadata")
            );
            names.push(m.name_any());
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp.continue_token = Some(c),
            None => break,
        }
    }
    assert_eq!(names, (0..5).map(|i| format!("s-{i}")).collect::<Vec<_>>());
    assert_eq!(rvs.len(), 1);

    // An Api of PartialObjectMeta asks for the metadata rendering on list and watch.
    let meta: Api<PartialObjectMeta<DynamicObject>> =
        Api::namespaced_with(server.kube_client().await, "md", &sessions());
    for (round, config) in [
        watcher::Config::default(),
        watcher::Config::default().streaming_lists(),
    ]
    .into_iter()
    .enumerate()
    {
        let mut stream = watcher::watcher(meta.clone(), config).boxed();
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(15), stream.try_next())
                .await
                .expect("watcher event within 15s")
                .expect("watcher error")
                .expect("watcher stream ended")
        };
        assert!(matches!(next().await, Event::Init));
        let mut initial = BTreeSet::new();
        loop {
            match next().await {
                Event::InitApply(m) => {
                    initial.insert(m.name_any());
                }
                Event::InitDone => break,
                other => panic!("unexpected during init: {other:?}"),
            }
        }
        assert_eq!(initial.len(), 5 + round);
        let name = format!("new-{round}");
        server
            .store
            .create_session(mk_session("md", &name, "srv-1"), false)
            .await
            .unwrap();
        match next().await {
            Event::Apply(m) => {
                assert_eq!(m.name_any(), name);
                assert_eq!(
                    m.types.as_ref().map(|t| t.kind.as_str()),
                    Some("PartialObjectMetadata")
                );
            }
            other => panic!("expected Apply({name}), got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflectors_converge_after_a_thousand_writes() {
    let server = TestServer::start().await;
    let client = server.kube_client().await;
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &sessions());
    let (listed, listed_trace, h1) =
        spawn_reflector(all.clone(), watcher::Config::default().page_size(100));
    let (streamed, streamed_trace, h2) =
        spawn_reflector(all.clone(), watcher::Config::default().streaming_lists());
    tokio::time::timeout(Duration::from_secs(10), async {
        listed.wait_until_ready().await.unwrap();
        streamed.wait_until_ready().await.unwrap();
    })
    .await
    .expect("reflectors ready");

    let started = Instant::now();
    let creates = futures::stream::iter(0..1000)
        .map(|i| {
            let ns = if i % 2 == 0 { "team-a" } else { "team-b" };
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &sessions());
            async move {
                api.create(
                    &PostParams::default(),
                    &dyn_session(ns, &format!("s-{i:04}"), "srv-1", &[]),
                )
                .await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .unwrap();
    assert_eq!(creates.len(), 1000);
    // Updates, deletions and revocations, interleaved.
    let changes = futures::stream::iter(0..200)
        .map(|i| {
            let client = client.clone();
            let store = server.store.clone();
            async move {
                let ns = if i % 2 == 0 { "team-a" } else { "team-b" };
                let name = format!("s-{i:04}");
                let api: Api<DynamicObject> = Api::namespaced_with(client, ns, &sessions());
                match i % 4 {
                    0 => {
                        api.delete(&name, &DeleteParams::default()).await.unwrap();
                    }
                    1 => {
                        support::revoke(&store, ns, &name, "manual").await;
                    }
                    _ => {
                        api.patch(
                            &name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"metadata": {"labels": {"n": i.to_string()}}})),
                        )
                        .await
                        .unwrap();
                    }
                }
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    assert_eq!(changes.len(), 200);
    let writes = started.elapsed();
    converge(
        &all,
        &[("list+watch", &listed), ("streaming", &streamed)],
        Duration::from_secs(60),
    )
    .await;
    let state = server_state(&all).await;
    assert_eq!(state.len(), 950);
    eprintln!(
        "1,200 writes in {writes:?}, converged after {:?}; traces: {:?} / {:?}",
        started.elapsed(),
        listed_trace.lock().unwrap(),
        streamed_trace.lock().unwrap()
    );
    for t in [&listed_trace, &streamed_trace] {
        let t = t.lock().unwrap();
        assert!(t.other_errors.is_empty(), "{t:?}");
        // Both keep up (a watch queue holds 1,024 events; 16 writers at a time): exactly the
        // initial list, never a 410 and never a relist. A relist here would mean the feed
        // cut off a client that was reading.
        assert_eq!(
            (t.inits, t.init_dones, t.expired),
            (1, 1, 0),
            "one initial list, no relist: {t:?}"
        );
    }
    h1.abort();
    h2.abort();
}

/// A watcher that sees no events (its selector matches nothing that changes) keeps its old
/// resourceVersion; once the log is trimmed past it, re-watching after the server closes the
/// stream (timeoutSeconds) is Expired and kube-rs must relist rather than loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_relists_after_its_resource_version_is_trimmed() {
    let server = TestServer::start_with(
        short_log,
        // No bookmarks: nothing advances the watcher's resourceVersion.
        HttpConfig {
            bookmark_interval: Duration::from_secs(3600),
        },
    )
    .await;
    let client = server.kube_client().await;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "exp", &sessions());
    for i in 0..3 {
        api.create(
            &PostParams::default(),
            &dyn_session("exp", &format!("m-{i}"), "srv-1", &[("app", "watched")]),
        )
        .await
        .unwrap();
    }
    let (store, trace, handle) = spawn_reflector(
        api.clone(),
        watcher::Config::default().labels("app=watched").timeout(1),
    );
    tokio::time::timeout(Duration::from_secs(10), store.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    let selected: Api<DynamicObject> = api.clone();
    let watched = || async {
        selected
            .list(&ListParams::default().labels("app=watched"))
            .await
            .unwrap()
            .items
            .iter()
            .map(|o| (key(o), o.resource_version().unwrap()))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(store_state(&store), watched().await);
    assert_eq!(trace.lock().unwrap().inits, 1);

    // 120 changes the watcher does not select, then trim to the last 50.
    for i in 0..120 {
        server
            .store
            .create_session(mk_session("exp", &format!("noise-{i}"), "srv-1"), false)
            .await
            .unwrap();
    }
    assert!(server.store.trim_log().await.unwrap() >= 70);
    let deadline = Instant::now() + Duration::from_secs(15);
    while trace.lock().unwrap().expired == 0 {
        assert!(
            Instant::now() < deadline,
            "no Expired reached the watcher: {:?}",
            trace.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // It relists (a new Init … InitDone) instead of retrying the stale resourceVersion.
    let deadline = Instant::now() + Duration::from_secs(10);
    while trace.lock().unwrap().init_dones < 2 {
        assert!(
            Instant::now() < deadline,
            "no relist after Expired: {:?}",
            trace.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Further changes to selected objects, while the server keeps trimming, still converge.
    api.create(
        &PostParams::default(),
        &dyn_session("exp", "m-new", "srv-1", &[("app", "watched")]),
    )
    .await
    .unwrap();
    api.patch(
        "m-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "other"}}})),
    )
    .await
    .unwrap();
    api.delete("m-1", &DeleteParams::default()).await.unwrap();
    api.patch(
        "noise-3",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "watched"}}})),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let want = watched().await;
        if store_state(&store) == want {
            let names: BTreeSet<_> = want.keys().cloned().collect();
            assert_eq!(
                names,
                ["exp/m-2", "exp/m-new", "exp/noise-3"]
                    .map(String::from)
                    .into()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "did not converge: {:?} vs {want:?}",
            store_state(&store)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t = trace.lock().unwrap();
    // One or two Expired (a reconnect may land before the trim), not an endless loop.
    assert!(t.expired <= 3, "{t:?}");
    assert!(t.other_errors.is_empty(), "{t:?}");
    drop(t);
    handle.abort();
}

/// Another apiserver start that rotates the epoch (`--rotate-epoch`, as after a restore; an
/// ordinary start keeps it): every open watch ends with Expired; kube-rs
/// watchers (list+watch and streaming) relist and hold the objects at the new epoch's
/// resourceVersions; later writes still reach them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_relist_after_an_epoch_rotation() {
    let server = TestServer::start_with(short_log, HttpConfig::default()).await;
    let client = server.kube_client().await;
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &sessions());
    for i in 0..20 {
        server
            .store
            .create_session(mk_session("rs", &format!("s-{i}"), "srv-1"), false)
            .await
            .unwrap();
    }
    let (listed, listed_trace, h1) = spawn_reflector(all.clone(), watcher::Config::default());
    let (streamed, streamed_trace, h2) =
        spawn_reflector(all.clone(), watcher::Config::default().streaming_lists());
    converge(
        &all,
        &[("list+watch", &listed), ("streaming", &streamed)],
        Duration::from_secs(10),
    )
    .await;
    let old_epoch = rv_of(&listed.state()[0]).epoch;

    let restarted = PgStore::start(apiserver::store::StoreConfig {
        rotate_epoch: true,
        ..server.db.store_config()
    })
    .await
    .unwrap();
    let new_epoch = restarted.current_version().await.unwrap().epoch;
    assert_ne!(new_epoch, old_epoch);
    let deadline = Instant::now() + Duration::from_secs(10);
    for trace in [&listed_trace, &streamed_trace] {
        while trace.lock().unwrap().init_dones < 2 {
            assert!(
                Instant::now() < deadline,
                "no relist after the restart: {:?}",
                trace.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let t = trace.lock().unwrap();
        assert!(t.expired >= 1, "the watch did not end with Expired: {t:?}");
        assert!(t.other_errors.is_empty(), "{t:?}");
    }
    // Writes after the restart (through the original server) reach both.
    for i in 20..40 {
        Api::<DynamicObject>::namespaced_with(client.clone(), "rs", &sessions())
            .create(
                &PostParams::default(),
                &dyn_session("rs", &format!("s-{i}"), "srv-1", &[]),
            )
            .await
            .unwrap();
    }
    support::revoke(&restarted, "rs", "s-3", "manual").await;
    server
        .store
        .remove::<apis::AccessSession>("rs", "s-4", &Preconditions::default(), false)
        .await
        .unwrap();
    converge(
        &all,
        &[("list+watch", &listed), ("streaming", &streamed)],
        Duration::from_secs(20),
    )
    .await;
    for store in [&listed, &streamed] {
        assert_eq!(store.state().len(), 39);
        assert!(
            store.state().iter().all(|o| rv_of(o).epoch == new_epoch),
            "an object kept an old-epoch resourceVersion"
        );
    }
    h1.abort();
    h2.abort();
}
