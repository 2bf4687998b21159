//! The gates before deploying (secret validation, the image allow-list) and the status
//! conditions they produce: pure functions of what was observed.

use std::collections::BTreeSet;

use apis::runtime::{EnvSecret, MCPServerStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The condition types this controller owns (the retirement controller owns `Retiring`).
pub const READY: &str = "Ready";
pub const SECRETS_RESOLVED: &str = "SecretsResolved";
pub const IMAGE_ALLOWED: &str = "ImageAllowed";
/// `Ready`'s reason (and the Warning Event's) when a child's name is held by another object.
pub const NAME_CONFLICT: &str = "NameConflict";
pub const OWNED: [&str; 3] = [READY, SECRETS_RESOLVED, IMAGE_ALLOWED];
/// Owned by the NetworkPolicy controller; read here as a gate.
pub const EXTERNAL_EGRESS_READY: &str = "ExternalEgressReady";
/// Owned by the NetworkPolicy controller: whether an L0 deny-all isolates the server.
pub const NETWORK_ISOLATED: &str = "NetworkIsolated";
/// `NetworkIsolated`'s False reason, and `Ready`'s under `--require-runtime-namespace`.
pub const OUTSIDE_RUNTIME_NAMESPACE: &str = "OutsideRuntimeNamespace";

/// What the referenced Secret looked like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretCheck {
    /// No `spec.envSecret`: nothing to resolve.
    NotReferenced,
    /// The Secret exists with every listed key.
    Resolved,
    /// The Secret does not exist.
    NotFound { name: String },
    /// The Secret exists but lacks these keys (sorted).
    KeysMissing { name: String, missing: Vec<String> },
}

impl SecretCheck {
    /// Checks `reference` against the keys the Secret has (`None`: no such Secret).
    pub fn of<'a>(
        reference: Option<&EnvSecret>,
        present: Option<impl IntoIterator<Item = &'a str>>,
    ) -> Self {
        let Some(reference) = reference else {
            return SecretCheck::NotReferenced;
        };
        let Some(present) = present else {
            return SecretCheck::NotFound {
                name: reference.name.clone(),
            };
        };
        let present: BTreeSet<&str> = present.into_iter().collect();
        let missing: BTreeSet<String> = reference
            .keys
            .iter()
            .filter(|k| !present.contains(k.as_str()))
            .cloned()
            .collect();
        if missing.is_empty() {
            SecretCheck::Resolved
        } else {
            SecretCheck::KeysMissing {
                name: reference.name.clone(),
                missing: missing.into_iter().collect(),
            }
        }
    }

    pub fn resolved(&self) -> bool {
        matches!(self, SecretCheck::NotReferenced | SecretCheck::Resolved)
    }

    fn condition(&self) -> (bool, &'static str, String) {
        match self {
            SecretCheck::NotReferenced => (
                true,
                "NoSecretReferenced",
                "spec.envSecret is not set".into(),
            ),
            SecretCheck::Resolved => (
                true,
                "SecretResolved",
                "the Secret has every listed key".into(),
            ),
            SecretCheck::NotFound { name } => {
                (false, "SecretNotFound", format!("Secret {name} not found"))
            }
            SecretCheck::KeysMissing { name, missing } => (
                false,
                "SecretKeysMissing",
                format!("Secret {name} lacks keys: {}", missing.join(", ")),
            ),
        }
    }
}

/// What the image allow-list does with a disallowed image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ImagePolicyMode {
    /// Record a Warning Event and `ImageAllowed=False`, deploy anyway.
    Audit,
    /// Refuse the workload.
    Enforce,
}

/// The image allow-list: prefixes, matched at a path boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePolicy {
    pub prefixes: Vec<String>,
    pub mode: ImagePolicyMode,
}

/// Result of the allow-list check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageCheck {
    /// No prefixes configured: every image is allowed.
    NoAllowList,
    /// A `remote` server: its Pod runs the platform's proxy, no image of the server's owners.
    Remote,
    Allowed {
        prefix: String,
    },
    NotAllowed {
        image: String,
        mode: ImagePolicyMode,
    },
}

impl ImagePolicy {
    /// `image` is allowed when a prefix matches it and the match ends at a reference
    /// boundary: `ghcr.io/acme` admits `ghcr.io/acme/x:1` but not `ghcr.io/acme-evil/x`
    /// (a prefix ending in `/`, `:` or `@` is its own boundary).
    pub fn check(&self, image: &str) -> ImageCheck {
        if self.prefixes.is_empty() {
            return ImageCheck::NoAllowList;
        }
        let matched = self.prefixes.iter().find(|p| {
            !p.is_empty()
                && image.starts_with(p.as_str())
                && (p.ends_with(['/', ':', '@'])
                    || image.len() == p.len()
                    || image[p.len()..].starts_with(['/', ':', '@']))
        });
        match matched {
            Some(prefix) => ImageCheck::Allowed {
                prefix: prefix.clone(),
            },
            None => ImageCheck::NotAllowed {
                image: image.to_string(),
                mode: self.mode,
            },
        }
    }
}

impl ImageCheck {
    /// Whether the workload may be deployed (audit mode deploys a disallowed image).
    pub fn deployable(&self) -> bool {
        !matches!(
            self,
            ImageCheck::NotAllowed {
                mode: ImagePolicyMode::Enforce,
                ..
            }
        )
    }

    /// The Warning Event's note for a disallowed image (`None` when the image is allowed).
    pub fn refusal(&self) -> Option<String> {
        match self {
            ImageCheck::NotAllowed { image, mode } => Some(match mode {
                ImagePolicyMode::Audit => {
                    format!("image {image} matches no allowed prefix (audit: deployed)")
                }
                ImagePolicyMode::Enforce => {
                    format!("image {image} matches no allowed prefix: not deployed")
                }
            }),
            _ => None,
        }
    }

    /// The `ImageAllowed` condition: status, reason and message.
    pub(crate) fn condition(&self) -> (bool, &'static str, String) {
        match self {
            ImageCheck::NoAllowList => (
                true,
                "NoAllowList",
                "no image allow-list is configured".into(),
            ),
            ImageCheck::Remote => (
                true,
                "Remote",
                "a remote server: the Pod runs only the platform's gateway image".into(),
            ),
            ImageCheck::Allowed { prefix } => (
                true,
                "ImageAllowed",
                format!("the image matches the allowed prefix {prefix}"),
            ),
            ImageCheck::NotAllowed { image, mode } => (
                false,
                "ImageNotAllowed",
                match mode {
                    ImagePolicyMode::Audit => format!(
                        "image {image} matches no allowed prefix (audit mode: deployed anyway)"
                    ),
                    ImagePolicyMode::Enforce => {
                        format!("image {image} matches no allowed prefix: not deployed")
                    }
                },
            ),
        }
    }
}

/// Whether the server's external egress (NetworkPolicy layer L3) is proven, as the
/// NetworkPolicy controller reports it in `ExternalEgressReady`: a server that declares
/// egress bindings is deployed only once every binding is proven for its current generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EgressGate {
    /// No `spec.egressBindings`.
    NotRequired,
    /// `ExternalEgressReady=True` for the current generation.
    Proven,
    /// Not (yet) proven: the condition is absent, stale or False.
    NotProven,
}

impl EgressGate {
    /// The gate for a server with `bindings` and `status`.
    pub fn of(bindings: usize, status: Option<&MCPServerStatus>, generation: Option<i64>) -> Self {
        if bindings == 0 {
            return EgressGate::NotRequired;
        }
        let proven = status
            .into_iter()
            .flat_map(|s| s.conditions.iter())
            .any(|c| {
                c.type_ == EXTERNAL_EGRESS_READY
                    && c.status == "True"
                    && c.observed_generation == generation
            });
        if proven {
            EgressGate::Proven
        } else {
            EgressGate::NotProven
        }
    }

    pub fn open(&self) -> bool {
        !matches!(self, EgressGate::NotProven)
    }
}

/// Whether the server's namespace lets it be deployed: under `--require-runtime-namespace`
/// only a runtime namespace does (an L0 deny-all isolates it there). Computed from the flags,
/// not read from `NetworkIsolated`, so the gate never waits on the other controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IsolationGate {
    /// A runtime namespace, or none is required.
    Open,
    /// Outside every runtime namespace, with `--require-runtime-namespace`.
    Refused { namespace: String },
}

impl IsolationGate {
    pub fn of(namespace: &str, isolation: &crate::netpol::settings::RuntimeIsolation) -> Self {
        if isolation.deployable(namespace) {
            IsolationGate::Open
        } else {
            IsolationGate::Refused {
                namespace: namespace.into(),
            }
        }
    }

    pub fn open(&self) -> bool {
        matches!(self, IsolationGate::Open)
    }
}

/// Where the workload stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkloadState {
    /// Not applied because a gate refused it.
    Blocked,
    /// Applied; the deployment controller has not observed the current generation yet.
    Pending,
    /// Applied and its current generation observed by the deployment controller.
    Observed,
    /// Not applied: these children's names (`Kind name`) are held by objects that are not
    /// this MCPServer's.
    NameConflict(Vec<String>),
}

/// The conditions of this controller, each keeping its `lastTransitionTime` from
/// `previous` unless its status changed (Kubernetes conventions).
#[allow(clippy::too_many_arguments)] // one per gate: each is its own observation
pub fn conditions(
    previous: Option<&MCPServerStatus>,
    generation: Option<i64>,
    secrets: &SecretCheck,
    image: &ImageCheck,
    egress: &EgressGate,
    isolation: &IsolationGate,
    workload: &WorkloadState,
    now: Time,
) -> Vec<Condition> {
    let ready = match workload {
        WorkloadState::NameConflict(conflicts) => (
            false,
            NAME_CONFLICT,
            crate::children::conflict_message("MCPServer", conflicts),
        ),
        WorkloadState::Observed => (
            true,
            "DeploymentObserved",
            "the Deployment is applied and its current generation observed".to_string(),
        ),
        WorkloadState::Pending => (
            false,
            "DeploymentPending",
            "the Deployment is applied; waiting for the deployment controller to observe it"
                .to_string(),
        ),
        WorkloadState::Blocked if !secrets.resolved() => (
            false,
            "SecretsUnresolved",
            "not deployed: see SecretsResolved".to_string(),
        ),
        WorkloadState::Blocked if !image.deployable() => (
            false,
            "ImageNotAllowed",
            "not deployed: see ImageAllowed".to_string(),
        ),
        WorkloadState::Blocked if !isolation.open() => (
            false,
            OUTSIDE_RUNTIME_NAMESPACE,
            match isolation {
                IsolationGate::Refused { namespace } => format!(
                    "not deployed: namespace {namespace} is not a --runtime-namespace, so no \
                     NetworkPolicy would isolate the server, and --require-runtime-namespace is \
                     set; see NetworkIsolated"
                ),
                IsolationGate::Open => String::new(),
            },
        ),
        WorkloadState::Blocked => {
            debug_assert!(!egress.open());
            (
                false,
                "ExternalEgressNotReady",
                "not deployed: see ExternalEgressReady".to_string(),
            )
        }
    };
    [
        (READY, ready),
        (SECRETS_RESOLVED, secrets.condition()),
        (IMAGE_ALLOWED, image.condition()),
    ]
    .into_iter()
    .map(|(type_, (ok, reason, message))| {
        let status = if ok { "True" } else { "False" };
        let before = previous.and_then(|p| p.conditions.iter().find(|c| c.type_ == type_));
        let last_transition_time = match before {
            Some(c) if c.status == status => c.last_transition_time.clone(),
            _ => now.clone(),
        };
        Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            observed_generation: generation,
            last_transition_time,
        }
    })
    .collect()
}

/// Whether `previous` already holds exactly `wanted` (our condition types) and
/// `generation` as observedGeneration: then the status write is skipped.
pub fn status_current(
    previous: Option<&MCPServerStatus>,
    generation: Option<i64>,
    wanted: &[Condition],
) -> bool {
    let Some(previous) = previous else {
        return false;
    };
    previous.observed_generation == generation
        && wanted
            .iter()
            .all(|w| previous.conditions.iter().any(|c| c == w))
}

/// The status of `type_` in `previous`, if any.
pub fn condition_status<'a>(previous: Option<&'a MCPServerStatus>, type_: &str) -> Option<&'a str> {
    status_of(&previous?.conditions, type_)
}

/// The status of the condition `type_` among `conditions`, if there is one.
pub fn status_of<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a str> {
    find(conditions, type_).map(|c| c.status.as_str())
}

/// The reason of the condition `type_` among `conditions`, if there is one.
pub fn reason_of<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a str> {
    find(conditions, type_).map(|c| c.reason.as_str())
}

fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn env(keys: &[&str]) -> EnvSecret {
        EnvSecret {
            name: "env".into(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
        }
    }

    #[test]
    fn a_name_held_by_another_object_is_not_ready_and_named() {
        let c = conditions(
            None,
            Some(1),
            &SecretCheck::Resolved,
            &ImageCheck::NoAllowList,
            &EgressGate::NotRequired,
            &IsolationGate::Open,
            &WorkloadState::NameConflict(vec!["Service web".into()]),
            t(100),
        );
        let ready = c.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", NAME_CONFLICT)
        );
        assert_eq!(
            ready.message,
            "Service web: not this MCPServer's, left alone; not deployed until removed (or the \
             MCPServer renamed)"
        );
        assert_eq!(reason_of(&c, READY), Some(NAME_CONFLICT));
        assert_eq!(reason_of(&c, "Missing"), None);
    }

    #[test]
    fn secret_check_names_missing_keys() {
        assert_eq!(
            SecretCheck::of(None, None::<Vec<&str>>),
            SecretCheck::NotReferenced
        );
        assert_eq!(
            SecretCheck::of(Some(&env(&["A"])), None::<Vec<&str>>),
            SecretCheck::NotFound { name: "env".into() }
        );
        assert_eq!(
            SecretCheck::of(Some(&env(&["B", "A", "C"])), Some(vec!["A"])),
            SecretCheck::KeysMissing {
                name: "env".into(),
                missing: vec!["B".into(), "C".into()]
            }
        );
        assert_eq!(
            SecretCheck::of(Some(&env(&["A"])), Some(vec!["A", "Z"])),
            SecretCheck::Resolved
        );
    }

    #[test]
    fn image_prefixes_match_at_a_boundary() {
        let policy = ImagePolicy {
            prefixes: vec!["ghcr.io/acme".into(), "docker.io/library/".into()],
            mode: ImagePolicyMode::Enforce,
        };
        assert!(matches!(
            policy.check("ghcr.io/acme/x:1"),
            ImageCheck::Allowed { .. }
        ));
        assert!(matches!(
            policy.check("ghcr.io/acme:1"),
            ImageCheck::Allowed { .. }
        ));
        assert!(matches!(
            policy.check("docker.io/library/nginx"),
            ImageCheck::Allowed { .. }
        ));
        let refused = policy.check("ghcr.io/acme-evil/x:1");
        assert!(matches!(refused, ImageCheck::NotAllowed { .. }));
        assert!(!refused.deployable());
        let audit = ImagePolicy {
            mode: ImagePolicyMode::Audit,
            ..policy
        };
        let audited = audit.check("evil.io/x");
        assert!(matches!(audited, ImageCheck::NotAllowed { .. }) && audited.deployable());
        let open = ImagePolicy {
            prefixes: vec![],
            mode: ImagePolicyMode::Enforce,
        };
        assert_eq!(open.check("anything"), ImageCheck::NoAllowList);
    }

    #[test]
    fn last_transition_time_moves_only_on_status_change() {
        let missing = SecretCheck::NotFound { name: "env".into() };
        let first = conditions(
            None,
            Some(1),
            &missing,
            &ImageCheck::NoAllowList,
            &EgressGate::NotRequired,
            &IsolationGate::Open,
            &WorkloadState::Blocked,
            t(100),
        );
        assert!(first.iter().all(|c| c.last_transition_time == t(100)));
        let ready = first.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "SecretsUnresolved")
        );
        let previous = MCPServerStatus {
            observed_generation: Some(1),
            conditions: first.clone(),
            ..Default::default()
        };
        // Same observation later: identical conditions, so no write.
        let again = conditions(
            Some(&previous),
            Some(1),
            &missing,
            &ImageCheck::NoAllowList,
            &EgressGate::NotRequired,
            &IsolationGate::Open,
            &WorkloadState::Blocked,
            t(200),
        );
        assert_eq!(again, first);
        assert!(status_current(Some(&previous), Some(1), &again));
        // The Secret appears and the Deployment is pending: SecretsResolved flips (new time),
        // Ready stays False with another reason (time kept), ImageAllowed unchanged.
        let later = conditions(
            Some(&previous),
            Some(1),
            &SecretCheck::Resolved,
            &ImageCheck::NoAllowList,
            &EgressGate::NotRequired,
            &IsolationGate::Open,
            &WorkloadState::Pending,
            t(300),
        );
        let by = |ty: &str| later.iter().find(|c| c.type_ == ty).unwrap().clone();
        assert_eq!(by(SECRETS_RESOLVED).last_transition_time, t(300));
        assert_eq!(by(READY).last_transition_time, t(100));
        assert_eq!(by(READY).reason, "DeploymentPending");
        assert_eq!(by(IMAGE_ALLOWED).last_transition_time, t(100));
        assert!(!status_current(Some(&previous), Some(1), &later));
        // Another controller's condition in the status does not matter.
        let mut with_retiring = previous.clone();
        with_retiring.conditions.push(Condition {
            type_: "Retiring".into(),
            status: "False".into(),
            reason: "x".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: t(1),
        });
        assert!(status_current(Some(&with_retiring), Some(1), &first));
        assert!(!status_current(Some(&with_retiring), Some(2), &first));
    }

    #[test]
    fn a_server_outside_the_runtime_namespaces_is_refused_when_required() {
        use crate::netpol::settings::RuntimeIsolation;
        let isolation = RuntimeIsolation {
            runtime_namespaces: ["tools".to_string()].into(),
            required: true,
        };
        assert_eq!(IsolationGate::of("tools", &isolation), IsolationGate::Open);
        let refused = IsolationGate::of("default", &isolation);
        assert!(!refused.open());
        let open = RuntimeIsolation {
            required: false,
            ..isolation
        };
        assert!(IsolationGate::of("default", &open).open());
        let c = conditions(
            None,
            Some(1),
            &SecretCheck::NotReferenced,
            &ImageCheck::NoAllowList,
            &EgressGate::NotRequired,
            &refused,
            &WorkloadState::Blocked,
            t(5),
        );
        let ready = c.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", OUTSIDE_RUNTIME_NAMESPACE)
        );
        assert!(
            ready.message.contains("namespace default")
                && ready.message.contains("--require-runtime-namespace"),
            "{}",
            ready.message
        );
        // NetworkIsolated is the NetworkPolicy controller's: never written here.
        assert!(c.iter().all(|c| c.type_ != NETWORK_ISOLATED));
    }

    #[test]
    fn unproven_egress_blocks_the_workload() {
        let cond = |status: &str, generation: i64| Condition {
            type_: EXTERNAL_EGRESS_READY.into(),
            status: status.into(),
            reason: "x".into(),
            message: String::new(),
            observed_generation: Some(generation),
            last_transition_time: t(1),
        };
        let with = |c: Vec<Condition>| MCPServerStatus {
            conditions: c,
            ..Default::default()
        };
        assert_eq!(EgressGate::of(0, None, Some(1)), EgressGate::NotRequired);
        assert_eq!(EgressGate::of(1, None, Some(1)), EgressGate::NotProven);
        assert_eq!(
            EgressGate::of(1, Some(&with(vec![cond("True", 1)])), Some(1)),
            EgressGate::Proven
        );
        assert_eq!(
            EgressGate::of(1, Some(&with(vec![cond("False", 1)])), Some(1)),
            EgressGate::NotProven
        );
        // Proven for an older spec says nothing about the current one.
        assert_eq!(
            EgressGate::of(1, Some(&with(vec![cond("True", 1)])), Some(2)),
            EgressGate::NotProven
        );
        let blocked = conditions(
            None,
            Some(1),
            &SecretCheck::NotReferenced,
            &ImageCheck::NoAllowList,
            &EgressGate::NotProven,
            &IsolationGate::Open,
            &WorkloadState::Blocked,
            t(5),
        );
        let ready = blocked.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "ExternalEgressNotReady")
        );
    }
}
