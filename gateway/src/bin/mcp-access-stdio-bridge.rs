//! `mcp-access-stdio-bridge`: a stdio MCP server served as Streamable HTTP, one child process
//! per MCP session (see `gateway::stdio_bridge`).
#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    gateway::stdio_bridge::cli::main()
}
