//! The local control plane with MCP Access behind its APIService — one launcher for
//! `hack/up.sh` and the end-to-end tests.
//!
//! `hack/cluster.sh` starts etcd, kube-apiserver and kube-controller-manager (built from the
//! Go module proxy by `hack/build-kube.sh`); this module then applies `deploy/rbac`, gives the
//! apiserver a token of its own service account (so the RBAC in `deploy/` is what it runs
//! with), registers the APIService through an ExternalName Service pointing at localhost, and
//! runs `mcp-access-apiserver` in delegated mode.
#![forbid(unsafe_code)]

pub mod gateway;
pub mod harness;
pub mod listening;
pub mod mcp;
pub mod node;
pub mod scratch_db;
pub mod stopped;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use base64::Engine;

/// The API group and version MCP Access serves.
const API_GROUP: &str = "access.mcp-runtime.dev";
const API_VERSION: &str = "v1alpha1";

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Where the database comes from.
pub enum Database {
    /// A fresh database is created in this server (libpq DSN of an admin connection).
    CreateIn(String),
    /// PostgreSQL is started under the cluster directory (for `hack/up.sh`).
    Local,
}

/// Launch settings.
pub struct Options {
    /// Working directory: pki, logs, data.
    pub dir: PathBuf,
    /// The `mcp-access-apiserver` binary.
    pub apiserver_bin: PathBuf,
    pub database: Database,
    /// Further flags for `mcp-access-apiserver` (e.g. a short `--gateway-reverify-interval`).
    pub apiserver_args: Vec<String>,
    /// A real node beside the control plane (`hack/node.sh`: kubelet, containerd, kube-proxy,
    /// kube-router, CoreDNS), so Pods run; MCP Access then listens on every address, so that
    /// gateway Pods reach the sync listener at [`NODE_IP`]. One per machine.
    pub node: bool,
}

/// The local node's address (`hack/cluster.sh`), where its Pods reach this machine.
pub const NODE_IP: &str = "10.250.0.1";

/// The gateway image the controllers of a cluster with a node deploy: `hack/image.sh --tag
/// local` built it from the binaries under test (or hack/up.sh's), and it is imported, never
/// pulled ([`node::import_images`]).
pub const NODE_GATEWAY_IMAGE: &str = "ghcr.io/mcp-runtime/mcp-access-gateway:local";

/// The session-token issuer of a cluster whose `hack/cluster.sh` env names none.
pub const DEFAULT_SESSION_TOKEN_ISSUER: &str = "https://mcp-access.local";

/// A running local cluster with MCP Access registered.
pub struct LocalCluster {
    pub dir: PathBuf,
    /// Admin kubeconfig (client certificate in `system:masters`).
    pub kubeconfig: PathBuf,
    /// `DIR/env` of `hack/cluster.sh`.
    pub env: HashMap<String, String>,
    pub database_url: String,
    /// Port of the MCP Access API (TLS) on 127.0.0.1.
    pub api_port: u16,
    pub metrics_port: u16,
    /// Port of the gateway sync listener (TLS) on 127.0.0.1.
    pub sync_port: u16,
    apiserver_bin: PathBuf,
    apiserver_args: Vec<String>,
    apiserver: Option<Child>,
    /// Started with a node ([`Options::node`]).
    pub node: bool,
    local_pg: bool,
    /// The database created for this cluster ([`Database::CreateIn`]), dropped on stop.
    scratch_db: Option<scratch_db::ScratchDatabase>,
}

/// Output of a command.
#[derive(Debug, Clone)]
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// A port the kernel just chose, for a listener that cannot be asked for port 0 (the
/// apiserver's `--sync-port 0` means "off"): the caller retries with a fresh candidate when
/// the start fails with "address already in use".
pub(crate) fn candidate_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    Ok(Output {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

fn checked(cmd: &mut Command) -> Result<String> {
    let out = run(cmd)?;
    if !out.success {
        bail!("{cmd:?} failed: {}{}", out.stdout, out.stderr);
    }
    Ok(out.stdout)
}

fn read_env(path: &Path) -> Result<HashMap<String, String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            (
                k.trim().to_string(),
                v.trim().trim_matches('\'').trim_matches('"').to_string(),
            )
        })
        .collect())
}

impl LocalCluster {
    /// Starts everything and waits until MCP Access is served through kube-apiserver (see
    /// [`LocalCluster::wait_available`]).
    pub fn start(options: Options) -> Result<Self> {
        let dir = options.dir;
        std::fs::create_dir_all(&dir)?;
        let root = repo_root();
        let started = Instant::now();
        let out = checked(
            Command::new("bash")
                .arg(root.join("hack/cluster.sh"))
                .arg("start")
                .arg(&dir)
                .env("CLUSTER_NODE", if options.node { "1" } else { "0" })
                .stderr(Stdio::inherit()),
        )?;
        if !out.contains("KUBECONFIG=") {
            bail!("hack/cluster.sh printed no KUBECONFIG");
        }
        let env = read_env(&dir.join("env"))?;
        let kubeconfig = PathBuf::from(
            env.get("KUBECONFIG")
                .context("KUBECONFIG missing from env")?,
        );
        let mut scratch = None;
        let (database_url, local_pg) = match options.database {
            Database::CreateIn(admin) => {
                let db = scratch.insert(scratch_db::ScratchDatabase::create(&admin, "e2e")?);
                (db.dsn().to_string(), false)
            }
            Database::Local => {
                let script = format!(
                    ". {}/hack/lib/postgres.sh && postgres_stop {pg} && postgres_start {pg} >&2 && echo \"$PG_DSN\"",
                    root.display(),
                    pg = dir.join("pg").display()
                );
                let dsn = checked(
                    Command::new("bash")
                        .arg("-c")
                        .arg(script)
                        .stderr(Stdio::inherit()),
                )?;
                (dsn.trim().to_string(), true)
            }
        };
        let mut cluster = Self {
            dir,
            kubeconfig,
            env,
            database_url,
            // Chosen at the first start (see start_apiserver), kept across restarts.
            api_port: 0,
            metrics_port: 0,
            sync_port: 0,
            apiserver_bin: options.apiserver_bin,
            apiserver_args: options.apiserver_args,
            apiserver: None,
            node: options.node,
            local_pg,
            scratch_db: scratch,
        };
        cluster.install()?;
        cluster.start_apiserver()?;
        cluster.register_apiservice()?;
        cluster.wait_available(Duration::from_secs(120))?;
        // What answered must have been the process started above, not one left behind.
        cluster.ensure_apiserver_running()?;
        eprintln!(
            "local cluster with MCP Access ready in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        Ok(cluster)
    }

    /// Runs `kubectl` as the admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_as(&self.kubeconfig, args, None)
    }

    /// Runs `kubectl` with a kubeconfig and optional stdin.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .env("KUBECACHEDIR", self.dir.join("kube-cache"))
            .env_remove("KUBECONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let spawned = cmd.spawn().and_then(|mut child| {
            if let Some(mut pipe) = child.stdin.take() {
                if let Some(input) = stdin {
                    pipe.write_all(input.as_bytes())?;
                }
            }
            child.wait_with_output()
        });
        match spawned {
            Ok(out) => Output {
                success: out.status.success(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            },
            Err(e) => Output {
                success: false,
                stdout: String::new(),
                stderr: format!("cannot run kubectl: {e}"),
            },
        }
    }

    fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let out = self.kubectl_as(&self.kubeconfig, args, stdin);
        if !out.success {
            bail!(
                "kubectl {} failed: {}{}",
                args.join(" "),
                out.stdout,
                out.stderr
            );
        }
        Ok(out.stdout)
    }

    /// The process id of the running `mcp-access-apiserver` (for its memory, in benchmarks).
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.as_ref().map(Child::id)
    }

    /// The gateway sync listener's URL.
    pub fn sync_url(&self) -> String {
        let host = if self.node { NODE_IP } else { "127.0.0.1" };
        format!("https://{host}:{}", self.sync_port)
    }

    /// Flags that turn on the controllers' Host API on port 0 (the port bound is
    /// [`Controllers::host_api_port`]), serving the local PKI's certificate and trusting the
    /// local host token issuer (`hack/host-token.sh`).
    pub fn host_api_args(&self) -> Result<Vec<String>> {
        let env = |k: &str| {
            self.env.get(k).cloned().with_context(|| {
                format!("{} has no {k}: re-run hack/cluster.sh", self.dir.display())
            })
        };
        Ok(vec![
            "--host-api-port=0".to_string(),
            format!(
                "--host-api-tls-cert-file={}",
                env("HOST_API_TLS_CERT_FILE")?
            ),
            format!("--host-api-tls-key-file={}", env("HOST_API_TLS_KEY_FILE")?),
            format!(
                "--host-token-public-key-file={}",
                env("HOST_TOKEN_PUBLIC_KEY_FILE")?
            ),
            format!("--host-token-issuer={}", env("HOST_TOKEN_ISSUER")?),
            format!("--host-token-audience={}", env("HOST_TOKEN_AUDIENCE")?),
        ])
    }

    /// With [`Self::host_api_args`]: the Host operator mints each Host's runtime token with the
    /// local issuer's key (`hack/cluster.sh`'s `pki/host-token.key`), and the Host API accepts
    /// its lifetime (1 h).
    pub fn runtime_token_args(&self) -> Result<Vec<String>> {
        let key = self
            .env
            .get("HOST_TOKEN_SIGNING_KEY_FILE")
            .cloned()
            .with_context(|| {
                format!(
                    "{} has no HOST_TOKEN_SIGNING_KEY_FILE: re-run hack/cluster.sh",
                    self.dir.display()
                )
            })?;
        Ok(vec![
            format!("--host-runtime-token-key-file={key}"),
            "--host-token-max-ttl=1h".to_string(),
        ])
    }

    /// The CA that signed the serving certificate of the API and sync listeners.
    pub fn sync_ca(&self) -> PathBuf {
        PathBuf::from(
            self.env
                .get("AGGREGATED_CA_FILE")
                .cloned()
                .unwrap_or_default(),
        )
    }

    /// Applies the CRDs and the RBAC and writes the apiserver's and the controllers' own
    /// kubeconfigs.
    fn install(&self) -> Result<()> {
        let root = repo_root();
        let crds = root.join("deploy/crds").display().to_string();
        self.kubectl_ok(&["apply", "-k", &crds], None)?;
        // Every CRD of this cluster is ours.
        self.kubectl_ok(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd",
                "--all",
            ],
            None,
        )?;
        self.kubectl_ok(
            &[
                "apply",
                "-k",
                &root.join("deploy/rbac").display().to_string(),
            ],
            None,
        )?;
        // The apiserver runs with its service account's token, as it would in a Pod.
        let token = self.kubectl_ok(
            &[
                "create",
                "token",
                "mcp-access-apiserver",
                "-n",
                "mcp-access",
                "--duration=24h",
            ],
            None,
        )?;
        let server = self
            .env
            .get("KUBE_APISERVER_URL")
            .context("KUBE_APISERVER_URL missing")?;
        let ca = self
            .env
            .get("CLUSTER_CA_FILE")
            .context("CLUSTER_CA_FILE missing")?;
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: mcp-access-apiserver\n  user:\n    token: {}\ncontexts:\n- name: local\n  context: {{cluster: local, user: mcp-access-apiserver}}\ncurrent-context: local\n",
            token.trim()
        );
        let path = self.dir.join("mcp-access-apiserver.kubeconfig");
        std::fs::write(&path, kubeconfig)?;
        // The controllers' service account and RBAC from deploy/controllers (not its
        // Deployment: here the controllers run as local processes, see start_controllers),
        // and a kubeconfig with that account's token, so the RBAC shipped is what they run with.
        for file in ["serviceaccount.yaml", "rbac.yaml"] {
            let file = root.join("deploy/controllers").join(file);
            self.kubectl_ok(&["apply", "-f", &file.display().to_string()], None)?;
        }
        let token = self.kubectl_ok(
            &[
                "create",
                "token",
                "mcp-access-controllers",
                "-n",
                "mcp-access",
                "--duration=24h",
            ],
            None,
        )?;
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: mcp-access-controllers\n  user:\n    token: {}\ncontexts:\n- name: local\n  context: {{cluster: local, user: mcp-access-controllers}}\ncurrent-context: local\n",
            token.trim()
        );
        std::fs::write(
            self.dir.join("mcp-access-controllers.kubeconfig"),
            kubeconfig,
        )?;
        Ok(())
    }

    /// Registers this cluster's mcp-access-apiserver process behind the APIService (an
    /// ExternalName Service to localhost) at the port it bound (so after its first start).
    pub fn register_apiservice(&self) -> Result<()> {
        let root = repo_root();
        let ca_bundle = std::fs::read(
            self.env
                .get("AGGREGATED_CA_FILE")
                .context("AGGREGATED_CA_FILE missing")?,
        )?;
        let manifest = std::fs::read_to_string(root.join("deploy/local/apiservice.yaml"))?
            .replace("@PORT@", &self.api_port.to_string())
            .replace(
                "@CA_BUNDLE@",
                &base64::engine::general_purpose::STANDARD.encode(ca_bundle),
            );
        self.kubectl_ok(&["apply", "-f", "-"], Some(&manifest))?;
        Ok(())
    }

    /// Starts (or restarts) `mcp-access-apiserver`; every start rotates the change-log epoch.
    /// Restarts MCP Access with extra flags for this start only (e.g. `--rotate-epoch`).
    pub fn start_apiserver_with(&mut self, extra: &[&str]) -> Result<()> {
        let kept = self.apiserver_args.clone();
        self.apiserver_args
            .extend(extra.iter().map(|s| s.to_string()));
        let started = self.start_apiserver();
        self.apiserver_args = kept;
        started
    }

    /// The `iss` of the session tokens this cluster's apiserver mints.
    pub fn session_token_issuer(&self) -> String {
        self.env
            .get("SESSION_TOKEN_ISSUER")
            .cloned()
            .unwrap_or_else(|| DEFAULT_SESSION_TOKEN_ISSUER.into())
    }

    /// The session-token signing key: `hack/cluster.sh`'s, or (a cluster started before it
    /// made one) an EC P-256 key generated once into the cluster directory, mode 600.
    fn session_token_key(&self) -> Result<PathBuf> {
        if let Some(key) = self.env.get("SESSION_TOKEN_SIGNING_KEY_FILE") {
            return Ok(PathBuf::from(key));
        }
        let key = self.dir.join("session-token.key");
        if !key.exists() {
            let tmp = self.dir.join("session-token.key.tmp");
            checked(
                Command::new("openssl")
                    .args([
                        "genpkey",
                        "-algorithm",
                        "EC",
                        "-pkeyopt",
                        "ec_paramgen_curve:P-256",
                        "-out",
                    ])
                    .arg(&tmp),
            )?;
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
            std::fs::rename(&tmp, &key)?;
        }
        Ok(key)
    }

    /// A session token for the AccessSession `ns/name` (default lifetime and audience),
    /// minted by `kubectl create --raw` on its `token` subresource as the admin.
    pub fn session_token(&self, ns: &str, name: &str) -> Result<String> {
        let path = format!(
            "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/{ns}/accesssessions/{name}/token"
        );
        let request =
            r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{}}"#;
        let out = self.kubectl_ok(&["create", "--raw", &path, "-f", "-"], Some(request))?;
        let answer: serde_json::Value =
            serde_json::from_str(&out).context("the token subresource answers a TokenRequest")?;
        answer["status"]["token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .context("the TokenRequest carries no status.token")
    }

    /// Starts (or restarts) `mcp-access-apiserver`. The first start asks for port 0 for the
    /// API and metrics listeners and reads the ports bound from its stderr; `--sync-port 0`
    /// turns the sync listener off, so its port is a kernel-chosen candidate, replaced by a
    /// fresh one when the start fails with "address already in use". A restart asks for the
    /// same ports again (the APIService and the gateways point at them), which the previous
    /// process held until it ended.
    pub fn start_apiserver(&mut self) -> Result<()> {
        let first = self.api_port == 0;
        for attempt in 1.. {
            if first {
                self.sync_port = candidate_port()?;
            }
            match self.try_start_apiserver() {
                Ok(()) => return Ok(()),
                Err(e) if first && attempt < 5 && format!("{e:#}").contains("already in use") => {
                    eprintln!(
                        "mcp-access-apiserver: sync port {} taken, another",
                        self.sync_port
                    );
                    (self.api_port, self.metrics_port) = (0, 0);
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop returns")
    }

    fn try_start_apiserver(&mut self) -> Result<()> {
        self.stop_apiserver();
        let logs = self.dir.join("logs");
        std::fs::create_dir_all(&logs)?;
        let log_path = logs.join("mcp-access-apiserver.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let get = |k: &str| {
            self.env
                .get(k)
                .cloned()
                .with_context(|| format!("{k} missing from env"))
        };
        let token_key = self.session_token_key()?;
        let mut child = Command::new(&self.apiserver_bin)
            .arg("--tls-cert-file")
            .arg(get("MCP_ACCESS_TLS_CERT_FILE")?)
            .arg("--session-token-signing-key-file")
            .arg(&token_key)
            .args(["--session-token-issuer", &self.session_token_issuer()])
            .arg("--tls-private-key-file")
            .arg(get("MCP_ACCESS_TLS_PRIVATE_KEY_FILE")?)
            .arg("--kubeconfig")
            .arg(self.dir.join("mcp-access-apiserver.kubeconfig"))
            .args([
                "--bind-address",
                if self.node { "0.0.0.0" } else { "127.0.0.1" },
            ])
            .args(["--secure-port", &self.api_port.to_string()])
            .args(["--metrics-port", &self.metrics_port.to_string()])
            .args(["--sync-port", &self.sync_port.to_string()])
            .args(&self.apiserver_args)
            .env("MCP_ACCESS_DATABASE_URL", &self.database_url)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(log.try_clone()?)
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {}", self.apiserver_bin.display()))?;
        let stderr = child.stderr.take().context("no stderr")?;
        let mut listening = listening::follow("mcp-access-apiserver", stderr, log);
        self.apiserver = Some(child);
        let ports = listening
            .ports(&["api", "metrics", "sync"], listening::LISTEN_TIMEOUT)
            .map_err(|e| {
                let text = std::fs::read_to_string(&log_path).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(5).collect();
                anyhow::anyhow!(
                    "{e}; see {}: {}",
                    log_path.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                )
            })?;
        (self.api_port, self.metrics_port, self.sync_port) = (ports[0], ports[1], ports[2]);
        Ok(())
    }

    /// Starts one replica of `mcp-access-controllers` (binary `bin`) as the controllers'
    /// service account, pointed at this cluster's gateway sync listener, with `args` added
    /// (e.g. `--image-policy=enforce`, `--lease-name=...`). `name` is its Lease identity and
    /// names its log, `logs/mcp-access-controllers-<name>.log`.
    pub fn start_controllers(&self, bin: &Path, name: &str, args: &[&str]) -> Result<Controllers> {
        let logs = self.dir.join("logs");
        std::fs::create_dir_all(&logs)?;
        let log_path = logs.join(format!("mcp-access-controllers-{name}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let mut child = Command::new(bin)
            .arg("--kubeconfig")
            .arg(self.dir.join("mcp-access-controllers.kubeconfig"))
            .args(["--identity", name])
            // Port 0: the process says which ports it bound.
            .args(["--metrics-port", "0"])
            // Never pulled: without a node Pods stay Pending; with one, the image is imported.
            .args([
                "--gateway-image",
                if self.node {
                    NODE_GATEWAY_IMAGE
                } else {
                    "mcp-access-gateway:local"
                },
            ])
            .args(["--gateway-sync-url", &self.sync_url()])
            .arg("--gateway-sync-ca-file")
            .arg(self.sync_ca())
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(log.try_clone()?)
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let stderr = child.stderr.take().context("no stderr")?;
        let mut listening = listening::follow("mcp-access-controllers", stderr, log);
        let mut controllers = Controllers {
            child: Some(child),
            metrics_port: 0,
            host_api_port: None,
            log: log_path,
        };
        let host_api = args.iter().any(|a| a.starts_with("--host-api-port"));
        let listeners: &[&str] = if host_api {
            &["metrics", "host-api"]
        } else {
            &["metrics"]
        };
        let ports = listening
            .ports(listeners, listening::LISTEN_TIMEOUT)
            .map_err(|e| anyhow::anyhow!("{e}; see {}", controllers.log.display()))?;
        controllers.metrics_port = ports[0];
        controllers.host_api_port = ports.get(1).copied();
        let deadline = Instant::now() + Duration::from_secs(30);
        while controllers.get("/readyz").is_err() {
            if !controllers.running() {
                bail!(
                    "mcp-access-controllers exited; see {}",
                    controllers.log.display()
                );
            }
            if Instant::now() > deadline {
                bail!("mcp-access-controllers was not ready within 30s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(controllers)
    }

    /// Fails if the `mcp-access-apiserver` this cluster started is not running.
    pub fn ensure_apiserver_running(&mut self) -> Result<()> {
        let log = self.dir.join("logs/mcp-access-apiserver.log");
        match self.apiserver.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => Ok(()),
            Some(Ok(Some(status))) => bail!(
                "mcp-access-apiserver exited ({status}); see {}",
                log.display()
            ),
            Some(Err(e)) => bail!("cannot check mcp-access-apiserver: {e}"),
            None => bail!("mcp-access-apiserver was not started"),
        }
    }

    /// Stops `mcp-access-apiserver` (SIGTERM via kill, then wait).
    pub fn stop_apiserver(&mut self) {
        if let Some(mut child) = self.apiserver.take() {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits until MCP Access is served through kube-apiserver as clients need it: the
    /// APIService is Available, aggregated discovery lists our resources, and kube-apiserver
    /// serves our OpenAPI v3 document (which `kubectl explain` and kubectl's validation read;
    /// the aggregator downloads it in the background after the APIService turns Available).
    /// `hack/up.sh` prints `KUBECONFIG=` only after this returns.
    pub fn wait_available(&self, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        let deadline = started + timeout;
        let mut last = String::new();
        loop {
            let missing = match self.not_yet_served() {
                Ok(None) => {
                    eprintln!(
                        "MCP Access served through kube-apiserver after {:.1}s",
                        started.elapsed().as_secs_f64()
                    );
                    return Ok(());
                }
                Ok(Some(missing)) => missing,
                Err(e) => format!("{e:#}"),
            };
            // Say what is awaited when it changes (the OpenAPI download trails availability).
            let what = missing.split(':').next().unwrap_or_default().to_string();
            if what != last {
                eprintln!("waiting ({:.1}s): {what}", started.elapsed().as_secs_f64());
                last = what;
            }
            if Instant::now() > deadline {
                bail!(
                    "MCP Access is not served through kube-apiserver after {timeout:?}: {missing}"
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What is not served yet, or `None` when everything is.
    fn not_yet_served(&self) -> Result<Option<String>> {
        let status = self.kubectl(&[
            "get",
            "apiservice",
            &format!("{API_VERSION}.{API_GROUP}"),
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Available\")]}",
        ]);
        if !status.stdout.contains(r#""status":"True""#) {
            return Ok(Some(format!(
                "the APIService is not Available: {}{}",
                status.stdout, status.stderr
            )));
        }
        // Aggregated discovery (what kubectl and client-go read first).
        let discovery = self.get_json(
            "/apis",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        )?;
        let group = discovery["items"]
            .as_array()
            .and_then(|items| items.iter().find(|g| g["metadata"]["name"] == API_GROUP));
        let version = group
            .and_then(|g| g["versions"].as_array())
            .and_then(|vs| vs.iter().find(|v| v["version"] == API_VERSION));
        let listed = version
            .and_then(|v| v["resources"].as_array())
            .is_some_and(|rs| rs.iter().any(|r| r["resource"] == "accesssessions"));
        if !listed || version.is_some_and(|v| v["freshness"] == "Stale") {
            return Ok(Some(format!(
                "aggregated discovery does not list {API_GROUP}/{API_VERSION} accesssessions: {}",
                version.map(|v| v.to_string()).unwrap_or_default()
            )));
        }
        // OpenAPI v3: the root names the group's document, which holds our kinds.
        let root = self.get_json("/openapi/v3", "application/json")?;
        let Some(url) =
            root["paths"][format!("apis/{API_GROUP}/{API_VERSION}")]["serverRelativeURL"].as_str()
        else {
            return Ok(Some(format!(
                "/openapi/v3 does not list apis/{API_GROUP}/{API_VERSION} yet"
            )));
        };
        let doc = self.get_json(url, "application/json")?;
        let has_kind = doc["components"]["schemas"]
            .as_object()
            .is_some_and(|schemas| {
                schemas.values().any(|schema| {
                    schema["x-kubernetes-group-version-kind"]
                        .as_array()
                        .is_some_and(|gvks| {
                            gvks.iter().any(|gvk| {
                                gvk["group"] == API_GROUP
                                    && gvk["version"] == API_VERSION
                                    && gvk["kind"] == "AccessSession"
                            })
                        })
                })
            });
        if !has_kind {
            return Ok(Some(format!("{url} has no AccessSession schema yet")));
        }
        Ok(None)
    }

    /// GET `path` from kube-apiserver as the admin, with `accept`; the body as JSON.
    fn get_json(&self, path: &str, accept: &str) -> Result<serde_json::Value> {
        let get = |k: &str| {
            self.env
                .get(k)
                .cloned()
                .with_context(|| format!("{k} missing from env"))
        };
        let body = checked(
            Command::new("curl")
                .args(["-fsS", "--max-time", "10", "-H"])
                .arg(format!("Accept: {accept}"))
                .arg("--cacert")
                .arg(get("CLUSTER_CA_FILE")?)
                .arg("--cert")
                .arg(get("ADMIN_CERT_FILE")?)
                .arg("--key")
                .arg(get("ADMIN_KEY_FILE")?)
                .arg(format!("{}{path}", get("KUBE_APISERVER_URL")?)),
        )?;
        serde_json::from_str(&body).with_context(|| format!("{path} is not JSON"))
    }

    /// Stops everything this cluster started.
    pub fn stop(&mut self) {
        self.stop_apiserver();
        self.scratch_db.take();
        let root = repo_root();
        let _ = Command::new("bash")
            .arg(root.join("hack/cluster.sh"))
            .arg("stop")
            .arg(&self.dir)
            .status();
        if self.local_pg {
            let script = format!(
                ". {}/hack/lib/postgres.sh && postgres_stop {}",
                root.display(),
                self.dir.join("pg").display()
            );
            let _ = Command::new("bash").arg("-c").arg(script).status();
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A running `mcp-access-controllers` replica (see [`LocalCluster::start_controllers`]);
/// stopped when dropped.
pub struct Controllers {
    child: Option<Child>,
    /// Port of its `/metrics`, `/livez` and `/readyz` on 127.0.0.1.
    pub metrics_port: u16,
    /// Port of its Host API, when `--host-api-port` turned it on.
    pub host_api_port: Option<u16>,
    /// Its log file.
    pub log: PathBuf,
}

impl Controllers {
    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// GET `path` from its metrics listener; the body on 200.
    pub fn get(&self, path: &str) -> Result<String> {
        checked(
            Command::new("curl")
                .args(["-fsS", "--max-time", "5"])
                .arg(format!("http://127.0.0.1:{}{path}", self.metrics_port)),
        )
    }

    /// The sum of the samples of metric `name` whose labels contain every `labels` pair
    /// (`key="value"`), from `/metrics`. An error when no sample matches: a misspelt name or
    /// label would otherwise read as 0 and let a "nothing happened" check pass vacuously.
    pub fn metric(&self, name: &str, labels: &[&str]) -> Result<f64> {
        self.samples(name, labels)?
            .ok_or_else(|| anyhow::anyhow!("no {name}{{{}}} in /metrics", labels.join(",")))
    }

    /// Like [`Controllers::metric`], but 0 when no sample matches: a labelled family with no
    /// series yet is not in `/metrics` at all (not even its `# TYPE` line). Only for a check
    /// whose scenario also shows the same series appearing (its positive control).
    pub fn metric_or_zero(&self, name: &str, labels: &[&str]) -> Result<f64> {
        Ok(self.samples(name, labels)?.unwrap_or(0.0))
    }

    /// The sum of the matching samples, `None` when there is none.
    fn samples(&self, name: &str, labels: &[&str]) -> Result<Option<f64>> {
        let text = self.get("/metrics")?;
        let values: Vec<f64> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
                (metric == name && labels.iter().all(|p| rest.contains(p)))
                    .then(|| value.parse::<f64>().ok())
                    .flatten()
            })
            .collect();
        Ok((!values.is_empty()).then(|| values.iter().sum()))
    }

    /// SIGKILL: no cleanup, the Lease is left held until it expires.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait (the leader releases its Lease).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Controllers {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `(manager, operation)` of each `metadata.managedFields` entry of an object, in order.
pub fn managed_field_managers(object: &serde_json::Value) -> Vec<(String, String)> {
    object["metadata"]["managedFields"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .map(|e| {
                    (
                        e["manager"].as_str().unwrap_or("").to_string(),
                        e["operation"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}
