//! An apiserver in standalone mode inside the test process, on a random loopback port, over
//! its own database, with a kubeconfig for `kubectl` and clients for kube-rs and raw HTTP.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use apiserver::auth::{AllowAuthenticated, Authenticator, Authorizer, TokenFile};
use apiserver::http::{AppState, HttpConfig, HttpMetrics, Limits};
use apiserver::store::{PgStore, StoreConfig};
use apiserver::tls::{self, ReloadingCert};
use apiserver::tokens::{PublicKey, SessionTokens, SigningKey, TokenMetrics};
use prometheus_client::registry::Registry;

use super::TestDb;

/// Token of a `system:masters` user.
pub const ADMIN_TOKEN: &str = "admin-token-0123456789";
/// Token of an ordinary user.
pub const USER_TOKEN: &str = "user-token-0123456789";

pub struct TestServer {
    pub db: TestDb,
    pub store: PgStore,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    pub ca_pem: String,
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    /// The server's metrics registry (what `/metrics` encodes).
    pub registry: Arc<Registry>,
    /// The session-token signer (a key generated for the test unless the test chose).
    pub tokens: Arc<SessionTokens>,
    shutdown: tokio::sync::watch::Sender<bool>,
}

/// The static token file every test server accepts: [`ADMIN_TOKEN`] (admin, in
/// `system:masters`) and [`USER_TOKEN`] (alice, in `devs`).
pub fn static_tokens() -> Arc<TokenFile> {
    Arc::new(
        TokenFile::parse(
            &format!("{ADMIN_TOKEN},admin,admin-uid,\"system:masters\"\n{USER_TOKEN},alice,alice-uid,\"devs\"\n"),
            "test",
        )
        .expect("the test token file parses"),
    )
}

/// The issuer of test servers' session tokens.
pub const TEST_ISSUER: &str = "https://mcp-access.test";
/// The max TTL of test servers' session tokens.
pub const TEST_TOKEN_MAX_TTL: Duration = Duration::from_secs(3600);

/// How a test server issues session tokens.
pub enum TokenSetup {
    /// A P-256 key generated for the test, issuer [`TEST_ISSUER`].
    Generated,
    /// No signing key: the subresource answers 503.
    Disabled,
    /// This signing key, publishing also these verification keys.
    Keys(Box<SigningKey>, Vec<PublicKey>),
}

impl TokenSetup {
    fn build(self, metrics: Arc<TokenMetrics>) -> SessionTokens {
        let (key, mut published) = match self {
            Self::Disabled => return SessionTokens::disabled(metrics),
            Self::Generated => (SigningKey::generate().expect("a P-256 key"), Vec::new()),
            Self::Keys(key, published) => (*key, published),
        };
        published.insert(0, key.public.clone());
        SessionTokens::from_keys(
            key,
            published,
            TEST_ISSUER.into(),
            TEST_TOKEN_MAX_TTL,
            apis::session_token::DEFAULT_AUDIENCE_TEMPLATE.into(),
            metrics,
        )
    }
}

/// A store tweak for tests of expiry: 50 events retained, so the log trims past a watcher
/// soon, and 8-event watcher buffers.
pub fn short_log(config: &mut StoreConfig) {
    config.retained_events = 50;
    config.watcher_buffer = 8;
}

/// Output of a command.
#[derive(Debug)]
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|_| {}, HttpConfig::default()).await
    }

    /// A server whose session tokens are set up as `tokens` says.
    pub async fn start_with_tokens(tokens: TokenSetup) -> Self {
        Self::start_parts_with(
            |_| {},
            HttpConfig::default(),
            static_tokens(),
            Arc::new(AllowAuthenticated),
            Limits::default(),
            tokens,
        )
        .await
    }

    /// A server with `authorizer` and session tokens set up as `tokens` says.
    pub async fn start_with_authorizer_and_tokens(
        authorizer: Arc<dyn Authorizer>,
        tokens: TokenSetup,
    ) -> Self {
        Self::start_parts_with(
            |_| {},
            HttpConfig::default(),
            static_tokens(),
            authorizer,
            Limits::default(),
            tokens,
        )
        .await
    }

    /// A server whose authorizer is `authorizer` instead of allow-all-authenticated.
    pub async fn start_with_authorizer(authorizer: Arc<dyn Authorizer>) -> Self {
        Self::start_full(|_| {}, HttpConfig::default(), authorizer).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut StoreConfig), http: HttpConfig) -> Self {
        Self::start_full(tweak, http, Arc::new(AllowAuthenticated)).await
    }

    /// A server with the listener's limits and timeouts set.
    pub async fn start_limited(
        tweak: impl FnOnce(&mut StoreConfig),
        http: HttpConfig,
        limits: Limits,
    ) -> Self {
        Self::start_parts(
            tweak,
            http,
            static_tokens(),
            Arc::new(AllowAuthenticated),
            limits,
        )
        .await
    }

    async fn start_full(
        tweak: impl FnOnce(&mut StoreConfig),
        http: HttpConfig,
        authorizer: Arc<dyn Authorizer>,
    ) -> Self {
        Self::start_parts(tweak, http, static_tokens(), authorizer, Limits::default()).await
    }

    /// A server that authenticates with `authenticator` and authorizes with `authorizer`.
    pub async fn start_with_auth(
        authenticator: Arc<dyn Authenticator>,
        authorizer: Arc<dyn Authorizer>,
    ) -> Self {
        Self::start_parts(
            |_| {},
            HttpConfig::default(),
            authenticator,
            authorizer,
            Limits::default(),
        )
        .await
    }

    async fn start_parts(
        tweak: impl FnOnce(&mut StoreConfig),
        http: HttpConfig,
        authenticator: Arc<dyn Authenticator>,
        authorizer: Arc<dyn Authorizer>,
        limits: Limits,
    ) -> Self {
        Self::start_parts_with(
            tweak,
            http,
            authenticator,
            authorizer,
            limits,
            TokenSetup::Generated,
        )
        .await
    }

    async fn start_parts_with(
        tweak: impl FnOnce(&mut StoreConfig),
        http: HttpConfig,
        authenticator: Arc<dyn Authenticator>,
        authorizer: Arc<dyn Authorizer>,
        limits: Limits,
        token_setup: TokenSetup,
    ) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let db = TestDb::new().await;
        let mut config = db.store_config();
        tweak(&mut config);
        let store = PgStore::start(config).await.expect("store starts");
        let dir =
            std::env::temp_dir().join(format!("mcp-access-test-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();

        let (key, ca_pem) = tls::self_signed(&["localhost".into(), "127.0.0.1".into()]).unwrap();
        let tls_config = tls::server_config(ReloadingCert::fixed(key), None).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
        let mut registry = Registry::default();
        let app = AppState::new(
            store.clone(),
            authenticator,
            authorizer,
            http,
            HttpMetrics::register(&mut registry),
            shutdown_rx.clone(),
        )
        .with_limits(limits);
        let tokens = Arc::new(token_setup.build(TokenMetrics::register(&mut registry)));
        let app = app.with_session_tokens(tokens.clone());
        store.change_feed_metrics().register(&mut registry);
        let registry = Arc::new(registry);
        tokio::spawn(apiserver::server::serve_api(
            listener,
            tls_config,
            app,
            shutdown_rx,
        ));

        let url = format!("https://127.0.0.1:{port}");
        std::fs::write(dir.join("ca.crt"), &ca_pem).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &url, &dir.join("ca.crt"), ADMIN_TOKEN);
        Self {
            db,
            store,
            url,
            ca_pem,
            dir,
            kubeconfig,
            registry,
            tokens,
            shutdown,
        }
    }

    /// A kubeconfig for another token.
    pub fn kubeconfig_for(&self, token: &str) -> PathBuf {
        let path = self.dir.join(format!("kubeconfig-{}", &token[..8]));
        write_kubeconfig(&path, &self.url, &self.dir.join("ca.crt"), token);
        path
    }

    /// Runs the real `kubectl` against this server as the admin.
    pub async fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with(&self.kubeconfig, args, None).await
    }

    /// Runs `kubectl` with a kubeconfig and optional stdin.
    pub async fn kubectl_with(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Output {
        use tokio::io::AsyncWriteExt;
        let mut cmd = tokio::process::Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .env("KUBECACHEDIR", self.dir.join("kube-cache"))
            .env_remove("KUBECONFIG")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("kubectl is on PATH");
        let mut pipe = child.stdin.take().unwrap();
        if let Some(input) = stdin {
            pipe.write_all(input.as_bytes()).await.unwrap();
        }
        drop(pipe);
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("kubectl finishes within 60s")
            .unwrap();
        Output {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Starts a long-running `kubectl` (e.g. `get -w`); its stdout is read line by line.
    pub fn kubectl_spawn(&self, args: &[&str]) -> tokio::process::Child {
        tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env("KUBECACHEDIR", self.dir.join("kube-cache"))
            .env_remove("KUBECONFIG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("kubectl is on PATH")
    }

    /// A raw HTTPS client trusting this server, with no credentials.
    pub fn http(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).unwrap()])
            .build()
            .unwrap()
    }

    /// The URL of the AccessSession collection in `ns`.
    pub fn sessions_url(&self, ns: &str) -> String {
        format!(
            "{}/apis/{}/namespaces/{ns}/accesssessions",
            self.url,
            apis::API_VERSION
        )
    }

    /// POSTs `body` to the AccessSession collection in `ns` as the admin.
    pub async fn post_session(&self, ns: &str, body: &serde_json::Value) -> reqwest::Response {
        self.http()
            .post(self.sessions_url(ns))
            .bearer_auth(ADMIN_TOKEN)
            .json(body)
            .send()
            .await
            .expect("POST reaches the server")
    }

    /// The URL of a session's `token` subresource.
    pub fn token_url(&self, ns: &str, name: &str) -> String {
        format!("{}/{name}/token", self.sessions_url(ns))
    }

    /// POSTs `body` (a TokenRequest) to a session's `token` subresource as `token`.
    pub async fn request_token_as(
        &self,
        token: &str,
        ns: &str,
        name: &str,
        body: &serde_json::Value,
    ) -> reqwest::Response {
        self.http()
            .post(self.token_url(ns, name))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .expect("POST reaches the server")
    }

    /// A session token for `ns/name` (default lifetime and audience), as the admin.
    pub async fn session_token(&self, ns: &str, name: &str) -> String {
        let response = self
            .request_token_as(
                ADMIN_TOKEN,
                ns,
                name,
                &serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"}),
            )
            .await;
        assert_eq!(response.status().as_u16(), 201, "a token is issued");
        let body: serde_json::Value = response.json().await.expect("a TokenRequest");
        body["status"]["token"]
            .as_str()
            .expect("status.token")
            .to_string()
    }

    /// A kube-rs client for the admin.
    pub async fn kube_client(&self) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        kube::Client::try_from(config).unwrap()
    }
}

impl TestServer {
    /// The `/metrics` text, as the metrics listener serves it.
    pub fn metrics_text(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text
    }

    /// Stops the server (open watches end, connections drain).
    pub fn shutdown(&self) {
        let _ = self.shutdown.send(true);
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write_kubeconfig(path: &Path, url: &str, ca: &Path, token: &str) {
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context: {{cluster: test, user: u, namespace: default}}\ncurrent-context: test\n",
            ca.display()
        ),
    )
    .unwrap();
}
