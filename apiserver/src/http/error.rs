//! Every API error as a `metav1.Status`, in one place.

use apis::resources::ResourceInfo;
use apis::rules::SessionRuleError;
use apis::validation::FieldError;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};
use serde_json::Value;

use super::patch::PatchError;
use crate::store::{Refusal, StoreError};

/// An API failure: HTTP code, Status reason, message and details.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: StatusCode,
    pub reason: &'static str,
    pub message: String,
    /// Boxed: most errors carry none, and `ApiResult` stays small.
    details: Option<Box<StatusDetails>>,
    /// Seconds a client should wait before retrying (`Retry-After`).
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    fn with_details(mut self, details: StatusDetails) -> Self {
        self.details = Some(Box::new(details));
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }
    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
    }
    /// 401 saying why, for callers a reason helps (gateways): it must name no object.
    pub fn unauthorized_because(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "Unauthorized", message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "Forbidden", message)
    }
    pub fn not_found_path() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        )
    }
    pub fn namespace_not_found(namespace: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("namespaces {namespace:?} not found"),
        )
        .with_details(StatusDetails {
            name: Some(namespace.to_string()),
            kind: Some("namespaces".to_string()),
            ..Default::default()
        })
    }
    pub fn method_not_allowed(verb: &str, what: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({verb} {what})"
            ),
        )
    }
    pub fn not_acceptable(accept: &str) -> Self {
        Self::new(
            StatusCode::NOT_ACCEPTABLE,
            "NotAcceptable",
            format!("only the following media types are accepted: application/json, application/json;as=Table;v=v1;g=meta.k8s.io, application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io (requested {accept:?})"),
        )
    }
    pub fn unsupported_media_type(content_type: &str, supported: &[&str]) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: {} (got {content_type:?})", supported.join(", ")),
        )
    }
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }
    /// 413 for a request the server refuses by its size or cost (kube-apiserver's
    /// `NewRequestEntityTooLargeError`).
    pub fn entity_too_large(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            message,
        )
    }
    /// 413 for an object larger than storage accepts (etcd's request limit behind
    /// kube-apiserver).
    pub fn object_too_large(size: usize, limit: usize) -> Self {
        Self::entity_too_large(format!(
            "Request entity too large: the object is {size} bytes encoded; limit is {limit}"
        ))
    }
    /// 429, as kube-apiserver's max-in-flight filter answers: `Retry-After` and
    /// `details.retryAfterSeconds` tell the client when to come back.
    pub fn too_many_requests(message: impl Into<String>, retry_after: u64) -> Self {
        let mut e = Self::new(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", message)
            .with_details(StatusDetails {
                retry_after_seconds: Some(i32::try_from(retry_after).unwrap_or(i32::MAX)),
                ..Default::default()
            });
        e.retry_after = Some(retry_after);
        e
    }
    /// 504, kube-apiserver's `NewTimeoutError`.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::GATEWAY_TIMEOUT, "Timeout", message)
    }
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(StatusCode::GONE, "Expired", message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            message,
        )
    }

    /// 409 for a session that may not have a token now (docs/session-tokens.md): not
    /// `Active`, past its expiry, or of a retired (fenced) server.
    pub fn token_refused(name: &str, refusal: &apis::session_token::NotMintable) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "accesssessions.{} {name:?}: no token is issued: {refusal}",
                apis::GROUP
            ),
        )
        .with_details(StatusDetails {
            name: Some(name.to_string()),
            group: Some(apis::GROUP.to_string()),
            kind: Some("accesssessions".to_string()),
            ..Default::default()
        })
    }

    /// 422 Invalid for a `TokenRequest` with bad fields, as kube-apiserver words it.
    pub fn invalid_token_request(name: &str, errors: &[FieldError]) -> Self {
        use apis::session_token::{TOKEN_REQUEST_GROUP, TOKEN_REQUEST_KIND};
        Self::invalid_kind(TOKEN_REQUEST_KIND, TOKEN_REQUEST_GROUP, name, errors)
    }

    /// 422 Invalid for request parameters (not an object's fields).
    pub fn invalid_params(resource: &ResourceInfo, errors: &[FieldError]) -> Self {
        Self::invalid(resource, "", errors)
    }

    /// 422 Invalid with one cause per field error.
    pub fn invalid(resource: &ResourceInfo, name: &str, errors: &[FieldError]) -> Self {
        Self::invalid_kind(resource.kind, apis::GROUP, name, errors)
    }

    /// 422 Invalid of `kind.group` `name`, one cause per field error.
    fn invalid_kind(kind: &str, group: &str, name: &str, errors: &[FieldError]) -> Self {
        let causes = errors
            .iter()
            .map(|e| StatusCause {
                reason: Some(e.kind.cause_type().to_string()),
                message: Some(e.message.clone()),
                field: Some(e.field.clone()),
            })
            .collect();
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!(
                "{kind}.{group} {name:?} is invalid: {}",
                apis::validation::join_errors(errors)
            ),
        )
        .with_details(StatusDetails {
            name: Some(name.to_string()),
            group: Some(group.to_string()),
            kind: Some(kind.to_string()),
            causes: Some(causes),
            ..Default::default()
        })
    }

    /// A patch that cannot be applied: malformed (400), inapplicable to the object (422)
    /// or too large once applied (413).
    pub fn from_patch(err: PatchError, resource: &ResourceInfo, name: &str) -> Self {
        match err {
            PatchError::Malformed(m) => Self::bad_request(m),
            PatchError::Inapplicable(m) => {
                Self::invalid(resource, name, &[FieldError::invalid("patch", m)])
            }
            PatchError::TooLarge(m) => Self::entity_too_large(m),
        }
    }

    /// 409 for a server-side apply that would change fields other managers own, one cause
    /// per field (kube-apiserver's `NewApplyConflict`).
    pub fn apply_conflict(conflicts: &apis::managed_fields::Conflicts) -> Self {
        let causes = conflicts
            .0
            .iter()
            .map(|c| StatusCause {
                reason: Some("FieldManagerConflict".into()),
                message: Some(format!("conflict with {}", c.manager)),
                field: Some(c.field.clone()),
            })
            .collect();
        Self::new(StatusCode::CONFLICT, "Conflict", conflicts.to_string()).with_details(
            StatusDetails {
                causes: Some(causes),
                ..Default::default()
            },
        )
    }

    /// Maps a storage error for a request on `resource` (named `name`, if any): every
    /// Status text of a refused write is written here.
    pub fn from_store(err: StoreError, resource: &ResourceInfo, name: &str) -> Self {
        let qualified = format!("{}.{}", resource.plural, apis::GROUP);
        let details = StatusDetails {
            name: Some(name.to_string()),
            group: Some(apis::GROUP.to_string()),
            kind: Some(resource.plural.to_string()),
            ..Default::default()
        };
        let conflict = |message: String| {
            Self::new(StatusCode::CONFLICT, "Conflict", message).with_details(details.clone())
        };
        let forbidden = |reason: &'static str, message: String| {
            Self::new(
                StatusCode::FORBIDDEN,
                reason,
                format!("{qualified} {name:?} is forbidden: {message}"),
            )
            .with_details(details.clone())
        };
        match err {
            StoreError::NotFound => Self::new(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("{qualified} {name:?} not found"),
            )
            .with_details(details),
            StoreError::AlreadyExists => Self::new(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{qualified} {name:?} already exists"),
            )
            .with_details(details),
            StoreError::NameReserved => Self::new(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{qualified} {name:?} already exists: the name was used before by a deleted {} and names are never reused", resource.singular),
            )
            .with_details(details),
            StoreError::UidPrecondition { given, actual } => conflict(format!(
                "Precondition failed: UID in precondition: {given}, UID in object meta: {actual}"
            )),
            StoreError::Modified => conflict(format!(
                "Operation cannot be fulfilled on {qualified} {name:?}: the object has been modified; please apply your changes to the latest version and try again"
            )),
            StoreError::Invalid(errors) => Self::invalid(resource, name, &errors),
            StoreError::Unsupported(message) => Self::bad_request(message),
            StoreError::Refused(refusal) => {
                let message = refusal.to_string();
                match refusal {
                    Refusal::Session(SessionRuleError::AgentInactive(_)) => {
                        forbidden("Forbidden", message)
                    }
                    Refusal::Session(
                        SessionRuleError::ScopeEscalation(_)
                        | SessionRuleError::ToolEscalation { .. },
                    ) => forbidden("ScopeEscalation", message),
                    Refusal::Session(SessionRuleError::QuotaExceeded { .. }) => {
                        forbidden("QuotaExceeded", message)
                    }
                    Refusal::NotOwner(_) => forbidden("Forbidden", message),
                    Refusal::Session(_)
                    | Refusal::Completion { .. }
                    | Refusal::Withdrawal { .. }
                    | Refusal::FencePermanent(_) => conflict(message),
                }
            }
            StoreError::Expired(message) => Self::expired(message),
            StoreError::EpochChanged(message) => Self::expired(message).with_details(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some(apis::feed::EPOCH_CHANGED_CAUSE.to_string()),
                    message: Some("the change history was reset (a new epoch)".to_string()),
                    field: None,
                }]),
                ..Default::default()
            }),
            StoreError::Unavailable(message) => {
                tracing::warn!(error = %message, "storage unavailable");
                Self::unavailable("storage is unavailable; retry later")
            }
            StoreError::Internal(message) => {
                tracing::error!(error = %message, "storage error");
                Self::internal(format!("Internal error occurred: {message}"))
            }
        }
    }

    /// The `metav1.Status` object.
    pub fn to_status(&self) -> Value {
        let status = Status {
            code: Some(i32::from(self.code.as_u16())),
            details: self.details.as_deref().cloned(),
            message: Some(self.message.clone()),
            reason: Some(self.reason.to_string()),
            status: Some("Failure".to_string()),
            ..Default::default()
        };
        serde_json::to_value(&status).unwrap_or(Value::Null)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.code, axum::Json(self.to_status())).into_response();
        let retry_after = match self.retry_after {
            Some(secs) => Some(secs),
            None if self.code == StatusCode::SERVICE_UNAVAILABLE => Some(1),
            None => None,
        };
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// Result of an API handler.
pub type ApiResult<T> = Result<T, ApiError>;
