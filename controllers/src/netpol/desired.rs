//! The desired NetworkPolicies: a pure function of the MCPServers, the Contexts and the
//! controller's settings, built as the JSON that server-side apply sends.

use apis::runtime::PortRef;
use ipnet::IpNet;

/// An `ipBlock` peer: a CIDR with the ranges carved out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpBlock {
    pub cidr: IpNet,
    pub except: Vec<IpNet>,
}

/// One proven external destination of a server (layer L3): addresses and ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressAllow {
    /// The egress binding it comes from.
    pub binding: String,
    pub blocks: Vec<IpBlock>,
    pub ports: Vec<PortRef>,
}
