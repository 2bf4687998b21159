// An MCP client built only with the official TypeScript SDK (@modelcontextprotocol/sdk, pinned
// in package-lock.json beside this file): `Client` over `StreamableHTTPClientTransport` with a
// bearer token. The same scenarios and output as e2e/mcp/client.py (`basic`, `count`, `tools`; one JSON
// object per stdout line, `progress` lines as they arrive, then one `result`), so
// e2e/tests/cluster/mcp_gateway.rs reads both alike. The SDK's node_modules live outside the
// repository: MCP_ACCESS_MCP_NODE_DIR (set by hack/test.sh through hack/lib/mcp-sdk.sh).
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const { createRequire } = require("node:module");

const nodeDir = process.env.MCP_ACCESS_MCP_NODE_DIR;
if (!nodeDir) {
  console.error("MCP_ACCESS_MCP_NODE_DIR is not set: run through hack/test.sh");
  process.exit(2);
}
const sdk = createRequire(path.join(nodeDir, "package.json"));
const { Client } = sdk("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = sdk("@modelcontextprotocol/sdk/client/streamableHttp.js");
const { extractWWWAuthenticateParams } = sdk("@modelcontextprotocol/sdk/client/auth.js");
const { CallToolResultSchema } = sdk("@modelcontextprotocol/sdk/types.js");

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

function arg(name, fallback) {
  const at = process.argv.indexOf(`--${name}`);
  return at >= 0 && at + 1 < process.argv.length ? process.argv[at + 1] : fallback;
}

const text = (result) => (result.content || []).map((c) => c.text || "").join("");

async function main() {
  const url = arg("url");
  const tokenFile = arg("token-file");
  const scenario = arg("scenario", "basic");
  const n = Number(arg("count", "5"));
  const delayMs = Number(arg("delay-ms", "50"));
  const token = tokenFile ? fs.readFileSync(tokenFile, "utf8").trim() : undefined;

  // The HTTP errors the SDK's transport received: a fetch wrapper (the transport's `fetch`
  // option), reading the challenge with the SDK's own parser.
  const httpErrors = [];
  const recordingFetch = async (input, init) => {
    const response = await fetch(input, init);
    if (response.status >= 400) {
      const body = await response.clone().text();
      let reason = null;
      try {
        reason = JSON.parse(body).reason ?? null;
      } catch (_) {}
      const challenge = extractWWWAuthenticateParams(response);
      httpErrors.push({
        status: response.status,
        method: (init && init.method) || "GET",
        www_authenticate: response.headers.get("www-authenticate"),
        resource_metadata: challenge.resourceMetadataUrl ? challenge.resourceMetadataUrl.toString() : null,
        error: challenge.error ?? null,
        deny_reason_header: response.headers.get("x-mcp-deny-reason"),
        reason,
        body: body.slice(0, 2000),
      });
    }
    return response;
  };

  const out = { kind: "result", mode: "ts-sdk", scenario };
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers },
    fetch: recordingFetch,
  });
  const client = new Client({ name: "mcp-access-e2e-ts", version: "1.0.0" });
  try {
    await client.connect(transport);
    out.protocol_version = transport.protocolVersion ?? null;
    out.server_name = client.getServerVersion()?.name ?? null;
    if (scenario === "basic") {
      const tools = await client.listTools();
      out.tools = tools.tools.map((t) => t.name).sort();
      const echoed = await client.callTool({ name: "echo", arguments: { text: "hello through the gateway" } });
      out.echo = text(echoed);
      out.echo_is_error = Boolean(echoed.isError);
      out.whoami = JSON.parse(text(await client.callTool({ name: "whoami", arguments: {} })));
    } else if (scenario === "tools") {
      const tools = await client.listTools();
      out.tools = tools.tools.map((t) => t.name).sort();
      try {
        out.echo = text(await client.callTool({ name: "echo", arguments: { text: "granted" } }));
      } catch (e) {
        out.echo_error = { code: e.code ?? null, message: String(e.message ?? e), data: e.data ?? null };
      }
      try {
        const counted = await client.callTool({ name: "count", arguments: { n: 1, delay_ms: 1 } });
        out.count = { result: text(counted), is_error: Boolean(counted.isError) };
      } catch (e) {
        out.count = { error: { code: e.code ?? null, message: String(e.message ?? e), data: e.data ?? null } };
      }
    } else {
      const started = performance.now();
      const progress = [];
      try {
        const result = await client.callTool(
          { name: "count", arguments: { n, delay_ms: delayMs } },
          CallToolResultSchema,
          {
            timeout: 120000,
            onprogress: (p) => {
              progress.push(p.progress);
              emit({ kind: "progress", progress: p.progress, total: p.total ?? null, message: p.message ?? null,
                     t: (performance.now() - started) / 1000 });
            },
          },
        );
        out.count = text(result);
        out.count_is_error = Boolean(result.isError);
      } finally {
        out.progress = progress;
        out.call_ended_after = (performance.now() - started) / 1000;
      }
    }
    out.ok = true;
  } catch (e) {
    out.ok = false;
    out.error = { type: e && e.constructor ? e.constructor.name : typeof e, code: e.code ?? null,
                  message: String(e && e.message ? e.message : e) };
  }
  out.http = httpErrors[0] ?? null;
  out.http_errors = httpErrors.length;
  emit(out);
  await client.close().catch(() => {});
  process.exit(0);
}

main();
