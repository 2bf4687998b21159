"""A stdio MCP server built only with the official Python SDK (`mcp` 2.3; `MCPServer` is what
1.x called FastMCP), run with `run(transport="stdio")`: MCP over its stdin and stdout. The
server behind `mcp-access-stdio-bridge` in gateway/tests/stdio_bridge.rs, one process per MCP
session.

Tools:
  echo(text)        -> text
  pid()             -> this process's id (two sessions, two processes)
  remember(value)   -> "ok", keeping value in this process
  recall()          -> what this process was told to remember ("" if nothing)
  count(n)          -> "counted N", after N progress notifications
  exit()            -> never answers: the process exits at once
"""

import os

import anyio
from mcp.server.mcpserver import Context, MCPServer

mcp = MCPServer("mcp-access-e2e-stdio", version="1.0.0")

memory = {"value": ""}


@mcp.tool()
def echo(text: str) -> str:
    """Returns its argument."""
    return text


@mcp.tool()
def pid() -> int:
    """The id of the process serving this session."""
    return os.getpid()


@mcp.tool()
def remember(value: str) -> str:
    """Keeps value in this process."""
    memory["value"] = value
    return "ok"


@mcp.tool()
def recall() -> str:
    """What this process keeps."""
    return memory["value"]


@mcp.tool()
async def count(n: int, ctx: Context) -> str:
    """Counts to n, reporting progress after each step."""
    for i in range(1, n + 1):
        await anyio.sleep(0.01)
        await ctx.report_progress(i, n, f"step {i}")
    return f"counted {n}"


@mcp.tool()
def exit() -> str:
    """Ends this process without answering."""
    os._exit(0)


if __name__ == "__main__":
    mcp.run(transport="stdio")
