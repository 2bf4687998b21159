//! The one error of the MCPServer, Host and NetworkPolicy reconciles.

use kube::Resource;

use crate::metrics::{kube_reason, KUBE_REASONS};

/// Why children cannot be built: their owner lacks what an owner reference or a namespaced
/// child needs (an object not yet fully created, or a test fixture).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("the {kind} has no {field} yet")]
pub struct Incomplete {
    /// The owner's kind.
    pub kind: String,
    /// The metadata field it lacks.
    pub field: &'static str,
}

impl Incomplete {
    /// A `K` without `field`.
    pub fn missing<K: Resource<DynamicType = ()>>(field: &'static str) -> Self {
        Incomplete {
            kind: K::kind(&()).into_owned(),
            field,
        }
    }
}

/// Why a reconcile (or a pass, or a sweep) failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Incomplete(#[from] Incomplete),
    /// A live or applied object (of the kind named) did not encode as JSON.
    #[error("cannot encode {0}: {1}")]
    Encode(&'static str, serde_json::Error),
}

impl ReconcileError {
    /// The reasons of failures talking to the API ([`KUBE_REASONS`] and `encode`): a
    /// controller that builds no owned children (the NetworkPolicy one) fails with these only.
    pub const API_REASONS: [&'static str; 5] = [
        KUBE_REASONS[0],
        KUBE_REASONS[1],
        KUBE_REASONS[2],
        KUBE_REASONS[3],
        "encode",
    ];
    /// Every reason: the error counters a controller declares at zero.
    pub const REASONS: [&'static str; 6] = [
        KUBE_REASONS[0],
        KUBE_REASONS[1],
        KUBE_REASONS[2],
        KUBE_REASONS[3],
        "encode",
        "incomplete_object",
    ];

    /// The `reason` label of `mcp_controllers_reconcile_errors_total` (one of [`Self::REASONS`];
    /// the values docs/controllers.md and the alerts name).
    pub fn reason(&self) -> &'static str {
        match self {
            ReconcileError::Kube(e) => kube_reason(e),
            ReconcileError::Incomplete(_) => "incomplete_object",
            ReconcileError::Encode(..) => "encode",
        }
    }

    /// kube-apiserver's message when it refused the object itself (bad request, forbidden,
    /// invalid) rather than failing for a moment (conflicts, throttling, server errors: those
    /// fail the reconcile and are retried sooner).
    pub fn refusal(&self) -> Option<&str> {
        match self {
            ReconcileError::Kube(kube::Error::Api(status))
                if matches!(status.code, 400 | 403 | 422) =>
            {
                Some(status.message.as_str())
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::runtime::MCPServer;

    fn api(code: u16) -> ReconcileError {
        ReconcileError::Kube(kube::Error::Api(Box::new(
            kube::core::Status::failure(&format!("said {code}"), "Reason").with_code(code),
        )))
    }

    #[test]
    fn reasons_are_the_labels_the_docs_name() {
        let encode = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let cases = [
            (api(409), "conflict"),
            (api(403), "forbidden"),
            (api(500), "api_error"),
            (
                ReconcileError::Incomplete(Incomplete::missing::<MCPServer>("uid")),
                "incomplete_object",
            ),
            (ReconcileError::Encode("Service", encode), "encode"),
        ];
        for (error, reason) in &cases {
            assert_eq!(error.reason(), *reason, "{error}");
            assert!(ReconcileError::REASONS.contains(reason));
        }
        assert!(ReconcileError::API_REASONS
            .iter()
            .all(|r| ReconcileError::REASONS.contains(r)));
        assert!(!ReconcileError::API_REASONS.contains(&"incomplete_object"));
        assert_eq!(
            cases[3].0.to_string(),
            "the MCPServer has no uid yet",
            "the message the reconcile logs"
        );
    }

    #[test]
    fn only_a_refusal_of_the_object_itself_is_one() {
        for code in [400, 403, 422] {
            assert_eq!(api(code).refusal(), Some(format!("said {code}").as_str()));
        }
        for code in [404, 409, 429, 500, 503] {
            assert_eq!(api(code).refusal(), None, "{code}");
        }
        let incomplete = ReconcileError::from(Incomplete::missing::<MCPServer>("uid"));
        assert_eq!(incomplete.refusal(), None);
    }
}
