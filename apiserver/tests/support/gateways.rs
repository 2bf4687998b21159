//! Gateways by token, for tests of the sync listener: who a gateway is comes from this table
//! (kube-apiserver's TokenReview and the live owner chain are exercised end to end in
//! `e2e/tests/cluster/gateway_*.rs`). Each token is a Pod of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use apiserver::auth::{Freshness, GatewayAuthenticator, GatewayIdentity, GatewayRefusal};
use async_trait::async_trait;

#[derive(Default)]
pub struct Gateways(Mutex<HashMap<String, GatewayIdentity>>);

impl Gateways {
    /// Gateways of `(token, namespace, server uid)`.
    pub fn with(gateways: &[(&str, &str, &str)]) -> Arc<Self> {
        let me = Arc::new(Self::default());
        for (token, ns, server_uid) in gateways {
            me.add(token, ns, server_uid);
        }
        me
    }

    /// A gateway of `server_uid` (an MCPServer named `github`) in `ns`, known by `token`.
    pub fn add(&self, token: &str, ns: &str, server_uid: &str) {
        self.add_named(token, ns, "github", server_uid);
    }

    /// A gateway of the MCPServer `server_name` of `server_uid` in `ns`, known by `token`.
    pub fn add_named(&self, token: &str, ns: &str, server_name: &str, server_uid: &str) {
        self.table().insert(
            token.to_string(),
            GatewayIdentity {
                user: format!("system:serviceaccount:{ns}:gw"),
                namespace: ns.to_string(),
                pod_uid: format!("pod-of-{token}"),
                server_name: server_name.to_string(),
                server_uid: server_uid.to_string(),
            },
        );
    }

    /// Takes `token`'s owner chain away: it is no gateway any more.
    pub fn break_chain(&self, token: &str) {
        self.table().remove(token);
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, GatewayIdentity>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl GatewayAuthenticator for Gateways {
    async fn authenticate(
        &self,
        token: &str,
        _freshness: Freshness,
    ) -> Result<GatewayIdentity, GatewayRefusal> {
        self.table()
            .get(token)
            .cloned()
            .ok_or(GatewayRefusal::ChainBroken)
    }
}
