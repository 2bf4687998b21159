//! Server-side apply (`application/apply-patch+yaml`): create from the configuration, or
//! merge it with field ownership.

use apis::managed_fields;
use apis::strategy::Strategy;
use axum::response::Response;
use http::StatusCode;
use serde_json::Value;

use super::object::{check_object_size, requested_document, written_response};
use super::request::{apply_force, context, field_manager, ResourceRequest};
use crate::http::error::{ApiError, ApiResult};
use crate::http::patch::{self, PatchType};
use crate::http::render::object_json;
use crate::store::{self, Store, StoreError};

/// Whether the request is a server-side apply (`application/apply-patch+yaml`).
pub fn is_apply(req: &ResourceRequest<'_>) -> bool {
    PatchType::from_content_type(req.content_type()) == Some(PatchType::Apply)
}

/// Server-side apply (`application/apply-patch+yaml`): creates the object from the
/// configuration when it does not exist; otherwise merges it with field ownership
/// (`apis::managed_fields::apply`): 409 naming the other managers when it would change
/// their fields, unless `force`.
pub(super) async fn server_side_apply<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    let manager = field_manager::<K>(&req, true)?;
    let force = apply_force::<K>(&req, true)?;
    let rendering = req.rendering()?;
    let dry_run = req.params.dry_run()?;
    let validation = req.params.field_validation()?;
    let ns = req.namespace().unwrap_or_default();
    let name = req.name().unwrap_or_default();
    let config = patch::apply_configuration(&req.body)
        .map_err(|e| ApiError::from_patch(e, &K::INFO, name))?;
    if config
        .pointer("/metadata/managedFields")
        .is_some_and(|v| !v.is_null())
    {
        return Err(ApiError::bad_request("metadata.managedFields must be nil"));
    }
    // Like any object a client sends, the configuration names its type.
    for (field, expected) in [("apiVersion", apis::API_VERSION), ("kind", K::KIND)] {
        match config.get(field).and_then(Value::as_str) {
            Some(given) if given == expected => {}
            Some(given) => {
                return Err(ApiError::bad_request(format!(
                    "the {field} in the apply configuration ({given}) does not match the expected {field} ({expected})"
                )))
            }
            None => {
                return Err(ApiError::bad_request(format!(
                    "the apply configuration must set {field}"
                )))
            }
        }
    }
    let pinned = config.pointer("/metadata/resourceVersion").is_some();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let mut warnings = Vec::new();
        let current: Option<K> = match store.get(ns, name).await {
            Ok(current) => Some(current),
            Err(StoreError::NotFound) => None,
            Err(e) => return Err(ApiError::from_store(e, &K::INFO, name)),
        };
        let Some(current) = current else {
            if pinned {
                return Err(ApiError::from_store(StoreError::NotFound, &K::INFO, name));
            }
            let cluster_authority = match &req.apply_create {
                Some(Ok(everywhere)) => *everywhere,
                Some(Err(refused)) => return Err(refused.clone()),
                None => {
                    return Err(ApiError::method_not_allowed(
                        "PATCH",
                        &format!("{} (create by apply)", K::INFO.plural),
                    ))
                }
            };
            let mut object: K = requested_document(
                &config,
                validation,
                (req.namespace(), Some(name)),
                &mut warnings,
            )?;
            let typed = object_json(&object)?;
            let mut managers = managed_fields::applied_create(&config, &manager, store::now());
            managed_fields::retain_present(&mut managers, &typed);
            object.meta_mut().managed_fields = managed_fields::encode(&managers);
            check_object_size(&object)?;
            let mut ctx = context(&req);
            if cluster_authority {
                ctx.authority = store::RevokerAuthority::Cluster;
            }
            match store.create(object, &ctx, dry_run).await {
                Ok(written) => {
                    return written_response(StatusCode::CREATED, written, rendering, warnings)
                }
                // Created meanwhile: apply to it.
                Err(StoreError::AlreadyExists) if attempts < 5 => continue,
                Err(e) => return Err(ApiError::from_store(e, &K::INFO, name)),
            }
        };
        let live = object_json(&current)?;
        let managers =
            managed_fields::requested_or_stored(None, current.meta().managed_fields.as_deref());
        let applied =
            managed_fields::apply(&live, &config, managers, &manager, force, store::now())
                .map_err(|c| ApiError::apply_conflict(&c))?;
        let mut object: K = requested_document(
            &applied.object,
            validation,
            (req.namespace(), Some(name)),
            &mut warnings,
        )?;
        // Fields the type does not know were dropped with a warning (or refused when
        // Strict): nobody owns them.
        let mut managers = applied.managers;
        managed_fields::retain_present(&mut managers, &object_json(&object)?);
        object.meta_mut().managed_fields = managed_fields::encode(&managers);
        check_object_size(&object)?;
        match store.update(object, &context(&req), dry_run).await {
            Ok(written) => return written_response(StatusCode::OK, written, rendering, warnings),
            Err(StoreError::Modified | StoreError::UidPrecondition { .. })
                if !pinned && attempts < 5 =>
            {
                continue
            }
            Err(e) => return Err(ApiError::from_store(e, &K::INFO, name)),
        }
    }
}
