//! Delegated authorization through kube-apiserver's SubjectAccessReview.
//!
//! A SubjectAccessReview per decision, allowed and denied results cached separately,
//! `system:masters` short-circuited (DESIGN §4). A review that cannot be made
//! (kube-apiserver unreachable, an error status, a timeout) is `Unavailable`, never a
//! denial, and is not cached.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::cache::{AuthCacheMetrics, TtlCache};
use super::{sha256, Attributes, Authorizer, Decision, Digest, UserInfo, REVIEW_TIMEOUT};

/// Group that is always allowed, as in kube-apiserver.
pub const MASTERS_GROUP: &str = "system:masters";

/// Authorizes through the cluster's SubjectAccessReview API.
pub struct SubjectAccessReviewer {
    reviews: Api<SubjectAccessReview>,
    /// Keyed by the SHA-256 of the review's spec. Kept apart so that a burst of denials
    /// (one per distinct request of a user with no rights) cannot push out allowed entries.
    allowed: TtlCache<Digest, ()>,
    denied: TtlCache<Digest, String>,
}

impl SubjectAccessReviewer {
    pub fn new(client: kube::Client, allow_ttl: Duration, deny_ttl: Duration) -> Self {
        Self {
            reviews: Api::all(client),
            allowed: TtlCache::new(allow_ttl, 10_000),
            denied: TtlCache::new(deny_ttl, 10_000),
        }
    }

    /// Counts cache hits and misses in `metrics` (`sar_allowed`, `sar_denied`).
    pub fn with_cache_metrics(mut self, metrics: &AuthCacheMetrics) -> Self {
        self.allowed = self.allowed.counted(metrics, "sar_allowed");
        self.denied = self.denied.counted(metrics, "sar_denied");
        self
    }

    fn spec(user: &UserInfo, a: &Attributes) -> SubjectAccessReviewSpec {
        let mut spec = SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            ..Default::default()
        };
        if a.resource_request {
            spec.resource_attributes = Some(ResourceAttributes {
                namespace: Some(a.namespace.clone()),
                verb: Some(a.verb.clone()),
                group: Some(a.api_group.clone()),
                version: Some(a.api_version.clone()),
                resource: Some(a.resource.clone()),
                subresource: (!a.subresource.is_empty()).then(|| a.subresource.clone()),
                name: (!a.name.is_empty()).then(|| a.name.clone()),
                ..Default::default()
            });
        } else {
            spec.non_resource_attributes = Some(NonResourceAttributes {
                path: Some(a.path.clone()),
                verb: Some(a.verb.clone()),
            });
        }
        spec
    }
}

#[async_trait]
impl Authorizer for SubjectAccessReviewer {
    async fn authorize(&self, user: &UserInfo, attributes: &Attributes) -> Decision {
        if user.groups.iter().any(|g| g == MASTERS_GROUP) {
            return Decision::Allow;
        }
        let spec = Self::spec(user, attributes);
        // Serializing a plain struct does not fail; if it ever did, skip the cache rather
        // than share one key between different requests.
        let key = serde_json::to_vec(&spec).ok().map(|json| sha256(&json));
        if let Some(key) = &key {
            if self.allowed.get(key).is_some() {
                return Decision::Allow;
            }
            if let Some(reason) = self.denied.get(key) {
                return Decision::Deny(reason);
            }
        }
        let review = SubjectAccessReview {
            spec,
            ..Default::default()
        };
        let created = tokio::time::timeout(
            REVIEW_TIMEOUT,
            self.reviews.create(&PostParams::default(), &review),
        )
        .await;
        match created {
            Ok(Ok(result)) => {
                let status = result.status.unwrap_or_default();
                if status.allowed && status.denied != Some(true) {
                    if let Some(key) = key {
                        self.allowed.insert(key, ());
                    }
                    Decision::Allow
                } else {
                    let reason = status.reason.unwrap_or_default();
                    if let Some(key) = key {
                        self.denied.insert(key, reason.clone());
                    }
                    Decision::Deny(reason)
                }
            }
            // No decision: not cached, and not a denial (callers would drop their authority).
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "SubjectAccessReview failed");
                Decision::Unavailable(format!("SubjectAccessReview failed: {e}"))
            }
            Err(_) => {
                tracing::warn!(timeout = ?REVIEW_TIMEOUT, "SubjectAccessReview timed out");
                Decision::Unavailable("SubjectAccessReview timed out".into())
            }
        }
    }
}
