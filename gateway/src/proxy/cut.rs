//! Revocation cuts: every admitted response body is wrapped so that it ends when its session
//! stops being usable (`SessionCache::subscribe` resolves). An SSE body closes with a JSON-RPC
//! error event naming the reason (see [`super::sse`]); any other body just ends. The
//! subscription runs in a task of its own, so a cut happens even while nobody polls the body;
//! if the body has not ended a short grace later (the client does not read, so the closing
//! bytes cannot be written), the connection itself is aborted: a client that never reads
//! cannot hold a revoked stream open.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use serde_json::Value;
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::legacy::{EndpointScan, Owed};
use super::mcp::filter_tools_list;
use super::metrics::ProxyMetrics;
use super::sse::{rewrite_events, SseFramer};
use super::tools::Lister;
use crate::credential::Reason;

/// Filtering of `tools/list` answers to the tools a session may call.
pub struct ToolsFilter {
    /// The ids of the `tools/list` requests the response answers (none for a GET stream: a
    /// legacy stream learns them from the POSTs of its transport session).
    ids: Vec<Value>,
    /// The session's `spec.tools` and the server's policies, indexed once for the whole
    /// response.
    lister: Lister,
}

impl ToolsFilter {
    /// Filters the answers to `ids` (requests of this response) to what `lister` allows.
    pub fn new(ids: Vec<Value>, lister: Lister) -> Self {
        Self { ids, lister }
    }

    /// Whole SSE events filtered; `owed`, on a legacy stream, adds the ids of the `tools/list`
    /// requests posted on its transport session.
    fn events(&self, events: Bytes, owed: Option<&Owed>) -> Bytes {
        let listed = owed.map(Owed::list_ids).unwrap_or_default();
        if self.ids.is_empty() && listed.is_empty() {
            return events;
        }
        let ids = if listed.is_empty() {
            &self.ids
        } else {
            &[self.ids.as_slice(), &listed].concat()
        };
        rewrite_events(&events, &mut |m| {
            filter_tools_list(m, ids, &|t, tool| self.lister.allows(t, tool))
        })
    }

    /// A whole JSON body filtered (one that is not JSON passes as it is).
    fn json(&self, body: Bytes) -> Bytes {
        let Ok(mut message) = serde_json::from_slice::<Value>(&body) else {
            return body;
        };
        if filter_tools_list(&mut message, &self.ids, &|t, tool| {
            self.lister.allows(t, tool)
        }) {
            Bytes::from(message.to_string())
        } else {
            body
        }
    }
}

/// What a legacy `endpoint` event is reported to.
pub type OnEndpoint = Arc<dyn Fn(&str) -> Arc<Owed> + Send + Sync>;

/// Boxed errors of response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a cut body may take to be written before the connection is aborted.
pub const CUT_GRACE: Duration = Duration::from_millis(500);

/// What a stream's end is reported to.
#[derive(Clone)]
pub struct CutContext {
    pub metrics: ProxyMetrics,
    /// Notified to abort the connection the body is written to.
    pub abort_connection: Arc<Notify>,
    /// Called once with the reason when the session stops being usable.
    pub on_cut: Arc<dyn Fn(Reason) + Send + Sync>,
    /// For a GET SSE stream: called with the transport session its legacy HTTP+SSE
    /// `endpoint` event announces (see [`super::legacy`]); returns what the stream owes.
    pub on_endpoint: Option<OnEndpoint>,
}

struct Shared {
    /// The stream ended (either way); the first to set it observes the cut metric.
    ended: AtomicBool,
}

/// A response body that ends when its session stops being usable.
pub struct CutBody {
    inner: Incoming,
    framer: Option<SseFramer>,
    /// Reading a GET stream's first events for a legacy `endpoint` event.
    endpoint: Option<(EndpointScan, OnEndpoint)>,
    /// The answers a legacy stream owes, once its endpoint event was seen.
    owed: Option<Arc<Owed>>,
    ids: Vec<Value>,
    /// Filters `tools/list` answers (a JSON body is held whole, up to `max_held` bytes).
    tools: Option<ToolsFilter>,
    held: Option<bytes::BytesMut>,
    max_held: usize,
    cut: oneshot::Receiver<(Reason, Instant)>,
    /// Set once the cut was seen: the closing bytes (if any) still to send.
    closing: Option<Bytes>,
    cut_at: Option<Instant>,
    done: bool,
    shared: Arc<Shared>,
    watcher: JoinHandle<()>,
    metrics: ProxyMetrics,
}

impl CutBody {
    /// Wraps `inner`. `sse` when the response is `text/event-stream`; `ids` are the JSON-RPC
    /// request ids the stream owes answers to; `until` resolves with the reason the session
    /// stopped being usable; `tools` filters the answers to `tools/list` requests.
    pub fn new(
        inner: Incoming,
        sse: bool,
        max_event_bytes: usize,
        ids: Vec<Value>,
        tools: Option<ToolsFilter>,
        until: impl std::future::Future<Output = Reason> + Send + 'static,
        ctx: CutContext,
    ) -> Self {
        let (tx, rx) = oneshot::channel();
        let shared = Arc::new(Shared {
            ended: AtomicBool::new(false),
        });
        let watcher_shared = shared.clone();
        let metrics = ctx.metrics.clone();
        let endpoint = ctx
            .on_endpoint
            .clone()
            .filter(|_| sse)
            .map(|f| (EndpointScan::default(), f));
        let watcher = tokio::spawn(async move {
            let reason = until.await;
            let at = Instant::now();
            (ctx.on_cut)(reason);
            let _ = tx.send((reason, at));
            tokio::time::sleep(CUT_GRACE).await;
            if !watcher_shared.ended.swap(true, Ordering::AcqRel) {
                tracing::info!(
                    reason = reason.as_str(),
                    "a cut stream was not read; aborting its connection"
                );
                ctx.metrics.stream_cut.observe(at.elapsed().as_secs_f64());
                ctx.metrics.open_streams.dec();
                ctx.abort_connection.notify_one();
            }
        });
        metrics.open_streams.inc();
        Self {
            inner,
            framer: sse.then(|| SseFramer::new(max_event_bytes)),
            endpoint,
            owed: None,
            ids,
            held: tools
                .as_ref()
                .filter(|_| !sse)
                .map(|_| bytes::BytesMut::new()),
            tools,
            max_held: max_event_bytes,
            cut: rx,
            closing: None,
            cut_at: None,
            done: false,
            shared,
            watcher,
            metrics,
        }
    }

    /// The stream is over: stop watching, count it once.
    fn end(&mut self) {
        self.done = true;
        self.watcher.abort();
        if !self.shared.ended.swap(true, Ordering::AcqRel) {
            if let Some(at) = self.cut_at {
                self.metrics.stream_cut.observe(at.elapsed().as_secs_f64());
            }
            self.metrics.open_streams.dec();
        }
    }
}

impl Drop for CutBody {
    fn drop(&mut self) {
        if !self.done {
            self.end();
        }
    }
}

impl Body for CutBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if this.cut_at.is_none() {
            if let Poll::Ready(Ok((reason, at))) = Pin::new(&mut this.cut).poll(cx) {
                this.cut_at = Some(at);
                if let Some(owed) = &this.owed {
                    this.ids.extend(owed.take());
                }
                this.closing = Some(match this.framer.as_mut() {
                    Some(f) => f.cut(reason.as_str(), &this.ids),
                    None => Bytes::new(),
                });
            }
        }
        if this.cut_at.is_some() {
            let closing = this.closing.take().filter(|b| !b.is_empty());
            return match closing {
                Some(bytes) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
                None => {
                    let sse = this.framer.is_some();
                    this.end();
                    if sse {
                        Poll::Ready(None)
                    } else {
                        // A JSON body cut short must not read as complete.
                        Poll::Ready(Some(Err("the session stopped being usable".into())))
                    }
                }
            };
        }
        // A legacy stream passes what the gateway answered itself between two events.
        if let Some(injected) = this.owed.as_ref().and_then(|o| o.take_injected(cx.waker())) {
            return Poll::Ready(Some(Ok(Frame::data(injected))));
        }
        loop {
            return match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(None) if this.held.is_some() => {
                    // The whole JSON answer, filtered; the next poll ends the body.
                    let body = this.held.take().unwrap_or_default().freeze();
                    let body = match &this.tools {
                        Some(tools) => tools.json(body),
                        None => body,
                    };
                    Poll::Ready(Some(Ok(Frame::data(body))))
                }
                Poll::Ready(None) => match this.framer.as_mut().map(SseFramer::finish) {
                    Some(rest) if !rest.is_empty() => {
                        let rest = match &this.tools {
                            Some(tools) => tools.events(rest, this.owed.as_deref()),
                            None => rest,
                        };
                        Poll::Ready(Some(Ok(Frame::data(rest))))
                    }
                    _ => {
                        this.end();
                        Poll::Ready(None)
                    }
                },
                Poll::Ready(Some(Err(e))) => {
                    this.end();
                    Poll::Ready(Some(Err(Box::new(e))))
                }
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => match this.framer.as_mut() {
                        None => match this.held.as_mut() {
                            None => Poll::Ready(Some(Ok(Frame::data(data)))),
                            Some(held) if held.len() + data.len() > this.max_held => {
                                // Too large to filter: fail closed, never pass it unfiltered.
                                this.end();
                                Poll::Ready(Some(Err(
                                    "a tools/list answer too large to filter".into()
                                )))
                            }
                            Some(held) => {
                                held.extend_from_slice(&data);
                                continue;
                            }
                        },
                        Some(f) => {
                            let ready = f.push(&data);
                            if ready.is_empty() {
                                continue;
                            }
                            let ready = match &this.tools {
                                Some(tools) => tools.events(ready, this.owed.as_deref()),
                                None => ready,
                            };
                            if let Some(owed) = &this.owed {
                                owed.passed(&ready);
                            } else if let Some((scan, on_endpoint)) = this.endpoint.as_mut() {
                                if let Some(id) = scan.feed(&ready) {
                                    this.owed = Some(on_endpoint(&id));
                                }
                            }
                            Poll::Ready(Some(Ok(Frame::data(ready))))
                        }
                    },
                    Err(frame) => Poll::Ready(Some(Ok(frame))),
                },
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        // A cut or an SSE reframe changes the length: never promise one.
        SizeHint::default()
    }
}
