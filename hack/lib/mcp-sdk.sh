# shellcheck shell=bash
# The official MCP SDKs the end-to-end scenarios drive through mcp-access-gateway
# (e2e/tests/cluster/mcp_gateway.rs), installed once outside the repository and reused:
#
#   mcp_sdk_python   prints the python of a venv holding e2e/mcp/requirements.txt (the `mcp`
#                    Python SDK and its dependencies, pinned with hashes, installed with
#                    --require-hashes), in $MCP_ACCESS_CACHE/mcp-sdk-py-<mcp version>
#   mcp_sdk_node     prints a directory whose node_modules holds the TypeScript SDK exactly as
#                    e2e/mcp/ts/package-lock.json pins it (`npm ci`), in
#                    $MCP_ACCESS_CACHE/mcp-sdk-ts-<sdk version>; fails (status 1, reason on
#                    stderr) when node or npm is missing or the install fails
#
# Only the path goes to stdout; progress and errors go to stderr. A cache entry is reused while
# the pin file it was made from is unchanged (a copy is kept beside it and compared).

_mcp_sdk_cache() {
  local cache=${MCP_ACCESS_CACHE:-$HOME/.cache/mcp-access}
  mkdir -p "$cache" && (cd "$cache" && pwd -P)
}

mcp_sdk_python() {
  local root req version cache dir python
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
  req=$root/e2e/mcp/requirements.txt
  version=$(sed -n 's/^mcp==\([0-9][0-9.]*\).*/\1/p' "$req")
  if [[ -z $version ]]; then
    echo "mcp-sdk.sh: no 'mcp==X.Y.Z' pin in $req" >&2
    return 1
  fi
  cache=$(_mcp_sdk_cache) || return 1
  dir=$cache/mcp-sdk-py-$version
  python=$dir/bin/python
  if [[ -x $python ]] && cmp -s "$req" "$dir/requirements.txt"; then
    echo "$python"
    return 0
  fi
  # A venv made before the pin file was kept beside it: adopt it when it holds exactly the pins.
  if [[ -x $python && ! -e $dir/requirements.txt ]] &&
    diff <(grep -E '^[A-Za-z0-9_.-]+==' "$req" | sed 's/ .*//' | tr 'A-Z_' 'a-z-' | sort) \
      <("$python" -m pip freeze 2>/dev/null | tr 'A-Z_' 'a-z-' | sort) >/dev/null; then
    cp "$req" "$dir/requirements.txt"
    echo "$python"
    return 0
  fi
  if ! command -v python3 >/dev/null 2>&1; then
    echo "mcp-sdk.sh: python3 is not on PATH (the MCP Python SDK needs >= 3.10)" >&2
    return 1
  fi
  echo "installing the MCP Python SDK $version into $dir..." >&2
  rm -rf "$dir"
  python3 -m venv "$dir" >&2 &&
    "$python" -m pip install -q --disable-pip-version-check --require-hashes --only-binary=:all: \
      -r "$req" >&2 &&
    cp "$req" "$dir/requirements.txt" || {
    echo "mcp-sdk.sh: installing $req failed" >&2
    rm -rf "$dir"
    return 1
  }
  echo "$python"
}

mcp_sdk_node() {
  local root src version cache dir
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
  src=$root/e2e/mcp/ts
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "mcp-sdk.sh: node or npm is not on PATH: the TypeScript SDK scenarios are skipped" >&2
    return 1
  fi
  version=$(sed -n 's/.*"@modelcontextprotocol\/sdk": *"\([0-9][0-9.]*\)".*/\1/p' "$src/package.json" | head -n1)
  if [[ -z $version ]]; then
    echo "mcp-sdk.sh: no exact @modelcontextprotocol/sdk version in $src/package.json" >&2
    return 1
  fi
  cache=$(_mcp_sdk_cache) || return 1
  dir=$cache/mcp-sdk-ts-$version
  if [[ -d $dir/node_modules/@modelcontextprotocol/sdk ]] &&
    cmp -s "$src/package-lock.json" "$dir/package-lock.json" &&
    cmp -s "$src/package.json" "$dir/package.json"; then
    echo "$dir"
    return 0
  fi
  echo "installing the MCP TypeScript SDK $version into $dir..." >&2
  mkdir -p "$dir"
  cp "$src/package.json" "$src/package-lock.json" "$dir/"
  if ! (cd "$dir" && npm ci --no-audit --no-fund --ignore-scripts >&2); then
    echo "mcp-sdk.sh: npm ci of $src/package-lock.json failed" >&2
    rm -rf "$dir/node_modules"
    return 1
  fi
  echo "$dir"
}
