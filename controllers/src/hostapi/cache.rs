//! The watch caches the Host API answers from: Hosts, Contexts, MCPServers, the controllers'
//! host AccessSessions, and Namespaces and Secrets as metadata only (Secret values are never
//! listed or watched; the credential endpoint GETs the one Secret it hands out).
//!
//! Every replica has its own caches (the API is not leader-gated). Nothing is answered before
//! all of them hold a complete first list ([`Caches::synced`]); after that a watch that breaks
//! is resumed with backoff, and answers come from the last state it delivered.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use apis::runtime::{Context, Host, MCPServer};
use apis::types::AccessSession;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;

use crate::children::{MANAGED_BY, MANAGED_BY_LABEL};
use crate::host::sessions::HOST_UID_LABEL;

/// Read handles on the caches; cheap to clone.
#[derive(Clone)]
pub struct Caches {
    pub hosts: Store<Host>,
    pub contexts: Store<Context>,
    pub servers: Store<MCPServer>,
    /// Only the sessions the controllers manage (their managed-by label).
    pub sessions: Store<AccessSession>,
    /// Metadata only: uid and resourceVersion feed `credentialRevision`.
    pub secrets: Store<PartialObjectMeta<Secret>>,
    /// Metadata only: the labels a server's `allowedContexts` selector may ask for.
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    synced: Arc<AtomicBool>,
}

/// The write side of [`Caches`]: what the watches (or a test) feed.
pub struct Writers {
    pub hosts: reflector::store::Writer<Host>,
    pub contexts: reflector::store::Writer<Context>,
    pub servers: reflector::store::Writer<MCPServer>,
    pub sessions: reflector::store::Writer<AccessSession>,
    pub secrets: reflector::store::Writer<PartialObjectMeta<Secret>>,
    pub namespaces: reflector::store::Writer<PartialObjectMeta<Namespace>>,
}

impl Caches {
    /// Empty, unsynced caches and their writers.
    pub fn new() -> (Self, Writers) {
        let (hosts, hosts_w) = reflector::store();
        let (contexts, contexts_w) = reflector::store();
        let (servers, servers_w) = reflector::store();
        let (sessions, sessions_w) = reflector::store();
        let (secrets, secrets_w) = reflector::store();
        let (namespaces, namespaces_w) = reflector::store();
        (
            Self {
                hosts,
                contexts,
                servers,
                sessions,
                secrets,
                namespaces,
                synced: Arc::default(),
            },
            Writers {
                hosts: hosts_w,
                contexts: contexts_w,
                servers: servers_w,
                sessions: sessions_w,
                secrets: secrets_w,
                namespaces: namespaces_w,
            },
        )
    }

    /// Whether every cache has held a complete list.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Marks the caches synced once every store is ready; returns an error if a writer was
    /// dropped first.
    pub async fn mark_synced_when_ready(&self) -> anyhow::Result<()> {
        let (a, b, c, d, e, f) = tokio::join!(
            self.hosts.wait_until_ready(),
            self.contexts.wait_until_ready(),
            self.servers.wait_until_ready(),
            self.sessions.wait_until_ready(),
            self.secrets.wait_until_ready(),
            self.namespaces.wait_until_ready(),
        );
        for ready in [a, b, c, d, e, f] {
            ready.map_err(|e| anyhow::anyhow!("a Host API cache was dropped: {e}"))?;
        }
        self.synced.store(true, Ordering::Release);
        tracing::info!("Host API caches synced");
        Ok(())
    }

    /// The Host `namespace/name`, as cached.
    pub fn host(&self, namespace: &str, name: &str) -> Option<Arc<Host>> {
        self.hosts.get(&ObjectRef::new(name).within(namespace))
    }

    /// The Context `namespace/name`, as cached.
    pub fn context(&self, namespace: &str, name: &str) -> Option<Arc<Context>> {
        self.contexts.get(&ObjectRef::new(name).within(namespace))
    }

    /// The MCPServer `namespace/name`, as cached.
    pub fn server(&self, namespace: &str, name: &str) -> Option<Arc<MCPServer>> {
        self.servers.get(&ObjectRef::new(name).within(namespace))
    }

    /// The metadata of Secret `namespace/name`, as cached.
    pub fn secret(&self, namespace: &str, name: &str) -> Option<Arc<PartialObjectMeta<Secret>>> {
        self.secrets.get(&ObjectRef::new(name).within(namespace))
    }

    /// The labels of namespace `name`, as cached; `None` when it is not in the cache.
    pub fn namespace_labels(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.namespaces
            .get(&ObjectRef::new(name))
            .map(|n| n.metadata.labels.clone().unwrap_or_default())
    }

    /// The cached sessions of the Host of UID `host_uid` in `namespace` (the server's).
    pub fn host_sessions(&self, namespace: &str, host_uid: &str) -> Vec<Arc<AccessSession>> {
        self.sessions.state_filter(|s| {
            s.metadata.namespace.as_deref() == Some(namespace)
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(HOST_UID_LABEL))
                    .map(String::as_str)
                    == Some(host_uid)
        })
    }
}

/// Drives every watch into `writers` and marks `caches` synced once all have listed; returns
/// (an error naming it) only if a watch ends, which it does not while the process runs.
pub async fn run(client: kube::Client, caches: Caches, writers: Writers) -> anyhow::Result<()> {
    let managed = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let mut watches = tokio::task::JoinSet::new();
    watches.spawn(follow(
        "Hosts",
        watcher(Api::<Host>::all(client.clone()), Default::default())
            .default_backoff()
            .reflect(writers.hosts),
    ));
    watches.spawn(follow(
        "Contexts",
        watcher(Api::<Context>::all(client.clone()), Default::default())
            .default_backoff()
            .reflect(writers.contexts),
    ));
    watches.spawn(follow(
        "MCPServers",
        watcher(Api::<MCPServer>::all(client.clone()), Default::default())
            .default_backoff()
            .reflect(writers.servers),
    ));
    watches.spawn(follow(
        "AccessSessions",
        watcher(Api::<AccessSession>::all(client.clone()), managed)
            .default_backoff()
            .reflect(writers.sessions),
    ));
    watches.spawn(follow(
        "Secrets",
        // `Api<PartialObjectMeta<_>>` lists and watches metadata only (PartialObjectMetadata).
        watcher(
            Api::<PartialObjectMeta<Secret>>::all(client.clone()),
            Default::default(),
        )
        .default_backoff()
        .reflect(writers.secrets),
    ));
    watches.spawn(follow(
        "Namespaces",
        watcher(
            Api::<PartialObjectMeta<Namespace>>::all(client),
            Default::default(),
        )
        .default_backoff()
        .reflect(writers.namespaces),
    ));
    tokio::select! {
        ended = watches.join_next() => match ended {
            Some(Ok(what)) => anyhow::bail!("the Host API's {what} watch ended"),
            Some(Err(e)) => anyhow::bail!("a Host API watch failed: {e}"),
            None => anyhow::bail!("the Host API has no watches"),
        },
        synced = caches.mark_synced_when_ready() => {
            synced?;
            match watches.join_next().await {
                Some(Ok(what)) => anyhow::bail!("the Host API's {what} watch ended"),
                Some(Err(e)) => anyhow::bail!("a Host API watch failed: {e}"),
                None => anyhow::bail!("the Host API has no watches"),
            }
        }
    }
}

/// Drives one reflector, logging its errors (the watcher retries with backoff); returns its
/// name if the stream ends.
async fn follow<S, K>(what: &'static str, stream: S) -> &'static str
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        if let Err(e) = event {
            tracing::warn!(error = %e, watch = what, "Host API watch failed; retrying");
        }
    }
    what
}

#[cfg(test)]
pub mod testing {
    //! Caches filled by hand: a whole list per kind, as a watch's first list delivers it.

    use super::*;

    /// Replaces the whole content of `writer` with `objects` (a relist), marking it ready.
    pub fn relist<K>(writer: &mut reflector::store::Writer<K>, objects: Vec<K>)
    where
        K: kube::Resource + Clone + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        writer.apply_watcher_event(&watcher::Event::Init);
        for o in objects {
            writer.apply_watcher_event(&watcher::Event::InitApply(o));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
    }

    /// Marks `caches` synced (its stores must be ready).
    pub fn mark_synced(caches: &Caches) {
        caches.synced.store(true, Ordering::Release);
    }
}
