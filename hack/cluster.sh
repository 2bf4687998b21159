#!/usr/bin/env bash
# A real local control plane (etcd + kube-apiserver + kube-controller-manager) as background
# processes, for the end-to-end tests and hack/up.sh. No Docker, kubelet or scheduler: Pods stay
# Pending, everything else (namespaces, garbage collection, Deployments -> ReplicaSets -> Pods,
# service accounts, TokenRequest, aggregation) is real.
#
#   hack/cluster.sh start  DIR   generate/reuse DIR/pki, start the three processes (restarting any
#                                that DIR's previous run left behind), write DIR/admin.kubeconfig and
#                                DIR/env; progress on stderr, last stdout line is KUBECONFIG=<path>
#   hack/cluster.sh stop   DIR   SIGTERM, then SIGKILL after a few seconds; idempotent
#   hack/cluster.sh status DIR   exit 0 if kube-apiserver answers /readyz
#
# DIR layout:
#   pki/     ca.{crt,key}                    cluster CA: --client-ca-file, signs apiserver.crt and
#                                            admin.crt, and is the controller-manager's signing CA
#            apiserver.{crt,key}             kube-apiserver serving cert
#            admin.{crt,key}                 CN=admin, O=system:masters
#            front-proxy-ca.{crt,key}        --requestheader-client-ca-file
#            front-proxy-client.{crt,key}    CN=front-proxy-client, the aggregator's proxy client cert
#            sa.{key,pub}                    service-account signing key pair
#            aggregated-ca.{crt,key}         CA for our aggregated server (the APIService caBundle)
#            mcp-access-apiserver.{crt,key}  our server's serving cert (SAN
#                                            mcp-access-apiserver.mcp-access.svc, localhost, 127.0.0.1)
#            host-api-ca.{crt,key}, host-api.{crt,key}  the controllers' Host API CA and serving cert
#            host-token.{key,pub}            the local host token issuer (RS256; hack/host-token.sh)
#            Existing files are reused, so a restart keeps trust (delete pki/ to start over).
#   etcd/    etcd data;  logs/  one log per process;  run/  pid files;  ports  the ports in use
#            (reused on restart when still free, so the kubeconfig and the service-account issuer
#            stay the same).
#   admin.kubeconfig, env (shell-sourceable: KUBECONFIG, KUBE_APISERVER_URL, ETCD_URL, CLUSTER_DIR,
#            *_PID, MCP_ACCESS_TLS_CERT_FILE, MCP_ACCESS_TLS_PRIVATE_KEY_FILE, AGGREGATED_CA_FILE,
#            HOST_API_*, HOST_TOKEN_*, ...)
#
# Environment: CLUSTER_START_TIMEOUT (seconds per component, default 180),
# KUBE_APISERVER/KUBE_CONTROLLER_MANAGER/ETCD (binaries; default: hack/build-kube.sh).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
timeout=${CLUSTER_START_TIMEOUT:-180}

log() { printf '[cluster %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

# The local node (CLUSTER_NODE=1, hack/node.sh): its name, its address (on
# the loopback interface, where Pods reach the host), and its Pods' network. One node per machine.
NODE_NAME=mcp-access-node
NODE_IP=10.250.0.1
POD_CIDR=10.244.0.0/24
CLUSTER_DNS=10.0.0.10
die() { log "error: $*"; exit 1; }

usage() {
  echo "usage: $0 start|stop|status DIR" >&2
  exit 2
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

port_is_free() {
  python3 - "$1" <<'EOF' 2>/dev/null
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
EOF
}

# ---------------------------------------------------------------------------------------------
# Certificates (openssl; RSA 2048, PKCS#8 keys, 10 years)

days=3650

new_key() { # path
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1" 2>/dev/null
  chmod 600 "$1"
}

serial() { printf '0x%s' "$(openssl rand -hex 16)"; }

# new_ca NAME CN: pki/NAME.{crt,key}, a self-signed CA
new_ca() {
  local name=$1 cn=$2
  log "pki: generating CA $name ($cn)"
  new_key "$pki/$name.key"
  openssl req -x509 -new -key "$pki/$name.key" -subj "/CN=$cn" -days "$days" -set_serial "$(serial)" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign,cRLSign" \
    -addext "subjectKeyIdentifier=hash" \
    -out "$pki/$name.crt" 2>/dev/null
}

# new_leaf NAME CA SUBJECT EKU [SAN]: pki/NAME.{crt,key} signed by pki/CA.{crt,key}
new_leaf() {
  local name=$1 ca=$2 subject=$3 eku=$4 san=${5:-}
  log "pki: generating $name ($subject${san:+, $san}) signed by $ca"
  new_key "$pki/$name.key"
  local ext
  ext=$(mktemp)
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    echo "subjectKeyIdentifier=hash"
    echo "authorityKeyIdentifier=keyid"
    if [[ -n $san ]]; then echo "subjectAltName=$san"; fi
  } >"$ext"
  openssl req -new -key "$pki/$name.key" -subj "$subject" 2>/dev/null |
    openssl x509 -req -CA "$pki/$ca.crt" -CAkey "$pki/$ca.key" -set_serial "$(serial)" \
      -days "$days" -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$ext"
}

have() { # NAME...: all of pki/NAME.{crt,key} exist
  local n
  for n in "$@"; do [[ -s $pki/$n.crt && -s $pki/$n.key ]] || return 1; done
}

gen_pki() {
  mkdir -p "$pki"
  chmod 700 "$pki"
  local fresh=

  # Cluster CA, kube-apiserver serving cert, admin client cert.
  fresh=
  have ca || { new_ca ca kubernetes-ca; fresh=1; }
  [[ -z $fresh ]] && have apiserver ||
    new_leaf apiserver ca "/CN=kube-apiserver" serverAuth \
      "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.0.0.1,IP:$NODE_IP"
  [[ -z $fresh ]] && have admin ||
    new_leaf admin ca "/O=system:masters/CN=admin" clientAuth

  # Front proxy (the aggregator's client identity towards aggregated servers).
  fresh=
  have front-proxy-ca || { new_ca front-proxy-ca front-proxy-ca; fresh=1; }
  [[ -z $fresh ]] && have front-proxy-client ||
    new_leaf front-proxy-client front-proxy-ca "/CN=front-proxy-client" clientAuth

  # Service-account key pair.
  if [[ ! -s $pki/sa.key || ! -s $pki/sa.pub ]]; then
    log "pki: generating service-account key pair"
    new_key "$pki/sa.key"
    openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  fi

  # Our aggregated server: its own CA (the APIService caBundle) and serving cert.
  fresh=
  have aggregated-ca || { new_ca aggregated-ca mcp-access-aggregated-ca; fresh=1; }
  [[ -z $fresh ]] && have mcp-access-apiserver ||
    new_leaf mcp-access-apiserver aggregated-ca "/CN=mcp-access-apiserver.mcp-access.svc" serverAuth \
      "DNS:mcp-access-apiserver.mcp-access.svc,DNS:mcp-access-apiserver.mcp-access.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP"
  # The controllers' Host API: its own CA and serving cert, and the key pair of the local host
  # token issuer (hack/host-token.sh signs with host-token.key; the API verifies with .pub).
  fresh=
  have host-api-ca || { new_ca host-api-ca mcp-access-host-api-ca; fresh=1; }
  [[ -z $fresh ]] && have host-api ||
    new_leaf host-api host-api-ca "/CN=mcp-access-controllers.mcp-access.svc" serverAuth \
      "DNS:mcp-access-controllers.mcp-access.svc,DNS:mcp-access-controllers.mcp-access.svc.cluster.local,DNS:localhost,IP:127.0.0.1"
  if [[ ! -s $pki/host-token.key || ! -s $pki/host-token.pub ]]; then
    log "pki: generating the local host token issuer's key pair"
    new_key "$pki/host-token.key"
    openssl pkey -in "$pki/host-token.key" -pubout -out "$pki/host-token.pub" 2>/dev/null
  fi
  # The session-token signing key of mcp-access-apiserver (EC P-256, PKCS#8; ES256 tokens of
  # the AccessSession token subresource, docs/session-tokens.md).
  if [[ ! -s $pki/session-token.key || ! -s $pki/session-token.pub ]]; then
    log "pki: generating the session-token signing key"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$pki/session-token.key" 2>/dev/null
    chmod 600 "$pki/session-token.key"
    openssl pkey -in "$pki/session-token.key" -pubout -out "$pki/session-token.pub" 2>/dev/null
  fi
  # Certificates and the public keys are not secret; keys stay 0600 in a 0700 directory.
  chmod 644 "$pki"/*.crt "$pki"/sa.pub "$pki"/host-token.pub "$pki"/session-token.pub
}

# ---------------------------------------------------------------------------------------------
# Processes

# Pid of component NAME if its recorded process is alive and is really ours (its command line
# mentions DIR), else nothing.
live_pid() {
  local f=$run/$1.pid pid
  [[ -s $f ]] || return 0
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  [[ -r /proc/$pid/cmdline ]] || return 0
  if tr '\0' '\n' <"/proc/$pid/cmdline" | grep -qF -- "$dir"; then
    echo "$pid"
  fi
}

stop_one() { # NAME
  local name=$1 pid i
  pid=$(live_pid "$name")
  if [[ -z $pid ]]; then
    rm -f "$run/$name.pid"
    return 0
  fi
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    [[ -d /proc/$pid ]] || break
    # A zombie (not reaped by its parent yet) is as good as gone.
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] && break
    sleep 0.1
  done
  if [[ -d /proc/$pid && $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]; then
    log "$name did not exit after SIGTERM; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      [[ -d /proc/$pid && $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]] || break
      sleep 0.1
    done
  fi
  rm -f "$run/$name.pid"
}

stop_all() {
  if [[ -e $run/containerd.pid || -e $run/kubelet.pid || -e $dir/node ]]; then
    "$here/node.sh" stop "$dir" || log "hack/node.sh stop failed"
  fi
  stop_one kube-controller-manager
  stop_one kube-apiserver
  stop_one etcd
}

# launch NAME CMD...: runs CMD in its own session (survives this script and the caller's
# terminal), output to logs/NAME.log, pid to run/NAME.pid; sets $launched_pid.
launch() {
  local name=$1 i
  shift
  rm -f "$run/$name.pid"
  [[ -f $logs/$name.log ]] && mv -f "$logs/$name.log" "$logs/$name.previous.log"
  # shellcheck disable=SC2016
  nohup setsid bash -c 'echo $$ >"$0.tmp" && mv "$0.tmp" "$0" && exec "$@"' "$run/$name.pid" "$@" \
    </dev/null >"$logs/$name.log" 2>&1 &
  for ((i = 0; i < 100; i++)); do
    [[ -s $run/$name.pid ]] && break
    sleep 0.05
  done
  [[ -s $run/$name.pid ]] || die "$name did not start"
  launched_pid=$(<"$run/$name.pid")
  log "$name started (pid $launched_pid, log $logs/$name.log)"
}

# wait_for NAME PID DESCRIPTION CMD...: polls CMD until it succeeds; fails if PID exits or after
# $timeout seconds, showing the end of the log. Returns 3 instead when PID exited saying a port
# was taken ("address already in use"): the caller starts it again on fresh ports.
wait_for() {
  local name=$1 pid=$2 what=$3 start=$SECONDS
  shift 3
  until "$@" >/dev/null 2>&1; do
    if [[ ! -d /proc/$pid || $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]]; then
      if grep -qi 'address already in use' "$logs/$name.log"; then
        log "$name: a port was taken before it could bind it; again on another"
        return 3
      fi
      tail -n 40 "$logs/$name.log" >&2 || true
      die "$name exited before it was $what (log: $logs/$name.log)"
    fi
    if ((SECONDS - start >= timeout)); then
      tail -n 40 "$logs/$name.log" >&2 || true
      die "$name was not $what after ${timeout}s (log: $logs/$name.log)"
    fi
    sleep 0.25
  done
  log "$name is $what after $((SECONDS - start))s"
}

# Port from DIR/ports under KEY if it is still free, else a new free port.
pick_port() { # KEY
  local p=
  if [[ -f $dir/ports ]]; then
    p=$(awk -F= -v k="$1" '$1 == k { print $2 }' "$dir/ports")
  fi
  if [[ -n $p ]] && port_is_free "$p"; then
    echo "$p"
  else
    free_port
  fi
}

apiserver_ready() {
  curl -fsS --max-time 5 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    "$1/readyz" >/dev/null 2>&1
}

# write_kubeconfig PATH SERVER [USER]: a kubeconfig for the client certificate pki/USER.{crt,key}
# (admin by default).
write_kubeconfig() {
  local b64='base64 -w0' user=${3:-admin}
  cat >"$1.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: $2
    certificate-authority-data: $($b64 <"$pki/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $($b64 <"$pki/$user.crt")
    client-key-data: $($b64 <"$pki/$user.key")
contexts:
- name: local
  context:
    cluster: local
    user: $user
current-context: local
EOF
  chmod 600 "$1.tmp"
  mv -f "$1.tmp" "$1"
}

# kube-apiserver on $api_port with etcd at $etcd_url (cmd_start's variables). With a node
# (CLUSTER_NODE=1, hack/node.sh): listening on every address so that Pods reach it at the node's
# address (the `kubernetes` Service's endpoint, kept by the lease reconciler), and the Node
# authorizer beside RBAC for the kubelet; without one, loopback only and no endpoint.
launch_kube_apiserver() {
  # Without a node, no ServiceAccount admission either: nothing would mount its tokens, and
  # Pods of a service account not created yet stay creatable.
  local node_flags=(--bind-address=127.0.0.1 --authorization-mode=RBAC --endpoint-reconciler-type=none
    --disable-admission-plugins=ServiceAccount)
  if [[ ${CLUSTER_NODE:-0} == 1 ]]; then
    node_flags=(--bind-address=0.0.0.0 --advertise-address="$NODE_IP" --authorization-mode=Node,RBAC
      --endpoint-reconciler-type=lease
      # Reach the kubelet (logs, exec) at its InternalIP, never by a host name resolved through
      # this machine's DNS, as the admin: the kubelet authorizes through the Node's RBAC.
      --kubelet-preferred-address-types=InternalIP --kubelet-certificate-authority="$pki/ca.crt"
      --kubelet-client-certificate="$pki/admin.crt" --kubelet-client-key="$pki/admin.key")
  fi
  # Service IPs: the e2e suite alone creates some 250 Services in one cluster (200 MCPServers
  # in one scenario); a /24 ran out ("range is full"), a /16 will not.
  launch kube-apiserver "$KUBE_APISERVER" \
    --etcd-servers="$etcd_url" \
    --secure-port="$api_port" \
    --cert-dir="$dir/kube-apiserver" \
    --tls-cert-file="$pki/apiserver.crt" \
    --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --service-cluster-ip-range=10.0.0.0/16 \
    "${node_flags[@]}" \
    --allow-privileged=true \
    --service-account-issuer="https://127.0.0.1:$api_port/" \
    --service-account-key-file="$pki/sa.pub" \
    --service-account-signing-key-file="$pki/sa.key" \
    --requestheader-client-ca-file="$pki/front-proxy-ca.crt" \
    --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User \
    --requestheader-uid-headers=X-Remote-Uid \
    --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$pki/front-proxy-client.crt" \
    --proxy-client-key-file="$pki/front-proxy-client.key" \
    --enable-aggregator-routing=false
}

# kube-controller-manager on $kcm_port with $kubeconfig (cmd_start's variables).
launch_kube_controller_manager() {
  launch kube-controller-manager "$KUBE_CONTROLLER_MANAGER" \
    --kubeconfig="$kubeconfig" \
    --authentication-kubeconfig="$kubeconfig" \
    --authorization-kubeconfig="$kubeconfig" \
    --leader-elect=false \
    --bind-address=127.0.0.1 \
    --secure-port="$kcm_port" \
    --cert-dir="$dir/kube-controller-manager" \
    --flex-volume-plugin-dir="$dir/kube-controller-manager/flexvolume" \
    --service-account-private-key-file="$pki/sa.key" \
    --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" \
    --cluster-signing-key-file="$pki/ca.key" \
    --use-service-account-credentials=false \
    --controllers='*'
}

# ---------------------------------------------------------------------------------------------

cmd_start() {
  local t0=$SECONDS
  mkdir -p "$dir" "$logs" "$run" "$dir/etcd"
  chmod 700 "$dir/etcd"

  # Binaries: each of KUBE_APISERVER/KUBE_CONTROLLER_MANAGER/ETCD the caller set wins; the others
  # come from hack/build-kube.sh (instant when cached).
  if [[ -z ${KUBE_APISERVER:-} || -z ${KUBE_CONTROLLER_MANAGER:-} || -z ${ETCD:-} ]]; then
    local bins line
    bins=$("$here/build-kube.sh") || die "hack/build-kube.sh failed"
    while IFS= read -r line; do
      [[ $line =~ ^(KUBE_APISERVER|KUBE_CONTROLLER_MANAGER|ETCD)= ]] || continue
      [[ -n ${!BASH_REMATCH[1]:-} ]] || eval "$line"
    done <<<"$bins"
  fi
  local b
  for b in "$KUBE_APISERVER" "$KUBE_CONTROLLER_MANAGER" "$ETCD"; do
    [[ -x $b ]] || die "missing binary $b"
  done

  # Whatever a previous start from this DIR left running.
  stop_all
  rm -f "$dir/env"

  gen_pki

  # If anything below fails, do not leave half a cluster behind.
  trap 'rc=$?; if ((rc != 0)); then log "start failed; stopping what was started"; stop_all; fi' EXIT

  # etcd, kube-apiserver and kube-controller-manager cannot report a port-0 bind: each starts
  # on a port the kernel just chose (or the previous run's, still free) and, should another
  # process take it first, again on a fresh one (wait_for returns 3; up to 5 attempts).
  local etcd_port etcd_peer_port api_port kcm_port attempt rc
  etcd_port=$(pick_port etcd)
  etcd_peer_port=$(pick_port etcd-peer)
  while [[ $etcd_peer_port == "$etcd_port" ]]; do etcd_peer_port=$(free_port); done
  api_port=$(pick_port kube-apiserver)
  if [[ ${CLUSTER_NODE:-0} == 1 ]]; then
    # Pods reach the API through the kubernetes Service (443), and NetworkPolicies see the port
    # it is translated to: the one real clusters use, so that policies written for them (the
    # controllers' egress to 443 and 6443) hold here too.
    api_port=6443
    port_is_free "$api_port" || die "port $api_port, the node's kube-apiserver port, is taken"
  fi
  kcm_port=$(pick_port kube-controller-manager)
  local etcd_url api_url etcd_pid api_pid kcm_pid
  local kubeconfig=$dir/admin.kubeconfig

  # --- etcd
  for ((attempt = 1; ; attempt++)); do
    etcd_url=http://127.0.0.1:$etcd_port
    launch etcd "$ETCD" \
      --name default \
      --data-dir "$dir/etcd" \
      --listen-client-urls "$etcd_url" \
      --advertise-client-urls "$etcd_url" \
      --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
      --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
      --initial-cluster "default=http://127.0.0.1:$etcd_peer_port" \
      --log-level warn
    etcd_pid=$launched_pid
    rc=0
    wait_for etcd "$etcd_pid" healthy \
      bash -c 'curl -fsS --max-time 5 "$0/health" | grep -q "\"health\":\"true\""' "$etcd_url" ||
      rc=$?
    ((rc == 3)) || break
    ((attempt < 5)) || die "etcd: every candidate port was taken"
    etcd_port=$(free_port)
    etcd_peer_port=$(free_port)
  done

  # --- kube-apiserver
  mkdir -p "$dir/kube-apiserver"
  for ((attempt = 1; ; attempt++)); do
    api_url=https://127.0.0.1:$api_port
    write_kubeconfig "$kubeconfig" "$api_url"
    launch_kube_apiserver
    api_pid=$launched_pid
    rc=0
    wait_for kube-apiserver "$api_pid" ready apiserver_ready "$api_url" || rc=$?
    ((rc == 3)) || break
    ((attempt < 5)) || die "kube-apiserver: every candidate port was taken"
    api_port=$(free_port)
  done

  # --- kube-controller-manager
  mkdir -p "$dir/kube-controller-manager"
  for ((attempt = 1; ; attempt++)); do
    launch_kube_controller_manager
    kcm_pid=$launched_pid
    rc=0
    wait_for kube-controller-manager "$kcm_pid" healthy \
      curl -fsSk --max-time 5 "https://127.0.0.1:$kcm_port/healthz" || rc=$?
    ((rc == 3)) || break
    ((attempt < 5)) || die "kube-controller-manager: every candidate port was taken"
    kcm_port=$(free_port)
  done
  printf 'etcd=%s\netcd-peer=%s\nkube-apiserver=%s\nkube-controller-manager=%s\n' \
    "$etcd_port" "$etcd_peer_port" "$api_port" "$kcm_port" >"$dir/ports"
  if [[ ${CLUSTER_NODE:-0} == 1 ]]; then
    "$here/node.sh" start "$dir" || die "the node did not start (hack/node.sh)"
  fi

  # --- env
  {
    printf 'KUBECONFIG=%q\n' "$kubeconfig"
    printf 'KUBE_APISERVER_URL=%q\n' "$api_url"
    printf 'ETCD_URL=%q\n' "$etcd_url"
    printf 'CLUSTER_DIR=%q\n' "$dir"
    printf 'ETCD_PID=%q\n' "$etcd_pid"
    printf 'KUBE_APISERVER_PID=%q\n' "$api_pid"
    printf 'KUBE_CONTROLLER_MANAGER_PID=%q\n' "$kcm_pid"
    printf 'KUBE_CONTROLLER_MANAGER_URL=%q\n' "https://127.0.0.1:$kcm_port"
    printf 'CLUSTER_CA_FILE=%q\n' "$pki/ca.crt"
    printf 'ADMIN_CERT_FILE=%q\n' "$pki/admin.crt"
    printf 'ADMIN_KEY_FILE=%q\n' "$pki/admin.key"
    printf 'FRONT_PROXY_CA_FILE=%q\n' "$pki/front-proxy-ca.crt"
    printf 'MCP_ACCESS_TLS_CERT_FILE=%q\n' "$pki/mcp-access-apiserver.crt"
    printf 'MCP_ACCESS_TLS_PRIVATE_KEY_FILE=%q\n' "$pki/mcp-access-apiserver.key"
    printf 'AGGREGATED_CA_FILE=%q\n' "$pki/aggregated-ca.crt"
    printf 'HOST_API_CA_FILE=%q\n' "$pki/host-api-ca.crt"
    printf 'HOST_API_TLS_CERT_FILE=%q\n' "$pki/host-api.crt"
    printf 'HOST_API_TLS_KEY_FILE=%q\n' "$pki/host-api.key"
    printf 'HOST_TOKEN_PUBLIC_KEY_FILE=%q\n' "$pki/host-token.pub"
    printf 'HOST_TOKEN_SIGNING_KEY_FILE=%q\n' "$pki/host-token.key"
    # The local issuer's name and the Host API's audience (hack/host-token.sh signs for them).
    printf 'HOST_TOKEN_ISSUER=%q\n' "mcp-access-local-issuer"
    printf 'HOST_TOKEN_AUDIENCE=%q\n' "mcp-access-host-api"
    # mcp-access-apiserver's session tokens (--session-token-signing-key-file, -issuer).
    printf 'SESSION_TOKEN_SIGNING_KEY_FILE=%q\n' "$pki/session-token.key"
    printf 'SESSION_TOKEN_PUBLIC_KEY_FILE=%q\n' "$pki/session-token.pub"
    printf 'SESSION_TOKEN_ISSUER=%q\n' "https://mcp-access.local"
  } >"$dir/env.tmp"
  mv -f "$dir/env.tmp" "$dir/env"

  trap - EXIT
  log "control plane up in $((SECONDS - t0))s: $api_url (env: $dir/env)"
  printf 'KUBECONFIG=%s\n' "$kubeconfig"
}

cmd_stop() {
  [[ -d $dir ]] || return 0
  stop_all
  rm -f "$dir/env"
}

cmd_status() {
  [[ -f $dir/env ]] || { log "not started ($dir/env missing)"; return 1; }
  local url
  url=$(. "$dir/env" && echo "$KUBE_APISERVER_URL")
  if apiserver_ready "$url"; then
    log "kube-apiserver at $url is ready"
  else
    log "kube-apiserver at $url is not ready"
    return 1
  fi
}

# hack/node.sh sources this file for its helpers (launch, wait_for, new_leaf, ...) and stops here.
[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0

(($# == 2)) || usage
action=$1
if [[ $action == start ]]; then mkdir -p "$2" || die "cannot create $2"; fi
if [[ -d $2 ]]; then
  dir=$(cd "$2" && pwd -P)
else
  dir=$2
fi
pki=$dir/pki
logs=$dir/logs
run=$dir/run

case $action in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) usage ;;
esac
