//! REST verbs on a resource: get, list, create, update, patch, delete, deletecollection.
//! Watch lives in `watch.rs`.

use apis::managed_fields;
use apis::selector::FieldSelector;
use apis::strategy::Strategy;
use apis::validation::FieldError;
use apis::Kind;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::{ApiError, ApiResult};
use super::patch::{self, PatchType, PATCH_TYPES};
use super::render::{json_response, object_json, render_list, render_object, streamed_list};
use super::request::{FieldValidation, ListOptions, Params, Rendering, RvMatch};
use super::MAX_OBJECT_BYTES;
use crate::auth::UserInfo;
use crate::store::{
    self, Context, ContinueToken, ListAt, ListQuery, Preconditions, Requester, ResourceVersion,
    Store, StoreError, Withdrawal,
};

/// The request's context for a kind's strategy: who asks, when, and how far their authority
/// to create this kind reaches.
fn context(req: &ResourceRequest<'_>) -> Context {
    let mut ctx = Context::new(
        store::now(),
        Requester {
            name: req.user.name.clone(),
            uid: req.user.uid.clone(),
        },
    );
    if req.cluster_authority {
        ctx.authority = store::RevokerAuthority::Cluster;
    }
    ctx
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
    /// ask, see [`Strategy::ASKS_CLUSTER_AUTHORITY`]).
    pub cluster_authority: bool,
    /// For a server-side apply: whether it may create its object (the create checks, and
    /// whether the caller may create this kind everywhere), decided by the caller of
    /// [`patch`]. None refuses every create by apply.
    pub apply_create: Option<ApiResult<bool>>,
    /// What the caller may see at all (the gateway sync listener's server scope): objects
    /// outside it do not exist for this request. None on the API listener.
    pub scope: Option<&'a FieldSelector>,
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

    pub(super) fn require_json_body(&self) -> ApiResult<()> {
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
fn reconcile_identity<K: Strategy>(
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

/// The object a create, update or patch asks for: decoded as `fieldValidation` says, its
/// identity checked against the path (`namespace`, `name`), its size bounded.
fn requested_object<K: Strategy>(
    body: &[u8],
    validation: FieldValidation,
    (namespace, name): (Option<&str>, Option<&str>),
    warnings: &mut Vec<String>,
) -> ApiResult<K> {
    let mut object: K = decode_object(body, validation, warnings)?;
    let tm = type_meta(&object);
    reconcile_identity(&mut object, (&tm.0, &tm.1), namespace, name)?;
    check_object_size(&object)?;
    Ok(object)
}

/// [`requested_object`] of a document the server composed (a patched or applied object).
fn requested_document<K: Strategy>(
    doc: &Value,
    validation: FieldValidation,
    identity: (Option<&str>, Option<&str>),
    warnings: &mut Vec<String>,
) -> ApiResult<K> {
    let bytes = serde_json::to_vec(doc).map_err(|e| ApiError::internal(e.to_string()))?;
    requested_object(&bytes, validation, identity, warnings)
}

/// The answer to a write: the object as written, with the request's and the write's warnings.
fn written_response<K: Strategy>(
    code: StatusCode,
    written: store::Written<K>,
    rendering: Rendering,
    mut warnings: Vec<String>,
) -> ApiResult<Response> {
    warnings.extend(written.warnings);
    Ok(json_response(
        code,
        &render_object(&written.object, rendering)?,
        &warnings,
    ))
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

fn store_err<K: Strategy>(name: &str) -> impl Fn(store::StoreError) -> ApiError + '_ {
    move |e| ApiError::from_store(e, &K::INFO, name)
}

pub async fn get<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    let rendering = req.rendering()?;
    let name = req.name.unwrap_or_default();
    let object: K = store
        .get(req.namespace.unwrap_or_default(), name)
        .await
        .map_err(store_err::<K>(name))?;
    // Outside the caller's scope is the same answer as absent: no hint that it exists.
    if let Some(scope) = req.scope {
        if !scope.matches(&object_json(&object)?) {
            return Err(store_err::<K>(name)(StoreError::NotFound));
        }
    }
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

pub async fn list<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
    options: ListOptions,
) -> ApiResult<Response> {
    let rendering = req.rendering()?;
    let mut fields = options.fields.clone();
    if let Some(scope) = req.scope {
        fields.0.extend(scope.0.iter().cloned());
    }
    let query = ListQuery {
        namespace: req.namespace.map(str::to_string),
        labels: options.labels.clone(),
        fields,
        limit: options.limit,
        at: list_at(&options)?,
    };
    let list_err = |e| {
        match e {
        StoreError::Expired(_) if options.continue_token.is_some() => ApiError::expired(
            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
        ),
        e => ApiError::from_store(e, &K::INFO, ""),
    }
    };
    // Plain JSON is served from the stored bytes, streamed; the other renderings are
    // computed from the typed objects.
    if rendering == Rendering::Object {
        let list = store.list_raw::<K>(&query).await.map_err(list_err)?;
        return Ok(streamed_list(K::INFO.list_kind, list));
    }
    let list = store.list::<K>(&query).await.map_err(list_err)?;
    let body = render_list(
        &list.items,
        K::INFO.list_kind,
        list.resource_version,
        list.continue_token,
        rendering,
    )?;
    Ok(json_response(StatusCode::OK, &body, &[]))
}

pub async fn create<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    req.require_json_body()?;
    let rendering = req.rendering()?;
    let dry_run = req.params.dry_run()?;
    let manager = field_manager::<K>(&req, false)?;
    let mut warnings = Vec::new();
    let mut object: K = requested_object(
        &req.body,
        req.params.field_validation()?,
        (req.namespace, None),
        &mut warnings,
    )?;
    record_update(&mut object, None, &manager)?;
    let name = object.meta().name.clone().unwrap_or_default();
    let written = store
        .create(object, &context(&req), dry_run)
        .await
        .map_err(store_err::<K>(&name))?;
    written_response(StatusCode::CREATED, written, rendering, warnings)
}

pub async fn update<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    req.require_json_body()?;
    let rendering = req.rendering()?;
    let dry_run = req.params.dry_run()?;
    let manager = field_manager::<K>(&req, false)?;
    let ns = req.namespace.unwrap_or_default();
    let name = req.name.unwrap_or_default();
    let mut warnings = Vec::new();
    let requested: K = requested_object(
        &req.body,
        req.params.field_validation()?,
        (req.namespace, Some(name)),
        &mut warnings,
    )?;
    // The fields it changes are recorded against the stored object; an update without a
    // resourceVersion is made against the one read, and read again if it moved meanwhile.
    let pinned = requested
        .meta()
        .resource_version
        .as_deref()
        .is_some_and(|rv| !rv.is_empty());
    let mut attempts = 0;
    loop {
        attempts += 1;
        let current: K = store.get(ns, name).await.map_err(store_err::<K>(name))?;
        let mut object = requested.clone();
        if !pinned {
            object.meta_mut().resource_version = current.meta().resource_version.clone();
        }
        record_update(&mut object, Some(&current), &manager)?;
        match store.update(object, &context(&req), dry_run).await {
            Ok(written) => {
                return written_response(StatusCode::OK, written, rendering, warnings);
            }
            Err(StoreError::Modified) if !pinned && attempts < 5 => continue,
            Err(e) => return Err(ApiError::from_store(e, &K::INFO, name)),
        }
    }
}

/// Whether the request is a server-side apply (`application/apply-patch+yaml`).
pub fn is_apply(req: &ResourceRequest<'_>) -> bool {
    PatchType::from_content_type(req.content_type()) == Some(PatchType::Apply)
}

/// Who a write's changes are recorded for: `fieldManager`, required for an apply; without
/// it, the User-Agent's product (kube-apiserver's rule).
fn field_manager<K: Strategy>(req: &ResourceRequest<'_>, apply: bool) -> ApiResult<String> {
    match req.params.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(m) if !managed_fields::valid_manager(m) => Err(ApiError::invalid_params(
            &K::INFO,
            &[FieldError::invalid(
                "fieldManager",
                format!(
                    "Invalid value: {m:?}: must be at most {} printable characters",
                    managed_fields::MAX_MANAGER_LEN
                ),
            )],
        )),
        Some(m) => Ok(m.to_string()),
        None if apply => Err(ApiError::invalid_params(
            &K::INFO,
            &[FieldError::required(
                "fieldManager",
                "Required value: is required for apply patch",
            )],
        )),
        None => Ok(managed_fields::manager_from_user_agent(
            req.headers
                .get(http::header::USER_AGENT)
                .and_then(|v| v.to_str().ok()),
        )),
    }
}

/// `force` of an apply; any other request may not set it.
fn apply_force<K: Strategy>(req: &ResourceRequest<'_>, apply: bool) -> ApiResult<bool> {
    match req.params.get("force") {
        None => Ok(false),
        Some(_) if !apply => Err(ApiError::invalid_params(
            &K::INFO,
            &[FieldError::forbidden(
                "force",
                "Forbidden: may not be specified for non-apply patch",
            )],
        )),
        Some("true" | "1" | "True" | "TRUE") => Ok(true),
        Some("false" | "0" | "False" | "FALSE" | "") => Ok(false),
        Some(other) => Err(ApiError::bad_request(format!(
            "force: invalid boolean value {other:?}"
        ))),
    }
}

/// Records in `object`'s `managedFields` that `manager` set every field it changes from
/// `live` (a create when None): the request's own entries when it sends some, else the
/// stored ones, updated.
fn record_update<K: Strategy>(object: &mut K, live: Option<&K>, manager: &str) -> ApiResult<()> {
    let base = managed_fields::requested_or_stored(
        object.meta().managed_fields.as_deref(),
        live.and_then(|l| l.meta().managed_fields.as_deref()),
    );
    let live = live.map(object_json).transpose()?;
    let managers = managed_fields::track_update(
        live.as_ref(),
        &object_json(&*object)?,
        base,
        manager,
        store::now(),
    );
    object.meta_mut().managed_fields = managed_fields::encode(&managers);
    // The request's own entries count towards the object's size like any field.
    check_object_size(&*object)
}

pub async fn patch<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    let content_type = req.content_type().to_string();
    let Some(patch_type) = PatchType::from_content_type(&content_type) else {
        return Err(ApiError::unsupported_media_type(&content_type, PATCH_TYPES));
    };
    if patch_type == PatchType::Apply {
        return server_side_apply::<K, S>(store, req).await;
    }
    apply_force::<K>(&req, false)?;
    let manager = field_manager::<K>(&req, false)?;
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
        patch::apply(&mut doc, patch_type, &req.body)
            .map_err(|e| ApiError::from_patch(e, &K::INFO, name))?;
        let pinned = doc.pointer("/metadata/resourceVersion").cloned() != current_rv;
        let mut warnings = Vec::new();
        let mut object: K =
            requested_document(&doc, validation, (req.namespace, Some(name)), &mut warnings)?;
        record_update(&mut object, Some(&current), &manager)?;
        match store.update(object, &context(&req), dry_run).await {
            Ok(written) => {
                return written_response(StatusCode::OK, written, rendering, warnings);
            }
            Err(StoreError::Modified | StoreError::UidPrecondition { .. })
                if !pinned && attempts < 5 =>
            {
                continue
            }
            Err(e) => return Err(ApiError::from_store(e, &K::INFO, name)),
        }
    }
}

/// Server-side apply (`application/apply-patch+yaml`): creates the object from the
/// configuration when it does not exist; otherwise merges it with field ownership
/// (`apis::managed_fields::apply`): 409 naming the other managers when it would change
/// their fields, unless `force`.
async fn server_side_apply<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    let manager = field_manager::<K>(&req, true)?;
    let force = apply_force::<K>(&req, true)?;
    let rendering = req.rendering()?;
    let dry_run = req.params.dry_run()?;
    let validation = req.params.field_validation()?;
    let ns = req.namespace.unwrap_or_default();
    let name = req.name.unwrap_or_default();
    let config = patch::apply_configuration(&req.body)
        .map_err(|e| ApiError::from_patch(e, &K::INFO, name))?;
    if config
        .pointer("/metadata/managedFields")
        .is_some_and(|v| !v.is_null())
    {
        return Err(ApiError::bad_request("metadata.managedFields must be nil"));
    }
    // Like any object a client sends, the configuration names its type.
    for (field, expected) in [("apiVersion", apis::API_VERSION), ("kind", K::KIND)] {
        match config.get(field).and_then(Value::as_str) {
            Some(given) if given == expected => {}
            Some(given) => {
                return Err(ApiError::bad_request(format!(
                    "the {field} in the apply configuration ({given}) does not match the expected {field} ({expected})"
                )))
            }
            None => {
                return Err(ApiError::bad_request(format!(
                    "the apply configuration must set {field}"
                )))
            }
        }
    }
    let pinned = config.pointer("/metadata/resourceVersion").is_some();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let mut warnings = Vec::new();
        let current: Option<K> = match store.get(ns, name).await {
            Ok(current) => Some(current),
            Err(StoreError::NotFound) => None,
            Err(e) => return Err(ApiError::from_store(e, &K::INFO, name)),
        };
        let Some(current) = current else {
            if pinned {
                return Err(ApiError::from_store(StoreError::NotFound, &K::INFO, name));
            }
            let cluster_authority = match &req.apply_create {
                Some(Ok(everywhere)) => *everywhere,
                Some(Err(refused)) => return Err(refused.clone()),
                None => {
                    return Err(ApiError::method_not_allowed(
                        "PATCH",
                        &format!("{} (create by apply)", K::INFO.plural),
                    ))
                }
            };
            let mut object: K = requested_document(
                &config,
                validation,
                (req.namespace, Some(name)),
                &mut warnings,
            )?;
            let typed = object_json(&object)?;
            let mut managers = managed_fields::applied_create(&config, &manager, store::now());
            managed_fields::retain_present(&mut managers, &typed);
            object.meta_mut().managed_fields = managed_fields::encode(&managers);
            check_object_size(&object)?;
            let mut ctx = context(&req);
            if cluster_authority {
                ctx.authority = store::RevokerAuthority::Cluster;
            }
            match store.create(object, &ctx, dry_run).await {
                Ok(written) => {
                    return written_response(StatusCode::CREATED, written, rendering, warnings)
                }
                // Created meanwhile: apply to it.
                Err(StoreError::AlreadyExists) if attempts < 5 => continue,
                Err(e) => return Err(ApiError::from_store(e, &K::INFO, name)),
            }
        };
        let live = object_json(&current)?;
        let managers =
            managed_fields::requested_or_stored(None, current.meta().managed_fields.as_deref());
        let applied =
            managed_fields::apply(&live, &config, managers, &manager, force, store::now())
                .map_err(|c| ApiError::apply_conflict(&c))?;
        let mut object: K = requested_document(
            &applied.object,
            validation,
            (req.namespace, Some(name)),
            &mut warnings,
        )?;
        // Fields the type does not know were dropped with a warning (or refused when
        // Strict): nobody owns them.
        let mut managers = applied.managers;
        managed_fields::retain_present(&mut managers, &object_json(&object)?);
        object.meta_mut().managed_fields = managed_fields::encode(&managers);
        check_object_size(&object)?;
        match store.update(object, &context(&req), dry_run).await {
            Ok(written) => return written_response(StatusCode::OK, written, rendering, warnings),
            Err(StoreError::Modified | StoreError::UidPrecondition { .. })
                if !pinned && attempts < 5 =>
            {
                continue
            }
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

pub async fn delete<K: Strategy, S: Store>(
    store: &S,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    let rendering = req.rendering()?;
    let (preconditions, dry_run) = delete_options(&req)?;
    let name = req.name.unwrap_or_default();
    let ctx = context(&req);
    // The namespace controller deletes one by one what has no deletecollection (revocations):
    // that is the namespace's teardown, not a withdrawal by the caller.
    let by = if req.namespace_terminating {
        Withdrawal::NamespaceTeardown
    } else {
        Withdrawal::ByCaller(ctx.requester.clone())
    };
    let last: K = store
        .delete(
            req.namespace.unwrap_or_default(),
            name,
            &by,
            &ctx,
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

pub async fn delete_collection<K: Strategy, S: Store>(
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
    let ctx = context(&req);
    let mut deleted = Vec::with_capacity(listed.items.len());
    for item in listed.items {
        let meta = item.meta();
        let (ns, name) = (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        // Tearing down a terminating namespace withdraws every pending enrollment, whoever
        // owns it, and restores nothing; otherwise the caller is checked as for a single
        // delete.
        let by = if req.namespace_terminating {
            Withdrawal::NamespaceTeardown
        } else {
            Withdrawal::ByCaller(ctx.requester.clone())
        };
        match store
            .delete::<K>(&ns, &name, &by, &ctx, &Preconditions::default(), dry_run)
            .await
        {
            Ok(last) => deleted.push(last),
            // Deleted concurrently: that is what was asked.
            Err(StoreError::NotFound) => {}
            Err(e) => return Err(ApiError::from_store(e, &K::INFO, &name)),
        }
    }
    let rv = store.current_version().await.map_err(store_err::<K>(""))?;
    let body = render_list(&deleted, K::INFO.list_kind, rv, None, rendering)?;
    Ok(json_response(StatusCode::OK, &body, &[]))
}

/// A write through the `status` subresource (PATCH or PUT).
pub async fn update_status<K: Strategy, S: Store>(
    store: &S,
    verb: &str,
    req: ResourceRequest<'_>,
) -> ApiResult<Response> {
    if !K::INFO.subresources.contains(&"status") {
        return Err(ApiError::method_not_allowed(
            "PATCH",
            &format!("{}/status", K::INFO.plural),
        ));
    }
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
        let patch_type = PatchType::from_content_type(&content_type)
            .filter(|t| *t != PatchType::Apply)
            .ok_or_else(|| ApiError::unsupported_media_type(&content_type, &PATCH_TYPES[..3]))?;
        let mut doc = current.clone();
        patch::apply(&mut doc, patch_type, &req.body)
            .map_err(|e| ApiError::from_patch(e, &K::INFO, name))?;
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
    K::check_status(&current, &requested).map_err(|e| store_err::<K>(name)(e.into()))?;
    // The typed form must still decode (rejects wrong types with a 400).
    let mut warnings = Vec::new();
    let bytes = serde_json::to_vec(&requested).map_err(|e| ApiError::internal(e.to_string()))?;
    let _: K = decode_object(&bytes, req.params.field_validation()?, &mut warnings)?;
    // The uid checked above is a precondition under the write lock too.
    let preconditions = Preconditions {
        uid: current
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .map(str::to_string),
        resource_version: None,
    };
    let written: K = store
        .write_status(
            req.namespace.unwrap_or_default(),
            name,
            &requested,
            &context(&req),
            &preconditions,
            dry_run,
        )
        .await
        .map_err(store_err::<K>(name))?;
    Ok(json_response(
        StatusCode::OK,
        &render_object(&written, rendering)?,
        &warnings,
    ))
}
