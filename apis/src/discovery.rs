//! Discovery documents for `access.mcp-runtime.dev/v1alpha1`, built from
//! [`RESOURCES`](crate::resources::RESOURCES): the legacy `/apis`, `/apis/<group>` and
//! `/apis/<group>/<version>` documents, and the aggregated discovery v2 form
//! (`apidiscovery.k8s.io/v2`, `APIGroupDiscoveryList`) that the aggregator asks for on `/apis`.
//!
//! Every function here is pure and cheap; callers may serve the values directly.

use serde_json::{json, Map, Value};

use crate::resources::{ResourceInfo, RESOURCES};
use crate::session_token::{
    TOKEN_REQUEST_GROUP, TOKEN_REQUEST_KIND, TOKEN_REQUEST_VERSION, TOKEN_SUBRESOURCE,
};
use crate::types::{API_VERSION, GROUP, VERSION};

/// `apiVersion` of the aggregated discovery documents.
pub const AGGREGATED_DISCOVERY_API_VERSION: &str = "apidiscovery.k8s.io/v2";
/// `kind` of the aggregated discovery documents.
pub const AGGREGATED_DISCOVERY_KIND: &str = "APIGroupDiscoveryList";

/// Verbs served on the `status` subresource (as kube-apiserver serves them).
pub const STATUS_SUBRESOURCE_VERBS: &[&str] = &["get", "patch", "update"];

/// Verbs served on the `token` subresource (as on ServiceAccounts' `token`).
pub const TOKEN_SUBRESOURCE_VERBS: &[&str] = &["create"];

/// Verbs served on a subresource: `get`, `patch` and `update` for `status`; `create` for
/// `token`; only `get` for any other subresource until it is modelled here.
pub fn subresource_verbs(subresource: &str) -> &'static [&'static str] {
    match subresource {
        "status" => STATUS_SUBRESOURCE_VERBS,
        TOKEN_SUBRESOURCE => TOKEN_SUBRESOURCE_VERBS,
        _ => &["get"],
    }
}

/// The group, version and kind a subresource takes and answers when it is not the
/// resource's own kind: `token` speaks `authentication.k8s.io/v1` `TokenRequest`.
pub fn subresource_kind(subresource: &str) -> Option<(&'static str, &'static str, &'static str)> {
    match subresource {
        TOKEN_SUBRESOURCE => Some((
            TOKEN_REQUEST_GROUP,
            TOKEN_REQUEST_VERSION,
            TOKEN_REQUEST_KIND,
        )),
        _ => None,
    }
}

/// The `GroupVersionForDiscovery` of the served version.
fn group_version_for_discovery() -> Value {
    json!({ "groupVersion": API_VERSION, "version": VERSION })
}

/// The group's `APIGroup` body, without `kind`/`apiVersion`.
fn group_body() -> Map<String, Value> {
    let mut group = Map::new();
    group.insert("name".into(), GROUP.into());
    group.insert(
        "versions".into(),
        Value::Array(vec![group_version_for_discovery()]),
    );
    group.insert("preferredVersion".into(), group_version_for_discovery());
    group
}

/// String slice as a JSON array.
fn strings(items: &[&str]) -> Value {
    Value::Array(items.iter().map(|s| Value::from(*s)).collect())
}

/// `/apis` as an `APIGroupList` (`v1`) with the one served group.
pub fn api_group_list() -> Value {
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [Value::Object(group_body())],
    })
}

/// `/apis/access.mcp-runtime.dev` as an `APIGroup` (`v1`).
pub fn api_group() -> Value {
    let mut group = Map::new();
    group.insert("kind".into(), "APIGroup".into());
    group.insert("apiVersion".into(), "v1".into());
    group.extend(group_body());
    Value::Object(group)
}

/// One `APIResource` of an `APIResourceList`: the resource itself.
fn api_resource(resource: &ResourceInfo) -> Value {
    let mut out = Map::new();
    out.insert("name".into(), resource.plural.into());
    out.insert("singularName".into(), resource.singular.into());
    out.insert("namespaced".into(), resource.namespaced.into());
    out.insert("kind".into(), resource.kind.into());
    out.insert("verbs".into(), strings(resource.verbs));
    if !resource.short_names.is_empty() {
        out.insert("shortNames".into(), strings(resource.short_names));
    }
    if !resource.categories.is_empty() {
        out.insert("categories".into(), strings(resource.categories));
    }
    Value::Object(out)
}

/// One `APIResource` of an `APIResourceList` for a subresource (`<plural>/<sub>`).
fn api_subresource(resource: &ResourceInfo, subresource: &str) -> Value {
    match subresource_kind(subresource) {
        Some((group, version, kind)) => json!({
            "name": format!("{}/{}", resource.plural, subresource),
            "singularName": "",
            "namespaced": resource.namespaced,
            "group": group,
            "version": version,
            "kind": kind,
            "verbs": strings(subresource_verbs(subresource)),
        }),
        None => json!({
            "name": format!("{}/{}", resource.plural, subresource),
            "singularName": "",
            "namespaced": resource.namespaced,
            "kind": resource.kind,
            "verbs": strings(subresource_verbs(subresource)),
        }),
    }
}

/// `/apis/access.mcp-runtime.dev/v1alpha1` as an `APIResourceList` (`v1`): every resource of
/// [`RESOURCES`], each followed by one entry per subresource.
pub fn api_resource_list() -> Value {
    api_resource_list_of(RESOURCES)
}

/// The `APIResourceList` of a listener that serves only `served`.
pub fn api_resource_list_of(served: &[ResourceInfo]) -> Value {
    let mut resources = Vec::new();
    for resource in served {
        resources.push(api_resource(resource));
        for sub in resource.subresources {
            resources.push(api_subresource(resource, sub));
        }
    }
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": API_VERSION,
        "resources": resources,
    })
}

/// `responseKind` of aggregated discovery: group and version are empty, meaning "the group
/// version being described", as kube-apiserver serves them.
fn response_kind(kind: &str) -> Value {
    json!({ "group": "", "version": "", "kind": kind })
}

/// One `APIResourceDiscovery`.
fn resource_discovery(resource: &ResourceInfo) -> Value {
    let mut out = Map::new();
    out.insert("resource".into(), resource.plural.into());
    out.insert("responseKind".into(), response_kind(resource.kind));
    out.insert(
        "scope".into(),
        if resource.namespaced {
            "Namespaced"
        } else {
            "Cluster"
        }
        .into(),
    );
    out.insert("singularResource".into(), resource.singular.into());
    out.insert("verbs".into(), strings(resource.verbs));
    if !resource.short_names.is_empty() {
        out.insert("shortNames".into(), strings(resource.short_names));
    }
    if !resource.categories.is_empty() {
        out.insert("categories".into(), strings(resource.categories));
    }
    if !resource.subresources.is_empty() {
        let subresources = resource
            .subresources
            .iter()
            .map(|sub| {
                let response = match subresource_kind(sub) {
                    Some((group, version, kind)) => {
                        json!({ "group": group, "version": version, "kind": kind })
                    }
                    None => response_kind(resource.kind),
                };
                json!({
                    "subresource": sub,
                    "responseKind": response,
                    "verbs": strings(subresource_verbs(sub)),
                })
            })
            .collect();
        out.insert("subresources".into(), Value::Array(subresources));
    }
    Value::Object(out)
}

/// An `APIGroupDiscoveryList` with the given items.
fn group_discovery_list(items: Vec<Value>) -> Value {
    json!({
        "kind": AGGREGATED_DISCOVERY_KIND,
        "apiVersion": AGGREGATED_DISCOVERY_API_VERSION,
        "metadata": {},
        "items": items,
    })
}

/// `/apis` as the aggregated discovery v2 document (`APIGroupDiscoveryList`), served for
/// `Accept: application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList`.
pub fn aggregated_discovery() -> Value {
    aggregated_discovery_of(RESOURCES)
}

/// The aggregated discovery document of a listener that serves only `served`.
pub fn aggregated_discovery_of(served: &[ResourceInfo]) -> Value {
    let resources: Vec<Value> = served.iter().map(resource_discovery).collect();
    group_discovery_list(vec![json!({
        "metadata": { "name": GROUP },
        "versions": [{
            "version": VERSION,
            "resources": resources,
            "freshness": "Current",
        }],
    })])
}

/// `/api` as `APIVersions` with no versions: this server serves no legacy (core) group.
pub fn empty_core_api_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": [],
        "serverAddressByClientCIDRs": [],
    })
}

/// `/api` in the aggregated discovery v2 form: an `APIGroupDiscoveryList` without items.
pub fn empty_aggregated_discovery() -> Value {
    group_discovery_list(Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{ACCESS_SESSIONS, AGENTS, ALL_VERBS, CATEGORY};

    fn verbs(v: &Value) -> Vec<&str> {
        v.as_array()
            .expect("verbs is an array")
            .iter()
            .map(|s| s.as_str().expect("verb is a string"))
            .collect()
    }

    #[test]
    fn group_list_has_the_group_and_preferred_version() {
        let doc = api_group_list();
        assert_eq!(doc["kind"], "APIGroupList");
        assert_eq!(doc["apiVersion"], "v1");
        let groups = doc["groups"].as_array().expect("groups");
        assert_eq!(groups.len(), 1);
        let group = &groups[0];
        assert_eq!(group["name"], GROUP);
        assert_eq!(
            group["versions"],
            json!([{"groupVersion": "access.mcp-runtime.dev/v1alpha1", "version": "v1alpha1"}])
        );
        assert_eq!(
            group["preferredVersion"],
            json!({"groupVersion": "access.mcp-runtime.dev/v1alpha1", "version": "v1alpha1"})
        );
    }

    #[test]
    fn group_is_an_api_group() {
        let doc = api_group();
        assert_eq!(doc["kind"], "APIGroup");
        assert_eq!(doc["apiVersion"], "v1");
        assert_eq!(doc["name"], "access.mcp-runtime.dev");
        assert_eq!(doc["preferredVersion"]["version"], "v1alpha1");
        assert_eq!(doc["versions"][0]["groupVersion"], API_VERSION);
    }

    #[test]
    fn resource_list_lists_every_resource() {
        let doc = api_resource_list();
        assert_eq!(doc["kind"], "APIResourceList");
        assert_eq!(doc["apiVersion"], "v1");
        assert_eq!(doc["groupVersion"], "access.mcp-runtime.dev/v1alpha1");
        let resources = doc["resources"].as_array().expect("resources");
        let expected: usize = RESOURCES.iter().map(|r| 1 + r.subresources.len()).sum();
        assert_eq!(resources.len(), expected);

        let acs = resources
            .iter()
            .find(|r| r["name"] == "accesssessions")
            .expect("accesssessions listed");
        assert_eq!(acs["singularName"], "accesssession");
        assert_eq!(acs["namespaced"], true);
        assert_eq!(acs["kind"], "AccessSession");
        assert_eq!(acs["shortNames"], json!(["acs"]));
        assert_eq!(acs["categories"], json!([CATEGORY]));
        assert_eq!(verbs(&acs["verbs"]), ALL_VERBS);
        assert!(verbs(&acs["verbs"]).contains(&"deletecollection"));

        let agents = resources
            .iter()
            .find(|r| r["name"] == "agents")
            .expect("agents listed");
        assert_eq!(agents["namespaced"], false);
        assert_eq!(agents["kind"], "Agent");
        assert_eq!(agents["singularName"], "agent");
        assert!(
            agents.get("shortNames").is_none(),
            "empty shortNames omitted"
        );
    }

    #[test]
    fn subresources_get_their_own_entries() {
        let status = ResourceInfo {
            subresources: &["status"],
            ..ACCESS_SESSIONS
        };
        let entry = api_subresource(&status, "status");
        assert_eq!(entry["name"], "accesssessions/status");
        assert_eq!(entry["kind"], "AccessSession");
        assert_eq!(entry["namespaced"], true);
        assert_eq!(verbs(&entry["verbs"]), ["get", "patch", "update"]);

        let discovered = resource_discovery(&status);
        assert_eq!(
            discovered["subresources"],
            json!([{
                "subresource": "status",
                "responseKind": {"group": "", "version": "", "kind": "AccessSession"},
                "verbs": ["get", "patch", "update"],
            }])
        );
        let plain = ResourceInfo {
            subresources: &[],
            ..ACCESS_SESSIONS
        };
        assert!(resource_discovery(&plain).get("subresources").is_none());
    }

    #[test]
    fn the_token_subresource_speaks_token_requests() {
        let entry = api_subresource(&ACCESS_SESSIONS, "token");
        assert_eq!(entry["name"], "accesssessions/token");
        assert_eq!(entry["group"], "authentication.k8s.io");
        assert_eq!(entry["version"], "v1");
        assert_eq!(entry["kind"], "TokenRequest");
        assert_eq!(verbs(&entry["verbs"]), ["create"]);
        assert_eq!(
            resource_discovery(&ACCESS_SESSIONS)["subresources"],
            json!([{
                "subresource": "token",
                "responseKind": {"group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest"},
                "verbs": ["create"],
            }])
        );
    }

    #[test]
    fn aggregated_discovery_matches_apidiscovery_v2() {
        let doc = aggregated_discovery();
        assert_eq!(doc["apiVersion"], "apidiscovery.k8s.io/v2");
        assert_eq!(doc["kind"], "APIGroupDiscoveryList");
        let items = doc["items"].as_array().expect("items");
        assert_eq!(items.len(), 1);
        assert_eq!(items[0]["metadata"]["name"], GROUP);
        let versions = items[0]["versions"].as_array().expect("versions");
        assert_eq!(versions.len(), 1);
        assert_eq!(versions[0]["version"], VERSION);
        assert_eq!(versions[0]["freshness"], "Current");
        let resources = versions[0]["resources"].as_array().expect("resources");
        assert_eq!(resources.len(), RESOURCES.len());

        let acs = &resources[0];
        assert_eq!(acs["resource"], ACCESS_SESSIONS.plural);
        assert_eq!(
            acs["responseKind"],
            json!({"group": "", "version": "", "kind": "AccessSession"})
        );
        assert_eq!(acs["scope"], "Namespaced");
        assert_eq!(acs["singularResource"], "accesssession");
        assert_eq!(verbs(&acs["verbs"]), ALL_VERBS);
        assert_eq!(acs["shortNames"], json!(["acs"]));
        assert_eq!(acs["categories"], json!(["mcp-access"]));

        let agents = &resources[1];
        assert_eq!(agents["resource"], AGENTS.plural);
        assert_eq!(agents["scope"], "Cluster");
        assert_eq!(agents["responseKind"]["kind"], "Agent");
        assert!(agents.get("shortNames").is_none());
    }

    #[test]
    fn empty_documents_for_the_core_group() {
        assert_eq!(
            empty_core_api_versions(),
            json!({"kind": "APIVersions", "versions": [], "serverAddressByClientCIDRs": []})
        );
        let empty = empty_aggregated_discovery();
        assert_eq!(empty["apiVersion"], "apidiscovery.k8s.io/v2");
        assert_eq!(empty["kind"], "APIGroupDiscoveryList");
        assert_eq!(empty["items"], json!([]));
    }
}
