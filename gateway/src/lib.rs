//! The gateway side of MCP Access (DESIGN §5): [`SessionCache`], a live cache of one MCP
//! server's AccessSessions kept by list+watch against the apiserver's sync listener, and the
//! `mcp-access-authz` forward-auth sidecar built on it ([`authz`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), gateway::CacheError> {
//! use gateway::{CacheConfig, Decision, SessionCache};
//! let config = CacheConfig::new(
//!     "https://mcp-access-apiserver.mcp-access.svc:8085",
//!     "/var/run/secrets/mcp-access/ca.crt",
//!     "/var/run/secrets/mcp-access/token",
//! )
//! .with_env()?;
//! let (cache, sync) = SessionCache::start(config)?;
//! tokio::spawn(sync); // watch it: it only ends by panicking
//! let now = k8s_openapi::jiff::Timestamp::now();
//! if let Decision::Deny(reason) = cache.authorize("team-a", "alice-github", now).await {
//!     println!("401 {reason}");
//! }
//! // Cut a live stream when the session stops being usable:
//! let reason = cache.subscribe("team-a", "alice-github").await;
//! # let _ = reason; Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod authz;
mod cache;
mod client;
pub mod config;
pub mod credential;
pub mod decision;
mod error;
pub mod metrics;
pub mod pins;
pub mod policies;
pub mod proxy;
mod state;
pub mod stdio_bridge;
pub mod token;

pub use cache::{SessionCache, SyncStatus, SyncTask};
pub use config::{parse_stale_window, CacheConfig};
pub use decision::{Decision, DenyReason};
pub use error::CacheError;
pub use metrics::CacheMetrics;
