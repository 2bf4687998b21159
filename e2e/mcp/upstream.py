"""An MCP server built only with the official Python SDK (`mcp` 2.3), the upstream behind
`mcp-access-gateway` in the end-to-end scenarios (e2e/tests/cluster/mcp_gateway.rs).

Tools:
  echo(text)                 -> text
  whoami()                   -> JSON: the X-MCP-Access-* request headers the gateway added and
                                whether an Authorization header reached this server (it must not)
  count(n, delay_ms)         -> "counted N", after N progress notifications `delay_ms` apart

Served over Streamable HTTP at /mcp and over the legacy HTTP+SSE transport (2024-11-05) at
/sse with messages posted to /messages/, on 127.0.0.1, on a port the kernel picks (or on
`--listen HOST:PORT`: the demo MCP server image of the local node binds 0.0.0.0:8080, so that
only NetworkPolicies keep other Pods from its port): the socket is bound here and handed to
uvicorn, and its address is printed to stdout as one line, `mcp-upstream listening on
HOST:PORT`, once bound.
"""

import argparse
import json
import socket
import sys

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer

IDENTITY_PREFIX = "x-mcp-access-"

mcp = MCPServer("mcp-access-e2e-upstream", version="1.0.0")


@mcp.tool()
def echo(text: str) -> str:
    """Returns its argument."""
    return text


@mcp.tool()
def whoami(ctx: Context) -> str:
    """The identity headers this request carried, and whether a bearer token reached us."""
    headers = {k.lower(): v for k, v in (ctx.headers or {}).items()}
    return json.dumps(
        {
            "identity": {k: v for k, v in sorted(headers.items()) if k.startswith(IDENTITY_PREFIX)},
            "authorization_present": "authorization" in headers,
            "headers_seen": ctx.headers is not None,
        },
        sort_keys=True,
    )


@mcp.tool()
async def count(n: int, delay_ms: int, ctx: Context) -> str:
    """Counts to n, reporting progress after each step, `delay_ms` apart."""
    for i in range(1, n + 1):
        await anyio.sleep(delay_ms / 1000)
        await ctx.report_progress(i, n, f"step {i}")
    return f"counted {n}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="warning")
    parser.add_argument(
        "--listen",
        default="127.0.0.1:0",
        help="HOST:PORT to bind (port 0: the kernel picks); the local node's demo image binds 0.0.0.0:8080",
    )
    args = parser.parse_args()
    bind_host, _, bind_port = args.listen.rpartition(":")

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((bind_host, int(bind_port)))
    sock.listen(1024)
    sock.set_inheritable(True)
    host, port = sock.getsockname()

    app = mcp.streamable_http_app(host="127.0.0.1")
    # The SDK's legacy transport beside it: its routes need no lifespan of their own.
    app.router.routes.extend(mcp.sse_app(host="127.0.0.1").routes)
    config = uvicorn.Config(app, log_level=args.log_level, access_log=False, timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    print(f"mcp-upstream listening on {host}:{port}", flush=True)
    print(f"mcp-upstream listening on {host}:{port}", file=sys.stderr, flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
