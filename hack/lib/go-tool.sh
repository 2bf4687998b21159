# shellcheck shell=bash
# go_tool_build SCRIPT DIR MODULE PACKAGE NAME GO_MIN: builds the Go command MODULE/PACKAGE at
# the exact version DIR/go.mod requires of MODULE (a small tools module of its own, with a
# committed go.sum that the default -mod=readonly build checks every download against) into
# ${MCP_ACCESS_CACHE:-$HOME/.cache/mcp-access}/bin/NAME-<version>-<key>, reused when present;
# <key> is go_tool_key of DIR, so a changed go.sum or tools.go (a replaced dependency, another
# package) builds anew instead of reusing a binary of the old sources. Prints
# only the binary's absolute path on stdout; everything else goes to stderr, errors named after
# SCRIPT. The module proxy serves exact versions only, never @latest.
# go_tool_key DIR [WORD...]: 16 hex digits of the SHA-256 of DIR's go.mod, go.sum and *.go files
# (in name order) and the WORDs (build flags that change the binary). Needs no go command, so a
# cached tool costs nothing to find.
go_tool_key() {
  local dir=$1
  shift
  {
    cat "$dir/go.mod" "$dir/go.sum"
    find "$dir" -maxdepth 1 -name '*.go' -type f -print0 | sort -z | xargs -0 -r cat
    printf '%s\n' "$@"
  } | sha256sum | cut -c1-16
}

go_tool_build() {
  local script=$1 dir=$2 mod=$3 pkg=$4 name=$5 go_min=$6
  local version cache bin out tmp
  version=$(awk -v m="$mod" '($1 == "require" && $2 == m) { print $3 } (NF >= 2 && $1 == m) { print $2 }' "$dir/go.mod" | head -n1)
  if [[ ! $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    echo "$script: no exact 'require $mod' version in $dir/go.mod" >&2
    return 1
  fi
  cache=${MCP_ACCESS_CACHE:-$HOME/.cache/mcp-access}
  mkdir -p "$cache/bin"
  bin=$(cd "$cache/bin" && pwd -P)
  out="$bin/$name-$version-$(go_tool_key "$dir" "$mod/$pkg")"
  if [[ ! -x $out ]]; then
    if ! command -v go >/dev/null 2>&1; then
      echo "$script: go is not on PATH (Go >= $go_min is needed)" >&2
      return 1
    fi
    echo "building $name $version..." >&2
    tmp=$(mktemp "$bin/.$name.XXXXXX")
    # shellcheck disable=SC2064 # the path is fixed now, on purpose
    trap "rm -f '$tmp'" EXIT
    (cd "$dir" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" -o "$tmp" "$mod/$pkg") >&2
    chmod 755 "$tmp"
    mv -f "$tmp" "$out"
  fi
  echo "$out"
}

# go_build_cached SCRIPT NAME DIR PACKAGE [go build flags...]: builds PACKAGE in the tools module
# DIR into ${MCP_ACCESS_CACHE:-$HOME/.cache/mcp-access}/bin/NAME-<key> (<key>: go_tool_key of DIR,
# PACKAGE and the flags) unless it is already there, and leaves that path in $built. Builds into
# a temporary name in the same directory and renames it, so an interrupted or concurrent run
# never leaves a half-written binary under the final name. go.sum is committed, so the default
# -mod=readonly build is reproducible from a clean clone; modules come from GOMODCACHE or the
# Go module proxy, outside the repository. CGO_ENABLED defaults to 0 (static binaries).
go_build_cached() {
  local script=$1 name=$2 dir=$3 pkg=$4
  shift 4
  local cache bin out tmp start
  cache=${MCP_ACCESS_CACHE:-$HOME/.cache/mcp-access}
  mkdir -p "$cache/bin"
  bin=$(cd "$cache/bin" && pwd -P)
  out=$bin/$name-$(go_tool_key "$dir" "$pkg" "$@")
  built=$out
  if [[ -x $out ]]; then
    echo "$script: $name: cached at $out" >&2
    return 0
  fi
  if ! command -v go >/dev/null 2>&1; then
    echo "$script: go is not on PATH (Go >= 1.26 is needed to build $name)" >&2
    return 1
  fi
  tmp=$(mktemp "$bin/.$name.XXXXXX")
  echo "$script: $name: building $pkg (cold builds take many minutes)..." >&2
  start=$SECONDS
  if ! (cd "$dir" && CGO_ENABLED=${CGO_ENABLED:-0} nice -n 10 go build -trimpath -o "$tmp" "$@" "$pkg") >&2; then
    rm -f "$tmp"
    echo "$script: $name: build failed" >&2
    return 1
  fi
  chmod 755 "$tmp"
  mv -f "$tmp" "$out"
  echo "$script: $name: built in $((SECONDS - start))s -> $out" >&2
}
