//! Namespace lifecycle admission, as kube-apiserver's NamespaceLifecycle plugin does it:
//! objects are created only in namespaces that exist and are not terminating.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store as ReflectorStore};
use kube::runtime::{watcher, WatchStreamExt};

/// Why a namespace does not accept new objects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespaceRefusal {
    #[error("namespaces {0:?} not found")]
    NotFound(String),
    #[error("unable to create new content in namespace {0} because it is being terminated")]
    Terminating(String),
    #[error("namespace {0:?} cannot be checked: {1}")]
    Unavailable(String, String),
}

/// Knows the cluster's namespaces from a reflector (falling back to a live read while the
/// reflector has not synced, or for a namespace it has not seen yet).
pub struct NamespaceLifecycle {
    api: Api<Namespace>,
    cache: ReflectorStore<Namespace>,
}

impl NamespaceLifecycle {
    /// Starts the reflector; the returned future must be polled (spawned) for it to run.
    pub fn start(
        client: kube::Client,
    ) -> (Arc<Self>, impl std::future::Future<Output = ()> + Send) {
        let api: Api<Namespace> = Api::all(client);
        let (reader, writer) = reflector::store();
        let stream = watcher::watcher(api.clone(), watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .applied_objects();
        let run = async move {
            let mut stream = stream.boxed();
            while let Some(item) = stream.next().await {
                if let Err(e) = item {
                    tracing::warn!(error = %e, "namespace watch failed; retrying");
                }
            }
        };
        (Arc::new(Self { api, cache: reader }), run)
    }

    /// Refuses creation in a missing or terminating namespace.
    pub async fn check_create(&self, namespace: &str) -> Result<(), NamespaceRefusal> {
        let cached = self.cache.get(&ObjectRef::new(namespace));
        let ns = match cached {
            Some(ns) => Some((*ns).clone()),
            // Not seen (yet): ask the cluster, briefly.
            None => match tokio::time::timeout(Duration::from_secs(5), self.api.get_opt(namespace))
                .await
            {
                Ok(Ok(ns)) => ns,
                Ok(Err(e)) => {
                    return Err(NamespaceRefusal::Unavailable(
                        namespace.into(),
                        e.to_string(),
                    ))
                }
                Err(_) => {
                    return Err(NamespaceRefusal::Unavailable(
                        namespace.into(),
                        "timed out".into(),
                    ))
                }
            },
        };
        match ns {
            None => Err(NamespaceRefusal::NotFound(namespace.into())),
            Some(ns)
                if ns.metadata.deletion_timestamp.is_some()
                    || ns.status.as_ref().and_then(|s| s.phase.as_deref())
                        == Some("Terminating") =>
            {
                Err(NamespaceRefusal::Terminating(namespace.into()))
            }
            Some(_) => Ok(()),
        }
    }
}
