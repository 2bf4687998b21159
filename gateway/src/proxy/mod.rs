//! `mcp-access-gateway`: an enforcing reverse proxy in front of one MCP server (DESIGN §5a,
//! docs/session-tokens.md). One concern per file; the decisions are pure functions
//! ([`crate::credential::verify`], [`crate::credential::admit`], [`mcp::check_routing_headers`],
//! [`session::Bindings`]) and the transport framing ([`mcp`], [`sse`]) stays apart from policy.

pub mod audit;
pub mod auth;
pub mod cli;
pub mod config;
pub mod cut;
pub mod http;
pub mod legacy;
pub mod mcp;
pub mod metrics;
pub mod rate;
pub mod serve;
pub mod session;
pub mod sse;
pub mod tools;
pub mod upstream;
pub mod wiring;

pub use cli::Cli;
pub use config::Config;
pub use wiring::{main, run};
