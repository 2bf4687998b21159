//! `mcp-access-apiserver`: the MCP Access aggregated API server.
#![forbid(unsafe_code)]

/// mimalloc rather than glibc's malloc: a create allocates and frees many small JSON values,
/// and glibc's allocator was about a fifth of this process's CPU per create.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    apiserver::wiring::main()
}
