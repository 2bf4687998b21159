//! The reads: get and list (watch lives in `http/watch.rs`).

use apis::strategy::Strategy;
use axum::response::Response;
use http::StatusCode;

use super::request::{store_err, ResourceRequest};
use crate::http::error::{ApiError, ApiResult};
use crate::http::render::{json_response, object_json, render_list, render_object, streamed_list};
use crate::http::request::{ListOptions, Rendering, RvMatch};
use crate::store::{ContinueToken, ListAt, ListQuery, ResourceVersion, Store, StoreError};

pub async fn get<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    let rendering = req.rendering()?;
    let name = req.name().unwrap_or_default();
    let object: K = store
        .get(req.namespace().unwrap_or_default(), name)
        .await
        .map_err(store_err::<K>(name))?;
    // Outside the caller's scope is the same answer as absent: no hint that it exists.
    if let Some(scope) = req.scope {
        if !scope.matches(&object_json(&object)?) {
            return Err(store_err::<K>(name)(StoreError::NotFound));
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &render_object(&object, rendering)?,
        &[],
    ))
}

/// Resolves which snapshot a list reads, by the resourceVersion rules of the API.
pub fn list_at(options: &ListOptions) -> ApiResult<ListAt> {
    if let Some(token) = &options.continue_token {
        let (token, rv) = ContinueToken::decode(token).map_err(|_| {
            ApiError::bad_request("continue key is not valid: invalid continue token")
        })?;
        return Ok(ListAt::Exact {
            rv,
            after: Some((token.ns, token.name)),
        });
    }
    match options.resource_version.as_deref() {
        None | Some("0") => Ok(ListAt::Latest),
        Some(rv) => {
            let parsed = ResourceVersion::parse(rv)
                .map_err(|_| ApiError::bad_request(format!("resourceVersion: Invalid value: {rv:?}: must be a resourceVersion this server returned")))?;
            let exact = options.rv_match == Some(RvMatch::Exact)
                || (options.rv_match.is_none() && options.limit.is_some());
            Ok(if exact {
                ListAt::Exact {
                    rv: parsed,
                    after: None,
                }
            } else {
                // "Not older than" an old version is the current state.
                ListAt::Latest
            })
        }
    }
}

pub async fn list<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
    options: ListOptions,
) -> ApiResult<Response> {
    let rendering = req.rendering()?;
    let mut fields = options.fields.clone();
    if let Some(scope) = req.scope {
        fields.0.extend(scope.0.iter().cloned());
    }
    let query = ListQuery {
        namespace: req.namespace().map(str::to_string),
        labels: options.labels.clone(),
        fields,
        limit: options.limit,
        at: list_at(&options)?,
    };
    let list_err = |e| {
        match e {
        StoreError::Expired(_) if options.continue_token.is_some() => ApiError::expired(
            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
        ),
        e => ApiError::from_store(e, &K::INFO, ""),
    }
    };
    // Plain JSON is served from the stored bytes, streamed; the other renderings are
    // computed from the typed objects.
    if rendering == Rendering::Object {
        let list = store.list_raw::<K>(&query).await.map_err(list_err)?;
        return Ok(streamed_list(K::INFO.list_kind, list));
    }
    let list = store.list::<K>(&query).await.map_err(list_err)?;
    let body = render_list(
        &list.items,
        K::INFO.list_kind,
        list.resource_version,
        list.continue_token,
        rendering,
    )?;
    Ok(json_response(StatusCode::OK, &body, &[]))
}
