//! Deletes that never take someone else's object: only what its owner reference names as
//! the owner's (or what a sweep's plan chose among objects carrying our labels), and only the
//! very object that was seen (a uid precondition, so one re-created meanwhile stays).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Preconditions};
use kube::core::DynamicObject;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

use super::kind::ChildKind;
use super::owner::owned_by;

/// Deletes `name` if it still is the object of `uid`; whether it did (`false`: gone already,
/// or re-created meanwhile and so left alone).
pub async fn delete_exact<K>(
    api: &Api<K>,
    name: &str,
    uid: Option<String>,
) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deletes `owner`'s child `name` of `kind` (in the owner's `namespace`) if it exists and its
/// owner reference names `owner`; whether it did. An object of that name that is not the
/// owner's is left alone.
pub async fn prune_owned<K: Resource<DynamicType = ()>>(
    client: &kube::Client,
    namespace: &str,
    kind: ChildKind,
    name: &str,
    owner: &K,
) -> Result<bool, kube::Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &kind.api_resource());
    let Some(live) = api.get_metadata_opt(name).await? else {
        return Ok(false);
    };
    if !owned_by(&live.metadata, owner) {
        return Ok(false);
    }
    delete_exact(&api, name, live.metadata.uid.clone()).await
}

/// The metadata of every object of `kind`, in all namespaces, matching `selector` (built
/// with [`super::managed_selector`]).
pub async fn list_managed(
    client: &kube::Client,
    kind: ChildKind,
    selector: &str,
) -> Result<Vec<ObjectMeta>, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &kind.api_resource());
    let list = api
        .list_metadata(&ListParams::default().labels(selector))
        .await?;
    Ok(list.items.into_iter().map(|o| o.metadata).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    use apis::runtime::{Host, HostSpec, LocalRef};
    use http::{Request, Response, StatusCode};
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    use serde_json::{json, Value};

    const PATH: &str = "/apis/apps/v1/namespaces/team/deployments/agent";

    /// A kube-apiserver holding at most one Deployment `team/agent`, answering deletes with
    /// `delete_status`; every request is logged as `METHOD path body`.
    #[derive(Default)]
    struct World {
        live: Option<Value>,
        delete_status: u16,
        log: Vec<String>,
    }

    fn status(code: u16) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
               "status": if code == 200 { "Success" } else { "Failure" }, "code": code,
               "message": format!("code {code}"),
               "reason": if code == 404 { "NotFound" } else { "Test" }})
    }

    fn client(world: Arc<Mutex<World>>) -> kube::Client {
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let world = world.clone();
            async move {
                let (parts, body) = request.into_parts();
                let body = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let mut w = world.lock().unwrap();
                w.log.push(format!(
                    "{} {} {}",
                    parts.method,
                    parts.uri.path(),
                    String::from_utf8_lossy(&body)
                ));
                let (code, answer) = match (parts.method.as_str(), &w.live) {
                    (_, _) if parts.uri.path() != PATH => (404, status(404)),
                    ("GET", Some(live)) => (200, live.clone()),
                    ("DELETE", Some(_)) if w.delete_status == 200 => (200, status(200)),
                    ("DELETE", Some(_)) => (w.delete_status, status(w.delete_status)),
                    _ => (404, status(404)),
                };
                let mut response = Response::new(Full::new(Bytes::from(answer.to_string())));
                *response.status_mut() = StatusCode::from_u16(code).unwrap();
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        kube::Client::new(service, "default")
    }

    fn mk_host(uid: &str) -> Host {
        let mut h = Host::new(
            "agent",
            HostSpec {
                context_ref: LocalRef { name: "dev".into() },
                image: "img".into(),
                resources: None,
                secret_ref: None,
                workspace_size: None,
            },
        );
        h.metadata.namespace = Some("team".into());
        h.metadata.uid = Some(uid.into());
        h
    }

    fn deployment(owner_uid: &str) -> Value {
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
               "metadata": {"name": "agent", "namespace": "team", "uid": "d1",
                   "ownerReferences": [{"apiVersion": "mcp-runtime.dev/v1alpha1", "kind": "Host",
                       "name": "agent", "uid": owner_uid, "controller": true}]}})
    }

    async fn prune(world: &Arc<Mutex<World>>, host: &Host) -> Result<bool, kube::Error> {
        let client = client(world.clone());
        prune_owned(&client, "team", ChildKind::Deployment, "agent", host).await
    }

    fn deletes(world: &Arc<Mutex<World>>) -> Vec<String> {
        let w = world.lock().unwrap();
        w.log
            .iter()
            .filter(|l| l.starts_with("DELETE"))
            .cloned()
            .collect()
    }

    #[tokio::test]
    async fn only_the_owners_own_child_is_pruned_and_only_as_seen() {
        let world = Arc::new(Mutex::new(World {
            live: Some(deployment("u1")),
            delete_status: 200,
            ..World::default()
        }));
        assert!(prune(&world, &mk_host("u1")).await.unwrap());
        let deleted = deletes(&world);
        assert_eq!(deleted.len(), 1, "{deleted:?}");
        assert!(
            deleted[0].starts_with(&format!("DELETE {PATH} ")),
            "{deleted:?}"
        );
        assert!(
            deleted[0].contains(r#""preconditions":{"uid":"d1"}"#),
            "{deleted:?}"
        );

        // The same name under the Host's previous uid (a re-created Host): left alone.
        let world = Arc::new(Mutex::new(World {
            live: Some(deployment("u0")),
            delete_status: 200,
            ..World::default()
        }));
        assert!(!prune(&world, &mk_host("u1")).await.unwrap());
        assert!(deletes(&world).is_empty());

        // Absent: nothing to delete.
        let world = Arc::new(Mutex::new(World::default()));
        assert!(!prune(&world, &mk_host("u1")).await.unwrap());
        assert!(deletes(&world).is_empty());
    }

    #[tokio::test]
    async fn a_child_gone_or_replaced_meanwhile_is_not_an_error() {
        for (code, result) in [(404, Some(false)), (409, Some(false)), (500, None)] {
            let world = Arc::new(Mutex::new(World {
                live: Some(deployment("u1")),
                delete_status: code,
                ..World::default()
            }));
            let pruned = prune(&world, &mk_host("u1")).await;
            assert_eq!(pruned.ok(), result, "{code}");
            assert_eq!(deletes(&world).len(), 1, "{code}");
        }
    }
}
