//! Delegated authorization: a SubjectAccessReview per decision, allowed and denied results
//! cached separately, `system:masters` short-circuited (DESIGN §4).

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::cache::TtlCache;
use super::{Attributes, Authorizer, Decision, UserInfo};

/// Group that is always allowed, as in kube-apiserver.
pub const MASTERS_GROUP: &str = "system:masters";

/// Authorizes through the cluster's SubjectAccessReview API.
pub struct SubjectAccessReviewer {
    reviews: Api<SubjectAccessReview>,
    allowed: TtlCache<String, ()>,
    denied: TtlCache<String, String>,
}

impl SubjectAccessReviewer {
    pub fn new(client: kube::Client, allow_ttl: Duration, deny_ttl: Duration) -> Self {
        Self {
            reviews: Api::all(client),
            allowed: TtlCache::new(allow_ttl, 10_000),
            denied: TtlCache::new(deny_ttl, 10_000),
        }
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
        let key = serde_json::to_string(&spec).unwrap_or_default();
        if self.allowed.get(&key).is_some() {
            return Decision::Allow;
        }
        if let Some(reason) = self.denied.get(&key) {
            return Decision::Deny(reason);
        }
        let review = SubjectAccessReview {
            spec,
            ..Default::default()
        };
        match self.reviews.create(&PostParams::default(), &review).await {
            Ok(result) => {
                let status = result.status.unwrap_or_default();
                if status.allowed && status.denied != Some(true) {
                    self.allowed.insert(key, ());
                    Decision::Allow
                } else {
                    let reason = status.reason.unwrap_or_default();
                    self.denied.insert(key, reason.clone());
                    Decision::Deny(reason)
                }
            }
            // Errors are not cached, and fail closed.
            Err(e) => {
                tracing::warn!(error = %e, "SubjectAccessReview failed");
                Decision::Deny("authorization check failed".into())
            }
        }
    }
}
