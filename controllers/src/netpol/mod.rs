//! NetworkPolicy layers (DESIGN §6): every MCP server isolated by default and opened only along
//! declared routes.
//!
//! - L0 `deny-all` (ingress and egress) in every runtime namespace;
//! - L1 infrastructure in every runtime namespace: DNS, the Kubernetes API for pods that opt in,
//!   the gateway → apiserver sync path;
//! - L2 per Context × server: ingress to the server port from the server's own pods and the
//!   Context's host pods, and the paired egress on the hosts' side;
//! - L3 external egress from `spec.egressBindings` ([`egress`] proves each binding safe);
//! - per-server `spec.network` ingress sources and in-cluster egress allow-lists.
//!
//! [`desired`] computes the whole set as a pure function of the inventory; this module applies
//! it and sweeps what is ours and no longer wanted, within caps.

pub mod desired;
pub mod egress;
pub mod settings;
