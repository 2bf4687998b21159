//! Gateway authentication for the sync listener (DESIGN §4): a Pod-bound projected
//! service-account token with audience [`GATEWAY_AUDIENCE`], confirmed by TokenReview, then
//! the live Pod → ReplicaSet → Deployment → MCPServer controller chain, every UID checked.
//!
//! The chain must be the one the controllers build for that MCPServer (`controllers/src/
//! mcpserver/desired.rs`): the Deployment is named after the server, carries the controllers'
//! `managed-by` and `mcpserver` labels, and its Pod runs as the server's `<name>-gateway`
//! ServiceAccount. Any other Deployment a namespace member points at the MCPServer (an owner
//! reference anyone with `create deployments` can write) is refused. What stays trusted: whoever
//! may edit the workloads of the server's namespace can edit the controllers' own Deployment
//! (its image, its arguments) and so run anything as that gateway until the controllers restore
//! it; the chain proves "the controllers' Deployment", not "the controllers' image".
//!
//! Kubernetes keeps accepting a bound token for up to a minute after its Pod is gone, so the
//! chain is read from the live objects, never inferred from the token. A verified chain is
//! reused for at most the re-verification period; an open watch re-verifies with
//! [`Freshness::Live`], which bypasses the reuse, so no verdict outlives a deletion by more
//! than that period.

use std::time::Duration;

use apis::runtime::MCPServer;
use async_trait::async_trait;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};

use super::cache::TtlCache;
use super::{sha256, Digest, REVIEW_TIMEOUT};

/// The audience a gateway's projected token must carry, and the only one the sync listener
/// accepts.
pub const GATEWAY_AUDIENCE: &str = "mcp-runtime-gateway";

/// Label naming the component that manages an object, and the controllers' value of it (as
/// `controllers::children` writes them).
const MANAGED_BY_LABEL: &str = "mcp-runtime.dev/managed-by";
const MANAGED_BY: &str = "mcp-access-controllers";
/// Label naming the MCPServer a workload belongs to.
const SERVER_LABEL: &str = "mcp-runtime.dev/mcpserver";

/// The ServiceAccount the controllers run a server's gateway Pod as.
fn gateway_service_account(server: &str) -> String {
    format!("{server}-gateway")
}

/// TokenReview extras of a token bound to a Pod.
const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";

/// Entries of each cache: bounds memory whatever tokens clients send.
const CACHE_CAPACITY: usize = 10_000;

/// How long a refused token stays refused without asking again: absorbs a flood of bad
/// tokens, short enough that a gateway whose chain was just completed gets in quickly.
const REFUSAL_TTL: Duration = Duration::from_secs(2);

/// The MCPServer a gateway serves, established from its token and the live owner chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayIdentity {
    /// The token's user (`system:serviceaccount:<ns>:<name>`).
    pub user: String,
    /// Namespace of the Pod, and so of its chain and of the sessions it may see.
    pub namespace: String,
    pub pod_uid: String,
    pub server_name: String,
    pub server_uid: String,
}

/// Why a gateway is not let in. The messages name no object: a caller must learn nothing
/// about objects it cannot see.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GatewayRefusal {
    #[error("no bearer token")]
    NoToken,
    #[error("the token is not valid for audience {GATEWAY_AUDIENCE}")]
    InvalidToken,
    #[error("the token is not bound to a pod")]
    NotPodBound,
    #[error("the token's pod is not a live gateway of an MCPServer")]
    ChainBroken,
    /// The chain reaches an MCPServer, but not through the workload the controllers made for it.
    #[error("the token's pod is not the gateway the controllers run for its MCPServer")]
    NotControllersWorkload,
    /// The authority that decides is unreachable: not a verdict (503, never cached).
    #[error("gateway authentication is unavailable: {0}")]
    Unavailable(String),
}

/// Whether a verified chain may be reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freshness {
    /// A chain verified within the re-verification period will do (requests).
    Cached,
    /// Read the live objects now (an open watch's periodic re-verification).
    Live,
}

/// Establishes which MCPServer a gateway token belongs to.
#[async_trait]
pub trait GatewayAuthenticator: Send + Sync + 'static {
    async fn authenticate(
        &self,
        token: &str,
        freshness: Freshness,
    ) -> Result<GatewayIdentity, GatewayRefusal>;
}

/// [`GatewayAuthenticator`] against kube-apiserver: TokenReview, then the owner chain.
pub struct PodChainAuthenticator {
    client: kube::Client,
    token_reviews: Api<TokenReview>,
    /// Verified chains by SHA-256 of the token, for at most the re-verification period.
    verified: TtlCache<Digest, GatewayIdentity>,
    refused: TtlCache<Digest, GatewayRefusal>,
}

impl PodChainAuthenticator {
    /// `reverify` bounds how long a verified chain is reused.
    pub fn new(client: kube::Client, reverify: Duration) -> Self {
        Self {
            token_reviews: Api::all(client.clone()),
            client,
            verified: TtlCache::new(reverify, CACHE_CAPACITY),
            refused: TtlCache::new(REFUSAL_TTL.min(reverify), CACHE_CAPACITY),
        }
    }

    /// The Pod a token is bound to, as TokenReview reports it: (namespace, service account,
    /// pod name, pod UID).
    async fn review(&self, token: &str) -> Result<BoundPod, GatewayRefusal> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: Some(vec![GATEWAY_AUDIENCE.to_string()]),
            },
            ..Default::default()
        };
        let result = tokio::time::timeout(
            REVIEW_TIMEOUT,
            self.token_reviews.create(&PostParams::default(), &review),
        )
        .await
        .map_err(|_| GatewayRefusal::Unavailable("TokenReview timed out".into()))?
        .map_err(|e| GatewayRefusal::Unavailable(format!("TokenReview failed: {e}")))?;
        let status = result.status.unwrap_or_default();
        let audience_confirmed = status
            .audiences
            .as_ref()
            .is_some_and(|a| a.iter().any(|a| a == GATEWAY_AUDIENCE));
        if status.authenticated != Some(true) || !audience_confirmed {
            return Err(GatewayRefusal::InvalidToken);
        }
        let user = status.user.unwrap_or_default();
        bound_pod(
            user.username.as_deref().unwrap_or_default(),
            user.extra.unwrap_or_default(),
        )
    }

    /// Follows the live controller chain from the Pod to its MCPServer.
    async fn chain(&self, pod: &BoundPod) -> Result<GatewayIdentity, GatewayRefusal> {
        let ns = pod.namespace.as_str();
        let live: Pod = get(Api::namespaced(self.client.clone(), ns), &pod.name).await?;
        let meta = &live.metadata;
        if meta.uid.as_deref() != Some(pod.uid.as_str()) {
            return Err(GatewayRefusal::ChainBroken);
        }
        let account = live
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref())
            .unwrap_or("default");
        if account != pod.service_account {
            return Err(GatewayRefusal::ChainBroken);
        }
        let rs_ref = controller(meta, "apps/v1", "ReplicaSet")?;
        let rs: ReplicaSet = get(Api::namespaced(self.client.clone(), ns), &rs_ref.name).await?;
        same_uid(&rs.metadata, rs_ref)?;
        let deploy_ref = controller(&rs.metadata, "apps/v1", "Deployment")?;
        let deploy: Deployment =
            get(Api::namespaced(self.client.clone(), ns), &deploy_ref.name).await?;
        same_uid(&deploy.metadata, deploy_ref)?;
        let server_ref = controller(
            &deploy.metadata,
            &format!("{}/v1alpha1", apis::runtime::RUNTIME_GROUP),
            "MCPServer",
        )?;
        controllers_workload(&server_ref.name, &deploy.metadata, account)?;
        let server: MCPServer =
            get(Api::namespaced(self.client.clone(), ns), &server_ref.name).await?;
        same_uid(&server.metadata, server_ref)?;
        // A retiring server's sessions are being fenced: its gateway gets nothing more.
        if server.metadata.deletion_timestamp.is_some() {
            return Err(GatewayRefusal::ChainBroken);
        }
        Ok(GatewayIdentity {
            user: format!("system:serviceaccount:{ns}:{}", pod.service_account),
            namespace: ns.to_string(),
            pod_uid: pod.uid.clone(),
            server_name: server_ref.name.clone(),
            server_uid: server_ref.uid.clone(),
        })
    }
}

#[async_trait]
impl GatewayAuthenticator for PodChainAuthenticator {
    async fn authenticate(
        &self,
        token: &str,
        freshness: Freshness,
    ) -> Result<GatewayIdentity, GatewayRefusal> {
        let key = sha256(token.as_bytes());
        if freshness == Freshness::Cached {
            if let Some(identity) = self.verified.get(&key) {
                return Ok(identity);
            }
            if let Some(refusal) = self.refused.get(&key) {
                return Err(refusal);
            }
        }
        let result = match self.review(token).await {
            Ok(pod) => self.chain(&pod).await.inspect_err(|refusal| {
                tracing::info!(
                    ns = %pod.namespace, pod = %pod.name, %refusal,
                    "gateway refused: owner chain"
                );
            }),
            Err(refusal) => Err(refusal),
        };
        match &result {
            Ok(identity) => self.verified.insert(key, identity.clone()),
            Err(GatewayRefusal::Unavailable(_)) => {}
            Err(refusal) => {
                // A chain that broke must not be served from the cache any more.
                self.verified.remove(&key);
                self.refused.insert(key, refusal.clone());
            }
        }
        result
    }
}

/// The Pod a token is bound to.
#[derive(Debug, PartialEq, Eq)]
struct BoundPod {
    namespace: String,
    service_account: String,
    name: String,
    uid: String,
}

/// Reads the bound Pod from a reviewed token's user: a service account, with exactly one Pod
/// name and one Pod UID in its extras.
fn bound_pod(
    username: &str,
    mut extra: std::collections::BTreeMap<String, Vec<String>>,
) -> Result<BoundPod, GatewayRefusal> {
    let (namespace, service_account) = username
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .filter(|(ns, sa)| !ns.is_empty() && !sa.is_empty() && !sa.contains(':'))
        .ok_or(GatewayRefusal::NotPodBound)?;
    let mut single = |key: &str| match extra.remove(key).as_deref() {
        Some([value]) if !value.is_empty() => Ok(value.clone()),
        _ => Err(GatewayRefusal::NotPodBound),
    };
    Ok(BoundPod {
        name: single(POD_NAME_EXTRA)?,
        uid: single(POD_UID_EXTRA)?,
        namespace: namespace.to_string(),
        service_account: service_account.to_string(),
    })
}

/// The controller owner reference of an object, which must be of the given kind.
fn controller<'m>(
    meta: &'m ObjectMeta,
    api_version: &str,
    kind: &str,
) -> Result<&'m OwnerReference, GatewayRefusal> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .filter(|r| r.api_version == api_version && r.kind == kind)
        .ok_or(GatewayRefusal::ChainBroken)
}

/// The Deployment (controlled by MCPServer `server`) and the Pod's ServiceAccount are the ones
/// the controllers make for that server: the Deployment is named `server` and labelled as its
/// workload by the controllers, the Pod runs as `<server>-gateway`. Checked before the MCPServer
/// is read: a hand-made Deployment pointing at it learns nothing more.
fn controllers_workload(
    server: &str,
    deployment: &ObjectMeta,
    pod_service_account: &str,
) -> Result<(), GatewayRefusal> {
    let label = |key: &str| {
        deployment
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .map(String::as_str)
    };
    let ours = deployment.name.as_deref() == Some(server)
        && label(MANAGED_BY_LABEL) == Some(MANAGED_BY)
        && label(SERVER_LABEL) == Some(server)
        && pod_service_account == gateway_service_account(server);
    if ours {
        Ok(())
    } else {
        Err(GatewayRefusal::NotControllersWorkload)
    }
}

/// The object an owner reference named is the one it was made for (not a namesake).
fn same_uid(meta: &ObjectMeta, reference: &OwnerReference) -> Result<(), GatewayRefusal> {
    if meta.uid.as_deref() == Some(reference.uid.as_str()) {
        Ok(())
    } else {
        Err(GatewayRefusal::ChainBroken)
    }
}

/// Reads one object of the chain: gone is a broken chain; anything else is not a verdict.
async fn get<K>(api: Api<K>, name: &str) -> Result<K, GatewayRefusal>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match tokio::time::timeout(REVIEW_TIMEOUT, api.get_opt(name)).await {
        Ok(Ok(Some(object))) => Ok(object),
        Ok(Ok(None)) => Err(GatewayRefusal::ChainBroken),
        Ok(Err(e)) => Err(GatewayRefusal::Unavailable(format!(
            "cannot read the gateway's owner chain: {e}"
        ))),
        Err(_) => Err(GatewayRefusal::Unavailable(
            "reading the gateway's owner chain timed out".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn extras(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn a_bound_pod_needs_a_service_account_and_exactly_one_pod_name_and_uid() {
        let both = extras(&[(POD_NAME_EXTRA, &["gw-1"]), (POD_UID_EXTRA, &["u-1"])]);
        assert_eq!(
            bound_pod("system:serviceaccount:team:gw", both.clone()),
            Ok(BoundPod {
                namespace: "team".into(),
                service_account: "gw".into(),
                name: "gw-1".into(),
                uid: "u-1".into(),
            })
        );
        for user in [
            "alice",
            "system:serviceaccount:team",
            "system:serviceaccount::gw",
            "system:serviceaccount:team:gw:x",
        ] {
            assert_eq!(
                bound_pod(user, both.clone()),
                Err(GatewayRefusal::NotPodBound),
                "{user}"
            );
        }
        for extra in [
            extras(&[(POD_NAME_EXTRA, &["gw-1"])]),
            extras(&[(POD_UID_EXTRA, &["u-1"])]),
            extras(&[
                (POD_NAME_EXTRA, &["gw-1", "gw-2"]),
                (POD_UID_EXTRA, &["u-1"]),
            ]),
            extras(&[(POD_NAME_EXTRA, &[""]), (POD_UID_EXTRA, &["u-1"])]),
            BTreeMap::new(),
        ] {
            assert_eq!(
                bound_pod("system:serviceaccount:team:gw", extra.clone()),
                Err(GatewayRefusal::NotPodBound),
                "{extra:?}"
            );
        }
    }

    fn owned_by(refs: Vec<OwnerReference>) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(refs),
            ..Default::default()
        }
    }

    fn reference(kind: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: "x".into(),
            uid: "u".into(),
            controller,
            ..Default::default()
        }
    }

    #[test]
    fn only_the_controller_reference_of_the_expected_kind_counts() {
        let meta = owned_by(vec![
            reference("ReplicaSet", None),
            reference("ReplicaSet", Some(true)),
        ]);
        assert!(controller(&meta, "apps/v1", "ReplicaSet").is_ok());
        // An owner that is not the controller does not make a chain.
        let meta = owned_by(vec![reference("ReplicaSet", Some(false))]);
        assert_eq!(
            controller(&meta, "apps/v1", "ReplicaSet"),
            Err(GatewayRefusal::ChainBroken)
        );
        // The controller is of another kind (a bare ReplicaSet under a StatefulSet, say).
        let meta = owned_by(vec![
            reference("StatefulSet", Some(true)),
            reference("ReplicaSet", None),
        ]);
        assert_eq!(
            controller(&meta, "apps/v1", "ReplicaSet"),
            Err(GatewayRefusal::ChainBroken)
        );
        assert_eq!(
            controller(&ObjectMeta::default(), "apps/v1", "ReplicaSet"),
            Err(GatewayRefusal::ChainBroken)
        );
    }

    fn controllers_deployment(name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [
                    ("app", name),
                    (MANAGED_BY_LABEL, MANAGED_BY),
                    (SERVER_LABEL, name),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn the_controllers_deployment_and_service_account_pass() {
        assert_eq!(
            controllers_workload(
                "github",
                &controllers_deployment("github"),
                "github-gateway"
            ),
            Ok(())
        );
    }

    #[test]
    fn a_deployment_of_another_name_is_refused() {
        // Every label right, but not the name the controllers give the server's Deployment.
        let mut meta = controllers_deployment("github");
        meta.name = Some("github-gateway".into());
        assert_eq!(
            controllers_workload("github", &meta, "github-gateway"),
            Err(GatewayRefusal::NotControllersWorkload)
        );
        meta.name = None;
        assert_eq!(
            controllers_workload("github", &meta, "github-gateway"),
            Err(GatewayRefusal::NotControllersWorkload)
        );
    }

    #[test]
    fn a_deployment_without_the_managed_by_label_is_refused() {
        let mut meta = controllers_deployment("github");
        meta.labels.as_mut().unwrap().remove(MANAGED_BY_LABEL);
        assert_eq!(
            controllers_workload("github", &meta, "github-gateway"),
            Err(GatewayRefusal::NotControllersWorkload)
        );
        meta.labels
            .as_mut()
            .unwrap()
            .insert(MANAGED_BY_LABEL.into(), "someone-else".into());
        assert_eq!(
            controllers_workload("github", &meta, "github-gateway"),
            Err(GatewayRefusal::NotControllersWorkload)
        );
    }

    #[test]
    fn a_deployment_labelled_for_another_server_is_refused() {
        let mut meta = controllers_deployment("github");
        meta.labels
            .as_mut()
            .unwrap()
            .insert(SERVER_LABEL.into(), "jira".into());
        assert_eq!(
            controllers_workload("github", &meta, "github-gateway"),
            Err(GatewayRefusal::NotControllersWorkload)
        );
        meta.labels.as_mut().unwrap().remove(SERVER_LABEL);
        assert_eq!(
            controllers_workload("github", &meta, "github-gateway"),
            Err(GatewayRefusal::NotControllersWorkload)
        );
        assert_eq!(
            controllers_workload("github", &ObjectMeta::default(), "github-gateway"),
            Err(GatewayRefusal::NotControllersWorkload)
        );
    }

    #[test]
    fn a_pod_of_another_service_account_is_refused() {
        let meta = controllers_deployment("github");
        for account in ["default", "jira-gateway", "github", "github-gateway-x"] {
            assert_eq!(
                controllers_workload("github", &meta, account),
                Err(GatewayRefusal::NotControllersWorkload),
                "{account}"
            );
        }
    }

    #[test]
    fn a_namesake_with_another_uid_breaks_the_chain() {
        let r = reference("Deployment", Some(true));
        let meta = ObjectMeta {
            uid: Some("other".into()),
            ..Default::default()
        };
        assert_eq!(same_uid(&meta, &r), Err(GatewayRefusal::ChainBroken));
        let meta = ObjectMeta {
            uid: Some("u".into()),
            ..Default::default()
        };
        assert_eq!(same_uid(&meta, &r), Ok(()));
    }
}
