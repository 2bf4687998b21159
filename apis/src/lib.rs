//! MCP Access API: the `access.mcp-runtime.dev/v1alpha1` types, their validation, and the
//! session rules as pure functions (no I/O), shared by the apiserver, controllers and gateways.
#![forbid(unsafe_code)]

pub mod discovery;
pub mod duration;
pub mod feed;
pub mod kinds;
pub mod kube_resource;
pub mod locks;
pub mod managed_fields;
pub mod openapi;
pub mod resources;
pub mod rules;
pub mod runtime;
pub mod selector;
pub mod session_token;
pub mod strategy;
pub mod table;
pub mod tool_policy;
pub mod types;
pub mod validation;

pub use types::*;
