//! The object a write asks for: decoded as `fieldValidation` says, its identity checked
//! against the path, its size bounded, its `managedFields` recorded; and the answer to it.

use apis::managed_fields;
use apis::strategy::Strategy;
use apis::Kind;
use axum::response::Response;
use http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::http::error::{ApiError, ApiResult};
use crate::http::patch;
use crate::http::render::{json_response, object_json, render_object};
use crate::http::request::{FieldValidation, Rendering};
use crate::http::MAX_OBJECT_BYTES;
use crate::store;

/// Decodes a request body into `K`, reporting unknown fields as `fieldValidation` asks.
pub fn decode_object<K: Kind + DeserializeOwned>(
    body: &[u8],
    validation: FieldValidation,
    warnings: &mut Vec<String>,
) -> ApiResult<K> {
    let cannot_handle = |e: &dyn std::fmt::Display| {
        ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: {e}",
            K::KIND,
            apis::VERSION,
            K::KIND
        ))
    };
    let mut unknown = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(body);
    let direct: Result<K, serde_json::Error> =
        serde_ignored::deserialize(&mut de, |path| unknown.push(path.to_string()))
            .and_then(|o| de.end().map(|()| o));
    let object = match direct {
        Ok(object) => object,
        // A field given twice: Kubernetes keeps the last value, and says so unless told
        // to ignore it (Strict refuses the request).
        Err(e) if e.to_string().starts_with("duplicate field") => {
            let message = e
                .to_string()
                .split(" at line")
                .next()
                .unwrap_or_default()
                .to_string();
            match validation {
                FieldValidation::Strict => {
                    return Err(ApiError::bad_request(format!(
                        "strict decoding error: {message}"
                    )))
                }
                FieldValidation::Warn => warnings.push(message),
                FieldValidation::Ignore => {}
            }
            // serde_json's Value keeps the last of duplicate keys.
            let value: Value = serde_json::from_slice(body).map_err(|e| cannot_handle(&e))?;
            unknown.clear();
            serde_ignored::deserialize(value, |path| unknown.push(path.to_string()))
                .map_err(|e| cannot_handle(&e))?
        }
        Err(e) => return Err(cannot_handle(&e)),
    };
    let unknown: Vec<String> = unknown
        .iter()
        .map(|p| format!("unknown field {p:?}"))
        .collect();
    match validation {
        FieldValidation::Strict if !unknown.is_empty() => Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            unknown.join(", ")
        ))),
        FieldValidation::Warn => {
            warnings.extend(unknown);
            Ok(object)
        }
        _ => Ok(object),
    }
}

/// Checks the body's `apiVersion`/`kind` (when given) and the namespace and name it names
/// against the request path, filling them in when absent.
pub(super) fn reconcile_identity<K: Strategy>(
    object: &mut K,
    value_kind: (&str, &str),
    namespace: Option<&str>,
    name: Option<&str>,
) -> ApiResult<()> {
    let (api_version, kind) = value_kind;
    if !api_version.is_empty() && api_version != apis::API_VERSION {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            apis::API_VERSION
        )));
    }
    if !kind.is_empty() && kind != K::KIND {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            K::KIND
        )));
    }
    let meta = object.meta_mut();
    if K::INFO.namespaced {
        let ns = namespace.unwrap_or_default();
        match meta.namespace.as_deref() {
            None | Some("") => meta.namespace = Some(ns.to_string()),
            Some(given) if given != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            _ => {}
        }
    } else {
        meta.namespace = None;
    }
    if let Some(name) = name {
        match meta.name.as_deref() {
            None | Some("") => meta.name = Some(name.to_string()),
            Some(given) if given != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({given}) does not match the name on the URL ({name})"
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

pub(super) fn type_meta(object: &impl Kind) -> (String, String) {
    let v = serde_json::to_value(object).unwrap_or_default();
    (
        v.get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        v.get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
    )
}

/// The object a create, update or patch asks for: decoded as `fieldValidation` says, its
/// identity checked against the path (`namespace`, `name`), its size bounded.
pub(super) fn requested_object<K: Strategy>(
    body: &[u8],
    validation: FieldValidation,
    (namespace, name): (Option<&str>, Option<&str>),
    warnings: &mut Vec<String>,
) -> ApiResult<K> {
    let mut object: K = decode_object(body, validation, warnings)?;
    let tm = type_meta(&object);
    reconcile_identity(&mut object, (&tm.0, &tm.1), namespace, name)?;
    check_object_size(&object)?;
    Ok(object)
}

/// [`requested_object`] of a document the server composed (a patched or applied object).
pub(super) fn requested_document<K: Strategy>(
    doc: &Value,
    validation: FieldValidation,
    identity: (Option<&str>, Option<&str>),
    warnings: &mut Vec<String>,
) -> ApiResult<K> {
    let bytes = serde_json::to_vec(doc).map_err(|e| ApiError::internal(e.to_string()))?;
    requested_object(&bytes, validation, identity, warnings)
}

/// The answer to a write: the object as written, with the request's and the write's warnings.
pub(super) fn written_response<K: Strategy>(
    code: StatusCode,
    written: store::Written<K>,
    rendering: Rendering,
    mut warnings: Vec<String>,
) -> ApiResult<Response> {
    warnings.extend(written.warnings);
    Ok(json_response(
        code,
        &render_object(&written.object, rendering)?,
        &warnings,
    ))
}

/// Refuses an object whose encoding exceeds [`MAX_OBJECT_BYTES`]: every stored object is
/// kept in memory by the change feed and sent to every watcher, so its size bounds memory.
pub(super) fn check_object_size<T: serde::Serialize + ?Sized>(object: &T) -> ApiResult<()> {
    let size = patch::encoded_len(object);
    if size > MAX_OBJECT_BYTES {
        return Err(ApiError::object_too_large(size, MAX_OBJECT_BYTES));
    }
    Ok(())
}

/// Records in `object`'s `managedFields` that `manager` set every field it changes from
/// `live` (a create when None): the request's own entries when it sends some, else the
/// stored ones, updated.
pub(super) fn record_update<K: Strategy>(
    object: &mut K,
    live: Option<&K>,
    manager: &str,
) -> ApiResult<()> {
    let base = managed_fields::requested_or_stored(
        object.meta().managed_fields.as_deref(),
        live.and_then(|l| l.meta().managed_fields.as_deref()),
    );
    let live = live.map(object_json).transpose()?;
    let managers = managed_fields::track_update(
        live.as_ref(),
        &object_json(&*object)?,
        base,
        manager,
        store::now(),
    );
    object.meta_mut().managed_fields = managed_fields::encode(&managers);
    // The request's own entries count towards the object's size like any field.
    check_object_size(&*object)
}
