//! The controllers' Host API against the local cluster: `mcp-access-controllers` started with
//! `--host-api-*` flags, its serving certificate and the host token issuer's RSA key pair
//! made here with the openssl CLI, tokens signed in the test (jsonwebtoken), and every request
//! made with curl over HTTPS, as a host would. Each scenario has namespaces and a Lease of its
//! own and stops its replica.
//!
//! The API answers from watch caches: after a change in the cluster a scenario polls until the
//! answer reflects it (within seconds; expected within milliseconds), never sleeps blindly.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use e2e::{Controllers, LocalCluster};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use super::controllers::{apply, controllers_bin, start, until};
use super::{create_namespace, ok};

const ISSUER: &str = "https://issuer.hosts.e2e";
const AUDIENCE: &str = "mcp-host-api";
const CAPABILITY: &str = "mcp:credential:read";
const INVENTORY: &str = "/api/v2/hosts/self/mcpservers";
const CREDENTIAL: &str = "/api/v2/hosts/self/mcpservers/credential";
/// The controllers' default `--gateway-port`: the port of the URLs in the inventory.
const GATEWAY_PORT: u16 = 8086;

/// Keys and certificates of one scenario, made with openssl.
struct Pki {
    /// The issuer's private key (signs tokens here; never given to the controllers).
    issuer_key: PathBuf,
    /// Its public key (SPKI PEM), `--host-token-public-key-file`.
    issuer_pub: PathBuf,
    /// The Host API's self-signed serving certificate and key.
    tls_cert: PathBuf,
    tls_key: PathBuf,
    dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("openssl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn pki(c: &LocalCluster, name: &str) -> Result<Pki, String> {
    let dir = c.dir.join(format!("host-api-{name}"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    openssl(&dir, &["genrsa", "-out", "issuer.key", "2048"])?;
    openssl(
        &dir,
        &["pkey", "-in", "issuer.key", "-pubout", "-out", "issuer.pub"],
    )?;
    openssl(
        &dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "tls.key",
            "-out",
            "tls.crt",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
    )?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join("tls.key"), std::fs::Permissions::from_mode(0o600))
            .map_err(|e| e.to_string())?;
    }
    Ok(Pki {
        issuer_key: dir.join("issuer.key"),
        issuer_pub: dir.join("issuer.pub"),
        tls_cert: dir.join("tls.crt"),
        tls_key: dir.join("tls.key"),
        dir,
    })
}

/// A controllers replica serving the Host API.
struct HostApi {
    controllers: Controllers,
    port: u16,
    pki: Pki,
}

/// The flags of an enabled Host API for `pki` on `port`.
fn host_api_flags(pki: &Pki, port: u16) -> Vec<String> {
    vec![
        format!("--host-api-port={port}"),
        format!("--host-api-tls-cert-file={}", pki.tls_cert.display()),
        format!("--host-api-tls-key-file={}", pki.tls_key.display()),
        format!("--host-token-public-key-file={}", pki.issuer_pub.display()),
        format!("--host-token-issuer={ISSUER}"),
        format!("--host-token-audience={AUDIENCE}"),
    ]
}

fn start_host_api(c: &LocalCluster, name: &str, extra: &[&str]) -> Result<HostApi, String> {
    let pki = pki(c, name)?;
    // Port 0: the controllers say which port the Host API bound.
    let mut args = host_api_flags(&pki, 0);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let controllers = start(
        c,
        &format!("host-api-{name}"),
        &format!("host-api-{name}"),
        &args,
    )?;
    let port = controllers.host_api_port.ok_or("no Host API port")?;
    let api = HostApi {
        controllers,
        port,
        pki,
    };
    // Serving: an unknown path answers 404 without any token.
    until(Duration::from_secs(20), "the Host API answers", || {
        Ok(api
            .call("GET", "/", None, None)
            .ok()
            .filter(|r| r.status == 404)
            .map(|_| ()))
    })?;
    Ok(api)
}

/// One HTTP answer as curl saw it.
#[derive(Debug, Clone)]
struct Reply {
    status: u16,
    /// The status line (`HTTP/1.1 200 OK`, `HTTP/2 200`).
    status_line: String,
    /// Lower-case names, in order.
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Result<Value, String> {
        serde_json::from_str(&self.body).map_err(|e| format!("{e}: {}", self.body))
    }

    /// What must be byte-identical between two negative answers: status, every header but
    /// `date`, and the body.
    fn comparable(&self) -> (u16, Vec<(String, String)>, String) {
        (
            self.status,
            self.headers
                .iter()
                .filter(|(n, _)| n != "date")
                .cloned()
                .collect(),
            self.body.clone(),
        )
    }

    /// Every answer of the Host API is JSON and never cached.
    fn check_common(&self, what: &str) -> Result<(), String> {
        ensure!(
            self.header("cache-control") == Some("no-store"),
            "{what}: Cache-Control is {:?}",
            self.header("cache-control")
        );
        ensure!(
            self.header("content-type") == Some("application/json"),
            "{what}: Content-Type is {:?}",
            self.header("content-type")
        );
        Ok(())
    }
}

impl HostApi {
    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    /// `curl -i` over HTTP/1.1: `body` is (content type, bytes).
    fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<(&str, &str)>,
    ) -> Result<Reply, String> {
        self.call_with(&["--http1.1"], method, path, token, body)
    }

    fn call_with(
        &self,
        flags: &[&str],
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<(&str, &str)>,
    ) -> Result<Reply, String> {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "-i", "--max-time", "10", "-X", method])
            .arg("--cacert")
            .arg(&self.pki.tls_cert)
            .args(flags)
            // No `Expect: 100-continue` (a second header block) for larger bodies.
            .args(["-H", "Expect:"]);
        if let Some(token) = token {
            cmd.args(["-H", &format!("Authorization: Bearer {token}")]);
        }
        if let Some((content_type, data)) = body {
            cmd.args([
                "-H",
                &format!("Content-Type: {content_type}"),
                "--data-binary",
                data,
            ]);
        }
        let out = cmd
            .arg(self.url(path))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("curl: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!(
                "curl {method} {path}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("no header block in {text:?}"))?;
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default().to_string();
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("status line {status_line:?}"))?;
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        Ok(Reply {
            status,
            status_line,
            headers,
            body: body.to_string(),
        })
    }

    fn inventory(&self, token: &str) -> Result<Reply, String> {
        self.call("GET", INVENTORY, Some(token), None)
    }

    fn credential(&self, token: &str, request: &Value) -> Result<Reply, String> {
        self.call(
            "POST",
            CREDENTIAL,
            Some(token),
            Some(("application/json", &request.to_string())),
        )
    }

    fn sign(&self, claims: &Value) -> Result<String, String> {
        let pem = std::fs::read(&self.pki.issuer_key).map_err(|e| e.to_string())?;
        let key = EncodingKey::from_rsa_pem(&pem).map_err(|e| e.to_string())?;
        jsonwebtoken::encode(&Header::new(Algorithm::RS256), claims, &key)
            .map_err(|e| e.to_string())
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

/// The claims of a valid token for Host `ns/name` of UID `uid`.
fn claims(ns: &str, name: &str, uid: &str) -> Value {
    let t = now();
    json!({
        "iss": ISSUER,
        "aud": [AUDIENCE],
        "iat": t - 5,
        "exp": t + 300,
        "hostRefs": [{"namespace": ns, "name": name}],
        "host_uid": uid,
        "capabilities": [CAPABILITY],
    })
}

fn uid(c: &LocalCluster, kind: &str, ns: &str, name: &str) -> Result<String, String> {
    let out = ok(
        &c.kubectl(&[
            "get",
            kind,
            name,
            "-n",
            ns,
            "-o",
            "jsonpath={.metadata.uid}",
        ]),
        &format!("get {kind} {ns}/{name}"),
    )?;
    ensure!(!out.trim().is_empty(), "{kind} {ns}/{name} has no uid");
    Ok(out.trim().to_string())
}

fn context(ns: &str, name: &str, servers: Value) -> Value {
    json!({
        "apiVersion": "mcp-runtime.dev/v1alpha1",
        "kind": "Context",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"mcpServers": servers, "hostSelector": {}},
    })
}

fn host(ns: &str, name: &str, context: &str) -> Value {
    json!({
        "apiVersion": "mcp-runtime.dev/v1alpha1",
        "kind": "Host",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"contextRef": {"name": context}, "image": "mcp-host:local"},
    })
}

fn server(ns: &str, name: &str, credential: Option<(&str, &str)>) -> Value {
    let mut spec = json!({"image": "mcp-server:local", "port": 8080});
    if let Some((secret, key)) = credential {
        spec["hostCredential"] = json!({"name": secret, "key": key});
    }
    json!({
        "apiVersion": "mcp-runtime.dev/v1alpha1",
        "kind": "MCPServer",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    })
}

fn secret(c: &LocalCluster, ns: &str, name: &str, key: &str, value: &str) -> Result<(), String> {
    ok(
        &c.kubectl(&[
            "create",
            "secret",
            "generic",
            name,
            "-n",
            ns,
            &format!("--from-literal={key}={value}"),
        ]),
        "create secret",
    )
    .map(|_| ())
}

/// A Host (and its empty Context) in `ns`, and its UID.
fn plain_host(c: &LocalCluster, ns: &str, name: &str) -> Result<String, String> {
    apply(c, &context(ns, "ctx", json!([])))?;
    apply(c, &host(ns, name, "ctx"))?;
    uid(c, "host", ns, name)
}

fn expect_401(reply: &Reply, what: &str) -> Result<(), String> {
    ensure!(
        reply.status == 401,
        "{what}: expected 401, got {} {}",
        reply.status,
        reply.body
    );
    ensure!(
        reply.body == r#"{"error":"unauthorized"}"#,
        "{what}: body {}",
        reply.body
    );
    ensure!(
        reply.header("www-authenticate") == Some(r#"Bearer error="invalid_token""#),
        "{what}: WWW-Authenticate {:?}",
        reply.header("www-authenticate")
    );
    reply.check_common(what)
}

fn b64(v: &Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string().as_bytes())
}

/// Every token the Host API must refuse, each with the same 401; a valid one is 200; the
/// token of a Host deleted and re-created under the same name is refused.
pub(super) fn token_matrix(c: &mut LocalCluster) -> Result<(), String> {
    let api = start_host_api(c, "tokens", &[])?;
    let ns = "hapi-tokens";
    create_namespace(c, ns)?;
    let uid = plain_host(c, ns, "agent")?;
    let good = claims(ns, "agent", &uid);

    let valid = until_reply(
        "the Host is cached",
        || api.inventory(&api.sign(&good)?),
        |r| r.status == 200,
    )?;
    ensure!(
        valid.status == 200,
        "valid token: {} {}",
        valid.status,
        valid.body
    );
    valid.check_common("valid token")?;
    ensure!(
        valid.json()? == json!({"host": {"namespace": ns, "name": "agent"}, "items": []}),
        "valid token: inventory {}",
        valid.body
    );
    // HTTP/2 too (ALPN h2).
    let h2 = api.call_with(
        &["--http2"],
        "GET",
        INVENTORY,
        Some(&api.sign(&good)?),
        None,
    )?;
    ensure!(
        h2.status == 200 && h2.status_line.starts_with("HTTP/2"),
        "valid token over HTTP/2: {}",
        h2.status_line
    );

    let with = |change: &dyn Fn(&mut Value)| -> Result<String, String> {
        let mut claims = good.clone();
        change(&mut claims);
        api.sign(&claims)
    };
    let public_pem = std::fs::read(&api.pki.issuer_pub).map_err(|e| e.to_string())?;
    let hs256 = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &good,
        &EncodingKey::from_secret(&public_pem),
    )
    .map_err(|e| e.to_string())?;
    let alg_none = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&good)
    );
    // A token of another issuer key, every claim right.
    let other = pki(c, "tokens-other")?;
    let other_key =
        EncodingKey::from_rsa_pem(&std::fs::read(&other.issuer_key).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    let foreign_key = jsonwebtoken::encode(&Header::new(Algorithm::RS256), &good, &other_key)
        .map_err(|e| e.to_string())?;
    let t = now();
    let cases: Vec<(&str, String)> = vec![
        (
            "wrong issuer",
            with(&|c| c["iss"] = json!("https://issuer.elsewhere"))?,
        ),
        (
            "wrong audience",
            with(&|c| c["aud"] = json!(["other-api"]))?,
        ),
        (
            "extra audience",
            with(&|c| c["aud"] = json!([AUDIENCE, "other-api"]))?,
        ),
        (
            "two hostRefs",
            with(&|c| {
                c["hostRefs"] = json!([
                    {"namespace": ns, "name": "agent"},
                    {"namespace": ns, "name": "agent2"}
                ])
            })?,
        ),
        (
            "wrong host_uid",
            with(&|c| c["host_uid"] = json!("00000000-0000-0000-0000-000000000000"))?,
        ),
        (
            "extra capability",
            with(&|c| c["capabilities"] = json!([CAPABILITY, "mcp:admin"]))?,
        ),
        (
            "missing capability",
            with(&|c| c["capabilities"] = json!([]))?,
        ),
        ("alg none", alg_none),
        ("HS256 signed with the public key PEM", hs256),
        ("signed by another key", foreign_key),
        (
            "expired",
            with(&|c| {
                c["iat"] = json!(t - 400);
                c["exp"] = json!(t - 100);
            })?,
        ),
        (
            "TTL over the maximum (600s)",
            with(&|c| {
                c["iat"] = json!(t - 5);
                c["exp"] = json!(t - 5 + 601);
            })?,
        ),
        (
            "no iat",
            with(&|c| {
                c.as_object_mut().map(|o| o.remove("iat"));
            })?,
        ),
        ("garbage", "not.a.jwt".into()),
    ];
    let mut first: Option<Reply> = None;
    for (what, token) in &cases {
        let reply = api.inventory(token)?;
        expect_401(&reply, what)?;
        let credential = api.credential(token, &json!({"serverName": "x"}))?;
        expect_401(&credential, &format!("{what} (credential)"))?;
        match &first {
            None => first = Some(reply),
            Some(f) => ensure!(
                f.comparable() == reply.comparable(),
                "{what}: the 401 differs: {reply:?} vs {f:?}"
            ),
        }
    }
    let anonymous = api.call("GET", INVENTORY, None, None)?;
    expect_401(&anonymous, "no Authorization header")?;

    // The Host deleted and re-created under the same name is another host.
    let old_token = api.sign(&good)?;
    ok(
        &c.kubectl(&["delete", "host", "agent", "-n", ns, "--wait=true"]),
        "delete host",
    )?;
    let gone = until_reply(
        "the deleted Host leaves the cache",
        || api.inventory(&old_token),
        |r| r.status != 200,
    )?;
    expect_401(&gone, "the Host deleted")?;
    apply(c, &host(ns, "agent", "ctx"))?;
    let new_uid = uid_of(c, ns, "agent")?;
    ensure!(new_uid != uid, "the re-created Host kept its UID");
    let fresh_token = api.sign(&claims(ns, "agent", &new_uid))?;
    let fresh = until_reply(
        "the re-created Host is cached",
        || api.inventory(&fresh_token),
        |r| r.status == 200,
    )?;
    ensure!(
        fresh.status == 200,
        "a token of the re-created Host: {} {}",
        fresh.status,
        fresh.body
    );
    expect_401(
        &api.inventory(&old_token)?,
        "wrong host_uid (the Host re-created: the old token)",
    )?;
    let refused = api
        .controllers
        .metric("mcp_controllers_host_api_token_refusals_total", &[])
        .map_err(|e| format!("{e:#}"))?;
    let expected = (2 * cases.len() + 3) as f64;
    ensure!(
        refused.total_cmp(&expected).is_ge(),
        "refusals counted: {refused}"
    );
    Ok(())
}

/// Runs the controllers binary with `args` (and the flags every run needs) and waits for it
/// to exit: (exited non-zero, stderr). A run still going after 15 s is killed and an error.
fn run_to_exit(c: &LocalCluster, args: &[String]) -> Result<(bool, String), String> {
    let dir = c.dir.join("host-api-config");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let stderr_path = dir.join(format!("stderr-{}", uuid::Uuid::new_v4().simple()));
    let stderr = std::fs::File::create(&stderr_path).map_err(|e| e.to_string())?;
    let mut child = Command::new(controllers_bin()?)
        .arg("--kubeconfig")
        .arg(c.dir.join("mcp-access-controllers.kubeconfig"))
        .args(["--identity", "host-api-config"])
        .args(["--lease-name", "host-api-config"])
        .args(["--metrics-port", "0"])
        .args(["--gateway-image", "mcp-access-gateway:local"])
        .args(["--gateway-sync-url", &c.sync_url()])
        .arg("--gateway-sync-ca-file")
        .arg(c.sync_ca())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("start the controllers: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("still running after 15s with {args:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&stderr_path).map_err(|e| e.to_string())?;
    Ok((!status.success(), text))
}

/// Each bad Host API setting stops the controllers with a non-zero exit naming the flag,
/// before serving anything, and prints no key material.
pub(super) fn configuration_failures_exit_nonzero(c: &mut LocalCluster) -> Result<(), String> {
    let pki = pki(c, "config")?;
    let malformed = pki.dir.join("malformed.pub");
    std::fs::write(
        &malformed,
        "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8A\n-----END PUBLIC KEY-----\n",
    )
    .map_err(|e| e.to_string())?;
    let placeholder = pki.dir.join("placeholder.pub");
    std::fs::write(&placeholder, "REPLACE_ME with the issuer's public key\n")
        .map_err(|e| e.to_string())?;
    let base = host_api_flags(&pki, 0);
    let replace = |prefix: &str, value: Option<String>| -> Vec<String> {
        let mut args: Vec<String> = base
            .iter()
            .filter(|a| !a.starts_with(prefix))
            .cloned()
            .collect();
        args.extend(value);
        args
    };
    let key_flag = "--host-token-public-key-file";
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "public key absent",
            replace(
                key_flag,
                Some(format!(
                    "{key_flag}={}",
                    pki.dir.join("absent.pub").display()
                )),
            ),
            key_flag,
        ),
        ("public key flag missing", replace(key_flag, None), key_flag),
        (
            "public key malformed",
            replace(
                key_flag,
                Some(format!("{key_flag}={}", malformed.display())),
            ),
            key_flag,
        ),
        (
            "public key a placeholder",
            replace(
                key_flag,
                Some(format!("{key_flag}={}", placeholder.display())),
            ),
            key_flag,
        ),
        (
            "a private key configured as the public key",
            replace(
                key_flag,
                Some(format!("{key_flag}={}", pki.issuer_key.display())),
            ),
            "--host-token-public-key-file: ",
        ),
        (
            "placeholder issuer",
            replace(
                "--host-token-issuer",
                Some("--host-token-issuer=https://issuer.example.com".into()),
            ),
            "--host-token-issuer",
        ),
        (
            "placeholder audience",
            replace(
                "--host-token-audience",
                Some("--host-token-audience=changeme".into()),
            ),
            "--host-token-audience",
        ),
        (
            "missing issuer",
            replace("--host-token-issuer", None),
            "--host-token-issuer",
        ),
        (
            "missing audience",
            replace("--host-token-audience", None),
            "--host-token-audience",
        ),
        (
            "missing serving certificate",
            replace("--host-api-tls-cert-file", None),
            "--host-api-tls-cert-file",
        ),
        (
            "a Host API flag without --host-api-port",
            vec![format!("--host-token-issuer={ISSUER}")],
            "--host-api-port",
        ),
    ];
    let key_body: String = std::fs::read_to_string(&pki.issuer_key)
        .map_err(|e| e.to_string())?
        .lines()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    for (what, args, needle) in cases {
        let started = Instant::now();
        let (failed, stderr) = run_to_exit(c, &args)?;
        ensure!(failed, "{what}: exited zero; stderr: {stderr}");
        // Refused before serving anything: no Host API listener was ever bound.
        ensure!(
            !stderr.contains("(host-api)"),
            "{what}: the Host API was bound: {stderr}"
        );
        ensure!(
            stderr.contains(needle),
            "{what}: stderr does not name {needle:?}: {stderr}"
        );
        ensure!(
            !what.contains("private key") || stderr.contains("PRIVATE key"),
            "{what}: stderr does not say it is a private key: {stderr}"
        );
        ensure!(
            key_body.is_empty() || !stderr.contains(&key_body),
            "{what}: key material in stderr"
        );
        // Expected well under 1 s (a settings check before any I/O); 10 s is over 5x.
        ensure!(
            started.elapsed() < Duration::from_secs(10),
            "{what}: took {:?}",
            started.elapsed()
        );
    }
    Ok(())
}

/// Two Hosts of two Contexts: A sees and obtains only what its Context grants; every negative
/// answer is the same 404, byte for byte; a grant removed holds on the next request.
pub(super) fn cross_context_isolation(c: &mut LocalCluster) -> Result<(), String> {
    let api = start_host_api(c, "cross", &[])?;
    let (a, b, other) = ("hapi-a", "hapi-b", "hapi-c");
    for ns in [a, b, other] {
        create_namespace(c, ns)?;
    }
    secret(c, a, "sa-cred", "token", "value-of-sa")?;
    secret(c, b, "sb-cred", "token", "value-of-sb")?;
    secret(c, other, "sc-cred", "token", "value-of-sc")?;
    apply(c, &server(a, "sa", Some(("sa-cred", "token"))))?;
    apply(c, &server(a, "plain", None))?;
    apply(c, &server(a, "nokey", Some(("sa-cred", "missing"))))?;
    apply(c, &server(b, "sb", Some(("sb-cred", "token"))))?;
    // sc consents to Contexts of every namespace: B's grant of it holds (issue 33 item 2).
    let mut sc = server(other, "sc", Some(("sc-cred", "token")));
    sc["spec"]["allowedContexts"] = json!({"namespaces": {"from": "All"}});
    apply(c, &sc)?;
    apply(
        c,
        &context(
            a,
            "ctx",
            json!([{"name": "sa"}, {"name": "plain"}, {"name": "nokey"}]),
        ),
    )?;
    apply(
        c,
        &context(
            b,
            "ctx",
            json!([{"name": "sb"}, {"name": "sc", "namespace": other}]),
        ),
    )?;
    apply(c, &host(a, "host", "ctx"))?;
    apply(c, &host(b, "host", "ctx"))?;
    let (uid_a, uid_b) = (uid(c, "host", a, "host")?, uid(c, "host", b, "host")?);
    let token_a = api.sign(&claims(a, "host", &uid_a))?;
    let token_b = api.sign(&claims(b, "host", &uid_b))?;
    // Each host's sessions are the Host operator's (this replica is its leader): every
    // granted server gets one.
    let listed = |r: &Reply, n: usize| {
        r.json().ok().and_then(|v| {
            let items = v["items"].as_array()?.clone();
            Some(items.len() == n && items.iter().all(|i| i["session"]["phase"] == "Active"))
        }) == Some(true)
    };

    // Inventories: each host its own Context's servers, no Secret metadata.
    let inv_a = until_reply(
        "A's inventory lists its servers and sessions",
        || api.inventory(&token_a),
        |r| listed(r, 3),
    )?;
    ensure!(
        inv_a.status == 200,
        "A's inventory: {} {}",
        inv_a.status,
        inv_a.body
    );
    inv_a.check_common("A's inventory")?;
    let items = inv_a.json()?["items"].clone();
    let names: Vec<&str> = items
        .as_array()
        .map(|i| i.iter().filter_map(|s| s["name"].as_str()).collect())
        .unwrap_or_default();
    ensure!(names == ["sa", "plain", "nokey"], "A lists {names:?}");
    let sa = &items[0];
    ensure!(
        sa["namespace"] == a
            && sa["transport"] == "streamable-http"
            && sa["url"] == format!("http://sa.{a}.svc:{GATEWAY_PORT}/mcp")
            && sa["ready"].is_boolean()
            && sa["credentialRevision"].is_string()
            && sa["session"]["namespace"] == a
            && sa["session"]["name"].is_string(),
        "A's sa entry: {sa}"
    );
    ensure!(
        items[1]["credentialRevision"].is_null() && items[2]["credentialRevision"].is_string(),
        "a server without hostCredential has a null revision, one whose Secret exists (metadata \
         only: whatever its keys) a revision: {items}"
    );
    for leak in ["sa-cred", "value-of", b, other] {
        ensure!(
            !inv_a.body.contains(leak),
            "A's inventory mentions {leak:?}: {}",
            inv_a.body
        );
    }
    let inv_b = until_reply(
        "B's inventory lists its servers",
        || api.inventory(&token_b),
        |r| {
            r.json().ok().is_some_and(|v| {
                v["items"].as_array().map(Vec::len) == Some(2)
                    && !v["items"][1]["session"].is_null()
            })
        },
    )?;
    let names_b: Vec<String> = inv_b.json()?["items"]
        .as_array()
        .map(|i| {
            i.iter()
                .map(|s| {
                    format!(
                        "{}/{}",
                        s["namespace"].as_str().unwrap_or(""),
                        s["name"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    ensure!(
        names_b == [format!("{b}/sb"), format!("{other}/sc")],
        "B lists {names_b:?}"
    );

    // A obtains its own server's credential.
    let got = api.credential(&token_a, &json!({"serverName": "sa"}))?;
    ensure!(
        got.status == 200,
        "A's sa credential: {} {}",
        got.status,
        got.body
    );
    got.check_common("A's sa credential")?;
    let mut got = got.json()?;
    let session_token = got["session"]
        .as_object_mut()
        .and_then(|s| s.remove("token"))
        .unwrap_or_default();
    let expires_at = got["session"]
        .as_object_mut()
        .and_then(|s| s.remove("expiresAt"))
        .unwrap_or_default();
    ensure!(
        got == json!({
            "serverName": "sa",
            "serverNamespace": a,
            "token": "value-of-sa",
            "credentialRevision": sa["credentialRevision"],
            "url": sa["url"],
            "session": {"namespace": a, "name": sa["session"]["name"]},
        }) && session_token.is_string()
            && expires_at.is_string(),
        "A's sa credential: {got}"
    );
    // A granted server without hostCredential: token null.
    let plain = api.credential(&token_a, &json!({"serverName": "plain"}))?;
    ensure!(
        plain.status == 200
            && plain.json()?["token"].is_null()
            && plain.json()?["credentialRevision"].is_null()
            && plain.json()?["session"]["name"] == items[1]["session"]["name"],
        "A's plain credential: {} {}",
        plain.status,
        plain.body
    );
    // A granted server whose Secret lacks the key: 503 for that server alone.
    let nokey = api.credential(&token_a, &json!({"serverName": "nokey"}))?;
    ensure!(
        nokey.status == 503,
        "A's nokey credential: {} {}",
        nokey.status,
        nokey.body
    );
    // B obtains sc: the server exists and is obtainable, only not by A.
    let sc = api.credential(
        &token_b,
        &json!({"serverName": "sc", "serverNamespace": other}),
    )?;
    ensure!(
        sc.status == 200 && sc.json()?["token"] == "value-of-sc",
        "B's sc credential: {} {}",
        sc.status,
        sc.body
    );

    // Every negative answer A gets is the same 404, byte for byte.
    let negatives: Vec<(&str, Value)> = vec![
        ("B's server sb", json!({"serverName": "sb"})),
        (
            "B's server sb, namespaced",
            json!({"serverName": "sb", "serverNamespace": b}),
        ),
        ("a nonexistent server", json!({"serverName": "nope"})),
        (
            "a server of another namespace granted to B",
            json!({"serverName": "sc", "serverNamespace": other}),
        ),
        (
            "a bare name granted only in another namespace",
            json!({"serverName": "sc"}),
        ),
        (
            "its own server named in another namespace",
            json!({"serverName": "sa", "serverNamespace": b}),
        ),
    ];
    let mut replies: Vec<(&str, Reply)> = Vec::new();
    for (what, request) in &negatives {
        let reply = api.credential(&token_a, request)?;
        ensure!(
            reply.status == 404 && reply.body == r#"{"error":"not_found"}"#,
            "A asking for {what}: {} {}",
            reply.status,
            reply.body
        );
        reply.check_common(what)?;
        replies.push((what, reply));
    }

    // The grant removed: the next request is the same 404, and the inventory drops it.
    apply(c, &context(a, "ctx", json!([{"name": "plain"}])))?;
    let revoked = until_reply(
        "sa's grant removed",
        || api.credential(&token_a, &json!({"serverName": "sa"})),
        |r| r.status != 200,
    )?;
    replies.push(("sa after its grant was removed", revoked));
    let (first_what, first) = &replies[0];
    for (what, reply) in &replies {
        ensure!(
            reply.comparable() == first.comparable(),
            "{what} differs from {first_what}: {reply:?} vs {first:?}"
        );
    }
    let after = api.inventory(&token_a)?.json()?;
    ensure!(
        after["items"].as_array().map(Vec::len) == Some(1) && after["items"][0]["name"] == "plain",
        "A's inventory after the grant was removed: {after}"
    );

    // Requests that are not understood, and unknown routes.
    let checks: Vec<(&str, Reply, u16, &str)> = vec![
        (
            "wrong content type",
            api.call(
                "POST",
                CREDENTIAL,
                Some(&token_a),
                Some(("text/plain", r#"{"serverName":"plain"}"#)),
            )?,
            400,
            r#"{"error":"bad_request"}"#,
        ),
        (
            "malformed JSON",
            api.call(
                "POST",
                CREDENTIAL,
                Some(&token_a),
                Some(("application/json", r#"{"serverName":"#)),
            )?,
            400,
            r#"{"error":"bad_request"}"#,
        ),
        (
            "a body over 4 KiB",
            api.call(
                "POST",
                CREDENTIAL,
                Some(&token_a),
                Some((
                    "application/json",
                    &json!({"serverName": "x".repeat(5000)}).to_string(),
                )),
            )?,
            400,
            r#"{"error":"bad_request"}"#,
        ),
        (
            "GET on the credential endpoint",
            api.call("GET", CREDENTIAL, Some(&token_a), None)?,
            405,
            r#"{"error":"method_not_allowed"}"#,
        ),
        (
            "an unknown path",
            api.call(
                "GET",
                "/api/v2/hosts/other/mcpservers",
                Some(&token_a),
                None,
            )?,
            404,
            r#"{"error":"not_found"}"#,
        ),
    ];
    for (what, reply, status, body) in checks {
        ensure!(
            reply.status == status && reply.body == body,
            "{what}: {} {}",
            reply.status,
            reply.body
        );
        reply.check_common(what)?;
    }
    Ok(())
}

/// With 5 requests per 6 s, the 6th is 429 with Retry-After; refused tokens are not counted,
/// another Host has its own budget, and the next window answers 200 again.
pub(super) fn rate_limit_recovers_in_the_next_window(c: &mut LocalCluster) -> Result<(), String> {
    let api = start_host_api(
        c,
        "rate",
        &["--host-api-rate-limit=5", "--host-api-rate-window=6s"],
    )?;
    let ns = "hapi-rate";
    create_namespace(c, ns)?;
    let uid = plain_host(c, ns, "agent")?;
    apply(c, &host(ns, "other", "ctx"))?;
    let other_uid = uid_of(c, ns, "other")?;
    let token = api.sign(&claims(ns, "agent", &uid))?;
    let other = api.sign(&claims(ns, "other", &other_uid))?;
    // Both Hosts cached (one watch, in order: the later one cached means the earlier is),
    // asked with the other Host's token so agent's windows stay whole.
    until_reply(
        "the Hosts are cached",
        || api.inventory(&other),
        |r| r.status == 200,
    )?;
    let mut bad = claims(ns, "agent", &uid);
    bad["aud"] = json!(["someone-else"]);
    let bad = api.sign(&bad)?;
    for i in 0..8 {
        expect_401(&api.inventory(&bad)?, &format!("refused token #{i}"))?;
    }
    let started = Instant::now();
    for i in 1..=5 {
        let r = api.inventory(&token)?;
        ensure!(r.status == 200, "request {i}: {} {}", r.status, r.body);
    }
    let limited = api.inventory(&token)?;
    ensure!(
        limited.status == 429 && limited.body == r#"{"error":"rate_limited"}"#,
        "request 6: {} {}",
        limited.status,
        limited.body
    );
    limited.check_common("429")?;
    let retry: u64 = limited
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("429 without a numeric Retry-After: {limited:?}"))?;
    ensure!((1..=6).contains(&retry), "Retry-After {retry}");
    // The credential endpoint has a window of its own: 5 answers (404: nothing granted),
    // then 429.
    let mut credential = Vec::new();
    for _ in 0..6 {
        credential.push(api.credential(&token, &json!({"serverName": "x"}))?);
    }
    // Every request so far fell in one window (the 429s say nothing otherwise): an ordering
    // against the limiter's window, not a performance bound (expected well under 1 s).
    let elapsed = started.elapsed();
    ensure!(
        elapsed < Duration::from_secs(6),
        "the requests took {elapsed:?}: the window ended before the checks"
    );
    let codes: Vec<u16> = credential.iter().map(|r| r.status).collect();
    ensure!(
        codes == [404, 404, 404, 404, 404, 429],
        "credential requests while the inventory is limited: {codes:?}"
    );
    let still = api.inventory(&token)?;
    ensure!(
        still.status == 429,
        "the inventory after the credential requests: {}",
        still.status
    );
    // Another Host is not limited by this one.
    let r = api.inventory(&other)?;
    ensure!(r.status == 200, "another Host: {} {}", r.status, r.body);

    std::thread::sleep(Duration::from_secs(retry) + Duration::from_millis(200));
    let again = api.inventory(&token)?;
    ensure!(
        again.status == 200,
        "after Retry-After ({retry}s): {} {}",
        again.status,
        again.body
    );
    let counted = api
        .controllers
        .metric(
            "mcp_controllers_host_api_requests_total",
            &[r#"endpoint="inventory""#, r#"code="429""#],
        )
        .map_err(|e| format!("{e:#}"))?;
    ensure!(counted == 2.0, "429s counted: {counted}");
    Ok(())
}

fn uid_of(c: &LocalCluster, ns: &str, name: &str) -> Result<String, String> {
    uid(c, "host", ns, name)
}

/// Polls `call` until its reply satisfies `done` (within 10 s): the caches catch up with a
/// change in the cluster.
fn until_reply(
    what: &str,
    mut call: impl FnMut() -> Result<Reply, String>,
    done: impl Fn(&Reply) -> bool,
) -> Result<Reply, String> {
    let mut last = None;
    let reached = until(Duration::from_secs(10), what, || {
        let reply = call()?;
        if done(&reply) {
            return Ok(Some(reply));
        }
        last = Some(reply);
        Ok(None)
    });
    reached.map_err(|e| format!("{e}; last answer {last:?}"))
}

/// The claims of session token `token`, its ES256 signature verified with the public half of
/// the key this cluster's mcp-access-apiserver signs session tokens with.
fn verified_session_claims(c: &LocalCluster, token: &str) -> Result<Value, String> {
    let header = jsonwebtoken::decode_header(token).map_err(|e| e.to_string())?;
    ensure!(
        header.alg == Algorithm::ES256,
        "session token alg {:?}",
        header.alg
    );
    let signing_key = c
        .env
        .get("SESSION_TOKEN_SIGNING_KEY_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| c.dir.join("session-token.key"));
    let out = Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&signing_key)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("openssl: {e}"))?;
    ensure!(
        out.status.success(),
        "openssl pkey -pubout {}: {}",
        signing_key.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let key = jsonwebtoken::DecodingKey::from_ec_pem(&out.stdout).map_err(|e| e.to_string())?;
    let mut validation = jsonwebtoken::Validation::new(Algorithm::ES256);
    // The audience is the server's resource URI: checked against the answer's url.
    validation.validate_aud = false;
    jsonwebtoken::decode::<Value>(token, &key, &validation)
        .map(|d| d.claims)
        .map_err(|e| format!("the session token does not verify: {e}"))
}

/// `/healthz` answers without a token once the caches synced; the legacy v1 routes answer 410
/// pointing at v2, whatever the method, with or without a token.
pub(super) fn healthz_and_legacy_routes(c: &mut LocalCluster) -> Result<(), String> {
    let api = start_host_api(c, "legacy", &[])?;
    let health = until_reply(
        "/healthz answers 200",
        || api.call("GET", "/healthz", None, None),
        |r| r.status == 200,
    )?;
    ensure!(
        health.body == r#"{"status":"ok"}"#,
        "/healthz: {}",
        health.body
    );
    health.check_common("/healthz")?;
    let post = api.call("POST", "/healthz", None, None)?;
    ensure!(
        post.status == 405 && post.header("allow") == Some("GET"),
        "POST /healthz: {post:?}"
    );

    let ns = "hapi-legacy";
    create_namespace(c, ns)?;
    let uid = plain_host(c, ns, "agent")?;
    let token = api.sign(&claims(ns, "agent", &uid))?;
    let gone = r#"{"error":"gone","use":"/api/v2/hosts/self/mcpservers"}"#;
    let mut first: Option<Reply> = None;
    for (method, path) in [
        ("GET", "/api/v1/mcpservers"),
        ("GET", "/api/v1/mcpservers/context/ctx"),
        ("GET", "/api/v1/mcpservers/github/auth"),
        ("POST", "/api/v1/mcpservers/github/auth"),
        ("DELETE", "/api/v1/mcpservers/context/ctx"),
    ] {
        for auth in [None, Some(token.as_str())] {
            let reply = api.call(method, path, auth, None)?;
            let what = format!("{method} {path} (token: {})", auth.is_some());
            ensure!(
                reply.status == 410 && reply.body == gone,
                "{what}: {} {}",
                reply.status,
                reply.body
            );
            reply.check_common(&what)?;
            match &first {
                None => first = Some(reply),
                Some(f) => ensure!(
                    f.comparable() == reply.comparable(),
                    "{what}: the 410 differs: {reply:?} vs {f:?}"
                ),
            }
        }
    }
    let other = api.call("GET", "/api/v1/mcpservers/github", None, None)?;
    ensure!(
        other.status == 404,
        "another v1 path: {} {}",
        other.status,
        other.body
    );
    let counted = api
        .controllers
        .metric(
            "mcp_controllers_host_api_requests_total",
            &[r#"endpoint="legacy""#, r#"code="410""#],
        )
        .map_err(|e| format!("{e:#}"))?;
    ensure!(counted == 10.0, "410s counted: {counted}");
    Ok(())
}

/// The host's session through the credential endpoint, the sessions being the Host
/// operator's: while a Revocation of the server refuses issuance there is none, 503
/// session_pending; the one issued is handed out with a freshly minted token that verifies
/// against the aggregated API's JWKS; a Revocation of it is 409 naming the Revocation; a
/// granted server without hostCredential answers token null. No token reaches the log.
pub(super) fn sessions_tokens_revocation_and_pending(c: &mut LocalCluster) -> Result<(), String> {
    let api = start_host_api(c, "sessions", &[])?;
    let ns = "hapi-sessions";
    create_namespace(c, ns)?;
    secret(c, ns, "gh-cred", "token", "value-of-gh")?;
    apply(c, &server(ns, "github", Some(("gh-cred", "token"))))?;
    apply(c, &server(ns, "plain", None))?;
    // No session may be issued for plain while this stands.
    let plain_uid = uid(c, "mcpserver", ns, "plain")?;
    apply(
        c,
        &json!({
            "apiVersion": "access.mcp-runtime.dev/v1alpha1",
            "kind": "Revocation",
            "metadata": {"name": "hold-plain", "namespace": ns},
            "spec": {"target": {"server": {"name": "plain", "uid": plain_uid}},
                     "cause": "manual"},
        }),
    )?;
    apply(
        c,
        &context(ns, "ctx", json!([{"name": "github"}, {"name": "plain"}])),
    )?;
    apply(c, &host(ns, "agent", "ctx"))?;
    let host_uid = uid(c, "host", ns, "agent")?;
    let token = api.sign(&claims(ns, "agent", &host_uid))?;
    let inventory = until_reply(
        "the inventory lists github's session",
        || api.inventory(&token),
        |r| {
            r.json().ok().is_some_and(|v| {
                v["items"].as_array().map(Vec::len) == Some(2)
                    && v["items"][0]["session"]["phase"] == "Active"
            })
        },
    )?
    .json()?;
    ensure!(
        inventory["items"][1]["session"].is_null(),
        "plain has a session despite the Revocation: {inventory}"
    );
    let pending = api.credential(&token, &json!({"serverName": "plain"}))?;
    ensure!(
        pending.status == 503 && pending.body == r#"{"error":"session_pending"}"#,
        "plain without a session: {} {}",
        pending.status,
        pending.body
    );
    ensure!(
        pending.header("retry-after") == Some("1"),
        "session_pending Retry-After {:?}",
        pending.header("retry-after")
    );
    pending.check_common("session_pending")?;

    let got = until_reply(
        "github's credential with a session",
        || api.credential(&token, &json!({"serverName": "github"})),
        |r| r.status == 200,
    )?;
    got.check_common("github's credential")?;
    let got = got.json()?;
    let server_uid = uid(c, "mcpserver", ns, "github")?;
    let url = format!("http://github.{ns}.svc:{GATEWAY_PORT}/mcp");
    ensure!(
        got["serverName"] == "github"
            && got["serverNamespace"] == ns
            && got["token"] == "value-of-gh"
            && got["credentialRevision"].is_string()
            && got["url"] == url
            && got["session"]["namespace"] == ns
            && got["session"]["name"].is_string(),
        "github's credential: {got}"
    );
    let session_name = got["session"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let session_token = got["session"]["token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let claims = verified_session_claims(c, &session_token)?;
    let private = &claims["access.mcp-runtime.dev"];
    ensure!(
        claims["sub"] == format!("system:accesssession:{ns}:{session_name}")
            && private["server"]["uid"] == server_uid
            && private["session"]["uid"] == uid(c, "accesssessions", ns, &session_name)?,
        "the session token's claims: {claims}"
    );
    let audiences = claims["aud"].as_array().cloned().unwrap_or_default();
    ensure!(
        audiences
            .iter()
            .any(|a| a.as_str().is_some_and(|a| url.starts_with(a))),
        "the session token's audience {audiences:?} is not the server's URL {url}"
    );
    let exp = claims["exp"].as_i64().unwrap_or_default();
    let expires_at = k8s_openapi::jiff::Timestamp::from_second(exp)
        .map_err(|e| e.to_string())?
        .to_string();
    ensure!(
        got["session"]["expiresAt"] == expires_at && (now() + 540..=now() + 610).contains(&exp),
        "expiresAt {} vs exp {exp} ({expires_at})",
        got["session"]["expiresAt"]
    );
    let inventory = api.inventory(&token)?.json()?;
    ensure!(
        inventory["items"][0]["session"]
            == json!({"namespace": ns, "name": session_name, "phase": "Active"}),
        "github's inventory session: {inventory}"
    );

    // The Revocation withdrawn (the Host nudged so its operator tries at once): plain gets its
    // session; a granted server without hostCredential answers token null.
    ok(
        &c.kubectl(&["delete", "revocation", "hold-plain", "-n", ns]),
        "delete the Revocation",
    )?;
    ok(
        &c.kubectl(&["annotate", "host", "agent", "-n", ns, "e2e/nudge=1"]),
        "annotate the Host",
    )?;
    let plain = until_reply(
        "plain's credential with a session",
        || api.credential(&token, &json!({"serverName": "plain"})),
        |r| r.status == 200,
    )?
    .json()?;
    ensure!(
        plain["token"].is_null()
            && plain["credentialRevision"].is_null()
            && plain["url"] == format!("http://plain.{ns}.svc:{GATEWAY_PORT}/mcp")
            && plain["session"]["token"].is_string(),
        "plain's credential: {plain}"
    );
    let plain_token = plain["session"]["token"].as_str().unwrap_or_default();
    let plain_claims = verified_session_claims(c, plain_token)?;
    ensure!(
        plain_claims["access.mcp-runtime.dev"]["server"]["uid"]
            == uid(c, "mcpserver", ns, "plain")?,
        "plain's session token: {plain_claims}"
    );

    // The session revoked: 409 naming the Revocation, and the inventory says so.
    apply(
        c,
        &json!({
            "apiVersion": "access.mcp-runtime.dev/v1alpha1",
            "kind": "Revocation",
            "metadata": {"name": "stop-agent", "namespace": ns},
            "spec": {"target": {"session": session_name}, "cause": "manual"},
        }),
    )?;
    let revoked = until_reply(
        "github's credential after the revocation",
        || api.credential(&token, &json!({"serverName": "github"})),
        |r| r.status != 200,
    )?;
    ensure!(
        revoked.status == 409
            && revoked.body == r#"{"error":"session_revoked","revocation":"stop-agent"}"#,
        "after the revocation: {} {}",
        revoked.status,
        revoked.body
    );
    revoked.check_common("session_revoked")?;
    // The 409 may come from the session as it stands (the token refused before the cache
    // caught up); the inventory, from the cache, says so once the watch delivers it.
    let want = json!({"namespace": ns, "name": session_name, "phase": "Revoked"});
    let mut seen = Value::Null;
    until(
        Duration::from_secs(10),
        "github's inventory session Revoked",
        || {
            seen = api.inventory(&token)?.json()?;
            Ok((seen["items"][0]["session"] == want).then_some(()))
        },
    )
    .map_err(|e| format!("{e}: {seen}"))?;

    // No token, credential or host token in the controllers' log.
    let log = std::fs::read_to_string(&api.controllers.log).map_err(|e| e.to_string())?;
    for (what, secret) in [
        ("a session token", session_token.as_str()),
        ("a session token", plain_token),
        ("the credential", "value-of-gh"),
        ("the host token", token.as_str()),
    ] {
        ensure!(!log.contains(secret), "{what} is in the controllers' log");
    }
    Ok(())
}
