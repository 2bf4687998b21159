//! `mcp-access-gateway`: the MCP Access enforcing reverse proxy.
#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    gateway::proxy::main()
}
