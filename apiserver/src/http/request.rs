//! What a request asks for: the rendering (from `Accept`) and the query parameters, with the
//! validation rules kube-apiserver applies to them.

use std::collections::HashMap;
use std::time::Duration;

use apis::resources::ResourceInfo;
use apis::selector::{FieldSelector, LabelSelector};
use apis::validation::FieldError;
use http::HeaderMap;

use super::error::{ApiError, ApiResult};

/// How objects are rendered in a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rendering {
    /// The objects themselves.
    Object,
    /// `meta.k8s.io/v1` Table (for `kubectl get`), with the row object as asked.
    Table(IncludeObject),
    /// `PartialObjectMetadata[List]` (the metadata client).
    Metadata,
}

/// `includeObject` of a Table request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl Rendering {
    /// Picks the first supported media type in `Accept`, as kube-apiserver does.
    pub fn from_headers(headers: &HeaderMap, include_object: Option<&str>) -> ApiResult<Self> {
        let accept = headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .trim();
        if accept.is_empty() {
            return Ok(Self::Object);
        }
        for media in accept.split(',') {
            let mut parts = media.split(';').map(str::trim);
            let mime = parts.next().unwrap_or("").to_ascii_lowercase();
            let params: HashMap<String, String> = parts
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| {
                    (
                        k.trim().to_ascii_lowercase(),
                        v.trim().trim_matches('"').to_string(),
                    )
                })
                .collect();
            if !matches!(
                mime.as_str(),
                "application/json" | "application/*" | "*/*" | "application/json-seq"
            ) {
                continue;
            }
            if mime == "application/json-seq" {
                continue;
            }
            let group = params.get("g").map(String::as_str);
            let version = params.get("v").map(String::as_str);
            let meta_version =
                group == Some("meta.k8s.io") && matches!(version, Some("v1") | Some("v1beta1"));
            match params.get("as").map(String::as_str) {
                None => return Ok(Self::Object),
                Some("Table") if meta_version => {
                    let include = match include_object {
                        None | Some("") | Some("Metadata") => IncludeObject::Metadata,
                        Some("None") => IncludeObject::None,
                        Some("Object") => IncludeObject::Object,
                        Some(other) => {
                            return Err(ApiError::bad_request(format!(
                                "includeObject: unsupported value {other:?}: must be None, Metadata or Object"
                            )))
                        }
                    };
                    return Ok(Self::Table(include));
                }
                Some("PartialObjectMetadata") | Some("PartialObjectMetadataList")
                    if meta_version =>
                {
                    return Ok(Self::Metadata)
                }
                _ => continue,
            }
        }
        Err(ApiError::not_acceptable(accept))
    }
}

/// Query parameters of a resource request.
#[derive(Clone, Debug, Default)]
pub struct Params {
    raw: HashMap<String, String>,
}

fn parse_bool(name: &str, v: &str) -> ApiResult<bool> {
    match v {
        "true" | "1" | "True" | "TRUE" => Ok(true),
        "false" | "0" | "False" | "FALSE" | "" => Ok(false),
        _ => Err(ApiError::bad_request(format!(
            "{name}: invalid boolean value {v:?}"
        ))),
    }
}

impl Params {
    pub fn parse(query: Option<&str>) -> ApiResult<Self> {
        let mut raw = HashMap::new();
        for (k, v) in form_pairs(query.unwrap_or("")) {
            raw.insert(k, v);
        }
        Ok(Self { raw })
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.raw.get(name).map(String::as_str)
    }

    fn flag(&self, name: &str) -> ApiResult<bool> {
        self.get(name).map_or(Ok(false), |v| parse_bool(name, v))
    }

    pub fn is_watch(&self) -> ApiResult<bool> {
        self.flag("watch")
    }

    /// `dryRun=All` (the only value Kubernetes defines).
    pub fn dry_run(&self) -> ApiResult<bool> {
        match self.get("dryRun") {
            None | Some("") => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            ))),
        }
    }

    /// `fieldValidation`: Strict, Warn (default) or Ignore.
    pub fn field_validation(&self) -> ApiResult<FieldValidation> {
        match self.get("fieldValidation") {
            None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
            ))),
        }
    }

    pub fn include_object(&self) -> Option<&str> {
        self.get("includeObject")
    }

    /// Selectors, limit, continue and resourceVersion rules of a list or watch.
    pub fn list_options(
        &self,
        resource: &ResourceInfo,
        fields: &'static [(&'static str, &'static [&'static str])],
    ) -> ApiResult<ListOptions> {
        let labels = LabelSelector::parse(self.get("labelSelector").unwrap_or(""))
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
        let fields = FieldSelector::parse(self.get("fieldSelector").unwrap_or(""), fields)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let limit = match self.get("limit") {
            None | Some("") => None,
            Some(v) => match v.parse::<i64>() {
                Ok(n) if n > 0 => Some(n as usize),
                Ok(_) => None,
                Err(_) => return Err(ApiError::bad_request(format!("limit: invalid value {v:?}"))),
            },
        };
        let continue_token = self
            .get("continue")
            .filter(|c| !c.is_empty())
            .map(str::to_string);
        let resource_version = self
            .get("resourceVersion")
            .filter(|v| !v.is_empty())
            .map(str::to_string);
        let watch = self.is_watch()?;
        let send_initial_events = match self.get("sendInitialEvents") {
            None => None,
            Some(v) => Some(parse_bool("sendInitialEvents", v)?),
        };
        let allow_bookmarks = self.flag("allowWatchBookmarks")?;
        let rv_match = match self.get("resourceVersionMatch") {
            None | Some("") => None,
            Some("NotOlderThan") => Some(RvMatch::NotOlderThan),
            Some("Exact") => Some(RvMatch::Exact),
            Some(other) => {
                return Err(ApiError::invalid_params(
                    resource,
                    &[FieldError::new(
                        apis::validation::FieldErrorKind::NotSupported,
                        "resourceVersionMatch",
                        format!("Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""),
                    )],
                ))
            }
        };
        let timeout = match self.get("timeoutSeconds") {
            None | Some("") => None,
            Some(v) => match v.parse::<u64>() {
                Ok(n) => Some(Duration::from_secs(n)),
                Err(_) => {
                    return Err(ApiError::bad_request(format!(
                        "timeoutSeconds: invalid value {v:?}"
                    )))
                }
            },
        };

        // The validation rules of k8s.io/apimachinery's ValidateListOptions.
        let mut errors = Vec::new();
        let forbidden = |field: &str, message: &str| FieldError::forbidden(field, message);
        if let Some(m) = rv_match {
            if watch {
                if send_initial_events != Some(true) {
                    errors.push(forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                    ));
                } else if m != RvMatch::NotOlderThan {
                    errors.push(FieldError::new(
                        apis::validation::FieldErrorKind::NotSupported,
                        "resourceVersionMatch",
                        "Unsupported value: \"Exact\": supported values: \"NotOlderThan\"",
                    ));
                }
            } else {
                if resource_version.is_none() {
                    errors.push(forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden unless resourceVersion is provided",
                    ));
                }
                if continue_token.is_some() {
                    errors.push(forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden when continue is provided",
                    ));
                }
                if m == RvMatch::Exact && resource_version.as_deref() == Some("0") {
                    errors.push(forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                    ));
                }
            }
        }
        if let Some(sie) = send_initial_events {
            if !watch {
                errors.push(forbidden(
                    "sendInitialEvents",
                    "sendInitialEvents is forbidden for list",
                ));
            } else if sie {
                if rv_match != Some(RvMatch::NotOlderThan) {
                    errors.push(forbidden(
                        "resourceVersionMatch",
                        "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                    ));
                }
                if !allow_bookmarks {
                    errors.push(forbidden(
                        "allowWatchBookmarks",
                        "sendInitialEvents requires setting allowWatchBookmarks to true",
                    ));
                }
            }
        }
        if !errors.is_empty() {
            return Err(ApiError::invalid_params(resource, &errors));
        }
        // As kube-apiserver's storage: the token decides the version; "0" is tolerated.
        if continue_token.is_some()
            && resource_version.as_deref().is_some_and(|rv| rv != "0")
            && !watch
        {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        Ok(ListOptions {
            labels,
            fields,
            limit,
            continue_token,
            resource_version,
            rv_match,
            send_initial_events: send_initial_events.unwrap_or(false),
            allow_bookmarks,
            timeout,
        })
    }
}

/// Decodes `application/x-www-form-urlencoded` pairs.
fn form_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// Percent-decoding with `+` as space.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `resourceVersionMatch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RvMatch {
    NotOlderThan,
    Exact,
}

/// `fieldValidation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldValidation {
    Strict,
    Warn,
    Ignore,
}

/// Parsed list/watch options.
#[derive(Clone, Debug)]
pub struct ListOptions {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub rv_match: Option<RvMatch>,
    pub send_initial_events: bool,
    pub allow_bookmarks: bool,
    pub timeout: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::resources::ACCESS_SESSIONS;
    use apis::{AccessSession, Kind};

    fn accept(v: &str) -> ApiResult<Rendering> {
        let mut h = HeaderMap::new();
        h.insert(http::header::ACCEPT, v.parse().unwrap());
        Rendering::from_headers(&h, None)
    }

    #[test]
    fn negotiates_like_kube_apiserver() {
        assert_eq!(
            accept("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json").unwrap(),
            Rendering::Table(IncludeObject::Metadata)
        );
        assert_eq!(
            accept("application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json").unwrap(),
            Rendering::Metadata
        );
        assert_eq!(
            accept("application/vnd.kubernetes.protobuf, */*").unwrap(),
            Rendering::Object
        );
        assert_eq!(
            accept("application/json;as=Table;v=v2;g=meta.k8s.io, application/json").unwrap(),
            Rendering::Object
        );
        assert!(accept("application/vnd.kubernetes.protobuf").is_err());
        assert!(accept("text/html").is_err());
    }

    fn opts(q: &str) -> ApiResult<ListOptions> {
        Params::parse(Some(q))
            .unwrap()
            .list_options(&ACCESS_SESSIONS, AccessSession::FIELDS)
    }

    #[test]
    fn list_option_rules() {
        assert!(opts("resourceVersionMatch=NotOlderThan").is_err());
        assert!(opts("resourceVersion=0&resourceVersionMatch=Exact").is_err());
        assert!(opts("resourceVersion=5&continue=abc").is_err());
        assert!(opts("sendInitialEvents=true").is_err());
        assert!(opts("watch=1&sendInitialEvents=true&allowWatchBookmarks=true").is_err());
        assert!(opts("watch=1&resourceVersionMatch=NotOlderThan").is_err());
        let o = opts("watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true").unwrap();
        assert!(o.send_initial_events && o.allow_bookmarks);
        let o = opts(
            "labelSelector=app%3Dweb%2Cenv+in+%28a%29&fieldSelector=spec.server.uid%3Du1&limit=2",
        )
        .unwrap();
        assert_eq!(o.labels.0.len(), 2);
        assert_eq!(o.limit, Some(2));
        assert!(opts("fieldSelector=spec.nope%3D1").is_err());
        assert_eq!(percent_decode("a%2Fb%2fc+d%"), "a/b/c d%");
    }
}
