//! The `token` subresource of AccessSession (docs/session-tokens.md): `POST` a `TokenRequest`,
//! get a signed session token. Nothing is written: minting reads the session and its
//! server's fence, signs, and answers.

use apis::resources::ACCESS_SESSIONS;
use apis::session_token::{
    check_request, mintable, parse_request, token_expiry, TOKEN_REQUEST_API_VERSION,
    TOKEN_REQUEST_KIND,
};
use apis::AccessSession;
use axum::response::Response;
use http::StatusCode;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::error::{ApiError, ApiResult};
use super::render::json_response;
use super::resource::ResourceRequest;
use crate::store::{self, Store, StoreError};
use crate::tokens::{MintError, SessionTokens};

/// RFC 3339 in UTC, second precision, as Kubernetes writes times.
fn rfc3339(at: Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `POST …/namespaces/NS/accesssessions/NAME/token`.
pub(super) async fn create<S: Store>(
    store: &S,
    tokens: &SessionTokens,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    let metrics = &tokens.metrics;
    let (Some(namespace), Some(name)) = (req.namespace(), req.name()) else {
        return Err(ApiError::not_found_path());
    };
    if !apis::validation::is_dns1123_label(namespace) {
        return Err(ApiError::not_found_path());
    }
    if !tokens.enabled() {
        metrics.refused("disabled");
        return Err(ApiError::unavailable(MintError::Disabled.to_string()));
    }
    req.require_json_body()?;
    // Validated, and then ignored the way a dry run is answered: see below.
    let dry_run = req.params.dry_run()?;
    let spec = parse_request(&req.body).map_err(|e| {
        metrics.refused("malformed");
        ApiError::bad_request(e.to_string())
    })?;
    let ask = check_request(&spec).map_err(|errors| {
        metrics.refused("invalid");
        ApiError::invalid_token_request(name, &errors)
    })?;
    let session: AccessSession = store.get(namespace, name).await.map_err(|e| {
        if e == StoreError::NotFound {
            metrics.refused("not_found");
        }
        ApiError::from_store(e, &ACCESS_SESSIONS, name)
    })?;
    let fenced = store
        .server_fenced(&session.spec.server.uid, namespace)
        .await
        .map_err(|e| ApiError::from_store(e, &ACCESS_SESSIONS, name))?;
    let now = store::now();
    let expires_at = mintable(&session, now, fenced).map_err(|refusal| {
        metrics.refused(refusal.label());
        ApiError::token_refused(name, &refusal)
    })?;
    let exp = token_expiry(
        now,
        ask.expiration_seconds,
        tokens.max_ttl_seconds(),
        expires_at,
    );
    let audiences = if ask.audiences.is_empty() {
        vec![tokens.default_audience(&session)]
    } else {
        ask.audiences
    };
    // A dry run answers what a token would be (lifetime, audiences) without minting one:
    // `status.token` is empty and nothing is counted as issued.
    let token = if dry_run {
        String::new()
    } else {
        let minted = tokens
            .mint(&session, audiences.clone(), now, exp)
            .map_err(|e| {
                tracing::error!(error = %e, "cannot mint a session token");
                ApiError::internal("the session token could not be signed")
            })?;
        metrics.issued();
        tracing::info!(
            ns = namespace,
            name,
            uid = session.metadata.uid.as_deref().unwrap_or_default(),
            jti = %minted.claims.jti,
            exp,
            "issued a session token"
        );
        minted.token
    };
    let expiration = Timestamp::from_second(exp).map_err(|_| {
        ApiError::internal("the token's expiry is outside the representable time range")
    })?;
    let body = json!({
        "apiVersion": TOKEN_REQUEST_API_VERSION,
        "kind": TOKEN_REQUEST_KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "creationTimestamp": rfc3339(now),
        },
        "spec": {
            "audiences": audiences,
            "expirationSeconds": exp - now.as_second(),
            "boundObjectRef": null,
        },
        "status": {
            "token": token,
            "expirationTimestamp": rfc3339(expiration),
        },
    });
    Ok(json_response(StatusCode::CREATED, &body, &[]))
}
