//! `mcp-access-authz`: the MCP Access forward-auth sidecar.
#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    gateway::authz::main()
}
