//! `mcp-access-apiserver`: the MCP Access aggregated API server.
#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    apiserver::cli::main()
}
