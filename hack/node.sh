#!/usr/bin/env bash
# A real Kubernetes node on this machine, joined to the control plane of hack/cluster.sh: Pods of
# MCPServers and Hosts run, and NetworkPolicies are enforced on their packets.
#
#   hack/node.sh start DIR   DIR is a started cluster (hack/cluster.sh start DIR, CLUSTER_NODE=1,
#                            which calls this); starts containerd, kube-scheduler, kubelet,
#                            kube-proxy and kube-router, imports the pause image, and waits until
#                            the Node is Ready; writes DIR/node.env
#   hack/node.sh stop  DIR   stops them, removes every container, network namespace, mount,
#                            iptables chain and ipset they made; idempotent
#   hack/node.sh import DIR ARCHIVE...
#                            imports OCI image archives (buildah push ... oci-archive:FILE:NAME)
#                            into the node's containerd, where kubelet finds them: never pulled
#
# Components (hack/build-node.sh builds and caches each; docs/local-node.md says why each):
#   containerd 2 + runc 1.4         CRI runtime; cgroupfs driver (no systemd here)
#   CNI bridge + host-local         Debian's containernetworking-plugins; bridge mcpa0, $POD_CIDR
#   kube-proxy (iptables mode)      Service IPs, also for processes on this machine
#   kube-router --run-firewall      the NetworkPolicy enforcer (iptables + ipset)
#   kube-scheduler                  so Deployments' Pods are placed
#   CoreDNS                         the cluster DNS ($CLUSTER_DNS), a Pod labelled k8s-app=kube-dns in
#                                   kube-system as the controllers' policies expect; cluster names
#                                   only, nothing is forwarded off this machine
# The node is named $NODE_NAME, at $NODE_IP on the loopback interface; Pods reach the host there. One node per machine: a second start from another DIR fails, naming the first.
#
# Needs root. Kernel features are checked first and a missing one is named. A node that is not
# Ready within NODE_START_TIMEOUT seconds (default 180) fails the start with the kubelet's last
# lines, and everything started is stopped again.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=hack/cluster.sh
. "$here/cluster.sh"
. "$here/lib/debian.sh"

log() { printf '[node %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }

timeout=${NODE_START_TIMEOUT:-180}
# Sockets and runtime state: short fixed paths (a unix socket path has 107 bytes at most).
rundir=/run/mcp-access-node
sock=$rundir/containerd.sock
bridge=mcpa0
# The pause image is named after the Kubernetes release whose build/pause/linux/pause.c it runs.
pause_image=localhost/mcp-access/pause:$(awk '($1 == "require" && $2 == "k8s.io/kubernetes") { print $3 }' "$here/node/go.mod" | tr -d v)

usage() {
  echo "usage: $0 start|stop DIR | import DIR ARCHIVE..." >&2
  exit 2
}

# ---------------------------------------------------------------------------------------------
# Preconditions

check_host() {
  [[ $(id -u) == 0 ]] || die "the node needs root (kubelet, containerd and iptables)"
  local missing=()
  [[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]] ||
    missing+=("bridge netfilter (CONFIG_BRIDGE_NETFILTER: /proc/sys/net/bridge missing)")
  grep -qw overlay /proc/filesystems || missing+=("overlayfs (CONFIG_OVERLAY_FS)")
  [[ -d /sys/fs/cgroup ]] || missing+=("cgroups (/sys/fs/cgroup)")
  ((${#missing[@]} == 0)) || die "this kernel lacks: ${missing[*]}"

  local pkgs=()
  command -v conntrack >/dev/null || pkgs+=(conntrack)
  command -v ipset >/dev/null || pkgs+=(ipset)
  command -v iptables >/dev/null || pkgs+=(iptables)
  [[ -x /usr/lib/cni/bridge ]] || pkgs+=(containernetworking-plugins)
  command -v buildah >/dev/null || pkgs+=(buildah)
  local p
  for p in "${pkgs[@]}"; do
    log "installing $p from Debian's packages"
    debian_install "$p" >&2 || die "could not install $p (apt-get install -y $p)"
  done
  # ipset and iptables must work here, not only exist: kube-router needs both.
  local probe=mcpa-probe-$$
  ipset create "$probe" hash:ip >/dev/null 2>&1 || die "ipset cannot create a set (CONFIG_IP_SET, CONFIG_IP_SET_HASH_IP)"
  ipset destroy "$probe"
  iptables -w -L INPUT -n >/dev/null 2>&1 || die "iptables cannot list the filter table (CONFIG_IP_NF_IPTABLES or nf_tables compat)"
}

# The node's binaries: each of KUBELET, KUBE_PROXY, ... the caller set wins; the rest come from
# hack/build-node.sh (instant when cached).
node_binaries() {
  local names=(KUBELET KUBE_PROXY KUBE_SCHEDULER CONTAINERD CONTAINERD_SHIM CTR RUNC KUBE_ROUTER COREDNS PAUSE)
  local n need=
  for n in "${names[@]}"; do [[ -n ${!n:-} ]] || need=1; done
  if [[ -n $need ]]; then
    local bins line
    bins=$("$here/build-node.sh") || die "hack/build-node.sh failed"
    while IFS= read -r line; do
      [[ $line =~ ^([A-Z_]+)= ]] || continue
      [[ -n ${!BASH_REMATCH[1]:-} ]] || eval "$line"
    done <<<"$bins"
  fi
  for n in "${names[@]}"; do [[ -x ${!n} ]] || die "missing binary $n=${!n}"; done
  mkdir -p "$node"
  for n in "${names[@]}"; do printf '%s=%q\n' "$n" "${!n}"; done >"$node/binaries.env"
  # containerd finds its shim on PATH by name.
  mkdir -p "$node/bin"
  ln -sf "$CONTAINERD_SHIM" "$node/bin/containerd-shim-runc-v2"
  ln -sf "$CTR" "$node/bin/ctr"
}

# The one node of this machine: $rundir/owner names the DIR whose node it is. Another DIR's
# node is live while its containerd runs.
other_node() {
  [[ -s $rundir/owner ]] || return 1
  local other pid
  other=$(<"$rundir/owner")
  [[ $other != "$dir" && -s $other/run/containerd.pid ]] || return 1
  pid=$(<"$other/run/containerd.pid")
  [[ -d /proc/$pid ]] || return 1
  echo "$other"
}

claim_machine() {
  mkdir -p "$rundir"
  local other
  if other=$(other_node); then
    die "a node of $other already runs on this machine (one node per machine: hack/node.sh stop $other)"
  fi
  echo "$dir" >"$rundir/owner"
}

# ---------------------------------------------------------------------------------------------
# Configuration

node_pki() {
  have node-kubelet || new_leaf node-kubelet ca "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
  have node-kubelet-serving ||
    new_leaf node-kubelet-serving ca "/CN=$NODE_NAME" serverAuth "DNS:$NODE_NAME,IP:$NODE_IP"
  have node-kube-proxy || new_leaf node-kube-proxy ca "/CN=system:kube-proxy" clientAuth
  have node-kube-scheduler || new_leaf node-kube-scheduler ca "/CN=system:kube-scheduler" clientAuth
  have node-kube-router || new_leaf node-kube-router ca "/CN=system:mcp-access:kube-router" clientAuth
  chmod 644 "$pki"/node-*.crt
}

host_network() {
  # On the loopback interface: this kernel has no dummy interfaces (CONFIG_DUMMY), and a /32
  # there is as local as anywhere, reached by Pods through their gateway on the bridge.
  ip addr replace "$NODE_IP/32" dev lo
  # Routed and bridged Pod traffic must pass iptables: Service NAT and the policies both live there.
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
}

write_configs() {
  mkdir -p "$node/cni/net.d" "$node/containerd" "$node/kubelet"
  cat >"$node/cni/net.d/10-mcp-access.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "mcp-access",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$POD_CIDR" }]],
        "routes": [{ "dst": "0.0.0.0/0" }],
        "dataDir": "$node/cni/ipam"
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
  cat >"$node/containerd/config.toml" <<EOF
version = 3
root = "$node/containerd/root"
state = "$rundir/state"

[grpc]
  address = "$sock"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$pause_image"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # This sandbox withholds CAP_SYS_RESOURCE, so no process may lower its OOM score (the sandbox
  # container's -998 fails with EACCES in runc init): keep every score >= containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$RUNC"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$node/cni/net.d"
EOF
  # cgroup v1 (or hybrid) hosts: kubelet >= 1.35 refuses them unless told (failCgroupV1).
  local cgroup_v1=false
  if [[ $(stat -fc %T /sys/fs/cgroup) != cgroup2fs ]]; then
    cgroup_v1=true
    log "this host has cgroup v1 (hybrid): kubelet runs with failCgroupV1: false"
  fi
  cat >"$node/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $kubelet_healthz_port
tlsCertFile: $pki/node-kubelet-serving.crt
tlsPrivateKeyFile: $pki/node-kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$sock
cgroupDriver: cgroupfs
failCgroupV1: $( [[ $cgroup_v1 == true ]] && echo false || echo true )
failSwapOn: false
podCIDR: $POD_CIDR
clusterDomain: cluster.local
clusterDNS: [$CLUSTER_DNS]
resolvConf: $node/resolv.conf
registerNode: true
serializeImagePulls: false
# This machine's disk is shared with everything else: evict only when it is really full.
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
  # Pods never get this machine's resolver (it is outside the sandbox): ClusterFirst Pods ask
  # CoreDNS, and the rest (CoreDNS itself, dnsPolicy Default) an empty configuration.
  : >"$node/resolv.conf"
  cat >"$node/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $node/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
healthzBindAddress: 127.0.0.1:$kube_proxy_healthz_port
metricsBindAddress: 127.0.0.1:$kube_proxy_metrics_port
conntrack: {maxPerCore: 0, min: 0}
EOF
}

# kube-router reads Pods, Namespaces, NetworkPolicies and Nodes, and nothing else.
kube_router_rbac() {
  kubectl --kubeconfig "$kubeconfig" apply -f - >/dev/null <<'EOF'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: mcp-access:kube-router
rules:
- apiGroups: [""]
  resources: [pods, namespaces, nodes, services, endpoints]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: mcp-access:kube-router
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "mcp-access:kube-router"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:mcp-access:kube-router"}
EOF
}

# ---------------------------------------------------------------------------------------------
# Images

# image_archive NAME IMAGE BINARY ENTRYPOINT USER: IMAGE, FROM scratch with BINARY as /NAME, as an
# OCI archive cached beside BINARY (keyed by it), for the node's own Pods (pause, CoreDNS).
image_archive() {
  local name=$1 image=$2 binary=$3 user=$4 archive=$3.oci.tar
  if [[ ! -s $archive ]]; then
    local c root
    c=$(buildah from scratch) || die "buildah from scratch failed"
    root=$(buildah mount "$c") || die "buildah mount failed"
    install -m 755 "$binary" "$root/$name"
    buildah umount "$c" >/dev/null
    buildah config --entrypoint "[\"/$name\"]" --user "$user" "$c" || die "buildah config failed"
    buildah commit --quiet --rm "$c" "$image" >/dev/null || die "buildah commit $image failed"
    rm -f "$archive.tmp"
    buildah push --quiet "$image" "oci-archive:$archive.tmp:$image" >/dev/null ||
      die "buildah push $image failed"
    mv -f "$archive.tmp" "$archive"
    log "built the image $image -> $archive"
  fi
  echo "$archive"
}

ctr_() { "$CTR" --address "$sock" --namespace k8s.io "$@"; }

import_archives() { # ARCHIVE...
  local a
  for a in "$@"; do
    [[ -s $a ]] || die "no image archive $a"
    ctr_ images import --no-unpack=false "$a" >/dev/null || die "ctr images import $a failed"
    log "imported $a"
  done
}

# The cluster DNS: CoreDNS answering for cluster.local (and reverse lookups of Pod and Service
# addresses) from the API, with its own read-only RBAC and a projected service-account token
# (the control plane runs without the ServiceAccount admission plugin, so nothing mounts one).
deploy_coredns() {
  local image=$1
  kubectl --kubeconfig "$kubeconfig" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "mcp-access:coredns"}
rules:
- apiGroups: [""]
  resources: [services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "mcp-access:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "mcp-access:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
        }
        cache 5
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      automountServiceAccountToken: false
      dnsPolicy: Default
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        sysctls: [{name: net.ipv4.ip_unprivileged_port_start, value: "53"}]
      containers:
      - name: coredns
        image: $image
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 1}
        livenessProbe: {httpGet: {path: /health, port: 8080}, periodSeconds: 10}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL]}
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
        - {name: token, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true}
      volumes:
      - name: config
        configMap: {name: coredns}
      - name: token
        projected:
          sources:
          - serviceAccountToken: {path: token, expirationSeconds: 3600}
          - configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}
          - downwardAPI: {items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: $CLUSTER_DNS
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
EOF
}

# ---------------------------------------------------------------------------------------------
# Start and stop

# Ready, as reported by a kubelet since $1 (UTC, %Y-%m-%dT%H:%M:%SZ): a Node object left by an
# earlier start stays Ready for a while after its kubelet is gone.
node_ready() {
  local state
  state=$(kubectl --kubeconfig "$kubeconfig" get node "$NODE_NAME" \
    -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}' 2>/dev/null)
  [[ ${state%% *} == True && ! ${state#* } < $1 ]]
}

cmd_node_start() {
  local t0=$SECONDS
  [[ -s $kubeconfig && -s $dir/ports ]] || die "$dir is not a started cluster (hack/cluster.sh start $dir)"
  api_port=$(awk -F= '$1 == "kube-apiserver" { print $2 }' "$dir/ports")
  api_url=https://127.0.0.1:$api_port
  check_host
  mkdir -p "$node" "$logs" "$run"
  node_binaries
  # What this DIR left running, gone (never another DIR's live node: see cmd_node_stop), then
  # the machine is ours or the start fails naming whose it is.
  cmd_node_stop quiet
  claim_machine
  trap 'rc=$?; if ((rc != 0)); then log "start failed; stopping what was started"; cmd_node_stop quiet; fi' EXIT

  node_pki
  local n
  for n in kubelet kube-proxy kube-scheduler kube-router; do
    write_kubeconfig "$node/$n.kubeconfig" "$api_url" "node-$n"
  done
  host_network
  kubelet_port=$(pick_port kubelet)
  kubelet_healthz_port=$(pick_port kubelet-healthz)
  kube_proxy_healthz_port=$(pick_port kube-proxy-healthz)
  kube_proxy_metrics_port=$(pick_port kube-proxy-metrics)
  local scheduler_port kube_router_health_port
  scheduler_port=$(pick_port kube-scheduler)
  kube_router_health_port=$(pick_port kube-router-health)
  write_configs

  PATH=$node/bin:$PATH launch containerd "$CONTAINERD" --config "$node/containerd/config.toml"
  wait_for containerd "$launched_pid" serving ctr_ version
  local pause_tar coredns_tar coredns_image
  pause_tar=$(image_archive pause "$pause_image" "$PAUSE" 65535:65535)
  coredns_image=localhost/mcp-access/coredns:$(awk '($1 == "require" && $2 == "github.com/coredns/coredns") { print $3 }' "$here/coredns/go.mod" | tr -d v)
  coredns_tar=$(image_archive coredns "$coredns_image" "$COREDNS" 65532:65532)
  import_archives "$pause_tar" "$coredns_tar"

  launch kube-scheduler "$KUBE_SCHEDULER" \
    --kubeconfig="$node/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$node/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig="$node/kube-scheduler.kubeconfig" \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port="$scheduler_port" \
    --cert-dir="$node/kube-scheduler"
  wait_for kube-scheduler "$launched_pid" healthy curl -fsSk --max-time 5 "https://127.0.0.1:$scheduler_port/healthz"

  local kubelet_since
  kubelet_since=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  launch kubelet "$KUBELET" \
    --config="$node/kubelet/config.yaml" \
    --kubeconfig="$node/kubelet.kubeconfig" \
    --hostname-override="$NODE_NAME" \
    --node-ip="$NODE_IP" \
    --root-dir="$node/kubelet/root" \
    --cert-dir="$node/kubelet/pki" \
    --v=1
  if ! wait_for_ready_node "$launched_pid" "$kubelet_since"; then
    tail -n 40 "$logs/kubelet.log" >&2 || true
    die "node $NODE_NAME was not Ready after ${timeout}s (kubelet log: $logs/kubelet.log)"
  fi

  launch kube-proxy "$KUBE_PROXY" --config="$node/kube-proxy.yaml"
  wait_for kube-proxy "$launched_pid" healthy curl -fsS --max-time 5 "http://127.0.0.1:$kube_proxy_healthz_port/healthz"

  kube_router_rbac
  launch kube-router "$KUBE_ROUTER" \
    --kubeconfig="$node/kube-router.kubeconfig" \
    --hostname-override="$NODE_NAME" \
    --run-firewall=true --run-router=false --run-service-proxy=false \
    --enable-cni=false --enable-ipv6=false --enable-ipv4=true \
    --metrics-port=0 --health-port="$kube_router_health_port" \
    --service-cluster-ip-range=10.0.0.0/16 \
    --iptables-sync-period=5m --ipvs-sync-period=5m
  wait_for kube-router "$launched_pid" healthy curl -fsS --max-time 5 "http://127.0.0.1:$kube_router_health_port/healthz"

  deploy_coredns "$coredns_image"
  local start=$SECONDS
  until [[ $(kubectl --kubeconfig "$kubeconfig" -n kube-system get deployment coredns \
    -o 'jsonpath={.status.readyReplicas}' 2>/dev/null) == 1 ]]; do
    if ((SECONDS - start >= timeout)); then
      kubectl --kubeconfig "$kubeconfig" -n kube-system describe pods -l k8s-app=kube-dns >&2 || true
      die "CoreDNS was not Ready after ${timeout}s"
    fi
    sleep 0.5
  done
  log "CoreDNS is Ready at $CLUSTER_DNS after $((SECONDS - start))s"

  {
    printf 'kubelet=%s\nkubelet-healthz=%s\nkube-proxy-healthz=%s\nkube-proxy-metrics=%s\n' \
      "$kubelet_port" "$kubelet_healthz_port" "$kube_proxy_healthz_port" "$kube_proxy_metrics_port"
    printf 'kube-scheduler=%s\nkube-router-health=%s\n' "$scheduler_port" "$kube_router_health_port"
  } >>"$dir/ports"
  {
    printf 'NODE_NAME=%q\nNODE_IP=%q\nPOD_CIDR=%q\nCLUSTER_DNS=%q\n' "$NODE_NAME" "$NODE_IP" "$POD_CIDR" "$CLUSTER_DNS"
    printf 'NODE_CONTAINERD_SOCKET=%q\nNODE_CTR=%q\n' "$sock" "$CTR"
  } >"$dir/node.env"
  trap - EXIT
  log "node $NODE_NAME Ready in $((SECONDS - t0))s ($NODE_IP, Pods $POD_CIDR, logs $logs/)"
}

wait_for_ready_node() { # KUBELET_PID SINCE
  local pid=$1 since=$2 start=$SECONDS
  until node_ready "$since"; do
    if [[ ! -d /proc/$pid ]]; then
      log "kubelet exited"
      return 1
    fi
    ((SECONDS - start < timeout)) || return 1
    sleep 0.5
  done
  log "node $NODE_NAME is Ready after $((SECONDS - start))s"
}

# What is left of the node's iptables rules once its programs are gone (kube-proxy's and
# kube-router's own cleanup miss the kubelet's chains, and a container killed without its CNI
# DEL leaves its masquerade chain): every chain named KUBE-*, and every CNI-* chain a rule of
# this network ("name: \"mcp-access\"") jumps to, with the rules that mention them, in one
# iptables-restore of what remains.
drop_node_rules() {
  local saved
  saved=$(iptables-save 2>/dev/null) || return 0
  python3 -c '
import re, sys
lines = sys.stdin.read().splitlines()
ours = set()
for l in lines:
    if "name: \\\"mcp-access\\\"" in l or "name: \"mcp-access\"" in l:
        m = re.search(r"-j (CNI-[0-9a-f]+)", l)
        if m:
            ours.add(m.group(1))
def mine(l):
    return "KUBE-" in l or any(c in l for c in ours)
print("\n".join(l for l in lines if not mine(l)))
' <<<"$saved" | iptables-restore 2>/dev/null || log "could not restore iptables without the node's rules"
}

# Everything the node made, gone: processes, containers and their network namespaces, mounts under
# DIR/node, the bridge, and the iptables chains and ipsets of kube-proxy and kube-router.
cmd_node_stop() {
  local quiet=${1:-} other
  if other=$(other_node); then
    # The machine's bridge, chains and sockets are that node's: only this DIR's processes go.
    for other in kube-router kube-proxy kubelet kube-scheduler containerd; do stop_one "$other"; done
    return 0
  fi
  stop_one kube-router
  stop_one kube-proxy
  stop_one kubelet
  stop_one kube-scheduler
  if [[ -n $(live_pid containerd) && -n ${CTR:-} ]]; then
    local id
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s KILL "$id" >/dev/null 2>&1 || true; done
    sleep 0.5
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" >/dev/null 2>&1 || true; done
  fi
  stop_one containerd
  # Shims outlive containerd by design; the ones of this node go too.
  pkill -KILL -f "containerd-shim-runc-v2.* -address $sock" 2>/dev/null || true
  local ns m
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^cni-/ { print $1 }'); do
    umount -l "/run/netns/$ns" 2>/dev/null || true
    ip netns delete "$ns" 2>/dev/null || true
  done
  if [[ -d $node ]]; then
    # Deepest first: volume tmpfs of Pods, overlay rootfs of containers, netns bind mounts.
    awk -v p="$node/" 'index($2, p) == 1 { print $2 }' /proc/self/mounts | sort -r |
      while read -r m; do umount -l "$m" 2>/dev/null || true; done
    rm -rf "$node/cni/ipam"
  fi
  awk -v p="$rundir/" 'index($2, p) == 1 { print $2 }' /proc/self/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
  ip link delete "$bridge" 2>/dev/null || true
  ip addr delete "$NODE_IP/32" dev lo 2>/dev/null || true
  if [[ -n ${KUBE_PROXY:-} ]]; then "$KUBE_PROXY" --cleanup >/dev/null 2>&1 || true; fi
  if [[ -n ${KUBE_ROUTER:-} ]]; then "$KUBE_ROUTER" --cleanup-config >/dev/null 2>&1 || true; fi
  drop_node_rules
  local set
  for set in $(ipset list -n 2>/dev/null | grep -E '^(KUBE-|kube-router)' || true); do
    ipset destroy "$set" 2>/dev/null || true
  done
  if [[ -s $rundir/owner && $(<"$rundir/owner") == "$dir" ]]; then rm -f "$rundir/owner"; fi
  [[ -n $quiet ]] || log "node stopped"
}

(($# >= 2)) || usage
action=$1
[[ -d $2 ]] || die "no such cluster directory $2"
dir=$(cd "$2" && pwd -P)
shift 2
pki=$dir/pki
logs=$dir/logs
run=$dir/run
node=$dir/node
kubeconfig=$dir/admin.kubeconfig

case $action in
  start) (($# == 0)) || usage; cmd_node_start ;;
  stop)
    (($# == 0)) || usage
    # The binaries of a cached build, if there are any, to clean up with; never builds.
    if [[ -s $node/binaries.env ]]; then . "$node/binaries.env"; fi
    cmd_node_stop
    ;;
  import) (($# > 0)) || usage; node_binaries; import_archives "$@" ;;
  *) usage ;;
esac
