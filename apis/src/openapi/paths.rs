//! Paths, operations and parameters of the group version, as kube-apiserver publishes them.

use std::borrow::Cow;

use serde_json::{json, Map, Value};

use super::{definition_name, foreign_definition_name, gvk, v3_ref, META_V1, V2_REF_PREFIX};
use crate::discovery::{subresource_kind, subresource_verbs};
use crate::resources::{ResourceInfo, RESOURCES};
use crate::types::{API_VERSION, GROUP, VERSION};

/// Request content types of PATCH operations on a resource, server-side apply
/// (`application/apply-patch+yaml`) included, as kube-apiserver lists them.
pub const PATCH_CONTENT_TYPES: &[&str] = &[
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
];

/// Request content types of PATCH on a `status` subresource: server-side apply of a status
/// is not served.
pub const STATUS_PATCH_CONTENT_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
];

const JSON: &str = "application/json";
const JSON_WATCH: &str = "application/json;stream=watch";

/// Which OpenAPI version to render.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Dialect {
    V2,
    V3,
}

/// Where a parameter goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum In {
    Path,
    Query,
}

/// One parameter of a path or operation.
#[derive(Clone)]
struct Param {
    name: &'static str,
    location: In,
    ty: &'static str,
    description: Cow<'static, str>,
}

impl Param {
    const fn query(name: &'static str, ty: &'static str, description: &'static str) -> Self {
        Self {
            name,
            location: In::Query,
            ty,
            description: Cow::Borrowed(description),
        }
    }

    fn render(&self, dialect: Dialect) -> Value {
        let location = match self.location {
            In::Path => "path",
            In::Query => "query",
        };
        let mut out = Map::new();
        out.insert("name".into(), self.name.into());
        out.insert("in".into(), location.into());
        out.insert("description".into(), self.description.as_ref().into());
        if self.location == In::Path {
            out.insert("required".into(), true.into());
        }
        let mut ty = Map::new();
        ty.insert("type".into(), self.ty.into());
        ty.insert("uniqueItems".into(), true.into());
        match dialect {
            Dialect::V3 => {
                out.insert("schema".into(), Value::Object(ty));
            }
            Dialect::V2 => out.extend(ty),
        }
        Value::Object(out)
    }
}

const PRETTY: Param = Param::query("pretty", "string", "If 'true', then the output is pretty printed. Defaults to 'false' unless the user-agent indicates a browser or command-line HTTP tool (curl and wget).");
const ALLOW_WATCH_BOOKMARKS: Param = Param::query("allowWatchBookmarks", "boolean", "allowWatchBookmarks requests watch events with type \"BOOKMARK\". Servers that do not implement bookmarks may ignore this flag and bookmarks are sent at the server's discretion. Clients should not assume bookmarks are returned at any specific interval, nor may they assume the server will send any BOOKMARK event during a session. If this is not a watch, this field is ignored.");
const CONTINUE: Param = Param::query("continue", "string", "The continue option should be set when retrieving more results from the server. Since this value is server defined, clients may only use the continue value from a previous query result with identical query parameters (except for the value of continue) and the server may reject a continue value it does not recognize. If the specified continue value is no longer valid the server will respond with a 410 ResourceExpired error. This field is not supported when watch is true.");
const FIELD_SELECTOR: Param = Param::query(
    "fieldSelector",
    "string",
    "A selector to restrict the list of returned objects by their fields. Defaults to everything.",
);
const LABEL_SELECTOR: Param = Param::query(
    "labelSelector",
    "string",
    "A selector to restrict the list of returned objects by their labels. Defaults to everything.",
);
const LIMIT: Param = Param::query("limit", "integer", "limit is a maximum number of responses to return for a list call. If more items exist, the server will set the `continue` field on the list metadata to a value that can be used with the same initial query to retrieve the next set of results. The server guarantees that the objects returned when using continue will be identical to issuing a single list call without a limit.");
const RESOURCE_VERSION: Param = Param::query("resourceVersion", "string", "resourceVersion sets a constraint on what resource versions a request may be served from. See https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions for details.\n\nDefaults to unset");
const RESOURCE_VERSION_MATCH: Param = Param::query("resourceVersionMatch", "string", "resourceVersionMatch determines how resourceVersion is applied to list calls. It is highly recommended that resourceVersionMatch be set for list calls where resourceVersion is set See https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions for details.\n\nDefaults to unset");
const SEND_INITIAL_EVENTS: Param = Param::query("sendInitialEvents", "boolean", "`sendInitialEvents=true` may be set together with `watch=true`. In that case, the watch stream will begin with synthetic events to produce the current state of objects in the collection. Once all such events have been sent, a synthetic \"Bookmark\" event will be sent. The bookmark will report the ResourceVersion (RV) corresponding to the set of objects, and be marked with `\"k8s.io/initial-events-end\": \"true\"` annotation. Afterwards, the watch stream will proceed as usual, sending watch events corresponding to changes (subsequent to the RV) to objects watched.\n\nWhen `sendInitialEvents` option is set, we require `resourceVersionMatch` option to also be set.");
const TIMEOUT_SECONDS: Param = Param::query("timeoutSeconds", "integer", "Timeout for the list/watch call. This limits the duration of the call, regardless of any activity or inactivity.");
const WATCH: Param = Param::query("watch", "boolean", "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications. Specify resourceVersion.");
const DRY_RUN: Param = Param::query("dryRun", "string", "When present, indicates that modifications should not be persisted. An invalid or unrecognized dryRun directive will result in an error response and no further processing of the request. Valid values are: - All: all dry run stages will be processed");
const FIELD_MANAGER: Param = Param::query("fieldManager", "string", "fieldManager is a name associated with the actor or entity that is making these changes. The value must be less than or 128 characters long, and only contain printable characters, as defined by https://golang.org/pkg/unicode/#IsPrint.");
const FIELD_VALIDATION: Param = Param::query("fieldValidation", "string", "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore: This will ignore any unknown fields that are silently dropped from the object, and will ignore all but the last duplicate field that the decoder encounters. - Warn: This will send a warning via the standard warning response header for each unknown field that is dropped from the object, and for each duplicate field that is encountered. The request will still succeed if there are no other errors, and will only persist the last of any duplicate fields. This is the default. - Strict: This will fail the request with a BadRequest error if any unknown fields would be dropped from the object, or if any duplicate fields are present. The error returned from the server will contain all unknown and duplicate fields encountered.");
const FORCE: Param = Param::query("force", "boolean", "Force is going to \"force\" Apply requests. It means user will re-acquire conflicting fields owned by other people. Force flag must be unset for non-apply patch requests.");
const GRACE_PERIOD_SECONDS: Param = Param::query("gracePeriodSeconds", "integer", "The duration in seconds before the object should be deleted. Value must be non-negative integer. The value zero indicates delete immediately. If this value is nil, the default grace period for the specified type will be used.");
const ORPHAN_DEPENDENTS: Param = Param::query("orphanDependents", "boolean", "Deprecated: please use the PropagationPolicy, this field will be deprecated in 1.7. Should the dependent objects be orphaned. If true/false, the \"orphan\" finalizer will be added to/removed from the object's finalizers list. Either this field or PropagationPolicy may be set, but not both.");
const PROPAGATION_POLICY: Param = Param::query("propagationPolicy", "string", "Whether and how garbage collection will be performed. Either this field or OrphanDependents may be set, but not both. The default policy is decided by the existing finalizer set in the metadata.finalizers and the resource-specific default policy. Acceptable values are: 'Orphan' - orphan the dependents; 'Background' - allow the garbage collector to delete the dependents in the background; 'Foreground' - a cascading policy that deletes all dependents in the foreground.");

fn namespace_param() -> Param {
    Param {
        name: "namespace",
        location: In::Path,
        ty: "string",
        description: Cow::Borrowed("object name and auth scope, such as for teams and projects"),
    }
}

fn name_param(kind: &str) -> Param {
    Param {
        name: "name",
        location: In::Path,
        ty: "string",
        description: Cow::Owned(format!("name of the {kind}")),
    }
}

/// Query parameters of list (and watch) calls.
fn list_params(resource: &ResourceInfo) -> Vec<Param> {
    let watch = resource.verbs.contains(&"watch");
    let mut params = Vec::new();
    if watch {
        params.push(ALLOW_WATCH_BOOKMARKS);
    }
    params.extend([
        CONTINUE,
        FIELD_SELECTOR,
        LABEL_SELECTOR,
        LIMIT,
        RESOURCE_VERSION,
        RESOURCE_VERSION_MATCH,
    ]);
    if watch {
        params.push(SEND_INITIAL_EVENTS);
    }
    params.push(TIMEOUT_SECONDS);
    if watch {
        params.push(WATCH);
    }
    params
}

/// Query parameters of create, replace and patch calls.
fn write_params() -> Vec<Param> {
    vec![DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION]
}

/// Query parameters of delete calls.
fn delete_params() -> Vec<Param> {
    vec![
        DRY_RUN,
        GRACE_PERIOD_SECONDS,
        ORPHAN_DEPENDENTS,
        PROPAGATION_POLICY,
    ]
}

/// Query parameters of deletecollection calls.
fn delete_collection_params() -> Vec<Param> {
    vec![
        CONTINUE,
        DRY_RUN,
        FIELD_SELECTOR,
        GRACE_PERIOD_SECONDS,
        LABEL_SELECTOR,
        LIMIT,
        ORPHAN_DEPENDENTS,
        PROPAGATION_POLICY,
        RESOURCE_VERSION,
        RESOURCE_VERSION_MATCH,
        SEND_INITIAL_EVENTS,
        TIMEOUT_SECONDS,
    ]
}

/// A request body.
struct Body {
    schema: String,
    content_types: &'static [&'static str],
    required: bool,
}

impl Body {
    /// A JSON body of schema `schema`.
    fn json(schema: String, required: bool) -> Self {
        Self {
            schema,
            content_types: &[JSON],
            required,
        }
    }
}

/// One response of an operation.
struct Response {
    code: &'static str,
    description: &'static str,
    /// Schema name and the content types it is served as.
    schema: Option<(String, &'static [&'static str])>,
}

impl Response {
    fn unauthorized() -> Self {
        Self {
            code: "401",
            description: "Unauthorized",
            schema: None,
        }
    }

    fn json(code: &'static str, description: &'static str, schema: String) -> Self {
        Self {
            code,
            description,
            schema: Some((schema, &[JSON])),
        }
    }
}

/// One operation of a path.
struct Operation {
    method: &'static str,
    action: &'static str,
    operation_id: String,
    description: String,
    params: Vec<Param>,
    body: Option<Body>,
    responses: Vec<Response>,
    /// `x-kubernetes-group-version-kind` (group, version, kind); `None` for operations on no
    /// kind.
    gvk: Option<(&'static str, &'static str, &'static str)>,
}

/// A path with its path-level parameters and operations.
struct PathItem {
    path: String,
    params: Vec<Param>,
    operations: Vec<Operation>,
}

/// `AccessMcpRuntimeDevV1alpha1`: the group and version as operation ids spell them.
pub(super) fn operation_group_version() -> String {
    let mut out = String::new();
    for word in GROUP.split(['.', '-']) {
        out.push_str(&capitalize(word));
    }
    out.push_str(&capitalize(VERSION));
    out
}

/// `accessMcpRuntimeDev_v1alpha1`: the tag of every operation of the group version.
pub(super) fn tag() -> String {
    let mut group = String::new();
    for (i, word) in GROUP.split(['.', '-']).enumerate() {
        if i == 0 {
            group.push_str(word);
        } else {
            group.push_str(&capitalize(word));
        }
    }
    format!("{group}_{VERSION}")
}

fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// `a` or `an` before a kind.
fn article(kind: &str) -> &'static str {
    match kind.chars().next().map(|c| c.to_ascii_lowercase()) {
        Some('a' | 'e' | 'i' | 'o' | 'u') => "an",
        _ => "a",
    }
}

/// Every path of the group version.
fn paths() -> Vec<PathItem> {
    let gv = operation_group_version();
    let base = format!("/apis/{API_VERSION}");
    let mut items = vec![PathItem {
        path: format!("{base}/"),
        params: Vec::new(),
        operations: vec![Operation {
            method: "get",
            action: "",
            operation_id: format!("get{gv}APIResources"),
            description: "get available resources".into(),
            params: Vec::new(),
            body: None,
            responses: vec![
                Response::json("200", "OK", format!("{META_V1}APIResourceList")),
                Response::unauthorized(),
            ],
            gvk: None,
        }],
    }];
    for resource in RESOURCES {
        items.extend(resource_paths(resource, &gv, &base));
    }
    items
}

/// The paths of one resource: collection, item, subresources and (namespaced) the
/// all-namespaces list.
fn resource_paths(resource: &ResourceInfo, gv: &str, base: &str) -> Vec<PathItem> {
    let kind = resource.kind;
    let has = |verb: &str| resource.verbs.contains(&verb);
    let object = definition_name(kind);
    let list = definition_name(resource.list_kind);
    let status = format!("{META_V1}Status");
    let scope = if resource.namespaced {
        "Namespaced"
    } else {
        ""
    };
    let collection_path = if resource.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}", resource.plural)
    } else {
        format!("{base}/{}", resource.plural)
    };
    let scope_params = || {
        let mut params = Vec::new();
        if resource.namespaced {
            params.push(namespace_param());
        }
        params.push(PRETTY);
        params
    };
    let list_operation = |operation_id: String| Operation {
        method: "get",
        action: "list",
        operation_id,
        description: format!("list or watch objects of kind {kind}"),
        params: list_params(resource),
        body: None,
        responses: vec![
            Response {
                code: "200",
                description: "OK",
                schema: Some((list.clone(), &[JSON, JSON_WATCH])),
            },
            Response::unauthorized(),
        ],
        gvk: Some((GROUP, VERSION, kind)),
    };

    let mut paths = Vec::new();

    // Collection.
    let mut operations = Vec::new();
    if has("list") || has("watch") {
        operations.push(list_operation(format!("list{gv}{scope}{kind}")));
    }
    if has("create") {
        operations.push(Operation {
            method: "post",
            action: "post",
            operation_id: format!("create{gv}{scope}{kind}"),
            description: format!("create {} {kind}", article(kind)),
            params: write_params(),
            body: Some(Body::json(object.clone(), true)),
            responses: vec![
                Response::json("200", "OK", object.clone()),
                Response::json("201", "Created", object.clone()),
                Response::json("202", "Accepted", object.clone()),
                Response::unauthorized(),
            ],
            gvk: Some((GROUP, VERSION, kind)),
        });
    }
    if has("deletecollection") {
        operations.push(Operation {
            method: "delete",
            action: "deletecollection",
            operation_id: format!("delete{gv}Collection{scope}{kind}"),
            description: format!("delete collection of {kind}"),
            params: delete_collection_params(),
            body: Some(Body::json(format!("{META_V1}DeleteOptions"), false)),
            responses: vec![
                Response::json("200", "OK", status.clone()),
                Response::unauthorized(),
            ],
            gvk: Some((GROUP, VERSION, kind)),
        });
    }
    if !operations.is_empty() {
        paths.push(PathItem {
            path: collection_path.clone(),
            params: scope_params(),
            operations,
        });
    }

    // Item.
    let item_path = format!("{collection_path}/{{name}}");
    let item_params = || {
        let mut params = vec![name_param(kind)];
        params.extend(scope_params());
        params
    };
    // PATCH and PUT differ only in method and body.
    let write_operation = |method: &'static str, body: Body, operation_id, description| Operation {
        method,
        action: method,
        operation_id,
        description,
        params: {
            let mut params = write_params();
            if body.content_types.contains(&"application/apply-patch+yaml") {
                params.push(FORCE);
            }
            params
        },
        body: Some(body),
        responses: vec![
            Response::json("200", "OK", object.clone()),
            Response::json("201", "Created", object.clone()),
            Response::unauthorized(),
        ],
        gvk: Some((GROUP, VERSION, kind)),
    };
    let patch_operation = |operation_id: String, description: String, content_types| {
        let body = Body {
            schema: format!("{META_V1}Patch"),
            content_types,
            required: true,
        };
        write_operation("patch", body, operation_id, description)
    };
    let replace_operation = |operation_id: String, description: String| {
        let body = Body::json(object.clone(), true);
        write_operation("put", body, operation_id, description)
    };
    let read_operation = |operation_id: String, description: String| Operation {
        method: "get",
        action: "get",
        operation_id,
        description,
        params: Vec::new(),
        body: None,
        responses: vec![
            Response::json("200", "OK", object.clone()),
            Response::unauthorized(),
        ],
        gvk: Some((GROUP, VERSION, kind)),
    };

    let mut operations = Vec::new();
    if has("get") {
        operations.push(read_operation(
            format!("read{gv}{scope}{kind}"),
            format!("read the specified {kind}"),
        ));
    }
    if has("update") {
        operations.push(replace_operation(
            format!("replace{gv}{scope}{kind}"),
            format!("replace the specified {kind}"),
        ));
    }
    if has("delete") {
        operations.push(Operation {
            method: "delete",
            action: "delete",
            operation_id: format!("delete{gv}{scope}{kind}"),
            description: format!("delete {} {kind}", article(kind)),
            params: delete_params(),
            body: Some(Body::json(format!("{META_V1}DeleteOptions"), false)),
            responses: vec![
                Response::json("200", "OK", status.clone()),
                Response::json("202", "Accepted", status.clone()),
                Response::unauthorized(),
            ],
            gvk: Some((GROUP, VERSION, kind)),
        });
    }
    if has("patch") {
        operations.push(patch_operation(
            format!("patch{gv}{scope}{kind}"),
            format!("partially update the specified {kind}"),
            PATCH_CONTENT_TYPES,
        ));
    }
    if !operations.is_empty() {
        paths.push(PathItem {
            path: item_path.clone(),
            params: item_params(),
            operations,
        });
    }

    // Subresources.
    for sub in resource.subresources {
        let suffix = capitalize(sub);
        let mut operations = Vec::new();
        for verb in subresource_verbs(sub) {
            match *verb {
                "get" => operations.push(read_operation(
                    format!("read{gv}{scope}{kind}{suffix}"),
                    format!("read {sub} of the specified {kind}"),
                )),
                "update" => operations.push(replace_operation(
                    format!("replace{gv}{scope}{kind}{suffix}"),
                    format!("replace {sub} of the specified {kind}"),
                )),
                "patch" => operations.push(patch_operation(
                    format!("patch{gv}{scope}{kind}{suffix}"),
                    format!("partially update {sub} of the specified {kind}"),
                    STATUS_PATCH_CONTENT_TYPES,
                )),
                "create" => {
                    // A subresource taking and answering another kind (`token`:
                    // TokenRequest), as kube-apiserver publishes ServiceAccounts' `token`.
                    let (group, version, sub_kind) =
                        subresource_kind(sub).unwrap_or((GROUP, VERSION, kind));
                    let schema = if group == GROUP {
                        object.clone()
                    } else {
                        foreign_definition_name(group, version, sub_kind)
                    };
                    operations.push(Operation {
                        method: "post",
                        action: "post",
                        operation_id: format!("create{gv}{scope}{kind}{suffix}"),
                        description: format!("create {sub} of {} {kind}", article(kind)),
                        params: write_params(),
                        body: Some(Body::json(schema.clone(), true)),
                        responses: vec![
                            Response::json("200", "OK", schema.clone()),
                            Response::json("201", "Created", schema.clone()),
                            Response::json("202", "Accepted", schema),
                            Response::unauthorized(),
                        ],
                        gvk: Some((group, version, sub_kind)),
                    });
                }
                _ => {}
            }
        }
        if !operations.is_empty() {
            paths.push(PathItem {
                path: format!("{item_path}/{sub}"),
                params: item_params(),
                operations,
            });
        }
    }

    // List across namespaces.
    if resource.namespaced && (has("list") || has("watch")) {
        paths.push(PathItem {
            path: format!("{base}/{}", resource.plural),
            params: vec![PRETTY],
            operations: vec![list_operation(format!("list{gv}{kind}ForAllNamespaces"))],
        });
    }
    paths
}

/// The `paths` object of the group version's document in the given dialect.
pub(super) fn document_paths(dialect: Dialect) -> Value {
    render_paths(&paths(), dialect)
}

/// Renders paths in the given dialect.
fn render_paths(items: &[PathItem], dialect: Dialect) -> Value {
    let mut paths = Map::new();
    for item in items {
        let mut path = Map::new();
        for operation in &item.operations {
            path.insert(
                operation.method.into(),
                render_operation(operation, dialect),
            );
        }
        if !item.params.is_empty() {
            let params = item.params.iter().map(|p| p.render(dialect)).collect();
            path.insert("parameters".into(), Value::Array(params));
        }
        paths.insert(item.path.clone(), Value::Object(path));
    }
    Value::Object(paths)
}

/// `$ref` to a schema name in the given dialect.
fn schema_ref(name: &str, dialect: Dialect) -> Value {
    match dialect {
        Dialect::V3 => v3_ref(name),
        Dialect::V2 => json!({ "$ref": format!("{V2_REF_PREFIX}{name}") }),
    }
}

fn render_operation(operation: &Operation, dialect: Dialect) -> Value {
    let mut out = Map::new();
    out.insert("description".into(), operation.description.clone().into());
    if dialect == Dialect::V2 {
        if let Some(body) = &operation.body {
            out.insert("consumes".into(), json!(body.content_types));
        }
        let mut produces: Vec<&str> = Vec::new();
        for response in &operation.responses {
            for content_type in response.schema.iter().flat_map(|(_, types)| types.iter()) {
                if !produces.contains(content_type) {
                    produces.push(content_type);
                }
            }
        }
        if produces.is_empty() {
            produces.push(JSON);
        }
        out.insert("produces".into(), json!(produces));
        out.insert("schemes".into(), json!(["https"]));
    }
    out.insert("tags".into(), json!([tag()]));
    out.insert("operationId".into(), operation.operation_id.clone().into());

    let mut params: Vec<Value> = Vec::new();
    if let (Dialect::V2, Some(body)) = (dialect, &operation.body) {
        params.push(json!({
            "name": "body",
            "in": "body",
            "required": body.required,
            "schema": schema_ref(&body.schema, dialect),
        }));
    }
    params.extend(operation.params.iter().map(|p| p.render(dialect)));
    if !params.is_empty() {
        out.insert("parameters".into(), Value::Array(params));
    }
    if let (Dialect::V3, Some(body)) = (dialect, &operation.body) {
        let mut content = Map::new();
        for content_type in body.content_types {
            content.insert(
                (*content_type).into(),
                json!({ "schema": schema_ref(&body.schema, dialect) }),
            );
        }
        out.insert(
            "requestBody".into(),
            json!({ "content": content, "required": body.required }),
        );
    }

    let mut responses = Map::new();
    for response in &operation.responses {
        let mut rendered = Map::new();
        rendered.insert("description".into(), response.description.into());
        if let Some((schema, content_types)) = &response.schema {
            match dialect {
                Dialect::V3 => {
                    let mut content = Map::new();
                    for content_type in *content_types {
                        content.insert(
                            (*content_type).into(),
                            json!({ "schema": schema_ref(schema, dialect) }),
                        );
                    }
                    rendered.insert("content".into(), Value::Object(content));
                }
                Dialect::V2 => {
                    rendered.insert("schema".into(), schema_ref(schema, dialect));
                }
            }
        }
        responses.insert(response.code.into(), Value::Object(rendered));
    }
    out.insert("responses".into(), Value::Object(responses));

    if !operation.action.is_empty() {
        out.insert("x-kubernetes-action".into(), operation.action.into());
    }
    if let Some((group, version, kind)) = operation.gvk {
        out.insert(
            "x-kubernetes-group-version-kind".into(),
            gvk(group, version, kind),
        );
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::param_names;
    use super::*;

    #[test]
    fn status_subresource_gets_paths() {
        let resource = ResourceInfo {
            subresources: &["status"],
            ..crate::resources::ACCESS_SESSIONS
        };
        let items = resource_paths(&resource, &operation_group_version(), "/apis/g/v");
        let status = items
            .iter()
            .find(|item| item.path.ends_with("/{name}/status"))
            .expect("status path");
        let methods: Vec<&str> = status.operations.iter().map(|o| o.method).collect();
        assert_eq!(methods, ["get", "patch", "put"]);
        let patch = render_operation(&status.operations[1], Dialect::V3);
        assert_eq!(
            patch["operationId"],
            "patchAccessMcpRuntimeDevV1alpha1NamespacedAccessSessionStatus"
        );
        assert!(param_names(&patch["parameters"]).contains(&"fieldValidation".to_string()));
    }

    #[test]
    fn token_subresource_posts_token_requests() {
        let items = resource_paths(
            &crate::resources::ACCESS_SESSIONS,
            &operation_group_version(),
            "/apis/g/v",
        );
        let token = items
            .iter()
            .find(|item| item.path.ends_with("/{name}/token"))
            .expect("token path");
        let methods: Vec<&str> = token.operations.iter().map(|o| o.method).collect();
        assert_eq!(methods, ["post"]);
        let post = render_operation(&token.operations[0], Dialect::V3);
        assert_eq!(
            post["operationId"],
            "createAccessMcpRuntimeDevV1alpha1NamespacedAccessSessionToken"
        );
        assert_eq!(post["x-kubernetes-action"], "post");
        assert_eq!(
            post["x-kubernetes-group-version-kind"],
            json!({"group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest"})
        );
        assert_eq!(
            post["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/io.k8s.api.authentication.v1.TokenRequest"
        );
        assert_eq!(
            post["responses"]["201"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/io.k8s.api.authentication.v1.TokenRequest"
        );
        assert!(param_names(&post["parameters"]).contains(&"dryRun".to_string()));
    }
}
