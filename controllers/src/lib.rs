//! The MCP Access controllers (DESIGN §6): one kube-runtime `Controller` per concern, each a
//! pure "desired state" builder with the I/O at the edge.
//!
//! - [`mcpserver`]: an MCPServer's workload (Deployment + Service with the `mcp-access-gateway`
//!   gateway container), secret validation, the image allow-list, status and Events;
//! - [`host`]: a Host's runtime (Deployment, Service, workspace PVC, ServiceAccount and Role,
//!   NetworkPolicy) and the startup sweep of deleted Hosts' objects;
//! - [`context`]: a Context's status: where each server it names stands, and `Ready`;
//! - [`hostapi`]: the host-scoped HTTPS API (inventory and credentials, RS256 host tokens);
//! - [`children`]: what the three share about their children: labels, the digest and the
//!   compare-before-apply check, owner references, apply, prune, and one [`children::ReconcileError`];
//! - [`retire`]: the finalizer that fences a deleted MCPServer through the aggregated API (a
//!   `server_retired` Revocation) before its objects may go.
#![forbid(unsafe_code)]

/// The binary's name, as its listening lines say it.
pub const BINARY: &str = "mcp-access-controllers";

pub mod children;
pub mod cli;
pub mod config;
pub mod context;
pub mod host;
pub mod hostapi;
pub mod leader;
pub mod mcpserver;
pub mod metrics;
pub mod netpol;
pub mod retire;
pub mod wiring;
