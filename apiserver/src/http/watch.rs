//! Watch: newline-delimited JSON events over a chunked 200 response, fed by the change feed.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::StreamExt;
use http::{header, StatusCode};
use rand::Rng;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::error::{ApiError, ApiResult};
use super::render::{bookmark_line, event_line, object_json, table, watch_line, BookmarkMark};
use super::request::{ListOptions, Rendering};
use super::AppState;
use crate::receipts::{Progress, Tracked};
use crate::store::{
    Event, EventType, ListAt, ListQuery, RawItems, ResourceVersion, Store, Subscription,
};
use apis::strategy::Strategy;

/// Lines queued between the watch task and the connection.
const LINE_BUFFER: usize = 256;

/// One piece of a watch's stream: the bytes to write (none for a mere mark), and how far in
/// the change feed the stream is once they are out, for the watch's delivery receipts.
struct Line {
    bytes: Bytes,
    through: Option<ResourceVersion>,
}

impl From<Bytes> for Line {
    fn from(bytes: Bytes) -> Self {
        Self {
            bytes,
            through: None,
        }
    }
}

impl Line {
    fn through(bytes: Bytes, rv: ResourceVersion) -> Self {
        Self {
            bytes,
            through: Some(rv),
        }
    }

    fn mark(rv: ResourceVersion) -> Self {
        Self::through(Bytes::new(), rv)
    }
}

/// Which objects a watch selects.
struct Selection {
    namespace: Option<String>,
    options: ListOptions,
}

impl Selection {
    fn matches(&self, object: &Value) -> bool {
        if let Some(ns) = &self.namespace {
            if object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("")
                != ns
            {
                return false;
            }
        }
        let labels = object
            .pointer("/metadata/labels")
            .and_then(|l| serde_json::from_value(l.clone()).ok());
        self.options.labels.matches(labels.as_ref()) && self.options.fields.matches(object)
    }

    /// The event this watcher sees for a change, if any: a MODIFIED that enters the
    /// selection is ADDED, one that leaves it is DELETED (carrying the last matching state).
    fn view(&self, event: &Event) -> Option<(EventType, Option<Value>)> {
        match event.event_type {
            EventType::Added | EventType::Deleted => self
                .matches(&event.object)
                .then_some((event.event_type, None)),
            EventType::Modified => {
                let now = self.matches(&event.object);
                let before = event.before.as_ref().is_some_and(|b| self.matches(b));
                match (before, now) {
                    (true, true) => Some((EventType::Modified, None)),
                    (false, true) => Some((EventType::Added, None)),
                    (true, false) => {
                        let mut last = event.before.clone().unwrap_or_default();
                        if let Some(meta) = last.get_mut("metadata").and_then(Value::as_object_mut)
                        {
                            meta.insert(
                                "resourceVersion".into(),
                                Value::String(event.rv.to_string()),
                            );
                        }
                        Some((EventType::Deleted, Some(last)))
                    }
                    (false, false) => None,
                }
            }
        }
    }
}

/// The ADDED line of a served JSON object.
fn added_line(object: &[u8]) -> Bytes {
    const START: &[u8] = br#"{"type":"ADDED","object":"#;
    let mut line = Vec::with_capacity(START.len() + object.len() + 2);
    line.extend_from_slice(START);
    line.extend_from_slice(object);
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

fn error_line(err: &ApiError) -> Bytes {
    watch_line("ERROR", &err.to_status())
}

/// Whether the caller of an open watch may still see it, asked every `every`; the watch ends
/// at the first no (the gateway sync listener re-verifies the gateway's owner chain).
pub struct WatchGuard {
    pub every: Duration,
    pub still_allowed: Box<dyn FnMut() -> BoxFuture<'static, bool> + Send>,
}

/// Starts a watch. Errors before the stream starts are returned as HTTP errors; an expired
/// resourceVersion is a 200 with one ERROR event, as clients expect. `tracked`, when set, is
/// the watch's entry in the delivery ledger: its stream reports there how far it has been
/// handed out.
pub async fn watch<K: Strategy, S: Store + Clone>(
    app: &AppState<S>,
    namespace: Option<String>,
    options: ListOptions,
    rendering: Rendering,
    slot: super::WatchSlot,
    guard: Option<WatchGuard>,
    tracked: Option<Tracked>,
) -> ApiResult<Response> {
    let selection = Selection { namespace, options };
    let (tx, rx) = mpsc::channel::<Line>(LINE_BUFFER);
    let progress = tracked.as_ref().map(Tracked::progress);
    let initial = selection.options.send_initial_events
        || matches!(
            selection.options.resource_version.as_deref(),
            None | Some("0")
        );

    // Resolve the starting point before answering, so early failures are plain errors.
    let mut lines: Vec<Bytes> = Vec::new();
    let mut raw_initial: Option<RawItems> = None;
    let mut first = true;
    let start: Result<(Subscription, Option<ResourceVersion>), ApiError> = async {
        if initial {
            let query = ListQuery {
                namespace: selection.namespace.clone(),
                labels: selection.options.labels.clone(),
                fields: selection.options.fields.clone(),
                limit: None,
                at: ListAt::Latest,
            };
            let store_err = |e| ApiError::from_store(e, &K::INFO, "");
            // Plain JSON: the stored bytes, streamed by the watch task.
            if rendering == Rendering::Object {
                let list = app.store.list_raw::<K>(&query).await.map_err(store_err)?;
                raw_initial = Some(list.items);
                let end = selection.options.send_initial_events.then_some(list.resource_version);
                let sub = app.store.subscribe(list.resource_version).await.map_err(store_err)?;
                return Ok((sub, end));
            }
            let list = app.store.list::<K>(&query).await.map_err(store_err)?;
            for item in &list.items {
                let object = object_json(item)?;
                let rendered = match rendering {
                    Rendering::Object => object,
                    Rendering::Metadata => super::render::partial_metadata(&object),
                    Rendering::Table(include) => {
                        let rv = object.pointer("/metadata/resourceVersion").and_then(Value::as_str).map(str::to_string);
                        table::<K>(std::slice::from_ref(&object), include, rv, None, first)?
                    }
                };
                first = false;
                lines.push(watch_line("ADDED", &rendered));
            }
            let end = selection.options.send_initial_events.then_some(list.resource_version);
            let sub = app.store.subscribe(list.resource_version).await.map_err(|e| ApiError::from_store(e, &K::INFO, ""))?;
            Ok((sub, end))
        } else {
            let raw = selection.options.resource_version.as_deref().unwrap_or_default();
            let rv = ResourceVersion::parse(raw)
                .map_err(|_| ApiError::expired(format!("too old resource version: {raw} (it is not a resourceVersion this server issued)")))?;
            let sub = app.store.subscribe(rv).await.map_err(|e| ApiError::from_store(e, &K::INFO, ""))?;
            Ok((sub, None))
        }
    }
    .await;

    let (subscription, initial_end) = match start {
        Ok(s) => s,
        Err(e) if e.code == StatusCode::GONE => {
            // Expired: 200 with one ERROR event, then the end of the stream.
            let _ = tx.try_send(error_line(&e).into());
            drop(tx);
            return Ok(stream_response(rx, None));
        }
        Err(e) => return Err(e),
    };
    if let Some(rv) = initial_end {
        lines.push(bookmark_line::<K>(
            rv,
            rendering,
            BookmarkMark::InitialEventsEnd,
        )?);
    }

    // `timeoutSeconds=0` means "not set", as in kube-apiserver (kube-rs sends it for
    // `watcher::Config::timeout(0)`): closing such a watch at once would make clients spin.
    let timeout = selection
        .options
        .timeout
        .filter(|t| !t.is_zero())
        .unwrap_or_else(|| {
            // kube-apiserver's default: a random duration between one and two minRequestTimeouts.
            Duration::from_secs(rand::rng().random_range(1800..3600))
        });
    let task = WatchTask {
        selection,
        rendering,
        subscription,
        tx,
        first,
        bookmark_interval: app.config.bookmark_interval,
        shutdown: app.shutdown.clone(),
        metrics: app.metrics.clone(),
        deadline: tokio::time::Instant::now() + timeout,
        guard,
        progress: progress.clone(),
        _tracked: tracked,
        _slot: slot,
    };
    // The watch outlives the request's handler but stays in its span.
    tokio::spawn(tracing::Instrument::in_current_span(
        task.run::<K>(raw_initial, lines),
    ));
    Ok(stream_response(rx, progress))
}

/// Most lines written as one chunk: a burst of events (one revocation of many sessions) goes
/// out in a few writes instead of one per event, and the client reads it in a few reads.
const LINES_PER_CHUNK: usize = 256;

/// The response streaming the queued lines. Each chunk handed to the connection advances
/// `progress` (the watch's delivery receipts) to the furthest resourceVersion in it.
fn stream_response(rx: mpsc::Receiver<Line>, progress: Option<Arc<Progress>>) -> Response {
    let stream = ReceiverStream::new(rx)
        .ready_chunks(LINES_PER_CHUNK)
        .filter_map(move |lines| {
            let through = lines.iter().filter_map(|l| l.through).max();
            let bytes = match <[Line; 1]>::try_from(lines) {
                Ok([one]) => one.bytes,
                Err(lines) => {
                    let mut all = Vec::with_capacity(lines.iter().map(|l| l.bytes.len()).sum());
                    for line in &lines {
                        all.extend_from_slice(&line.bytes);
                    }
                    Bytes::from(all)
                }
            };
            if let (Some(progress), Some(through)) = (&progress, through) {
                progress.advance(through);
            }
            // A chunk of marks only has nothing to write.
            std::future::ready(
                (!bytes.is_empty()).then_some(Ok::<_, std::convert::Infallible>(bytes)),
            )
        });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

struct WatchTask {
    selection: Selection,
    rendering: Rendering,
    subscription: Subscription,
    tx: mpsc::Sender<Line>,
    first: bool,
    bookmark_interval: Duration,
    shutdown: tokio::sync::watch::Receiver<bool>,
    metrics: Arc<super::HttpMetrics>,
    /// When the watch ends (`timeoutSeconds`).
    deadline: tokio::time::Instant,
    guard: Option<WatchGuard>,
    /// How far the stream has been handed out, for delivery receipts (gateway watches).
    progress: Option<Arc<Progress>>,
    /// This watch's entry in the delivery ledger, removed when the task ends.
    _tracked: Option<Tracked>,
    /// This watch's place in its user's quota, freed when the task ends.
    _slot: super::WatchSlot,
}

impl WatchTask {
    /// Queues one line for the connection. A client that stops reading fills the queue;
    /// the send then waits, but never past the watch's deadline or the server's shutdown.
    /// Returns false when the watch must end.
    async fn send(&mut self, line: impl Into<Line>) -> bool {
        let line = line.into();
        if *self.shutdown.borrow() {
            return false;
        }
        // Room in the queue (the usual case): no timer armed per line. A fan-out to
        // thousands of watches would otherwise register and cancel thousands of timers per
        // event.
        let line = match self.tx.try_send(line) {
            Ok(()) => return true,
            Err(mpsc::error::TrySendError::Closed(_)) => return false,
            Err(mpsc::error::TrySendError::Full(line)) => line,
        };
        tokio::select! {
            sent = self.tx.send(line) => sent.is_ok(),
            _ = tokio::time::sleep_until(self.deadline) => false,
            _ = self.shutdown.changed() => false,
        }
    }

    /// The feed moved past `rv` with nothing for this watch. With nothing of its own queued,
    /// everything up to `rv` is out: the receipts advance at once, with no wake-up of the
    /// connection; otherwise a mark follows the queued lines (or, when the queue is full,
    /// the next line or bookmark carries the position).
    fn skipped(&self, rv: ResourceVersion) {
        let Some(progress) = &self.progress else {
            return;
        };
        if self.tx.capacity() == self.tx.max_capacity() {
            progress.advance(rv);
        } else {
            let _ = self.tx.try_send(Line::mark(rv));
        }
    }

    /// Ends the watch with an error event, counted as a cut-off.
    async fn cut_off<K: Strategy>(&mut self, e: ApiError) {
        let reason = e.reason;
        self.metrics.watch_cut_off(K::PLURAL, reason);
        tracing::debug!(reason, "watch cut off");
        self.send(error_line(&e)).await;
    }

    /// Sends the initial events (`raw`: served JSON items still to read, each an ADDED;
    /// then `initial`: lines ready to send), then follows the feed.
    async fn run<K: Strategy>(mut self, raw: Option<RawItems>, initial: Vec<Bytes>) {
        let _gauge = self.metrics.watch_started(K::PLURAL);
        if let Some(mut items) = raw {
            while let Some(item) = items.next().await {
                match item {
                    Ok(object) => {
                        if !self.send(added_line(&object)).await {
                            return;
                        }
                    }
                    Err(e) => {
                        self.cut_off::<K>(ApiError::from_store(e, &K::INFO, ""))
                            .await;
                        return;
                    }
                }
            }
        }
        for line in initial {
            if !self.send(line).await {
                return;
            }
        }
        // The client now holds everything up to where the feed starts.
        if self.progress.is_some() && !self.send(Line::mark(self.subscription.cursor())).await {
            return;
        }
        let deadline = tokio::time::sleep_until(self.deadline);
        tokio::pin!(deadline);
        let mut bookmarks = tokio::time::interval(self.bookmark_interval);
        bookmarks.tick().await;
        let mut checks = tokio::time::interval(
            self.guard
                .as_ref()
                .map_or(Duration::from_secs(3600), |g| g.every),
        );
        checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        checks.tick().await;
        // The guard's check runs beside the stream, not in its way: a TokenReview that hangs
        // or retries must not hold back the events (revocations among them) meanwhile.
        let mut check: Option<BoxFuture<'static, bool>> = None;
        loop {
            tokio::select! {
                event = self.subscription.next() => match event {
                    Ok(event) => {
                        if event.resource != K::PLURAL {
                            self.skipped(event.rv);
                            continue;
                        }
                        let Some((event_type, replaced)) = self.selection.view(&event) else {
                            self.skipped(event.rv);
                            continue;
                        };
                        let line = match replaced {
                            Some(object) => {
                                let owned = Event { object, event_type, ..(*event).clone() };
                                event_line::<K>(&owned, event_type, self.rendering, self.first)
                            }
                            None => event_line::<K>(&event, event_type, self.rendering, self.first),
                        };
                        self.first = false;
                        match line {
                            Ok(line) => if !self.send(Line::through(line, event.rv)).await { return },
                            Err(e) => {
                                self.cut_off::<K>(e).await;
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        self.cut_off::<K>(ApiError::from_store(e, &K::INFO, "")).await;
                        return;
                    }
                },
                _ = bookmarks.tick(), if self.selection.options.allow_bookmarks => {
                    // Sent every interval, changed or not: it tells the client the stream is
                    // alive and how far behind the head it is. A feed that cannot vouch for
                    // being current sends none (the silence is the signal; nobody is cut off,
                    // and the watch goes on where it stopped once the feed recovers).
                    let Some(mark) = self.subscription.bookmark() else { continue };
                    let progress = BookmarkMark::Progress {
                        head: mark.head,
                        interval: self.bookmark_interval,
                    };
                    match bookmark_line::<K>(mark.at, self.rendering, progress) {
                        Ok(line) => if !self.send(Line::through(line, mark.at)).await { return },
                        Err(_) => return,
                    }
                }
                _ = checks.tick(), if self.guard.is_some() && check.is_none() => {
                    if let Some(guard) = self.guard.as_mut() {
                        check = Some((guard.still_allowed)());
                    }
                }
                allowed = async {
                    match check.as_mut() {
                        Some(check) => check.await,
                        None => std::future::pending().await,
                    }
                }, if check.is_some() => {
                    check = None;
                    if !allowed {
                        // Ended without an event, as when kube-apiserver closes a watch: the
                        // client's next request meets the refusal (401).
                        self.metrics.watch_cut_off(K::PLURAL, "Unauthorized");
                        tracing::info!("watch ended: the caller is no longer allowed");
                        return;
                    }
                }
                _ = &mut deadline => return,
                _ = self.tx.closed() => return,
                _ = self.shutdown.changed() => return,
            }
        }
    }
}
