//! One request on a resource as the handlers take it, and what they read from it: the
//! strategy's context, the field manager, `force`.

use apis::managed_fields;
use apis::selector::FieldSelector;
use apis::strategy::Strategy;
use apis::validation::FieldError;
use bytes::Bytes;
use http::HeaderMap;

use crate::auth::UserInfo;
use crate::http::error::{ApiError, ApiResult};
use crate::http::request::{Params, Rendering};
use crate::http::route::ResourceRoute;
use crate::store::{self, Context, Requester};

/// The request's context for a kind's strategy: who asks, when, and how far their authority
/// to create this kind reaches.
pub(super) fn context(req: &ResourceRequest<'_>) -> Context {
    let mut ctx = Context::new(
        store::now(),
        Requester {
            name: req.user.name.clone(),
            uid: req.user.uid.clone(),
        },
    );
    if req.cluster_authority {
        ctx.authority = store::RevokerAuthority::Cluster;
    }
    ctx
}

/// One request on a resource, as routed.
pub struct ResourceRequest<'a> {
    /// What the request does and what it addresses.
    pub route: &'a ResourceRoute,
    pub params: Params,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
    /// Who is asking (owners of enrollments are recorded and checked).
    pub user: &'a UserInfo,
    /// The request's namespace is terminating (set for deletecollection).
    pub namespace_terminating: bool,
    /// The caller may create this kind in every namespace (set for creates of kinds that
    /// ask, see [`Strategy::ASKS_CLUSTER_AUTHORITY`]).
    pub cluster_authority: bool,
    /// For a server-side apply: whether it may create its object (the create checks, and
    /// whether the caller may create this kind everywhere), decided by the caller of
    /// [`super::patch`]. None refuses every create by apply.
    pub apply_create: Option<ApiResult<bool>>,
    /// What the caller may see at all (the gateway sync listener's server scope): objects
    /// outside it do not exist for this request. None on the API listener.
    pub scope: Option<&'a FieldSelector>,
}

impl<'a> ResourceRequest<'a> {
    /// Namespace from the path (None for cluster-scoped kinds and all-namespace requests).
    pub fn namespace(&self) -> Option<&'a str> {
        self.route.namespace.as_deref()
    }

    /// The object's name from the path (None on a collection).
    pub fn name(&self) -> Option<&'a str> {
        self.route.name.as_deref()
    }

    /// `status` for requests to `<name>/status`, `token` for `<name>/token`.
    pub fn subresource(&self) -> Option<&'a str> {
        self.route.subresource.as_deref()
    }

    pub(super) fn rendering(&self) -> ApiResult<Rendering> {
        Rendering::from_headers(self.headers, self.params.include_object())
    }

    pub(super) fn content_type(&self) -> &str {
        self.headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    pub(crate) fn require_json_body(&self) -> ApiResult<()> {
        let ct = self.content_type().split(';').next().unwrap_or("").trim();
        if ct.is_empty() || ct == "application/json" || ct == "*/*" {
            Ok(())
        } else {
            Err(ApiError::unsupported_media_type(ct, &["application/json"]))
        }
    }
}

pub(super) fn store_err<K: Strategy>(name: &str) -> impl Fn(store::StoreError) -> ApiError + '_ {
    move |e| ApiError::from_store(e, &K::INFO, name)
}

/// Who a write's changes are recorded for: `fieldManager`, required for an apply; without
/// it, the User-Agent's product (kube-apiserver's rule).
pub(super) fn field_manager<K: Strategy>(
    req: &ResourceRequest<'_>,
    apply: bool,
) -> ApiResult<String> {
    match req.params.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(m) if !managed_fields::valid_manager(m) => Err(ApiError::invalid_params(
            &K::INFO,
            &[FieldError::invalid(
                "fieldManager",
                format!(
                    "Invalid value: {m:?}: must be at most {} printable characters",
                    managed_fields::MAX_MANAGER_LEN
                ),
            )],
        )),
        Some(m) => Ok(m.to_string()),
        None if apply => Err(ApiError::invalid_params(
            &K::INFO,
            &[FieldError::required(
                "fieldManager",
                "Required value: is required for apply patch",
            )],
        )),
        None => Ok(managed_fields::manager_from_user_agent(
            req.headers
                .get(http::header::USER_AGENT)
                .and_then(|v| v.to_str().ok()),
        )),
    }
}

/// `force` of an apply; any other request may not set it.
pub(super) fn apply_force<K: Strategy>(req: &ResourceRequest<'_>, apply: bool) -> ApiResult<bool> {
    match req.params.get("force") {
        None => Ok(false),
        Some(_) if !apply => Err(ApiError::invalid_params(
            &K::INFO,
            &[FieldError::forbidden(
                "force",
                "Forbidden: may not be specified for non-apply patch",
            )],
        )),
        Some("true" | "1" | "True" | "TRUE") => Ok(true),
        Some("false" | "0" | "False" | "FALSE" | "") => Ok(false),
        Some(other) => Err(ApiError::bad_request(format!(
            "force: invalid boolean value {other:?}"
        ))),
    }
}
