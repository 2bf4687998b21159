//! MCP Access's own delegated authentication and authorization, decided by MCP Access and
//! not by kube-apiserver in front of it (issue 8, item 14): every request here goes straight
//! to MCP Access's port with a front-proxy client certificate, as the aggregator's would, so
//! a 401 or 403 can only come from MCP Access, and the SubjectAccessReview it makes is
//! answered by the cluster's real RBAC.

use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::LocalCluster;
use serde_json::Value;

/// The name the serving certificate is issued for (the APIService's Service).
const SERVICE_HOST: &str = "mcp-access-apiserver.mcp-access.svc";
/// The CN kube-apiserver's `--requestheader-allowed-names` allows (see `hack/cluster.sh`).
const ALLOWED_CN: &str = "front-proxy-client";
const GROUP_VERSION: &str = "/apis/access.mcp-runtime.dev/v1alpha1";

fn pki(c: &LocalCluster) -> Result<PathBuf, String> {
    let ca = c
        .env
        .get("FRONT_PROXY_CA_FILE")
        .ok_or("FRONT_PROXY_CA_FILE missing from the cluster env")?;
    Path::new(ca)
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("{ca} has no directory"))
}

fn kubectl_ok(c: &LocalCluster, args: &[&str]) -> Result<String, String> {
    let out = c.kubectl(args);
    if out.success {
        Ok(out.stdout)
    } else {
        Err(format!(
            "kubectl {} failed: {}{}",
            args.join(" "),
            out.stdout,
            out.stderr
        ))
    }
}

/// A client certificate signed by the cluster's front-proxy CA with the given subject
/// (e.g. `/CN=a` or `/CN=a/CN=b`), made with openssl as `hack/cluster.sh` makes the real
/// one. Returns the PEM of key and certificate together.
fn front_proxy_identity(c: &LocalCluster, name: &str, subject: &str) -> Result<Vec<u8>, String> {
    let pki = pki(c)?;
    let dir = c.dir.join("delegated-auth");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let key = dir.join(format!("{name}.key"));
    let csr = dir.join(format!("{name}.csr"));
    let crt = dir.join(format!("{name}.crt"));
    let ext = dir.join(format!("{name}.ext"));
    std::fs::write(
        &ext,
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
    )
    .map_err(|e| e.to_string())?;
    let run = |cmd: &mut Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("openssl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{cmd:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    };
    run(Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
        ])
        .arg(&key))?;
    run(Command::new("openssl")
        .args(["req", "-new", "-subj", subject, "-key"])
        .arg(&key)
        .arg("-out")
        .arg(&csr))?;
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "1", "-in"])
        .arg(&csr)
        .arg("-CA")
        .arg(pki.join("front-proxy-ca.crt"))
        .arg("-CAkey")
        .arg(pki.join("front-proxy-ca.key"))
        .arg("-set_serial")
        .arg(format!("0x{}", uuid::Uuid::new_v4().simple()))
        .arg("-extfile")
        .arg(&ext)
        .arg("-out")
        .arg(&crt))?;
    let mut pem = std::fs::read(&key).map_err(|e| e.to_string())?;
    pem.extend(std::fs::read(&crt).map_err(|e| e.to_string())?);
    Ok(pem)
}

/// The real front-proxy client identity kube-apiserver uses towards MCP Access.
fn real_front_proxy_identity(c: &LocalCluster) -> Result<Vec<u8>, String> {
    let pki = pki(c)?;
    let mut pem = std::fs::read(pki.join("front-proxy-client.key")).map_err(|e| e.to_string())?;
    pem.extend(std::fs::read(pki.join("front-proxy-client.crt")).map_err(|e| e.to_string())?);
    Ok(pem)
}

/// Talks to MCP Access's own port, presenting `identity` in the TLS handshake.
struct Direct {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    port: u16,
}

impl Direct {
    fn new(c: &LocalCluster, identity: &[u8]) -> Result<Self, String> {
        Self::to_port(c, c.api_port, Some(identity))
    }

    /// A client of the MCP Access instance on `port`, with a client certificate or without.
    fn to_port(c: &LocalCluster, port: u16, identity: Option<&[u8]>) -> Result<Self, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = std::fs::read(
            c.env
                .get("AGGREGATED_CA_FILE")
                .ok_or("AGGREGATED_CA_FILE missing")?,
        )
        .map_err(|e| e.to_string())?;
        let mut builder = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(&ca).map_err(|e| e.to_string())?])
            .resolve(SERVICE_HOST, ([127, 0, 0, 1], port).into())
            .timeout(Duration::from_secs(30));
        if let Some(identity) = identity {
            builder =
                builder.identity(reqwest::Identity::from_pem(identity).map_err(|e| e.to_string())?);
        }
        let client = builder.build().map_err(|e| e.to_string())?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self { rt, client, port })
    }

    /// GET `path` with a bearer token; status code, `Retry-After` and body.
    fn get_with_token(
        &self,
        token: &str,
        path: &str,
    ) -> Result<(u16, Option<String>, Value), String> {
        let request = self
            .client
            .get(format!("https://{SERVICE_HOST}:{}{path}", self.port))
            .bearer_auth(token);
        self.rt.block_on(async {
            let response = request
                .send()
                .await
                .map_err(|e| format!("GET {path}: {e}"))?;
            let code = response.status().as_u16();
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body = response.json().await.unwrap_or(Value::Null);
            Ok((code, retry_after, body))
        })
    }

    /// GET `path` as the user the proxy headers assert; status code and body.
    fn get_as(&self, user: &str, groups: &[&str], path: &str) -> Result<(u16, Value), String> {
        self.get_as_with_retry_after(user, groups, path)
            .map(|(code, _, body)| (code, body))
    }

    /// Same, with the `Retry-After` header.
    fn get_as_with_retry_after(
        &self,
        user: &str,
        groups: &[&str],
        path: &str,
    ) -> Result<(u16, Option<String>, Value), String> {
        let mut request = self
            .client
            .get(format!("https://{SERVICE_HOST}:{}{path}", self.port))
            .header("X-Remote-User", user);
        for group in groups {
            request = request.header("X-Remote-Group", *group);
        }
        self.rt.block_on(async {
            let response = request
                .send()
                .await
                .map_err(|e| format!("GET {path}: {e}"))?;
            let code = response.status().as_u16();
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body = response.json().await.unwrap_or(Value::Null);
            Ok((code, retry_after, body))
        })
    }
}

fn sessions(ns: &str) -> String {
    format!("{GROUP_VERSION}/namespaces/{ns}/accesssessions")
}

fn create_namespace(c: &LocalCluster, ns: &str) -> Result<(), String> {
    kubectl_ok(c, &["create", "namespace", ns]).map(|_| ())
}

fn expect_forbidden_by_mcp_access(
    (code, body): &(u16, Value),
    user: &str,
    ns: &str,
) -> Result<(), String> {
    let expected = format!(
        "accesssessions.access.mcp-runtime.dev is forbidden: User \"{user}\" cannot list resource \"accesssessions\" in API group \"access.mcp-runtime.dev\" in the namespace \"{ns}\""
    );
    let message = body["message"].as_str().unwrap_or_default();
    if *code == 403
        && body["kind"] == "Status"
        && body["reason"] == "Forbidden"
        && message.starts_with(&expected)
    {
        Ok(())
    } else {
        Err(format!(
            "expected MCP Access's 403 for {user} in {ns}, got {code} {body}"
        ))
    }
}

/// (a) A valid front proxy asserting an unprivileged user: MCP Access's own
/// SubjectAccessReview denies it.
pub fn front_proxy_user_without_rbac_is_denied_by_mcp_access(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let ns = "e2e-da-denied";
    create_namespace(c, ns)?;
    let proxy = Direct::new(c, &real_front_proxy_identity(c)?)?;
    let user = "e2e-da-nobody";
    let denied = proxy.get_as(user, &["system:authenticated"], &sessions(ns))?;
    expect_forbidden_by_mcp_access(&denied, user, ns)?;
    // The proxy itself is trusted: the same certificate asserting system:masters is served
    // (short-circuited, no review), so the 403 above is a decision about the user.
    let (code, body) = proxy.get_as("e2e-da-admin", &["system:masters"], &sessions(ns))?;
    if code != 200 || body["kind"] != "AccessSessionList" {
        return Err(format!(
            "system:masters through the real proxy: {code} {body}"
        ));
    }
    Ok(())
}

/// (b) Certificates from the front-proxy CA whose CN is not allowed: their headers are not
/// trusted, so the request is anonymous and answered 401. A subject with two CNs is judged
/// by the last one, as kube-apiserver judges it.
pub fn front_proxy_certificate_with_disallowed_cn_is_not_trusted(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let ns = "default";
    for (name, subject) in [
        ("intruder", "/CN=e2e-intruder".to_string()),
        // kube reads CN=e2e-intruder from this one (Go keeps the last CN).
        ("smuggled", format!("/CN={ALLOWED_CN}/CN=e2e-intruder")),
    ] {
        let identity = front_proxy_identity(c, name, &subject)?;
        let direct = Direct::new(c, &identity)?;
        let (code, body) = direct.get_as("e2e-da-admin", &["system:masters"], &sessions(ns))?;
        if code != 401 || body["reason"] != "Unauthorized" {
            return Err(format!(
                "certificate {subject} signed by the front-proxy CA must not be trusted: {code} {body}"
            ));
        }
    }
    // Control: a certificate made the same way whose last CN is the allowed one is trusted,
    // so the 401s above come from the name check and not from the certificate itself.
    let identity =
        front_proxy_identity(c, "allowed", &format!("/CN=e2e-intruder/CN={ALLOWED_CN}"))?;
    let direct = Direct::new(c, &identity)?;
    let (code, body) = direct.get_as("e2e-da-admin", &["system:masters"], &sessions(ns))?;
    if code != 200 {
        return Err(format!(
            "allowed CN (last of two) not trusted: {code} {body}"
        ));
    }
    Ok(())
}

/// (c) Removing a RoleBinding takes effect within the authorization cache TTL (10 s, the
/// launcher's default) plus RBAC propagation in kube-apiserver.
pub fn removed_rolebinding_takes_effect_within_the_cache_ttl(
    c: &mut LocalCluster,
) -> Result<(), String> {
    let ns = "e2e-da-revoke";
    let user = "e2e-da-reader";
    create_namespace(c, ns)?;
    let proxy = Direct::new(c, &real_front_proxy_identity(c)?)?;
    let path = sessions(ns);
    let groups = ["system:authenticated"];
    expect_forbidden_by_mcp_access(&proxy.get_as(user, &groups, &path)?, user, ns)?;

    kubectl_ok(
        c,
        &[
            "create",
            "rolebinding",
            "reader",
            "-n",
            ns,
            "--clusterrole=view",
            &format!("--user={user}"),
        ],
    )?;
    // The earlier denial is cached for up to 10 s, and RBAC needs a moment to see the
    // binding: wait for the grant.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = proxy.get_as(user, &groups, &path)?;
        if code == 200 && body["kind"] == "AccessSessionList" {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the RoleBinding never granted access: {code} {body}"
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }

    kubectl_ok(c, &["delete", "rolebinding", "reader", "-n", ns])?;
    let removed = Instant::now();
    let bound = Duration::from_secs(10) + Duration::from_secs(5);
    loop {
        let response = proxy.get_as(user, &groups, &path)?;
        if response.0 == 403 {
            expect_forbidden_by_mcp_access(&response, user, ns)?;
            println!(
                "    access ended {:.1}s after the RoleBinding was deleted (bound {}s)",
                removed.elapsed().as_secs_f64(),
                bound.as_secs()
            );
            break;
        }
        if removed.elapsed() > bound {
            return Err(format!(
                "still {} {} {:.1}s after the RoleBinding was deleted",
                response.0,
                response.1,
                removed.elapsed().as_secs_f64()
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(())
}

/// A TCP relay to kube-apiserver that can be cut: while cut, open connections are shut down
/// and new ones closed at once, as if kube-apiserver were unreachable. Only the MCP Access
/// instance configured to use it is partitioned; the shared cluster keeps running.
struct Partition {
    port: u16,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl Partition {
    fn start(upstream: String) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (cut2, stop2, open2) = (cut.clone(), stop.clone(), open.clone());
        std::thread::spawn(move || {
            while !stop2.load(Ordering::SeqCst) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                };
                if cut2.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let _ = client.set_nonblocking(false);
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                if let Ok(mut open) = open2.lock() {
                    open.extend(client.try_clone().ok());
                    open.extend(server.try_clone().ok());
                }
                for (mut from, mut to) in [(client, s2), (server, c2)] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Ok(Self {
            port,
            cut,
            open,
            stop,
        })
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
        if cut {
            if let Ok(mut open) = self.open.lock() {
                for stream in open.drain(..) {
                    let _ = stream.shutdown(Shutdown::Both);
                }
            }
        }
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.set_cut(true);
    }
}

/// A second MCP Access instance over the same database whose kube-apiserver is reached
/// through `partition`. Killed on drop. (Its start rotates the change-log epoch, so watches
/// on the main instance are expired once, as after any restart.)
struct PartitionedInstance {
    child: Child,
    port: u16,
}

impl PartitionedInstance {
    fn start(c: &LocalCluster, partition: &Partition) -> Result<Self, String> {
        let bin = std::env::var("MCP_ACCESS_APISERVER_BIN")
            .map_err(|_| "MCP_ACCESS_APISERVER_BIN is not set".to_string())?;
        let upstream = c
            .env
            .get("KUBE_APISERVER_URL")
            .ok_or("KUBE_APISERVER_URL missing")?;
        let kubeconfig = std::fs::read_to_string(c.dir.join("mcp-access-apiserver.kubeconfig"))
            .map_err(|e| e.to_string())?
            .replace(
                &format!("server: {upstream}"),
                &format!("server: https://127.0.0.1:{}", partition.port),
            );
        let kubeconfig_path = c.dir.join("mcp-access-apiserver-partitioned.kubeconfig");
        std::fs::write(&kubeconfig_path, kubeconfig).map_err(|e| e.to_string())?;
        let log_path = c.dir.join("logs/mcp-access-apiserver-partitioned.log");
        let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
        let get = |k: &str| c.env.get(k).cloned().ok_or(format!("{k} missing"));
        let mut child = Command::new(bin)
            .arg("--tls-cert-file")
            .arg(get("MCP_ACCESS_TLS_CERT_FILE")?)
            .arg("--tls-private-key-file")
            .arg(get("MCP_ACCESS_TLS_PRIVATE_KEY_FILE")?)
            .arg("--kubeconfig")
            .arg(&kubeconfig_path)
            .args(["--bind-address", "127.0.0.1"])
            // Port 0: the process says which ports it bound.
            .args(["--secure-port", "0"])
            .args(["--metrics-port", "0"])
            .env("MCP_ACCESS_DATABASE_URL", &c.database_url)
            .env("RUST_LOG", "info")
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        // From here on, an early return drops `me` and so kills the process.
        let mut me = Self { child, port: 0 };
        me.port = e2e::listening::follow("mcp-access-apiserver", stderr, log)
            .ports(&["api"], e2e::listening::LISTEN_TIMEOUT)
            .map_err(|e| {
                format!(
                    "partitioned instance: {e}: {}",
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                )
            })?[0];
        Ok(me)
    }
}

impl Drop for PartitionedInstance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (d) kube-apiserver unreachable: an authenticated request is answered 503 with
/// Retry-After, neither 401 (TokenReview) nor 403 (SubjectAccessReview), and nothing of the
/// outage is cached — once kube-apiserver is back, the same requests are decided again.
pub fn kube_apiserver_unreachable_answers_503(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "e2e-da-outage";
    let user = "e2e-da-outage-reader";
    create_namespace(c, ns)?;
    kubectl_ok(
        c,
        &[
            "create",
            "rolebinding",
            "reader",
            "-n",
            ns,
            "--clusterrole=view",
            &format!("--user={user}"),
        ],
    )?;
    kubectl_ok(c, &["create", "serviceaccount", "reader", "-n", ns])?;
    kubectl_ok(
        c,
        &[
            "create",
            "rolebinding",
            "sa-reader",
            "-n",
            ns,
            "--clusterrole=view",
            &format!("--serviceaccount={ns}:reader"),
        ],
    )?;
    let token = kubectl_ok(c, &["create", "token", "reader", "-n", ns, "--duration=1h"])?;
    let token = token.trim();
    let upstream = c
        .env
        .get("KUBE_APISERVER_URL")
        .and_then(|u| u.strip_prefix("https://"))
        .ok_or("KUBE_APISERVER_URL is not https://host:port")?
        .to_string();
    let partition = Partition::start(upstream)?;
    let instance = PartitionedInstance::start(c, &partition)?;
    let proxy = Direct::to_port(c, instance.port, Some(&real_front_proxy_identity(c)?))?;
    let bearer = Direct::to_port(c, instance.port, None)?;
    let path = sessions(ns);
    let groups = ["system:authenticated"];

    // Connected: both users are allowed (RBAC may need a moment to see the bindings).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (a, _, _) = proxy.get_as_with_retry_after(user, &groups, &path)?;
        let (b, _, _) = bearer.get_with_token(token, &path)?;
        if a == 200 && b == 200 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("before the outage: proxy user {a}, token {b}"));
        }
        std::thread::sleep(Duration::from_millis(250));
    }

    partition.set_cut(true);
    let expect_503 = |what: &str, (code, retry_after, body): (u16, Option<String>, Value)| {
        if code == 503 && body["reason"] == "ServiceUnavailable" && retry_after.is_some() {
            Ok(())
        } else {
            Err(format!(
                "{what} with kube-apiserver unreachable: {code} (Retry-After {retry_after:?}) {body}"
            ))
        }
    };
    // A request whose review is not cached: another path for the proxied user (its earlier
    // allow is cached by design and may still be served), and a token never seen before.
    let cut_at = Instant::now();
    let uncached = format!("{GROUP_VERSION}/namespaces/{ns}/revocations");
    expect_503(
        "SubjectAccessReview",
        proxy.get_as_with_retry_after(user, &groups, &uncached)?,
    )?;
    let elapsed = cut_at.elapsed();
    println!(
        "    503 {:.2}s after kube-apiserver became unreachable",
        elapsed.as_secs_f64()
    );
    let other_token = kubectl_ok(c, &["create", "token", "reader", "-n", ns, "--duration=1h"])?;
    expect_503(
        "TokenReview",
        bearer.get_with_token(other_token.trim(), &path)?,
    )?;

    partition.set_cut(false);
    // Back: the outage left nothing cached; the same requests are decided afresh.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (a, _, body_a) = proxy.get_as_with_retry_after(user, &groups, &uncached)?;
        let (b, _, body_b) = bearer.get_with_token(other_token.trim(), &path)?;
        if a == 200 && b == 200 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "after the outage: proxy user {a} {body_a}, token {b} {body_b}"
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(instance);
    drop(partition);
    Ok(())
}
