//! The MCP Access aggregated API server.
#![forbid(unsafe_code)]

pub mod admission;
pub mod auth;
pub mod cli;
pub mod config;
pub mod events;
pub mod expiry;
pub mod http;
pub mod receipts;
pub mod server;
pub mod store;
pub mod tasks;
pub mod tokens;
pub mod wiring;
pub use process::tls;
