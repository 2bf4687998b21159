//! REST verbs on a resource: get, list, create, update, patch, delete, deletecollection.
//! Watch lives in `watch.rs`.

use apis::resources::{ResourceInfo, ACCESS_SESSIONS, AGENTS, ENROLLMENTS, REVOCATIONS};
use apis::{AccessSession, Agent, Enrollment, Kind, Revocation};
use async_trait::async_trait;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::{ApiError, ApiResult};
use super::patch::{self, PatchError, PatchType, PATCH_TYPES};
use super::render::{json_response, object_json, render_list, render_object, Renderable};
use super::request::{FieldValidation, ListOptions, Params, Rendering, RvMatch};
use super::MAX_OBJECT_BYTES;
use crate::auth::UserInfo;
use crate::store::{
    self, ContinueToken, ListAt, ListQuery, Preconditions, ResourceVersion, Store, Written,
};

/// Who creates an object, and how far their authority reaches.
pub struct Caller<'a> {
    pub user: &'a UserInfo,
    /// Whether RBAC lets them create this kind in every namespace (asked only for kinds
    /// with [`Served::ASKS_CLUSTER_AUTHORITY`]).
    pub cluster_authority: bool,
}

/// The user as storage records an owner.
fn requester(user: &UserInfo) -> store::Requester {
    store::Requester {
        name: user.name.clone(),
        uid: user.uid.clone(),
    }
}

/// A kind served over HTTP, with its kind-specific writes.
#[async_trait]
pub trait Served: Renderable {
    const INFO: ResourceInfo;
    /// Whether a create needs to know if the caller may create this kind cluster-wide
    /// (a revocation's fence reaches every namespace only then).
    const ASKS_CLUSTER_AUTHORITY: bool = false;
    async fn create<S: Store>(
        store: &S,
        object: Self,
        caller: &Caller<'_>,
        dry_run: bool,
    ) -> store::Result<Written<Self>>;
    /// Update through the main resource (only kinds that serve `update`).
    async fn update<S: Store>(
        _store: &S,
        _object: Self,
        _dry_run: bool,
    ) -> store::Result<Written<Self>> {
        Err(store::StoreError::BadRequest(format!(
            "{} cannot be updated",
            Self::INFO.plural
        )))
    }
    async fn delete<S: Store>(
        store: &S,
        namespace: &str,
        name: &str,
        _user: Option<&UserInfo>,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> store::Result<Self> {
        store
            .delete::<Self>(namespace, name, preconditions, dry_run)
            .await
    }
    /// Checks a write through the `status` subresource before the requested object is
    /// decoded, so that a value the kind does not support is reported as the kind's
    /// validation reports it (422) rather than as an undecodable body (400).
    fn check_status(_name: &str, _current: &Value, _requested: &Value) -> ApiResult<()> {
        Ok(())
    }
    /// A write through the `status` subresource: `current` is the object as stored,
    /// `requested` the object the client asks for (after its patch).
    async fn write_status<S: Store>(
        _store: &S,
        _name: &str,
        _current: &Value,
        _requested: &Value,
        _dry_run: bool,
    ) -> ApiResult<Self> {
        Err(ApiError::method_not_allowed(
            "PATCH",
            &format!("{}/status", Self::INFO.plural),
        ))
    }
}

#[async_trait]
impl Served for AccessSession {
    const INFO: ResourceInfo = ACCESS_SESSIONS;
    async fn create<S: Store>(
        store: &S,
        object: Self,
        _caller: &Caller<'_>,
        dry_run: bool,
    ) -> store::Result<Written<Self>> {
        store.create_session(object, dry_run).await
    }
    async fn update<S: Store>(
        store: &S,
        object: Self,
        dry_run: bool,
    ) -> store::Result<Written<Self>> {
        store.update_session(object, dry_run).await
    }
}

#[async_trait]
impl Served for Agent {
    const INFO: ResourceInfo = AGENTS;
    async fn create<S: Store>(
        store: &S,
        object: Self,
        _caller: &Caller<'_>,
        dry_run: bool,
    ) -> store::Result<Written<Self>> {
        store.create_agent(object, dry_run).await
    }
    async fn update<S: Store>(
        store: &S,
        object: Self,
        dry_run: bool,
    ) -> store::Result<Written<Self>> {
        store.update_agent(object, dry_run).await
    }
}

#[async_trait]
impl Served for Enrollment {
    const INFO: ResourceInfo = ENROLLMENTS;
    async fn create<S: Store>(
        store: &S,
        object: Self,
        caller: &Caller<'_>,
        dry_run: bool,
    ) -> store::Result<Written<Self>> {
        store
            .create_enrollment(object, &requester(caller.user), dry_run)
            .await
    }
    async fn update<S: Store>(
        store: &S,
        object: Self,
        dry_run: bool,
    ) -> store::Result<Written<Self>> {
        store.update_metadata(object, dry_run).await
    }
    async fn delete<S: Store>(
        store: &S,
        namespace: &str,
        name: &str,
        user: Option<&UserInfo>,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> store::Result<Self> {
        let caller = user.map(requester);
        store
            .delete_enrollment(namespace, name, caller.as_ref(), preconditions, dry_run)
            .await
    }
    /// Completion: the only change allowed is `status.phase` to `Completed`; a
    /// `metadata.uid` in the request is a precondition.
    fn check_status(name: &str, current: &Value, requested: &Value) -> ApiResult<()> {
        let uid = |v: &Value| {
            v.pointer("/metadata/uid")
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let (current_uid, requested_uid) = (uid(current), uid(requested));
        if requested_uid != current_uid {
            return Err(ApiError::from_store(
                store::StoreError::Conflict(format!(
                    "Precondition failed: UID in precondition: {}, UID in object meta: {}",
                    requested_uid.unwrap_or_default(),
                    current_uid.unwrap_or_default()
                )),
                &Self::INFO,
                name,
            ));
        }
        let rv = |v: &Value| v.pointer("/metadata/resourceVersion").cloned();
        if rv(requested) != rv(current) {
            return Err(ApiError::from_store(
                store::StoreError::Conflict(format!(
                    "Operation cannot be fulfilled on enrollments.{} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
                    apis::GROUP
                )),
                &Self::INFO,
                name,
            ));
        }
        let phase = requested
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        let mut errors = Vec::new();
        if phase != "Completed" {
            errors.push(apis::validation::FieldError::new(
                apis::validation::FieldErrorKind::NotSupported,
                "status.phase",
                format!("Unsupported value: {phase:?}: supported values: \"Completed\""),
            ));
        }
        let mut changed = Vec::new();
        let mut before = current.clone();
        let mut after = requested.clone();
        for v in [&mut before, &mut after] {
            if let Some(status) = v.get_mut("status").and_then(Value::as_object_mut) {
                status.remove("phase");
            }
            if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("managedFields");
            }
        }
        diff_paths(&before, &after, "", &mut changed);
        for path in changed {
            errors.push(apis::validation::FieldError::forbidden(
                path,
                "completion sets status.phase to Completed and changes nothing else",
            ));
        }
        if !errors.is_empty() {
            return Err(ApiError::invalid(&Self::INFO, name, &errors));
        }
        Ok(())
    }
    async fn write_status<S: Store>(
        store: &S,
        name: &str,
        current: &Value,
        requested: &Value,
        dry_run: bool,
    ) -> ApiResult<Self> {
        Self::check_status(name, current, requested)?;
        let current_uid = current
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        let ns = current
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default();
        store
            .complete_enrollment(ns, name, current_uid.as_deref(), dry_run)
            .await
            .map_err(|e| ApiError::from_store(e, &Self::INFO, name))
    }
}

#[async_trait]
impl Served for Revocation {
    const INFO: ResourceInfo = REVOCATIONS;
    const ASKS_CLUSTER_AUTHORITY: bool = true;
    async fn create<S: Store>(
        store: &S,
        object: Self,
        caller: &Caller<'_>,
        dry_run: bool,
    ) -> store::Result<Written<Self>> {
        let authority = if caller.cluster_authority {
            store::RevokerAuthority::Cluster
        } else {
            store::RevokerAuthority::Namespace
        };
        store.create_revocation(object, authority, dry_run).await
    }
    async fn update<S: Store>(
        store: &S,
        object: Self,
        dry_run: bool,
    ) -> store::Result<Written<Self>> {
        store.update_metadata(object, dry_run).await
    }
    async fn delete<S: Store>(
        store: &S,
        namespace: &str,
        name: &str,
        user: Option<&UserInfo>,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> store::Result<Self> {
        // Without a caller the namespace is being torn down: its sessions go too, so none
        // is restored on the way.
        store
            .delete_revocation(namespace, name, user.is_some(), preconditions, dry_run)
            .await
    }
}

/// Paths (`a.b.c`) where two JSON documents differ.
fn diff_paths(a: &Value, b: &Value, prefix: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match (x.get(k), y.get(k)) {
                    (Some(va), Some(vb)) => diff_paths(va, vb, &path, out),
                    _ => out.push(path),
                }
            }
        }
        (x, y) if x != y => out.push(prefix.to_string()),
        _ => {}
    }
}

/// One request on a resource, as routed.
pub struct ResourceRequest<'a> {
    /// Namespace from the path (None for cluster-scoped kinds and all-namespace lists).
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    /// `status` for requests to `<name>/status`.
    pub subresource: Option<&'a str>,
    pub params: Params,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
    /// Who is asking (owners of enrollments are recorded and checked).
    pub user: &'a UserInfo,
    /// The request's namespace is terminating (set for deletecollection).
    pub namespace_terminating: bool,
    /// The caller may create this kind in every namespace (set for creates of kinds that
    /// ask, see [`Served::ASKS_CLUSTER_AUTHORITY`]).
    pub cluster_authority: bool,
}

impl ResourceRequest<'_> {
    fn rendering(&self) -> ApiResult<Rendering> {
        Rendering::from_headers(self.headers, self.params.include_object())
    }

    fn content_type(&self) -> &str {
        self.headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    fn require_json_body(&self) -> ApiResult<()> {
        let ct = self.content_type().split(';').next().unwrap_or("").trim();
        if ct.is_empty() || ct == "application/json" || ct == "*/*" {
            Ok(())
        } else {
            Err(ApiError::unsupported_media_type(ct, &["application/json"]))
        }
    }
}

/// Decodes a request body into `K`, reporting unknown fields as `fieldValidation` asks.
pub fn decode_object<K: Kind + DeserializeOwned>(
    body: &[u8],
    validation: FieldValidation,
    warnings: &mut Vec<String>,
) -> ApiResult<K> {
    let cannot_handle = |e: &dyn std::fmt::Display| {
        ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: {e}",
            K::KIND,
            apis::VERSION,
            K::KIND
        ))
    };
    let mut unknown = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(body);
    let direct: Result<K, serde_json::Error> =
        serde_ignored::deserialize(&mut de, |path| unknown.push(path.to_string()))
            .and_then(|o| de.end().map(|()| o));
    let object = match direct {
        Ok(object) => object,
        // A field given twice: Kubernetes keeps the last value, and says so unless told
        // to ignore it (Strict refuses the request).
        Err(e) if e.to_string().starts_with("duplicate field") => {
            let message = e
                .to_string()
                .split(" at line")
                .next()
                .unwrap_or_default()
                .to_string();
            match validation {
                FieldValidation::Strict => {
                    return Err(ApiError::bad_request(format!(
                        "strict decoding error: {message}"
                    )))
                }
                FieldValidation::Warn => warnings.push(message),
                FieldValidation::Ignore => {}
            }
            // serde_json's Value keeps the last of duplicate keys.
            let value: Value = serde_json::from_slice(body).map_err(|e| cannot_handle(&e))?;
            unknown.clear();
            serde_ignored::deserialize(value, |path| unknown.push(path.to_string()))
                .map_err(|e| cannot_handle(&e))?
        }
        Err(e) => return Err(cannot_handle(&e)),
    };
    let unknown: Vec<String> = unknown
        .iter()
        .map(|p| format!("unknown field {p:?}"))
        .collect();
    match validation {
        FieldValidation::Strict if !unknown.is_empty() => Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            unknown.join(", ")
        ))),
        FieldValidation::Warn => {
            warnings.extend(unknown);
            Ok(object)
        }
        _ => Ok(object),
    }
}

/// Checks the body's `apiVersion`/`kind` (when given) and the namespace and name it names
/// against the request path, filling them in when absent.
fn reconcile_identity<K: Served>(
    object: &mut K,
    value_kind: (&str, &str),
    namespace: Option<&str>,
    name: Option<&str>,
) -> ApiResult<()> {
    let (api_version, kind) = value_kind;
    if !api_version.is_empty() && api_version != apis::API_VERSION {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            apis::API_VERSION
        )));
    }
    if !kind.is_empty() && kind != K::KIND {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            K::KIND
        )));
    }
    let meta = object.meta_mut();
    if K::INFO.namespaced {
        let ns = namespace.unwrap_or_default();
        match meta.namespace.as_deref() {
            None | Some("") => meta.namespace = Some(ns.to_string()),
            Some(given) if given != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            _ => {}
        }
    } else {
        meta.namespace = None;
    }
    if let Some(name) = name {
        match meta.name.as_deref() {
            None | Some("") => meta.name = Some(name.to_string()),
            Some(given) if given != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({given}) does not match the name on the URL ({name})"
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

fn type_meta(object: &impl Kind) -> (String, String) {
    let v = serde_json::to_value(object).unwrap_or_default();
    (
        v.get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        v.get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
    )
}

fn patch_error<K: Served>(name: &str) -> impl Fn(PatchError) -> ApiError + '_ {
    move |e| match e {
        PatchError::Malformed(m) => ApiError::bad_request(m),
        PatchError::Inapplicable(m) => ApiError::invalid(
            &K::INFO,
            name,
            &[apis::validation::FieldError::invalid("patch", m)],
        ),
        PatchError::TooLarge(m) => ApiError::entity_too_large(m),
    }
}

/// Refuses an object whose encoding exceeds [`MAX_OBJECT_BYTES`]: every stored object is
/// kept in memory by the change feed and sent to every watcher, so its size bounds memory.
fn check_object_size<T: serde::Serialize + ?Sized>(object: &T) -> ApiResult<()> {
    let size = patch::encoded_len(object);
    if size > MAX_OBJECT_BYTES {
        return Err(ApiError::object_too_large(size, MAX_OBJECT_BYTES));
    }
    Ok(())
}

fn store_err<K: Served>(name: &str) -> impl Fn(store::StoreError) -> ApiError + '_ {
    move |e| ApiError::from_store(e, &K::INFO, name)
}

pub async fn get<K: Served, S: Store>(store: &S, req: ResourceRequest<'_>) -> ApiResult<Response> {
    let rendering = req.rendering()?;
    let name = req.name.unwrap_or_default();
    let object: K = store
        .get(req.namespace.unwrap_or_default(), name)
        .await
        .map_err(store_err::<K>(name))?;
    Ok(json_response(
        StatusCode::OK,
        &render_object(&object, rendering)?,
        &[],
    ))
}

/// Resolves which snapshot a list reads, by the resourceVersion rules of the API.
pub fn list_at(options: &ListOptions) -> ApiResult<ListAt> {
    if let Some(token) = &options.continue_token {
        let (token, rv) = ContinueToken::decode(token).map_err(|_| {
            ApiError::bad_request("continue key is not valid: invalid continue token")
        })?;
        return Ok(ListAt::Exact {
            rv,
            after: Some((token.ns, token.name)),
        });
    }
    match options.resource_version.as_deref() {
        None | Some("0") => Ok(ListAt::Latest),
        Some(rv) => {
            let parsed = ResourceVersion::parse(rv)
                .map_err(|_| ApiError::bad_request(format!("resourceVersion: Invalid value: {rv:?}: must be a resourceVersion this server returned")))?;
            let exact = options.rv_match == Some(RvMatch::Exact)
                || (options.rv_match.is_none() && options.limit.is_some());
            Ok(if exact {
                ListAt::Exact {
                    rv: parsed,
                    after: None,
                }
            } else {
                // "Not older than" an old version is the current state.
                ListAt::Latest
            })
        }
    }
}

pub async fn list<K: Served, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
    options: ListOptions,
) -> ApiResult<Response> {
    let rendering = req.rendering()?;
    let query = ListQuery {
        namespace: req.namespace.map(str::to_string),
        labels: options.labels.clone(),
        fields: options.fields.clone(),
        limit: options.limit,
        at: list_at(&options)?,
    };
    let list = store.list::<K>(&query).await.map_err(|e| match e {
        store::StoreError::Expired(_) if options.continue_token.is_some() => ApiError::expired(
            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
        ),
        e => ApiError::from_store(e, &K::INFO, ""),
    })?;
    let body = render_list(
        &list.items,
        K::INFO.list_kind,
        list.resource_version,
        list.continue_token,
        rendering,
    )?;
    Ok(json_response(StatusCode::OK, &body, &[]))
}

pub async fn create<K: Served, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    req.require_json_body()?;
    let rendering = req.rendering()?;
    let dry_run = req.params.dry_run()?;
    let mut warnings = Vec::new();
    let mut object: K = decode_object(&req.body, req.params.field_validation()?, &mut warnings)?;
    let tm = type_meta(&object);
    reconcile_identity(&mut object, (&tm.0, &tm.1), req.namespace, None)?;
    check_object_size(&object)?;
    let name = object.meta().name.clone().unwrap_or_default();
    let caller = Caller {
        user: req.user,
        cluster_authority: req.cluster_authority,
    };
    let written = K::create(store, object, &caller, dry_run)
        .await
        .map_err(store_err::<K>(&name))?;
    warnings.extend(written.warnings);
    Ok(json_response(
        StatusCode::CREATED,
        &render_object(&written.object, rendering)?,
        &warnings,
    ))
}

pub async fn update<K: Served, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    req.require_json_body()?;
    let rendering = req.rendering()?;
    let dry_run = req.params.dry_run()?;
    let name = req.name.unwrap_or_default();
    let mut warnings = Vec::new();
    let mut object: K = decode_object(&req.body, req.params.field_validation()?, &mut warnings)?;
    let tm = type_meta(&object);
    reconcile_identity(&mut object, (&tm.0, &tm.1), req.namespace, Some(name))?;
    check_object_size(&object)?;
    let written = K::update(store, object, dry_run)
        .await
        .map_err(store_err::<K>(name))?;
    warnings.extend(written.warnings);
    Ok(json_response(
        StatusCode::OK,
        &render_object(&written.object, rendering)?,
        &warnings,
    ))
}

pub async fn patch<K: Served, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    let content_type = req.content_type().to_string();
    let Some(patch_type) = PatchType::from_content_type(&content_type) else {
        return Err(ApiError::unsupported_media_type(&content_type, PATCH_TYPES));
    };
    let rendering = req.rendering()?;
    let dry_run = req.params.dry_run()?;
    let validation = req.params.field_validation()?;
    let ns = req.namespace.unwrap_or_default();
    let name = req.name.unwrap_or_default();
    // Like kube-apiserver: a patch that does not pin a resourceVersion is applied to the
    // latest state and retried on a conflicting concurrent write.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let current: K = store.get(ns, name).await.map_err(store_err::<K>(name))?;
        let mut doc = object_json(&current)?;
        let current_rv = doc.pointer("/metadata/resourceVersion").cloned();
        patch::apply(&mut doc, patch_type, &req.body).map_err(patch_error::<K>(name))?;
        let pinned = doc.pointer("/metadata/resourceVersion").cloned() != current_rv;
        let bytes = serde_json::to_vec(&doc).map_err(|e| ApiError::internal(e.to_string()))?;
        let mut warnings = Vec::new();
        let mut object: K = decode_object(&bytes, validation, &mut warnings)?;
        let tm = type_meta(&object);
        reconcile_identity(&mut object, (&tm.0, &tm.1), req.namespace, Some(name))?;
        check_object_size(&object)?;
        match K::update(store, object, dry_run).await {
            Ok(written) => {
                warnings.extend(written.warnings);
                return Ok(json_response(
                    StatusCode::OK,
                    &render_object(&written.object, rendering)?,
                    &warnings,
                ));
            }
            Err(store::StoreError::Conflict(_)) if !pinned && attempts < 5 => continue,
            Err(e) => return Err(ApiError::from_store(e, &K::INFO, name)),
        }
    }
}

/// `DeleteOptions` as far as this server honours them.
#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeleteOptions {
    #[serde(default)]
    preconditions: Option<DeletePreconditions>,
    #[serde(default)]
    dry_run: Vec<String>,
    #[serde(default)]
    propagation_policy: Option<String>,
}

#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeletePreconditions {
    uid: Option<String>,
    resource_version: Option<String>,
}

fn delete_options(req: &ResourceRequest<'_>) -> ApiResult<(Preconditions, bool)> {
    let options: DeleteOptions = if req.body.iter().all(u8::is_ascii_whitespace) {
        DeleteOptions::default()
    } else {
        serde_json::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    if let Some(p) = options.propagation_policy.as_deref() {
        if !matches!(p, "Orphan" | "Background" | "Foreground") {
            return Err(ApiError::bad_request(format!(
                "propagationPolicy: Unsupported value: {p:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
            )));
        }
    }
    let body_dry_run = match options.dry_run.as_slice() {
        [] => false,
        [all] if all == "All" => true,
        other => {
            return Err(ApiError::bad_request(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            )))
        }
    };
    let pre = options.preconditions.unwrap_or_default();
    Ok((
        Preconditions {
            uid: pre.uid,
            resource_version: pre.resource_version,
        },
        body_dry_run || req.params.dry_run()?,
    ))
}

pub async fn delete<K: Served, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    let rendering = req.rendering()?;
    let (preconditions, dry_run) = delete_options(&req)?;
    let name = req.name.unwrap_or_default();
    let last: K = K::delete(
        store,
        req.namespace.unwrap_or_default(),
        name,
        Some(req.user),
        &preconditions,
        dry_run,
    )
    .await
    .map_err(store_err::<K>(name))?;
    Ok(json_response(
        StatusCode::OK,
        &render_object(&last, rendering)?,
        &[],
    ))
}

pub async fn delete_collection<K: Served, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
    options: ListOptions,
) -> ApiResult<Response> {
    let rendering = req.rendering()?;
    let (_, dry_run) = delete_options(&req)?;
    let listed = store
        .list::<K>(&ListQuery {
            namespace: req.namespace.map(str::to_string),
            labels: options.labels,
            fields: options.fields,
            limit: None,
            at: ListAt::Latest,
        })
        .await
        .map_err(store_err::<K>(""))?;
    let mut deleted = Vec::with_capacity(listed.items.len());
    for item in listed.items {
        let meta = item.meta();
        let (ns, name) = (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        // Tearing down a terminating namespace withdraws every pending enrollment, whoever
        // owns it; otherwise the caller is checked as for a single delete.
        let caller = (!req.namespace_terminating).then_some(req.user);
        match K::delete(
            store,
            &ns,
            &name,
            caller,
            &Preconditions::default(),
            dry_run,
        )
        .await
        {
            Ok(last) => deleted.push(last),
            // Deleted concurrently: that is what was asked.
            Err(store::StoreError::NotFound { .. }) => {}
            Err(e) => return Err(ApiError::from_store(e, &K::INFO, &name)),
        }
    }
    let rv = store.current_version().await.map_err(store_err::<K>(""))?;
    let body = render_list(&deleted, K::INFO.list_kind, rv, None, rendering)?;
    Ok(json_response(StatusCode::OK, &body, &[]))
}

/// A write through the `status` subresource (PATCH or PUT).
pub async fn update_status<K: Served, S: Store>(
    store: &S,
    verb: &str,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    let rendering = req.rendering()?;
    let dry_run = req.params.dry_run()?;
    let name = req.name.unwrap_or_default();
    let current: K = store
        .get(req.namespace.unwrap_or_default(), name)
        .await
        .map_err(store_err::<K>(name))?;
    let current = object_json(&current)?;
    let requested = if verb == "patch" {
        let content_type = req.content_type().to_string();
        let Some(patch_type) = PatchType::from_content_type(&content_type) else {
            return Err(ApiError::unsupported_media_type(&content_type, PATCH_TYPES));
        };
        let mut doc = current.clone();
        patch::apply(&mut doc, patch_type, &req.body).map_err(patch_error::<K>(name))?;
        doc
    } else {
        req.require_json_body()?;
        let mut doc: Value = serde_json::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))?;
        // An update may leave the resourceVersion out (unconditional).
        if doc.pointer("/metadata/resourceVersion").is_none() {
            if let (Some(meta), Some(rv)) = (
                doc.get_mut("metadata").and_then(Value::as_object_mut),
                current.pointer("/metadata/resourceVersion"),
            ) {
                meta.insert("resourceVersion".into(), rv.clone());
            }
        }
        doc
    };
    check_object_size(&requested)?;
    K::check_status(name, &current, &requested)?;
    // The typed form must still decode (rejects wrong types with a 400).
    let mut warnings = Vec::new();
    let bytes = serde_json::to_vec(&requested).map_err(|e| ApiError::internal(e.to_string()))?;
    let _: K = decode_object(&bytes, req.params.field_validation()?, &mut warnings)?;
    let written = K::write_status(store, name, &current, &requested, dry_run).await?;
    Ok(json_response(
        StatusCode::OK,
        &render_object(&written, rendering)?,
        &warnings,
    ))
}
