"""An MCP client built only with the official Python SDK (`mcp` 2.3): `mcp.Client` over the
SDK's Streamable HTTP transport, with a bearer token, in `mode="legacy"` (initialize handshake)
or `mode="2026-07-28"` (no handshake); or, with `--transport sse`, over the SDK's legacy
HTTP+SSE transport (`sse_client`, `--url` the GET /sse endpoint; initialize handshake). Used by e2e/tests/cluster/mcp_gateway.rs against
`mcp-access-gateway` and by hand against e2e/mcp/upstream.py.

Scenarios (`--scenario`):
  basic   initialize (legacy) / adopt (2026-07-28), tools/list, tools/call echo and whoami
  count   tools/call count with a progress callback: one `progress` line per notification,
          as it arrives; with a large `--count` this is the open stream a revocation must cut
  tools   tools/list, then tools/call echo and tools/call count (either refusal recorded as
          `echo_error` / `count.error`): on a session whose spec.tools
          grants echo only, the list shows only what is granted and count fails with the
          gateway's JSON-RPC error (its code, message and data reported)
  prm     the RFC 9728 document, discovered the way the SDK's OAuth client does
          (`build_protected_resource_metadata_discovery_urls`) and parsed by the SDK's
          `ProtectedResourceMetadata` model (`handle_protected_resource_response`)

Every line on stdout is one JSON object: zero or more `{"kind": "progress", ...}` (flushed as
they happen) and then exactly one `{"kind": "result", ...}`. When the server answers an HTTP
error, the result says `"ok": false` and carries `http`: the status, the WWW-Authenticate
header, the `resource_metadata` and `error` the SDK's own challenge parser reads from it,
`X-MCP-Deny-Reason` and the JSON body's `reason` — next to `error`, what the SDK surfaced.
The token is never printed.
"""

import argparse
import json
import sys
import time
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.auth.utils import (
    build_protected_resource_metadata_discovery_urls,
    extract_field_from_www_auth,
    extract_resource_metadata_from_www_auth,
    handle_protected_resource_response,
)
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj, sort_keys=True), flush=True)


class HttpErrors:
    """Records the HTTP errors the SDK's HTTP client received (an httpx2 response hook)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def __call__(self, response: httpx2.Response) -> None:
        if response.status_code < 400:
            return
        body = (await response.aread()).decode("utf-8", "replace")
        try:
            reason = json.loads(body).get("reason")
        except (ValueError, AttributeError):
            reason = None
        self.seen.append(
            {
                "status": response.status_code,
                "method": response.request.method,
                "www_authenticate": response.headers.get("www-authenticate"),
                "resource_metadata": extract_resource_metadata_from_www_auth(response),
                "error": extract_field_from_www_auth(response, "error"),
                "error_description": extract_field_from_www_auth(response, "error_description"),
                "deny_reason_header": response.headers.get("x-mcp-deny-reason"),
                "reason": reason,
                "body": body[:2000],
            }
        )


def http_client(token: str | None, errors: HttpErrors) -> httpx2.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(30.0, read=300.0),
        event_hooks={"response": [errors]},
    )


def sse_transport(url: str, token: str | None, errors: HttpErrors) -> Any:
    """The SDK's legacy HTTP+SSE client transport, its HTTP client recording errors as above."""

    def factory(
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        client = http_client(token, errors)
        if headers:
            client.headers.update(headers)
        return client

    return sse_client(url, timeout=30.0, sse_read_timeout=300.0, httpx_client_factory=factory)


def tool_text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def run_basic(client: Client, out: dict[str, Any]) -> None:
    out["protocol_version"] = client.protocol_version
    out["server_name"] = client.server_info.name if client.server_info else None
    tools = await client.list_tools()
    out["tools"] = sorted(t.name for t in tools.tools)
    echoed = await client.call_tool("echo", {"text": "hello through the gateway"})
    out["echo"] = tool_text(echoed)
    out["echo_is_error"] = bool(echoed.is_error)
    who = await client.call_tool("whoami", {})
    out["whoami"] = json.loads(tool_text(who))


async def run_tools(client: Client, out: dict[str, Any]) -> None:
    tools = await client.list_tools()
    out["tools"] = sorted(t.name for t in tools.tools)
    try:
        echoed = await client.call_tool("echo", {"text": "granted"})
        out["echo"] = tool_text(echoed)
    except MCPError as e:
        out["echo_error"] = {"code": e.code, "message": e.message, "data": e.data}
    try:
        counted = await client.call_tool("count", {"n": 1, "delay_ms": 1})
        out["count"] = {"result": tool_text(counted), "is_error": bool(counted.is_error)}
    except MCPError as e:
        out["count"] = {"error": {"code": e.code, "message": e.message, "data": e.data}}


async def run_count(client: Client, out: dict[str, Any], n: int, delay_ms: int) -> None:
    out["protocol_version"] = client.protocol_version
    started = time.monotonic()
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)
        emit(
            {
                "kind": "progress",
                "progress": value,
                "total": total,
                "message": message,
                "t": round(time.monotonic() - started, 4),
            }
        )

    try:
        result = await client.call_tool(
            "count", {"n": n, "delay_ms": delay_ms}, progress_callback=on_progress
        )
        out["count"] = tool_text(result)
        out["count_is_error"] = bool(result.is_error)
    finally:
        out["progress"] = progress
        out["call_ended_after"] = round(time.monotonic() - started, 4)


async def run_prm(url: str, token: str | None, out: dict[str, Any]) -> None:
    errors = HttpErrors()
    async with http_client(token, errors) as http:
        # What the SDK's OAuth client starts from: the 401 challenge (run without a token).
        probe = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        out["probe_status"] = probe.status_code
        out["challenge_resource_metadata"] = extract_resource_metadata_from_www_auth(probe)
        # The challenge names the public URL; locally the same paths are asked of `url`'s origin.
        for candidate in build_protected_resource_metadata_discovery_urls(None, url):
            response = await http.get(candidate)
            metadata = await handle_protected_resource_response(response)
            out.setdefault("tried", []).append({"url": candidate, "status": response.status_code})
            if metadata is not None:
                out["metadata"] = metadata.model_dump(mode="json", exclude_none=True)
                out["metadata_url"] = candidate
                return
        raw = await http.get(build_protected_resource_metadata_discovery_urls(None, url)[-1])
        out["raw"] = raw.text[:2000]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the MCP endpoint, e.g. http://127.0.0.1:PORT/mcp")
    parser.add_argument("--token-file", help="file holding the bearer token (none: no Authorization header)")
    parser.add_argument("--mode", default="legacy", help='"legacy" or a modern version such as "2026-07-28"')
    parser.add_argument("--transport", default="streamable-http", choices=["streamable-http", "sse"])
    parser.add_argument("--scenario", default="basic", choices=["basic", "count", "tools", "prm"])
    parser.add_argument("--count", type=int, default=5)
    parser.add_argument("--delay-ms", type=int, default=50)
    args = parser.parse_args()

    token = None
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            token = f.read().strip()

    out: dict[str, Any] = {
        "kind": "result",
        "mode": args.mode,
        "scenario": args.scenario,
        "transport": args.transport,
    }
    if args.scenario == "prm":
        await run_prm(args.url, token, out)
        out["ok"] = "metadata" in out
        emit(out)
        return 0

    errors = HttpErrors()
    try:
        async with http_client(token, errors) as http:
            if args.transport == "sse":
                transport = sse_transport(args.url, token, errors)
            else:
                transport = streamable_http_client(args.url, http_client=http)
            async with Client(transport, mode=args.mode, read_timeout_seconds=120) as client:
                if args.scenario == "basic":
                    await run_basic(client, out)
                elif args.scenario == "tools":
                    await run_tools(client, out)
                else:
                    await run_count(client, out, args.count, args.delay_ms)
        out["ok"] = True
    except Exception as e:  # noqa: BLE001 - every failure is reported to the test, not raised
        out["ok"] = False
        leaf: BaseException = e
        while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
            leaf = leaf.exceptions[0]
        if isinstance(leaf, MCPError):
            out["error"] = {"type": "MCPError", "code": leaf.code, "message": leaf.message, "data": leaf.data}
        else:
            out["error"] = {"type": type(leaf).__name__, "message": str(leaf)}
    out["http"] = errors.seen[0] if errors.seen else None
    out["http_errors"] = len(errors.seen)
    emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
