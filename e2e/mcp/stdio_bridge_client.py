"""Two concurrent MCP sessions through `mcp-access-stdio-bridge`, each with the official
Python SDK's Streamable HTTP client (`mcp` 2.3, `mcp.Client` in `mode="legacy"`: the
initialize handshake): initialize, tools/list, tools/call echo, pid, remember (a value of its
own) and recall, and count with a progress callback. Used by gateway/tests/stdio_bridge.rs.

Prints one JSON object: {"ok": bool, "sessions": [{...}, {...}]} with, per session, its
tools, echo, pid, recall and the progress it saw; or "error". On leaving, the SDK ends each
session with DELETE (the test checks that each child is gone).
"""

import argparse
import json
import sys
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def text_of(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def one_session(url: str, name: str, out: dict[str, Any], started: anyio.Event, other: anyio.Event) -> None:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=120.0)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
            out["server_name"] = client.server_info.name if client.server_info else None
            tools = await client.list_tools()
            out["tools"] = sorted(t.name for t in tools.tools)
            out["echo"] = text_of(await client.call_tool("echo", {"text": f"hello from {name}"}))
            out["pid"] = int(text_of(await client.call_tool("pid", {})))
            await client.call_tool("remember", {"value": name})
            # Both sessions live and remembered before either recalls.
            started.set()
            await other.wait()
            out["recall"] = text_of(await client.call_tool("recall", {}))
            progress: list[float] = []

            async def on_progress(p: float, total: float | None, message: str | None) -> None:
                progress.append(p)

            out["count"] = text_of(
                await client.call_tool("count", {"n": 3}, progress_callback=on_progress)
            )
            out["progress"] = progress


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    args = parser.parse_args()
    sessions: list[dict[str, Any]] = [{}, {}]
    events = [anyio.Event(), anyio.Event()]
    out: dict[str, Any] = {"sessions": sessions}
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(one_session, args.url, "a", sessions[0], events[0], events[1])
            tg.start_soon(one_session, args.url, "b", sessions[1], events[1], events[0])
        out["ok"] = True
    except Exception as e:  # noqa: BLE001 - reported to the test
        leaf: BaseException = e
        while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
            leaf = leaf.exceptions[0]
        out["ok"] = False
        out["error"] = {"type": type(leaf).__name__, "message": str(leaf)}
    print(json.dumps(out, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
