//! What the API serves: one descriptor per resource, the single source for discovery,
//! OpenAPI paths, routing and RBAC verb lists.

use crate::types::{AccessSession, Agent, Enrollment, Kind, Revocation, ToolPolicy};

/// A served resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResourceInfo {
    /// URL segment and storage key, e.g. `accesssessions`.
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub list_kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    pub verbs: &'static [&'static str],
    /// Subresources served under `<name>/<subresource>`.
    pub subresources: &'static [&'static str],
}

/// Every verb of a fully served resource.
pub const ALL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// The category every MCP Access resource belongs to (`kubectl get mcp-access`).
pub const CATEGORY: &str = "mcp-access";

pub const ACCESS_SESSIONS: ResourceInfo = ResourceInfo {
    plural: AccessSession::PLURAL,
    singular: "accesssession",
    kind: AccessSession::KIND,
    list_kind: "AccessSessionList",
    namespaced: true,
    short_names: &["acs"],
    categories: &[CATEGORY],
    verbs: ALL_VERBS,
    // `token`: POST a TokenRequest, get a session token (docs/session-tokens.md).
    subresources: &[crate::session_token::TOKEN_SUBRESOURCE],
};

pub const AGENTS: ResourceInfo = ResourceInfo {
    plural: Agent::PLURAL,
    singular: "agent",
    kind: Agent::KIND,
    list_kind: "AgentList",
    namespaced: false,
    short_names: &[],
    categories: &[CATEGORY],
    verbs: ALL_VERBS,
    subresources: &[],
};

pub const ENROLLMENTS: ResourceInfo = ResourceInfo {
    plural: Enrollment::PLURAL,
    singular: "enrollment",
    kind: Enrollment::KIND,
    list_kind: "EnrollmentList",
    namespaced: true,
    short_names: &["enr"],
    categories: &[CATEGORY],
    // The spec is fixed at creation (updates change metadata only); progress goes through
    // the status subresource.
    verbs: ALL_VERBS,
    subresources: &["status"],
};

pub const REVOCATIONS: ResourceInfo = ResourceInfo {
    plural: Revocation::PLURAL,
    singular: "revocation",
    kind: Revocation::KIND,
    list_kind: "RevocationList",
    namespaced: true,
    short_names: &["rvk"],
    categories: &[CATEGORY],
    // A revocation is an event: created, read, labelled (metadata-only updates), and
    // (single-session ones) withdrawn.
    verbs: &[
        "create", "delete", "get", "list", "patch", "update", "watch",
    ],
    subresources: &[],
};

pub const TOOL_POLICIES: ResourceInfo = ResourceInfo {
    plural: ToolPolicy::PLURAL,
    singular: "toolpolicy",
    kind: ToolPolicy::KIND,
    list_kind: "ToolPolicyList",
    namespaced: true,
    short_names: &["tp"],
    categories: &[CATEGORY],
    verbs: ALL_VERBS,
    subresources: &[],
};

/// Every served resource, in discovery order.
pub const RESOURCES: &[ResourceInfo] = &[
    ACCESS_SESSIONS,
    AGENTS,
    ENROLLMENTS,
    REVOCATIONS,
    TOOL_POLICIES,
];

/// The verbs of the gateway sync listener: it only reads.
const SYNC_VERBS: &[&str] = &["get", "list", "watch"];

/// What the gateway sync listener serves, read-only and scoped to the caller's server
/// (DESIGN §4): access sessions and tool policies.
pub const GATEWAY_SYNC_RESOURCES: &[ResourceInfo] = &[
    ResourceInfo {
        verbs: SYNC_VERBS,
        subresources: &[],
        ..ACCESS_SESSIONS
    },
    ResourceInfo {
        verbs: SYNC_VERBS,
        subresources: &[],
        ..TOOL_POLICIES
    },
];
