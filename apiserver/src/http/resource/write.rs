//! The writes: create, update, patch (a server-side apply is handed to `apply.rs`),
//! delete, deletecollection and writes through the `status` subresource.

use apis::strategy::Strategy;
use axum::response::Response;
use http::StatusCode;
use serde_json::Value;

use super::object::{
    check_object_size, decode_object, record_update, requested_document, requested_object,
    written_response,
};
use super::request::{apply_force, context, field_manager, store_err, ResourceRequest};
use crate::http::error::{ApiError, ApiResult};
use crate::http::patch::{self, PatchType, PATCH_TYPES};
use crate::http::render::{json_response, object_json, render_list, render_object};
use crate::http::request::ListOptions;
use crate::http::route::Verb;
use crate::store::{ListAt, ListQuery, Preconditions, Store, StoreError, Withdrawal};

pub async fn create<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    req.require_json_body()?;
    let rendering = req.rendering()?;
    let dry_run = req.params.dry_run()?;
    let manager = field_manager::<K>(&req, false)?;
    let mut warnings = Vec::new();
    let mut object: K = requested_object(
        &req.body,
        req.params.field_validation()?,
        (req.namespace(), None),
        &mut warnings,
    )?;
    record_update(&mut object, None, &manager)?;
    let name = object.meta().name.clone().unwrap_or_default();
    let written = store
        .create(object, &context(&req), dry_run)
        .await
        .map_err(store_err::<K>(&name))?;
    written_response(StatusCode::CREATED, written, rendering, warnings)
}

pub async fn update<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    req.require_json_body()?;
    let rendering = req.rendering()?;
    let dry_run = req.params.dry_run()?;
    let manager = field_manager::<K>(&req, false)?;
    let ns = req.namespace().unwrap_or_default();
    let name = req.name().unwrap_or_default();
    let mut warnings = Vec::new();
    let requested: K = requested_object(
        &req.body,
        req.params.field_validation()?,
        (req.namespace(), Some(name)),
        &mut warnings,
    )?;
    // The fields it changes are recorded against the stored object; an update without a
    // resourceVersion is made against the one read, and read again if it moved meanwhile.
    let pinned = requested
        .meta()
        .resource_version
        .as_deref()
        .is_some_and(|rv| !rv.is_empty());
    let mut attempts = 0;
    loop {
        attempts += 1;
        let current: K = store.get(ns, name).await.map_err(store_err::<K>(name))?;
        let mut object = requested.clone();
        if !pinned {
            object.meta_mut().resource_version = current.meta().resource_version.clone();
        }
        record_update(&mut object, Some(&current), &manager)?;
        match store.update(object, &context(&req), dry_run).await {
            Ok(written) => {
                return written_response(StatusCode::OK, written, rendering, warnings);
            }
            Err(StoreError::Modified) if !pinned && attempts < 5 => continue,
            Err(e) => return Err(ApiError::from_store(e, &K::INFO, name)),
        }
    }
}

pub async fn patch<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    let content_type = req.content_type().to_string();
    let Some(patch_type) = PatchType::from_content_type(&content_type) else {
        return Err(ApiError::unsupported_media_type(&content_type, PATCH_TYPES));
    };
    if patch_type == PatchType::Apply {
        return super::apply::server_side_apply::<K, S>(store, req).await;
    }
    apply_force::<K>(&req, false)?;
    let manager = field_manager::<K>(&req, false)?;
    let rendering = req.rendering()?;
    let dry_run = req.params.dry_run()?;
    let validation = req.params.field_validation()?;
    let ns = req.namespace().unwrap_or_default();
    let name = req.name().unwrap_or_default();
    // Like kube-apiserver: a patch that does not pin a resourceVersion is applied to the
    // latest state and retried on a conflicting concurrent write.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let current: K = store.get(ns, name).await.map_err(store_err::<K>(name))?;
        let mut doc = object_json(&current)?;
        let current_rv = doc.pointer("/metadata/resourceVersion").cloned();
        patch::apply(&mut doc, patch_type, &req.body)
            .map_err(|e| ApiError::from_patch(e, &K::INFO, name))?;
        let pinned = doc.pointer("/metadata/resourceVersion").cloned() != current_rv;
        let mut warnings = Vec::new();
        let mut object: K = requested_document(
            &doc,
            validation,
            (req.namespace(), Some(name)),
            &mut warnings,
        )?;
        record_update(&mut object, Some(&current), &manager)?;
        match store.update(object, &context(&req), dry_run).await {
            Ok(written) => {
                return written_response(StatusCode::OK, written, rendering, warnings);
            }
            Err(StoreError::Modified | StoreError::UidPrecondition { .. })
                if !pinned && attempts < 5 =>
            {
                continue
            }
            Err(e) => return Err(ApiError::from_store(e, &K::INFO, name)),
        }
    }
}

/// `DeleteOptions` as far as this server honours them.
#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeleteOptions {
    #[serde(default)]
    preconditions: Option<DeletePreconditions>,
    #[serde(default)]
    dry_run: Vec<String>,
    #[serde(default)]
    propagation_policy: Option<String>,
}

#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeletePreconditions {
    uid: Option<String>,
    resource_version: Option<String>,
}

fn delete_options(req: &ResourceRequest<'_>) -> ApiResult<(Preconditions, bool)> {
    let options: DeleteOptions = if req.body.iter().all(u8::is_ascii_whitespace) {
        DeleteOptions::default()
    } else {
        serde_json::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    if let Some(p) = options.propagation_policy.as_deref() {
        if !matches!(p, "Orphan" | "Background" | "Foreground") {
            return Err(ApiError::bad_request(format!(
                "propagationPolicy: Unsupported value: {p:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
            )));
        }
    }
    let body_dry_run = match options.dry_run.as_slice() {
        [] => false,
        [all] if all == "All" => true,
        other => {
            return Err(ApiError::bad_request(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            )))
        }
    };
    let pre = options.preconditions.unwrap_or_default();
    Ok((
        Preconditions {
            uid: pre.uid,
            resource_version: pre.resource_version,
        },
        body_dry_run || req.params.dry_run()?,
    ))
}

pub async fn delete<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    let rendering = req.rendering()?;
    let (preconditions, dry_run) = delete_options(&req)?;
    let name = req.name().unwrap_or_default();
    let ctx = context(&req);
    // The namespace controller deletes one by one what has no deletecollection (revocations):
    // that is the namespace's teardown, not a withdrawal by the caller.
    let by = if req.namespace_terminating {
        Withdrawal::NamespaceTeardown
    } else {
        Withdrawal::ByCaller(ctx.requester.clone())
    };
    let last: K = store
        .delete(
            req.namespace().unwrap_or_default(),
            name,
            &by,
            &ctx,
            &preconditions,
            dry_run,
        )
        .await
        .map_err(store_err::<K>(name))?;
    Ok(json_response(
        StatusCode::OK,
        &render_object(&last, rendering)?,
        &[],
    ))
}

pub async fn delete_collection<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
    options: ListOptions,
) -> ApiResult<Response> {
    let rendering = req.rendering()?;
    let (_, dry_run) = delete_options(&req)?;
    let listed = store
        .list::<K>(&ListQuery {
            namespace: req.namespace().map(str::to_string),
            labels: options.labels,
            fields: options.fields,
            limit: None,
            at: ListAt::Latest,
        })
        .await
        .map_err(store_err::<K>(""))?;
    let ctx = context(&req);
    let mut deleted = Vec::with_capacity(listed.items.len());
    for item in listed.items {
        let meta = item.meta();
        let (ns, name) = (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        // Tearing down a terminating namespace withdraws every pending enrollment, whoever
        // owns it, and restores nothing; otherwise the caller is checked as for a single
        // delete.
        let by = if req.namespace_terminating {
            Withdrawal::NamespaceTeardown
        } else {
            Withdrawal::ByCaller(ctx.requester.clone())
        };
        match store
            .delete::<K>(&ns, &name, &by, &ctx, &Preconditions::default(), dry_run)
            .await
        {
            Ok(last) => deleted.push(last),
            // Deleted concurrently: that is what was asked.
            Err(StoreError::NotFound) => {}
            Err(e) => return Err(ApiError::from_store(e, &K::INFO, &name)),
        }
    }
    let rv = store.current_version().await.map_err(store_err::<K>(""))?;
    let body = render_list(&deleted, K::INFO.list_kind, rv, None, rendering)?;
    Ok(json_response(StatusCode::OK, &body, &[]))
}

/// A write through the `status` subresource (PATCH or PUT).
pub async fn update_status<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    if !K::INFO.subresources.contains(&"status") {
        return Err(ApiError::method_not_allowed(
            "PATCH",
            &format!("{}/status", K::INFO.plural),
        ));
    }
    let rendering = req.rendering()?;
    let dry_run = req.params.dry_run()?;
    let name = req.name().unwrap_or_default();
    let current: K = store
        .get(req.namespace().unwrap_or_default(), name)
        .await
        .map_err(store_err::<K>(name))?;
    let current = object_json(&current)?;
    let requested = if req.route.verb == Verb::Patch {
        let content_type = req.content_type().to_string();
        let patch_type = PatchType::from_content_type(&content_type)
            .filter(|t| *t != PatchType::Apply)
            .ok_or_else(|| ApiError::unsupported_media_type(&content_type, &PATCH_TYPES[..3]))?;
        let mut doc = current.clone();
        patch::apply(&mut doc, patch_type, &req.body)
            .map_err(|e| ApiError::from_patch(e, &K::INFO, name))?;
        doc
    } else {
        req.require_json_body()?;
        let mut doc: Value = serde_json::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))?;
        // An update may leave the resourceVersion out (unconditional).
        if doc.pointer("/metadata/resourceVersion").is_none() {
            if let (Some(meta), Some(rv)) = (
                doc.get_mut("metadata").and_then(Value::as_object_mut),
                current.pointer("/metadata/resourceVersion"),
            ) {
                meta.insert("resourceVersion".into(), rv.clone());
            }
        }
        doc
    };
    check_object_size(&requested)?;
    K::check_status(&current, &requested).map_err(|e| store_err::<K>(name)(e.into()))?;
    // The typed form must still decode (rejects wrong types with a 400).
    let mut warnings = Vec::new();
    let bytes = serde_json::to_vec(&requested).map_err(|e| ApiError::internal(e.to_string()))?;
    let _: K = decode_object(&bytes, req.params.field_validation()?, &mut warnings)?;
    // The uid checked above is a precondition under the write lock too.
    let preconditions = Preconditions {
        uid: current
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .map(str::to_string),
        resource_version: None,
    };
    let written: K = store
        .write_status(
            req.namespace().unwrap_or_default(),
            name,
            &requested,
            &context(&req),
            &preconditions,
            dry_run,
        )
        .await
        .map_err(store_err::<K>(name))?;
    Ok(json_response(
        StatusCode::OK,
        &render_object(&written, rendering)?,
        &warnings,
    ))
}
