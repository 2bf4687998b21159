//! Renderings of objects, lists and watch events: plain JSON, `meta.k8s.io/v1` Table and
//! `PartialObjectMetadata[List]`.

use apis::table::TableRow;
use apis::Kind;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use futures::stream::{self, StreamExt};
use http::{header, HeaderValue, StatusCode};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Map, Value};

use super::error::{ApiError, ApiResult};
use super::request::{IncludeObject, Rendering};
use crate::store::{Event, EventType, RawList, ResourceVersion, StoreError};

const META_V1: &str = "meta.k8s.io/v1";

/// A kind the HTTP layer can render.
pub trait Renderable: Kind + TableRow {}
impl<K: Kind + TableRow> Renderable for K {}

/// The object as JSON with `apiVersion` and `kind` set.
pub fn object_json<K: Kind>(object: &K) -> ApiResult<Value> {
    let mut object = object.clone();
    object.set_type_meta();
    serde_json::to_value(object).map_err(|e| ApiError::internal(e.to_string()))
}

/// `PartialObjectMetadata` of a JSON object.
pub fn partial_metadata(object: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": META_V1,
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

fn table_row<K: Renderable>(
    object: &Value,
    include: IncludeObject,
    now: Timestamp,
) -> ApiResult<Value> {
    let typed: K =
        serde_json::from_value(object.clone()).map_err(|e| ApiError::internal(e.to_string()))?;
    let mut row = Map::new();
    row.insert("cells".into(), Value::Array(typed.cells(now)));
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            row.insert("object".into(), partial_metadata(object));
        }
        IncludeObject::Object => {
            row.insert("object".into(), object.clone());
        }
    }
    Ok(Value::Object(row))
}

fn table_columns<K: Renderable>() -> Value {
    Value::Array(K::COLUMNS.iter().map(|c| c.to_json()).collect())
}

/// A Table of `objects`.
pub fn table<K: Renderable>(
    objects: &[Value],
    include: IncludeObject,
    resource_version: Option<String>,
    continue_token: Option<String>,
    with_columns: bool,
) -> ApiResult<Value> {
    let now = Timestamp::now();
    let rows = objects
        .iter()
        .map(|o| table_row::<K>(o, include, now))
        .collect::<ApiResult<Vec<_>>>()?;
    let mut metadata = Map::new();
    if let Some(rv) = resource_version {
        metadata.insert("resourceVersion".into(), Value::String(rv));
    }
    if let Some(c) = continue_token {
        metadata.insert("continue".into(), Value::String(c));
    }
    let mut table = json!({
        "kind": "Table",
        "apiVersion": META_V1,
        "metadata": metadata,
        "rows": rows,
    });
    if with_columns {
        table["columnDefinitions"] = table_columns::<K>();
    }
    Ok(table)
}

/// One object in the requested rendering.
pub fn render_object<K: Renderable>(object: &K, rendering: Rendering) -> ApiResult<Value> {
    let json = object_json(object)?;
    Ok(match rendering {
        Rendering::Object => json,
        Rendering::Metadata => partial_metadata(&json),
        Rendering::Table(include) => {
            let rv = json
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string);
            table::<K>(&[json], include, rv, None, true)?
        }
    })
}

/// A list in the requested rendering.
pub fn render_list<K: Renderable>(
    items: &[K],
    list_kind: &str,
    resource_version: ResourceVersion,
    continue_token: Option<String>,
    rendering: Rendering,
) -> ApiResult<Value> {
    let items = items
        .iter()
        .map(object_json)
        .collect::<ApiResult<Vec<_>>>()?;
    let mut metadata = Map::new();
    metadata.insert(
        "resourceVersion".into(),
        Value::String(resource_version.to_string()),
    );
    if let Some(c) = &continue_token {
        metadata.insert("continue".into(), Value::String(c.clone()));
    }
    Ok(match rendering {
        Rendering::Object => json!({
            "kind": list_kind,
            "apiVersion": apis::API_VERSION,
            "metadata": metadata,
            "items": items,
        }),
        Rendering::Metadata => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": META_V1,
            "metadata": metadata,
            "items": items.iter().map(partial_metadata).collect::<Vec<_>>(),
        }),
        Rendering::Table(include) => table::<K>(
            &items,
            include,
            Some(resource_version.to_string()),
            continue_token,
            true,
        )?,
    })
}

/// A list of served JSON items as a streamed body: the envelope, then the items as the
/// store yields them. An error after the first byte ends the body abnormally (the
/// connection is reset before the end of the chunked body): a client never sees a list cut
/// short that looks complete.
pub fn streamed_list(list_kind: &str, list: RawList) -> Response {
    let mut metadata = Map::new();
    metadata.insert(
        "resourceVersion".into(),
        Value::String(list.resource_version.to_string()),
    );
    if let Some(c) = list.continue_token {
        metadata.insert("continue".into(), Value::String(c));
    }
    let head = format!(
        "{{\"kind\":{},\"apiVersion\":{},\"metadata\":{},\"items\":[",
        Value::from(list_kind),
        Value::from(apis::API_VERSION),
        Value::Object(metadata)
    );
    let mut first = true;
    let items = list
        .items
        .ready_chunks(STREAMED_ITEMS_PER_FRAME)
        .map(move |batch| {
            let mut frame = BytesMut::new();
            for item in batch {
                let item = item.inspect_err(|e| {
                    tracing::warn!(error = %e, "list ended abnormally after its first bytes");
                })?;
                if !std::mem::take(&mut first) {
                    frame.put_u8(b',');
                }
                frame.extend_from_slice(&item);
            }
            Ok::<_, StoreError>(frame.freeze())
        });
    let body = stream::once(async move { Ok::<_, StoreError>(Bytes::from(head)) })
        .chain(items)
        .chain(stream::once(async {
            Ok::<_, StoreError>(Bytes::from_static(b"]}"))
        }));
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// Items of a streamed list written per body frame, at most (as many as are ready).
const STREAMED_ITEMS_PER_FRAME: usize = 256;

/// Encodes one watch event line (`{"type":…,"object":…}\n`).
pub fn watch_line(event_type: &str, object: &Value) -> Bytes {
    let mut line =
        serde_json::to_vec(&json!({"type": event_type, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// The watch line of a change in the requested rendering. Lines for the event's own type
/// are encoded once and shared by every watcher; a type rewritten by a selector (a
/// MODIFIED that enters or leaves the selection) is encoded for this watcher alone.
pub fn event_line<K: Renderable>(
    event: &Event,
    event_type: EventType,
    rendering: Rendering,
    first: bool,
) -> ApiResult<Bytes> {
    let shared = event_type == event.event_type;
    let encode = || -> ApiResult<Bytes> {
        let object = match rendering {
            Rendering::Object => event.object.clone(),
            Rendering::Metadata => partial_metadata(&event.object),
            Rendering::Table(include) => table::<K>(
                std::slice::from_ref(&event.object),
                include,
                Some(event.rv.to_string()),
                None,
                first,
            )?,
        };
        Ok(watch_line(event_type.as_str(), &object))
    };
    let cell = match rendering {
        Rendering::Object => &event.rendered.json,
        Rendering::Metadata => &event.rendered.metadata,
        Rendering::Table(IncludeObject::Metadata) if !first => &event.rendered.table_row,
        Rendering::Table(_) => return encode(),
    };
    if !shared {
        return encode();
    }
    if let Some(bytes) = cell.get() {
        return Ok(bytes.clone());
    }
    let bytes = encode()?;
    Ok(cell.get_or_init(|| bytes).clone())
}

/// What a BOOKMARK says besides its resourceVersion.
#[derive(Clone, Copy, Debug)]
pub enum BookmarkMark {
    /// The end of the initial events (`sendInitialEvents`), as kube-apiserver marks it.
    InitialEventsEnd,
    /// A periodic bookmark: the change log's head it is measured against and the interval of
    /// bookmarks on this watch (`apis::feed`).
    Progress {
        head: ResourceVersion,
        interval: std::time::Duration,
    },
}

/// A BOOKMARK line at `rv`, marked as `mark` says.
pub fn bookmark_line<K: Renderable>(
    rv: ResourceVersion,
    rendering: Rendering,
    mark: BookmarkMark,
) -> ApiResult<Bytes> {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    match mark {
        BookmarkMark::InitialEventsEnd => {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        BookmarkMark::Progress { head, interval } => {
            metadata["annotations"] = json!({
                apis::feed::HEAD_ANNOTATION: head.to_string(),
                apis::feed::BOOKMARK_INTERVAL_ANNOTATION: interval.as_millis().to_string(),
            });
        }
    }
    let object = match rendering {
        Rendering::Object => {
            json!({"kind": K::KIND, "apiVersion": apis::API_VERSION, "metadata": metadata})
        }
        Rendering::Metadata => {
            json!({"kind": "PartialObjectMetadata", "apiVersion": META_V1, "metadata": metadata})
        }
        Rendering::Table(_) => {
            json!({"kind": "Table", "apiVersion": META_V1, "metadata": metadata, "rows": []})
        }
    };
    Ok(watch_line("BOOKMARK", &object))
}

/// A JSON response with `Warning` headers.
pub fn json_response(code: StatusCode, body: &Value, warnings: &[String]) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut response = (code, [(header::CONTENT_TYPE, "application/json")], bytes).into_response();
    for w in warnings {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            response.headers_mut().append(header::WARNING, v);
        }
    }
    response
}
