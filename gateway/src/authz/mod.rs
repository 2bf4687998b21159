//! `mcp-access-authz`: a forward-auth sidecar on [`crate::SessionCache`], so a proxy that can
//! call out (Envoy `ext_authz` HTTP, Traefik `ForwardAuth`, nginx `auth_request`) enforces
//! MCP Access without linking the library.

pub mod cli;
pub mod config;
pub mod http;
pub mod wiring;

pub use cli::Cli;
pub use config::Config;
pub use wiring::{main, run};
