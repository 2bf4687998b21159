//! What a path addresses: a resource (namespace, plural, name, subresource) or a document,
//! and the authorization attributes of a request on it.

use apis::resources::RESOURCES;
use http::Method;

use super::documents::Doc;
use super::error::{ApiError, ApiResult};
use super::request::Params;
use crate::auth::Attributes;

/// A path's segments, percent-decoded.
pub(crate) fn segments(path: &str) -> Vec<String> {
    path.split('/')
        .filter(|s| !s.is_empty())
        .map(super::request::percent_decode)
        .collect()
}

/// What a path addresses.
#[derive(Debug)]
pub(crate) enum Target {
    NonResource(Doc),
    Resource {
        namespace: Option<String>,
        plural: String,
        name: Option<String>,
        /// `status` for `<name>/status`, `token` for `<name>/token`.
        subresource: Option<String>,
    },
    Unknown,
}

impl Target {
    pub(crate) fn parse(segs: &[&str]) -> Self {
        let (g, v) = (apis::GROUP, apis::VERSION);
        match segs {
            ["api"] => Self::NonResource(Doc::Api),
            ["apis"] => Self::NonResource(Doc::Apis),
            ["apis", group] if *group == g => Self::NonResource(Doc::Group),
            ["apis", group, version] if *group == g && *version == v => {
                Self::NonResource(Doc::ResourceList)
            }
            ["openapi", "v2"] => Self::NonResource(Doc::OpenApiV2),
            ["openapi", "v3"] => Self::NonResource(Doc::OpenApiV3),
            ["openapi", "v3", "apis", group, version] if *group == g && *version == v => {
                Self::NonResource(Doc::OpenApiV3Group)
            }
            ["version"] => Self::NonResource(Doc::Version),
            ["openid", "v1", "jwks"] => Self::NonResource(Doc::Jwks),
            [".well-known", "openid-configuration"] => Self::NonResource(Doc::OpenIdConfiguration),
            ["apis", group, version, rest @ ..] if *group == g && *version == v => match rest {
                ["namespaces", ns, plural] => Self::resource(Some(ns), plural, None, None),
                ["namespaces", ns, plural, name] => {
                    Self::resource(Some(ns), plural, Some(name), None)
                }
                ["namespaces", ns, plural, name, sub] => {
                    Self::resource(Some(ns), plural, Some(name), Some(sub))
                }
                [plural] => Self::resource(None, plural, None, None),
                [plural, name] => Self::resource(None, plural, Some(name), None),
                [plural, name, sub] => Self::resource(None, plural, Some(name), Some(sub)),
                _ => Self::Unknown,
            },
            _ => Self::Unknown,
        }
    }

    pub(crate) fn resource(
        namespace: Option<&str>,
        plural: &str,
        name: Option<&str>,
        subresource: Option<&str>,
    ) -> Self {
        let Some(info) = RESOURCES.iter().find(|r| r.plural == plural) else {
            return Self::Unknown;
        };
        if subresource.is_some_and(|sub| !info.subresources.contains(&sub)) {
            return Self::Unknown;
        }
        Self::Resource {
            namespace: namespace.map(str::to_string),
            plural: plural.to_string(),
            name: name.map(str::to_string),
            subresource: subresource.map(str::to_string),
        }
    }

    /// Authorization attributes, with Kubernetes' verb mapping.
    pub(crate) fn attributes(
        &self,
        method: &Method,
        params: &Params,
        path: &str,
    ) -> ApiResult<Attributes> {
        match self {
            Self::Resource {
                namespace,
                plural,
                name,
                subresource,
            } => {
                let watch = params.is_watch()?;
                // `<name>/token` takes a POST (a create of the subresource) and nothing else.
                if subresource.as_deref() == Some(apis::session_token::TOKEN_SUBRESOURCE)
                    && (method != Method::POST || name.is_none())
                {
                    return Err(ApiError::method_not_allowed(
                        method.as_str(),
                        &format!("{plural}/token"),
                    ));
                }
                let verb = match (method, name.is_some()) {
                    (&Method::POST, true)
                        if subresource.as_deref()
                            == Some(apis::session_token::TOKEN_SUBRESOURCE) =>
                    {
                        "create"
                    }
                    (&Method::GET | &Method::HEAD, true) => "get",
                    (&Method::GET | &Method::HEAD, false) if watch => "watch",
                    (&Method::GET | &Method::HEAD, false) => "list",
                    (&Method::POST, false) => "create",
                    (&Method::PUT, true) => "update",
                    (&Method::PATCH, true) => "patch",
                    (&Method::DELETE, true) => "delete",
                    (&Method::DELETE, false) => "deletecollection",
                    (m, _) => return Err(ApiError::method_not_allowed(m.as_str(), plural)),
                };
                // A list or watch pinned to one name is authorized as that name.
                let pinned = if name.is_none() {
                    params
                        .get("fieldSelector")
                        .and_then(|f| {
                            f.split(',').find_map(|t| {
                                let t = t.trim();
                                t.strip_prefix("metadata.name==")
                                    .or_else(|| t.strip_prefix("metadata.name="))
                            })
                        })
                        .map(str::to_string)
                } else {
                    None
                };
                Ok(Attributes {
                    verb: verb.to_string(),
                    resource_request: true,
                    namespace: namespace.clone().unwrap_or_default(),
                    api_group: apis::GROUP.to_string(),
                    api_version: apis::VERSION.to_string(),
                    resource: plural.clone(),
                    subresource: subresource.clone().unwrap_or_default(),
                    name: name.clone().or(pinned).unwrap_or_default(),
                    path: path.to_string(),
                })
            }
            Self::NonResource(_) | Self::Unknown => Ok(Attributes {
                verb: method.as_str().to_lowercase(),
                resource_request: false,
                path: path.to_string(),
                ..Default::default()
            }),
        }
    }
}
