//! What a request addresses and does: its path is a resource (namespace, plural, name,
//! subresource) or a document ([`Target`]); a request on a resource is routed once into a
//! [`ResourceRoute`] (its [`Verb`] and address), which the handlers take and which gives the
//! authorization attributes.

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

    /// The request of `method` on this target, routed: a resource request gets its verb
    /// (Kubernetes' mapping of method, name and `?watch`).
    pub(crate) fn route(self, method: &Method, params: &Params) -> ApiResult<Route> {
        Ok(match self {
            Self::Resource {
                namespace,
                plural,
                name,
                subresource,
            } => {
                let watch = params.is_watch()?;
                let verb = Verb::of(method, name.is_some(), subresource.as_deref(), watch)
                    .map_err(|()| {
                        let what = match subresource.as_deref() {
                            Some(sub @ apis::session_token::TOKEN_SUBRESOURCE) => {
                                format!("{plural}/{sub}")
                            }
                            _ => plural.clone(),
                        };
                        ApiError::method_not_allowed(method.as_str(), &what)
                    })?;
                Route::Resource(ResourceRoute {
                    verb,
                    namespace,
                    resource: plural,
                    name,
                    subresource,
                })
            }
            Self::NonResource(doc) => Route::NonResource(doc),
            Self::Unknown => Route::Unknown,
        })
    }
}

/// What a request does to a resource, as Kubernetes' authorization names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    /// The verb of `method` on a resource: on one object (`named`) or a collection, through
    /// `subresource`, as a watch (`?watch`). `<name>/token` takes a POST (a create of the
    /// subresource) and nothing else. `Err` is 405.
    pub(crate) fn of(
        method: &Method,
        named: bool,
        subresource: Option<&str>,
        watch: bool,
    ) -> Result<Self, ()> {
        if subresource == Some(apis::session_token::TOKEN_SUBRESOURCE) {
            return match (method, named) {
                (&Method::POST, true) => Ok(Self::Create),
                _ => Err(()),
            };
        }
        Ok(match (method, named) {
            (&Method::GET | &Method::HEAD, true) => Self::Get,
            (&Method::GET | &Method::HEAD, false) if watch => Self::Watch,
            (&Method::GET | &Method::HEAD, false) => Self::List,
            (&Method::POST, false) => Self::Create,
            (&Method::PUT, true) => Self::Update,
            (&Method::PATCH, true) => Self::Patch,
            (&Method::DELETE, true) => Self::Delete,
            (&Method::DELETE, false) => Self::DeleteCollection,
            _ => return Err(()),
        })
    }

    /// The verb as RBAC, metrics and logs spell it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
            Self::Create => "create",
            Self::Update => "update",
            Self::Patch => "patch",
            Self::Delete => "delete",
            Self::DeleteCollection => "deletecollection",
        }
    }

    /// The verb as a 405 names it (`GET`, `DELETECOLLECTION`).
    pub(crate) fn upper(self) -> String {
        self.as_str().to_uppercase()
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request routed to a resource: what it does and what it addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResourceRoute {
    pub(crate) verb: Verb,
    /// Namespace from the path (None for cluster-scoped kinds and all-namespace requests).
    pub(crate) namespace: Option<String>,
    /// The resource's plural (`accesssessions`).
    pub(crate) resource: String,
    pub(crate) name: Option<String>,
    /// `status` for `<name>/status`, `token` for `<name>/token`.
    pub(crate) subresource: Option<String>,
}

impl ResourceRoute {
    /// Authorization attributes. A list or watch pinned to one name (`fieldSelector`
    /// `metadata.name=`) is authorized as that name.
    pub(crate) fn attributes(&self, params: &Params, path: &str) -> Attributes {
        let pinned = if self.name.is_none() {
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
        Attributes {
            verb: self.verb.as_str().to_string(),
            resource_request: true,
            namespace: self.namespace.clone().unwrap_or_default(),
            api_group: apis::GROUP.to_string(),
            api_version: apis::VERSION.to_string(),
            resource: self.resource.clone(),
            subresource: self.subresource.clone().unwrap_or_default(),
            name: self.name.clone().or(pinned).unwrap_or_default(),
            path: path.to_string(),
        }
    }
}

/// A request, routed.
#[derive(Debug)]
pub(crate) enum Route {
    NonResource(Doc),
    Resource(ResourceRoute),
    Unknown,
}

impl Route {
    /// Authorization attributes, with Kubernetes' verb mapping.
    pub(crate) fn attributes(&self, method: &Method, params: &Params, path: &str) -> Attributes {
        match self {
            Self::Resource(route) => route.attributes(params, path),
            Self::NonResource(_) | Self::Unknown => Attributes {
                verb: method.as_str().to_lowercase(),
                resource_request: false,
                path: path.to_string(),
                ..Default::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(method: Method, path: &str, query: Option<&str>) -> ApiResult<Route> {
        let segments = segments(path);
        let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
        Target::parse(&segs).route(&method, &Params::parse(query)?)
    }

    fn verb(method: Method, path: &str, query: Option<&str>) -> Verb {
        match route(method, path, query) {
            Ok(Route::Resource(route)) => route.verb,
            other => panic!("not a resource route: {other:?}"),
        }
    }

    #[test]
    fn verbs_by_method_name_and_watch() {
        let ns = &format!(
            "/apis/{}/{}/namespaces/demo/accesssessions",
            apis::GROUP,
            apis::VERSION
        );
        let one = format!("{ns}/s1");
        assert_eq!(verb(Method::GET, ns, None), Verb::List);
        assert_eq!(verb(Method::GET, ns, Some("watch=1")), Verb::Watch);
        assert_eq!(verb(Method::HEAD, &one, None), Verb::Get);
        assert_eq!(verb(Method::POST, ns, None), Verb::Create);
        assert_eq!(verb(Method::PUT, &one, None), Verb::Update);
        assert_eq!(verb(Method::PATCH, &one, None), Verb::Patch);
        assert_eq!(verb(Method::DELETE, &one, None), Verb::Delete);
        assert_eq!(verb(Method::DELETE, ns, None), Verb::DeleteCollection);
        assert_eq!(
            verb(Method::POST, &format!("{one}/token"), None),
            Verb::Create
        );
        // Sessions have no status subresource; enrollments do.
        assert!(matches!(
            route(Method::PATCH, &format!("{one}/status"), None),
            Ok(Route::Unknown)
        ));
        let enrollment = one.replace("accesssessions", "enrollments");
        assert_eq!(
            verb(Method::PATCH, &format!("{enrollment}/status"), None),
            Verb::Patch
        );
        assert!(route(Method::POST, &one, None).is_err());
        assert!(route(Method::GET, &format!("{one}/token"), None).is_err());
        assert!(route(Method::GET, ns, Some("watch=maybe")).is_err());
    }

    #[test]
    fn a_resource_route_names_its_address() {
        let path = &format!(
            "/apis/{}/{}/namespaces/demo/enrollments/s1/status",
            apis::GROUP,
            apis::VERSION
        );
        let Ok(Route::Resource(route)) = route(Method::GET, path, None) else {
            panic!("a resource");
        };
        assert_eq!(route.namespace.as_deref(), Some("demo"));
        assert_eq!(route.resource, "enrollments");
        assert_eq!(route.name.as_deref(), Some("s1"));
        assert_eq!(route.subresource.as_deref(), Some("status"));
        let attributes = route.attributes(&Params::default(), path);
        assert_eq!(
            (attributes.verb.as_str(), attributes.subresource.as_str()),
            ("get", "status")
        );
    }
}
