//! The MCP Access aggregated API server.
#![forbid(unsafe_code)]

pub mod store;
