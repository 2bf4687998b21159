//! The MCP Access controllers (DESIGN §6): one kube-runtime `Controller` per concern, each a
//! pure "desired state" builder with the I/O at the edge.
//!
//! - [`mcpserver`]: an MCPServer's workload (Deployment + Service with the `mcp-access-authz`
//!   gateway container), secret validation, the image allow-list, status and Events;
//! - [`retire`]: the finalizer that fences a deleted MCPServer through the aggregated API (a
//!   `server_retired` Revocation) before its objects may go.
#![forbid(unsafe_code)]

pub mod cli;
pub mod leader;
pub mod mcpserver;
pub mod metrics;
pub mod netpol;
pub mod retire;
