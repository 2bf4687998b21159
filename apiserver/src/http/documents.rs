//! The discovery and OpenAPI documents, encoded once at start and served as `Accept` asks.

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{header, StatusCode};
use serde_json::{json, Value};

use super::error::{ApiError, ApiResult};

/// Discovery and OpenAPI documents, encoded once.
pub(crate) struct Documents {
    group_list: Bytes,
    group: Bytes,
    resource_list: Bytes,
    aggregated: Bytes,
    core_versions: Bytes,
    core_aggregated: Bytes,
    openapi_v2: Bytes,
    openapi_v3_root: Bytes,
    openapi_v3_group: Bytes,
    openapi_v3_hash: String,
    version: Bytes,
}

pub(crate) fn encode(v: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(v).unwrap_or_default())
}

impl Documents {
    /// The documents of the API listener: every resource.
    pub(crate) fn build() -> Self {
        Self::build_for(apis::resources::RESOURCES)
    }

    /// The documents of a listener that serves only `served` (the gateway sync listener).
    pub(crate) fn build_for(served: &[apis::resources::ResourceInfo]) -> Self {
        let v3 = encode(&apis::openapi::openapi_v3_group());
        let hash = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            v3.hash(&mut h);
            format!("{:016X}", h.finish())
        };
        Self {
            group_list: encode(&apis::discovery::api_group_list()),
            group: encode(&apis::discovery::api_group()),
            resource_list: encode(&apis::discovery::api_resource_list_of(served)),
            aggregated: encode(&apis::discovery::aggregated_discovery_of(served)),
            core_versions: encode(&apis::discovery::empty_core_api_versions()),
            core_aggregated: encode(&apis::discovery::empty_aggregated_discovery()),
            openapi_v2: encode(&apis::openapi::openapi_v2()),
            openapi_v3_root: encode(&apis::openapi::openapi_v3_root(&hash)),
            openapi_v3_group: v3,
            openapi_v3_hash: hash,
            version: encode(&json!({
                "major": "1",
                "minor": "36",
                "gitVersion": concat!("v", env!("CARGO_PKG_VERSION"), "-mcp-access"),
                "gitCommit": "",
                "gitTreeState": "clean",
                "buildDate": "",
                "goVersion": "",
                "compiler": "rustc",
                "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
            })),
        }
    }
}

impl Documents {
    /// Answers a request for `doc` as its `Accept` header asks.
    pub(super) fn serve(&self, doc: Doc, headers: &http::HeaderMap) -> ApiResult<Response> {
        let accept = headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let wants_aggregated = wants_aggregated_discovery(accept);
        if matches!(doc, Doc::OpenApiV2 | Doc::OpenApiV3 | Doc::OpenApiV3Group)
            && !accepts_json(accept)
        {
            return Err(ApiError::not_acceptable(accept));
        }
        let docs = self;
        let (bytes, content_type) = match doc {
            Doc::Apis if wants_aggregated => (
                docs.aggregated.clone(),
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            ),
            Doc::Api if wants_aggregated => (
                docs.core_aggregated.clone(),
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            ),
            Doc::Apis => (docs.group_list.clone(), "application/json"),
            Doc::Api => (docs.core_versions.clone(), "application/json"),
            Doc::Group => (docs.group.clone(), "application/json"),
            Doc::ResourceList => (docs.resource_list.clone(), "application/json"),
            Doc::OpenApiV2 => (docs.openapi_v2.clone(), "application/json"),
            Doc::OpenApiV3 => (docs.openapi_v3_root.clone(), "application/json"),
            Doc::OpenApiV3Group => (docs.openapi_v3_group.clone(), "application/json"),
            Doc::Version => (docs.version.clone(), "application/json"),
            // Served from the session-token signer, not from here.
            Doc::Jwks | Doc::OpenIdConfiguration => return Err(ApiError::not_found_path()),
        };
        let mut response = (
            StatusCode::OK,
            [(header::CONTENT_TYPE, content_type)],
            bytes,
        )
            .into_response();
        if matches!(doc, Doc::OpenApiV3Group) {
            if let Ok(etag) = http::HeaderValue::from_str(&format!("\"{}\"", docs.openapi_v3_hash))
            {
                response.headers_mut().insert(header::ETAG, etag);
            }
        }
        Ok(response)
    }
}

/// Whether `Accept` admits JSON (an absent header does). OpenAPI is served as JSON only; a
/// client asking only for protobuf gets 406 rather than bytes it cannot parse.
pub(crate) fn accepts_json(accept: &str) -> bool {
    accept.trim().is_empty()
        || accept.split(',').any(|m| {
            let mime = m.split(';').next().unwrap_or("").trim();
            matches!(mime, "application/json" | "application/*" | "*/*")
        })
}

/// Whether the first media type of `Accept` this server can answer is aggregated
/// discovery v2 (rather than the legacy documents).
pub(crate) fn wants_aggregated_discovery(accept: &str) -> bool {
    for media in accept.split(',') {
        let mut parts = media.split(';').map(str::trim);
        let mime = parts.next().unwrap_or("");
        let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
        let param = |k: &str| params.iter().find(|(pk, _)| *pk == k).map(|(_, v)| *v);
        match param("as") {
            Some("APIGroupDiscoveryList")
                if param("g") == Some("apidiscovery.k8s.io") && param("v") == Some("v2") =>
            {
                return true
            }
            Some(_) => continue,
            None if mime == "application/json" || mime == "*/*" || mime == "application/*" => {
                return false
            }
            None => continue,
        }
    }
    false
}

/// A non-resource document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Doc {
    Api,
    Apis,
    Group,
    ResourceList,
    OpenApiV2,
    OpenApiV3,
    OpenApiV3Group,
    Version,
    /// `/openid/v1/jwks`: the session-token keys.
    Jwks,
    /// `/.well-known/openid-configuration`: the session-token issuer.
    OpenIdConfiguration,
}

/// The JWK Set of the session-token keys (`{"keys":[]}` without a signing key).
pub(crate) fn jwks(tokens: &crate::tokens::SessionTokens) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/jwk-set+json")],
        tokens.jwks(),
    )
        .into_response()
}

/// The OpenID discovery document of the session-token issuer; 404 without a signing key
/// (there is no issuer).
pub(crate) fn openid_configuration(tokens: &crate::tokens::SessionTokens) -> ApiResult<Response> {
    let document = tokens.discovery().ok_or_else(ApiError::not_found_path)?;
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        document,
    )
        .into_response())
}
