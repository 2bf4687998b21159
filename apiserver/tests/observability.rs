//! Observability of the runtime: every request runs in a span naming what it addresses and who asked.
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::server::{TestServer, USER_TOKEN};
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

/// The server, the client and the spans all run on this test's one thread, where the
/// collecting subscriber is the default.
#[tokio::test(flavor = "current_thread")]
async fn every_request_runs_in_a_span_naming_what_it_addresses_and_who_asked() {
    let spans = RequestSpans::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
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
