#!/usr/bin/env bash
# Prints a host token for the Host API of the cluster hack/up.sh runs, signed (RS256) by the
# local issuer's key in .local/pki/host-token.key: the claims the Host API requires, for the
# live Host NAMESPACE/NAME (its UID is read with kubectl, so a re-created Host needs a new
# token).
#
#   hack/host-token.sh NAMESPACE NAME [TTL_SECONDS]     (TTL default 300, the API's maximum 600)
#
# Only for the local cluster: in production a host's tokens come from the platform's issuer,
# whose public key, issuer and audience the controllers are configured with (docs/hosts.md).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 2 || $# -gt 3 ]]; then
  echo "usage: $0 NAMESPACE NAME [TTL_SECONDS]" >&2
  exit 2
fi
namespace=$1 name=$2 ttl=${3:-300}
# 1 to 600: the local Host API's --host-token-max-ttl (the default) refuses longer ones.
[[ $ttl =~ ^[0-9]+$ ]] && (( 10#$ttl >= 1 && 10#$ttl <= 600 )) ||
  { echo "$0: TTL_SECONDS must be 1 to 600 seconds" >&2; exit 2; }

dir=${MCP_ACCESS_LOCAL_DIR:-$(pwd -P)/.local}
[[ -s $dir/env ]] || { echo "$0: $dir/env not found: start the cluster with hack/up.sh" >&2; exit 1; }
# shellcheck disable=SC1091
. "$dir/env"
: "${HOST_TOKEN_SIGNING_KEY_FILE:?$dir/env has no HOST_TOKEN_SIGNING_KEY_FILE: restart hack/up.sh}"

uid=$(KUBECONFIG=$KUBECONFIG kubectl get hosts.mcp-runtime.dev -n "$namespace" "$name" \
  -o 'jsonpath={.metadata.uid}')
[[ -n $uid ]] || { echo "$0: host $namespace/$name has no uid" >&2; exit 1; }

b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }

# JSON from python3, so that no value is ever spliced into JSON by hand.
claims=$(python3 - "$HOST_TOKEN_ISSUER" "$HOST_TOKEN_AUDIENCE" "$namespace" "$name" "$uid" "$ttl" <<'EOF'
import json, sys, time
iss, aud, ns, name, uid, ttl = sys.argv[1:]
now = int(time.time())
print(json.dumps({
    "iss": iss,
    "aud": [aud],
    "iat": now,
    "exp": now + int(ttl),
    "hostRefs": [{"namespace": ns, "name": name}],
    "host_uid": uid,
    "capabilities": ["mcp:credential:read"],
}, separators=(",", ":")))
EOF
)
input="$(printf '%s' '{"alg":"RS256","typ":"JWT"}' | b64url).$(printf '%s' "$claims" | b64url)"
signature=$(printf '%s' "$input" | openssl dgst -sha256 -sign "$HOST_TOKEN_SIGNING_KEY_FILE" -binary | b64url)
printf '%s.%s\n' "$input" "$signature"
