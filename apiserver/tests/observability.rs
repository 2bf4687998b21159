//! Observability of the runtime: request spans and the change feed's metrics.
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apiserver::store::{PgStore, Store};
use support::server::{TestServer, ADMIN_TOKEN, USER_TOKEN};
use support::{mk_session, session_body, StoreExt, TestDb};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The fields of one span as they were recorded.
#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
}

/// Collects the fields of every closed `request` span.
#[derive(Clone, Default)]
struct RequestSpans(Arc<Mutex<Vec<BTreeMap<String, String>>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for RequestSpans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
                values.record(fields);
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        if span.name() != "request" {
            return;
        }
        let fields = span.extensions_mut().remove::<Fields>();
        if let Some(fields) = fields {
            self.0.lock().unwrap().push(fields.0);
        }
    }
}

/// The collecting subscriber, global to this test binary: a scoped default would miss
/// spans whose callsites another test's thread registered first.
fn request_spans() -> &'static RequestSpans {
    static SPANS: std::sync::OnceLock<RequestSpans> = std::sync::OnceLock::new();
    SPANS.get_or_init(|| {
        let spans = RequestSpans::default();
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(spans.clone()))
            .expect("no other global subscriber in this test binary");
        spans
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_runs_in_a_span_naming_what_it_addresses_and_who_asked() {
    let spans = request_spans();
    let server = TestServer::start().await;
    let url = format!(
        "{}/apis/{}/namespaces/observed/accesssessions/nobody-here",
        server.url,
        apis::API_VERSION
    );
    let resp = server
        .http()
        .get(&url)
        .bearer_auth(USER_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    drop(resp);
    let deadline = Instant::now() + Duration::from_secs(5);
    let span = loop {
        let found = spans
            .0
            .lock()
            .unwrap()
            .iter()
            .find(|f| f.get("name").map(String::as_str) == Some("nobody-here"))
            .cloned();
        if let Some(span) = found {
            break span;
        }
        assert!(Instant::now() < deadline, "no request span closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let field = |name: &str| span.get(name).map(String::as_str);
    assert_eq!(field("verb"), Some("get"), "{span:?}");
    assert_eq!(field("resource"), Some("accesssessions"), "{span:?}");
    assert_eq!(field("namespace"), Some("observed"), "{span:?}");
    assert_eq!(field("user"), Some("alice"), "{span:?}");
    assert_eq!(field("code"), Some("404"), "{span:?}");
}

/// The feed's sample lines, as `/metrics` shows them.
fn feed_metrics(store: &PgStore) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    store.change_feed_metrics().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

/// A subscriber that never reads is cut off as a slow consumer and counted; the head follows
/// the writes and the lag drains to zero once the feed has fanned them out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_change_feed_reports_its_head_lag_and_cut_offs() {
    let db = TestDb::new().await;
    let mut config = db.store_config();
    config.watcher_buffer = 2;
    config.ring_capacity = 2;
    let store = PgStore::start(config).await.unwrap();
    let text = feed_metrics(&store);
    assert!(
        text.contains(
            "\nmcp_access_apiserver_change_feed_cutoffs_total{reason=\"slow_consumer\"} 0\n"
        ),
        "{text}"
    );
    let start = store.current_version().await.unwrap();
    let mut stuck = store.subscribe(start).await.unwrap();
    store
        .create_session(mk_session("feed-metrics", "first", "srv"), false)
        .await
        .unwrap();
    // Attached live with its first event; from here on it reads nothing.
    assert_eq!(stuck.next().await.unwrap().name, "first");
    for i in 0..6 {
        store
            .create_session(mk_session("feed-metrics", &format!("s-{i}"), "srv"), false)
            .await
            .unwrap();
    }
    let head = store.current_version().await.unwrap().seq;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = feed_metrics(&store);
        if text.contains(
            "\nmcp_access_apiserver_change_feed_cutoffs_total{reason=\"slow_consumer\"} 1\n",
        ) && text.contains(&format!("\nmcp_access_apiserver_change_feed_head {head}\n"))
            && text.contains("\nmcp_access_apiserver_change_feed_lag_events 0\n")
            && text.contains("\nmcp_access_apiserver_change_feed_subscribers 0\n")
            && text.contains("\nmcp_access_apiserver_change_feed_live 1\n")
        {
            break;
        }
        assert!(Instant::now() < deadline, "head {head}:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads the watch body until a line contains `needle` (within 10 s); returns that line.
async fn read_until(resp: &mut reqwest::Response, buffer: &mut String, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(line) = buffer.lines().find(|l| l.contains(needle)) {
            let line = line.to_string();
            buffer.clear();
            return line;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = tokio::time::timeout(left, resp.chunk())
            .await
            .unwrap_or_else(|_| panic!("no {needle} within 10s: {buffer}"))
            .unwrap()
            .unwrap_or_else(|| panic!("the watch ended before {needle}: {buffer}"));
        buffer.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// A restart of another replica rotates the epoch: the feed ends every watch with 410, and
/// /metrics counts it on both sides (the watch's resource and reason, the feed's cause).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ended_by_the_server_is_counted_as_a_cut_off() {
    let server = TestServer::start().await;
    let sessions = format!(
        "{}/apis/{}/namespaces/cut/accesssessions",
        server.url,
        apis::API_VERSION
    );
    let mut watch = server
        .http()
        .get(format!("{sessions}?watch=true&resourceVersion=0"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    let created = server
        .http()
        .post(&sessions)
        .bearer_auth(ADMIN_TOKEN)
        .json(&session_body("cut", "watched"))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let mut buffer = String::new();
    read_until(&mut watch, &mut buffer, "\"watched\"").await;

    let _restarted = PgStore::start(apiserver::store::StoreConfig {
        rotate_epoch: true,
        ..server.db.store_config()
    })
    .await
    .unwrap();
    let error = read_until(&mut watch, &mut buffer, "\"ERROR\"").await;
    assert!(error.contains("\"code\":410"), "{error}");

    let text = server.metrics_text();
    assert!(
        text.contains(
            "\nmcp_access_apiserver_watch_cutoffs_total{resource=\"accesssessions\",reason=\"Expired\"} 1\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "\nmcp_access_apiserver_change_feed_cutoffs_total{reason=\"epoch_rotated\"} 1\n"
        ),
        "{text}"
    );
}
