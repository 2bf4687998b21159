//! The scripts in `hack/` report what really happened: `hack/dev.sh` reports the readiness of
//! the apiserver it started, never of another server on its ports, and `hack/test.sh` stops
//! when a build fails.
//!
//! Needs (set by `hack/test.sh`): MCP_ACCESS_APISERVER_BIN, MCP_ACCESS_INFORMER_BIN, and the
//! PostgreSQL server binaries `hack/lib/postgres.sh` uses.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn need(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run through hack/test.sh"))
}

fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "mcp-access-{what}-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Another server on a port: answers every HTTP request with 200 "ok", as another
/// apiserver's /readyz would. Runs until the test process ends.
fn impostor(listener: TcpListener) {
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
}

/// `hack/dev.sh` running in a directory of its own, its output collected line by line.
struct DevScript {
    child: Child,
    dir: PathBuf,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
    seen_stdout: Vec<String>,
    seen_stderr: Vec<String>,
}

fn lines(pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

impl DevScript {
    /// `ready_timeout`: seconds dev.sh waits for its apiserver to answer.
    fn start(port: u16, metrics_port: u16, apiserver_bin: &str, ready_timeout: u32) -> Self {
        let dir = temp_dir("dev");
        let mut child = Command::new("bash")
            .arg(e2e::repo_root().join("hack/dev.sh"))
            .env("MCP_ACCESS_DEV_DIR", &dir)
            .env("MCP_ACCESS_DEV_PORT", port.to_string())
            .env("MCP_ACCESS_DEV_METRICS_PORT", metrics_port.to_string())
            .env("MCP_ACCESS_DEV_READY_TIMEOUT", ready_timeout.to_string())
            .env("MCP_ACCESS_APISERVER_BIN", apiserver_bin)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("bash runs hack/dev.sh");
        let stdout = lines(child.stdout.take().expect("stdout"));
        let stderr = lines(child.stderr.take().expect("stderr"));
        Self {
            child,
            dir,
            stdout,
            stderr,
            seen_stdout: Vec::new(),
            seen_stderr: Vec::new(),
        }
    }

    fn drain(&mut self) {
        self.seen_stdout.extend(self.stdout.try_iter());
        self.seen_stderr.extend(self.stderr.try_iter());
    }

    /// Waits for the script to exit (true) or for a stdout line starting with `KUBECONFIG=`
    /// (false), whichever comes first.
    fn exit_or_ready(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            self.drain();
            if self.ready() {
                return false;
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                // Let the reader threads deliver the last lines.
                std::thread::sleep(Duration::from_millis(200));
                self.drain();
                return !self.ready();
            }
            assert!(
                Instant::now() < deadline,
                "hack/dev.sh neither exited nor reported ready in {timeout:?}: {}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn ready(&self) -> bool {
        self.seen_stdout
            .iter()
            .any(|l| l.starts_with("KUBECONFIG="))
    }

    fn output(&self) -> String {
        format!(
            "stdout: {:?}\nstderr:\n{}",
            self.seen_stdout,
            self.seen_stderr.join("\n")
        )
    }

    /// Waits for a stderr line containing `text`.
    fn wait_stderr(&mut self, text: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.seen_stderr.iter().any(|l| l.contains(text)) {
            assert!(
                Instant::now() < deadline,
                "hack/dev.sh never printed {text:?}: {}",
                self.output()
            );
            if let Ok(line) = self.stderr.recv_timeout(Duration::from_millis(100)) {
                self.seen_stderr.push(line);
            }
        }
    }

    /// SIGTERM (what Ctrl-C in a terminal amounts to) and wait for the exit.
    fn stop(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(Instant::now() < deadline, "hack/dev.sh ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for DevScript {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // A killed script leaves its PostgreSQL behind; stop it before removing the directory.
        let _ = Command::new("bash")
            .arg("-c")
            .arg(format!(
                ". {}/hack/lib/postgres.sh && postgres_stop {}",
                e2e::repo_root().display(),
                self.dir.join("pg").display()
            ))
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// dev.sh started while another server holds its API port (`api`) or its metrics port:
/// it must exit non-zero naming the port, never report ready.
fn dev_sh_refuses_a_taken_port(api: bool, what: &str) {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    impostor(taken);
    let (api_port, metrics_port) = if api {
        (port, free_port())
    } else {
        (free_port(), port)
    };
    let mut dev = DevScript::start(
        api_port,
        metrics_port,
        &need("MCP_ACCESS_APISERVER_BIN"),
        10,
    );
    assert!(
        dev.exit_or_ready(Duration::from_secs(60)),
        "hack/dev.sh reported ready while another server held its {what}: {}",
        dev.output()
    );
    let status = dev.child.wait().expect("exit status");
    assert!(!status.success(), "{status}: {}", dev.output());
    assert!(
        dev.seen_stderr
            .iter()
            .any(|l| l.contains(&format!("port {port} is already in use"))),
        "{}",
        dev.output()
    );
}

#[test]
fn dev_sh_fails_loudly_when_the_metrics_port_is_taken() {
    dev_sh_refuses_a_taken_port(false, "metrics port");
}

#[test]
fn dev_sh_fails_loudly_when_the_api_port_is_taken() {
    dev_sh_refuses_a_taken_port(true, "port");
}

/// The port is free when dev.sh checks it and taken by someone else before its apiserver
/// binds (here: an "apiserver" that never listens but stays alive). Only the check that the
/// answering sockets belong to its own process tells the difference.
#[test]
fn dev_sh_does_not_take_another_servers_answer_for_its_own() {
    let bin_dir = temp_dir("fake-apiserver");
    let fake = bin_dir.join("mcp-access-apiserver");
    std::fs::write(&fake, "#!/bin/sh\nexec sleep 120\n").expect("write fake apiserver");
    let _ = Command::new("chmod").arg("755").arg(&fake).status();
    let metrics_port = free_port();
    // The fake never answers: the wait must run out, so it is short.
    let mut dev = DevScript::start(free_port(), metrics_port, &fake.display().to_string(), 10);
    // Printed after the port checks and before the apiserver starts.
    dev.wait_stderr("PostgreSQL on", Duration::from_secs(60));
    impostor(TcpListener::bind(("127.0.0.1", metrics_port)).expect("bind the metrics port"));
    assert!(
        dev.exit_or_ready(Duration::from_secs(60)),
        "hack/dev.sh reported ready from another server: {}",
        dev.output()
    );
    let status = dev.child.wait().expect("exit status");
    assert!(!status.success(), "{status}: {}", dev.output());
    assert!(
        dev.seen_stderr
            .iter()
            .any(|l| l.contains("was not ready after")),
        "{}",
        dev.output()
    );
    let _ = std::fs::remove_dir_all(&bin_dir);
}

#[test]
fn dev_sh_reports_ready_from_its_own_apiserver_and_stops_it() {
    // A real apiserver on a loaded machine (a cluster or an image build alongside): dev.sh's
    // own default.
    let mut dev = DevScript::start(
        free_port(),
        free_port(),
        &need("MCP_ACCESS_APISERVER_BIN"),
        60,
    );
    assert!(
        !dev.exit_or_ready(Duration::from_secs(120)),
        "hack/dev.sh exited instead of reporting ready: {}",
        dev.output()
    );
    let kubeconfig = dev
        .seen_stdout
        .iter()
        .find_map(|l| l.strip_prefix("KUBECONFIG="))
        .map(PathBuf::from)
        .expect("KUBECONFIG= line");
    let pid = dev
        .seen_stderr
        .iter()
        .find_map(|l| {
            l.strip_prefix("apiserver (pid ")
                .and_then(|rest| rest.split(')').next())
                .map(str::to_string)
        })
        .expect("the apiserver's pid on stderr");
    // Right after the line: kubectl works.
    let out = kubectl(&kubeconfig, &["get", "acs", "-n", "default"]);
    assert!(out.status.success(), "kubectl get acs: {out:?}");
    let status = dev.stop();
    assert!(status.success(), "{status}: {}", dev.output());
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.split_whitespace().nth(2) == Some("Z")),
        "the apiserver (pid {pid}) outlived hack/dev.sh"
    );
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("kubectl runs")
}

/// `hack/test.sh` must stop when the Kubernetes build cannot run. Here Go is missing (not on
/// PATH, nothing cached; the prerequisite check, hack/lib/prereqs.sh, names it first); the
/// client-go programs are cached, so the next steps would succeed and reach `cargo`, which is a
/// stand-in that records being called.
#[test]
fn test_sh_stops_when_the_kube_build_fails() {
    let work = temp_dir("test-sh");
    let cache_bin = work.join("cache/bin");
    std::fs::create_dir_all(&cache_bin).expect("cache dir");
    for var in ["MCP_ACCESS_INFORMER_BIN", "MCP_ACCESS_GATEWAY_INFORMER_BIN"] {
        let informer = PathBuf::from(need(var));
        std::fs::copy(
            &informer,
            cache_bin.join(informer.file_name().expect("informer file name")),
        )
        .expect("copy the cached informer");
    }
    let fake_bin = work.join("bin");
    std::fs::create_dir_all(&fake_bin).expect("bin dir");
    let marker = work.join("cargo-was-called");
    std::fs::write(
        fake_bin.join("cargo"),
        format!("#!/bin/sh\necho \"$@\" >>'{}'\n", marker.display()),
    )
    .expect("fake cargo");
    let _ = Command::new("chmod")
        .arg("755")
        .arg(fake_bin.join("cargo"))
        .status();
    // The system directories (runuser, used for PostgreSQL as root, is in sbin), without the
    // Go and Rust toolchains.
    let system = ["/usr/sbin", "/usr/bin", "/sbin", "/bin"];
    for dir in system {
        for tool in ["go", "cargo"] {
            assert!(
                !Path::new(dir).join(tool).exists(),
                "{dir}/{tool} exists: this test needs a PATH without {tool}"
            );
        }
    }
    let out = Command::new("bash")
        .arg(e2e::repo_root().join("hack/test.sh"))
        .env(
            "PATH",
            format!("{}:{}", fake_bin.display(), system.join(":")),
        )
        .env("MCP_ACCESS_CACHE", work.join("cache"))
        .stdin(Stdio::null())
        .output()
        .expect("bash runs hack/test.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let called = std::fs::read_to_string(&marker).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&work);
    assert!(
        called.is_empty(),
        "hack/test.sh went on to run cargo ({called:?}) after the kube build failed: {stderr}"
    );
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("go is not on PATH"), "{stderr}");
}

/// What `hack/up.sh` runs: `KUBECONFIG=` comes only once kube-apiserver serves MCP Access's
/// discovery and OpenAPI, so `kubectl explain` works at the first attempt right after it,
/// after the gateway sync listener's `GATEWAY_SYNC_URL=` and `GATEWAY_SYNC_CA=`, and SIGTERM
/// stops the whole control plane.
#[test]
fn up_prints_kubeconfig_only_when_explain_works() {
    let dir = temp_dir("up");
    let log_path = dir.join("mcp-access-local.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-access-local"))
        .arg("--dir")
        .arg(&dir)
        .arg("--apiserver-bin")
        .arg(need("MCP_ACCESS_APISERVER_BIN"))
        .arg("--controllers-bin")
        .arg(need("MCP_ACCESS_CONTROLLERS_BIN"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("mcp-access-local starts");
    let stdout = lines(child.stdout.take().expect("stdout"));
    let mut printed = Vec::new();
    let kubeconfig = loop {
        match stdout.recv_timeout(Duration::from_secs(300)) {
            Ok(line) => {
                if let Some(path) = line.strip_prefix("KUBECONFIG=") {
                    break PathBuf::from(path);
                }
                printed.push(line);
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                panic!("mcp-access-local printed no KUBECONFIG=: {e}\n{log}");
            }
        }
    };
    let explain = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["explain", "accesssession.spec"])
        .env("KUBECACHEDIR", dir.join("fresh-kube-cache"))
        .env_remove("KUBECONFIG")
        .output()
        .expect("kubectl runs");
    // The gateway sync listener's URL and CA come before KUBECONFIG= and work together:
    // TLS verifies with that CA and the listener answers (401 without a token).
    let value = |key: &str| {
        printed
            .iter()
            .find_map(|l| l.strip_prefix(key))
            .map(str::to_string)
    };
    let sync = value("GATEWAY_SYNC_URL=")
        .zip(value("GATEWAY_SYNC_CA="))
        .map(|(url, ca)| {
            Command::new("curl")
                .args([
                    "-sS",
                    "--max-time",
                    "10",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                ])
                .arg("--cacert")
                .arg(&ca)
                .arg(format!(
                    "{url}/apis/access.mcp-runtime.dev/v1alpha1/accesssessions"
                ))
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        });
    // So do the Host API's: it answers 401 to a request without a host token.
    let host_api = value("HOST_API_URL=")
        .zip(value("HOST_API_CA="))
        .map(|(url, ca)| {
            Command::new("curl")
                .args(["-sS", "--max-time", "10", "-w", "%{http_code}"])
                .arg("--cacert")
                .arg(&ca)
                .arg(format!("{url}/api/v2/hosts/self/mcpservers"))
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        });
    let pids: Vec<String> = std::fs::read_dir(dir.join("run"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .map(|pid| pid.trim().to_string())
                .collect()
        })
        .unwrap_or_default();
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let status = child.wait().expect("exit status");
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        explain.status.success() && String::from_utf8_lossy(&explain.stdout).contains("expiresAt"),
        "kubectl explain right after KUBECONFIG=: {}\n{log}",
        String::from_utf8_lossy(&explain.stderr)
    );
    assert!(
        matches!(&sync, Some(Ok(code)) if code == "401"),
        "GATEWAY_SYNC_URL= and GATEWAY_SYNC_CA= before KUBECONFIG=, the listener answering 401 \
         without a token: printed {printed:?}, got {sync:?}\n{log}"
    );
    assert!(
        matches!(&host_api, Some(Ok(answer)) if answer == r#"{"error":"unauthorized"}401"#),
        "HOST_API_URL= and HOST_API_CA= before KUBECONFIG=, the Host API answering 401 \
         without a token: printed {printed:?}, got {host_api:?}\n{log}"
    );
    assert!(
        status.success(),
        "mcp-access-local on SIGTERM: {status}\n{log}"
    );
    assert!(
        pids.len() == 3,
        "pid files of etcd, kube-apiserver, controller-manager: {pids:?}"
    );
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.split_whitespace().nth(2) == Some("Z"),
            "pid {pid} outlived mcp-access-local: {stat}"
        );
    }
}

/// The Kubernetes release hack/kube/go.mod pins (the version of the kubectl it builds).
fn pinned_kube_version() -> String {
    let go_mod = std::fs::read_to_string(e2e::repo_root().join("hack/kube/go.mod"))
        .expect("hack/kube/go.mod");
    go_mod
        .lines()
        .find_map(|l| l.trim().strip_prefix("require k8s.io/kubernetes "))
        .map(|v| v.trim().to_string())
        .expect("require k8s.io/kubernetes in hack/kube/go.mod")
}

/// A fresh machine as hack/up.sh and hack/test.sh meet it first (they run
/// hack/lib/prereqs.sh before anything else): PATH holds every system command except kubectl,
/// plus Go and Rust; PG_BIN is an empty directory. Not allowed to install, the check names
/// both and the exact commands, and fails; as a user that is not root it says so and gives
/// the root command. Allowed (root), it runs `apt-get install -y postgresql-15` (with
/// --no-upgrade: on this machine the package is installed already, so apt changes nothing and
/// the check finds the package's binaries), builds the pinned kubectl from the Go module proxy
/// (or finds it cached) and puts it first on PATH, and what comes next works: PostgreSQL starts
/// from the binaries it found and answers a query, and `kubectl` is the pinned release.
#[test]
fn prereqs_name_what_is_missing_then_install_it() {
    assert_eq!(
        Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .ok()
            .as_deref(),
        Some("0"),
        "this test installs packages: run it as root (as hack/test.sh runs in CI)"
    );
    let work = temp_dir("prereqs");
    let _ = Command::new("chmod").arg("755").arg(&work).status();
    let bin = work.join("bin");
    let pg_empty = work.join("pg-bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    std::fs::create_dir_all(&pg_empty).expect("empty PG_BIN");
    for dir in ["/usr/bin", "/usr/sbin"] {
        for entry in std::fs::read_dir(dir).expect("system dir").flatten() {
            let name = entry.file_name();
            let link = bin.join(&name);
            if name != "kubectl" && !link.exists() {
                std::os::unix::fs::symlink(entry.path(), link).expect("symlink");
            }
        }
    }
    // Go and Rust from this process's PATH, by their own directories (go finds its GOROOT from
    // where it lies); neither may hold a kubectl.
    let path = std::env::var_os("PATH").expect("PATH");
    let tool_dir = |tool: &str| {
        std::env::split_paths(&path)
            .find(|d| d.join(tool).is_file())
            .unwrap_or_else(|| panic!("{tool} is not on PATH"))
    };
    let (go_dir, cargo_dir) = (tool_dir("go"), tool_dir("cargo"));
    for dir in [&go_dir, &cargo_dir] {
        assert!(
            !dir.join("kubectl").exists(),
            "{} holds a kubectl",
            dir.display()
        );
    }
    let restricted = std::env::join_paths([bin.clone(), go_dir, cargo_dir]).expect("PATH");
    let script = e2e::repo_root().join("hack/lib/prereqs.sh");
    let run = |cmd: &mut Command| {
        let out = cmd
            .env("PATH", &restricted)
            .env("PG_BIN", &pg_empty)
            .stdin(Stdio::null())
            .output()
            .expect("bash runs");
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status, text(&out.stdout), text(&out.stderr))
    };

    // 1. Root, installing not allowed: both named, with the commands.
    let started = Instant::now();
    let (status, stdout, stderr) = run(Command::new("bash")
        .arg(&script)
        .env("MCP_ACCESS_NO_INSTALL", "1"));
    eprintln!("--- not allowed to install ({status}):\n{stderr}");
    assert!(!status.success(), "{stderr}");
    assert!(stdout.is_empty(), "stdout: {stdout}");
    for expected in [
        format!(
            "PostgreSQL 15 server binaries: no initdb, pg_ctl and postgres in {} (PG_BIN)",
            pg_empty.display()
        ),
        "kubectl is not on PATH".to_string(),
        "run as root: apt-get install -y postgresql-15".to_string(),
        "run: hack/build-kube.sh kubectl".to_string(),
        "MCP_ACCESS_NO_INSTALL=1: nothing was installed".to_string(),
    ] {
        assert!(stderr.contains(&expected), "no {expected:?} in:\n{stderr}");
    }

    // 2. Not root: the command to run as root.
    let (status, stdout, stderr) = run(Command::new("runuser")
        .args(["-u", "nobody", "--", "bash"])
        .arg(&script));
    eprintln!("--- as nobody ({status}):\n{stderr}");
    assert!(!status.success(), "{stderr}");
    assert!(stdout.is_empty(), "stdout: {stdout}");
    for expected in [
        "not root: nothing was installed",
        "run as root: apt-get install -y postgresql-15",
    ] {
        assert!(stderr.contains(expected), "no {expected:?} in:\n{stderr}");
    }
    let checks = started.elapsed();

    // 3. Allowed: installs, builds, and what follows works.
    let pg_dir = work.join("pg");
    let (status, stdout, stderr) = run(Command::new("bash")
        .arg("-c")
        .arg(
            r#"set -euo pipefail
. "$REPO/hack/lib/prereqs.sh"
prereqs_ensure
. "$REPO/hack/lib/postgres.sh"
trap 'postgres_stop "$PG_DIR"' EXIT
postgres_start "$PG_DIR"
echo "PG_BIN=$PG_BIN"
"$PG_BIN/psql" "$PG_DSN" -Atc 'select version()'
echo "KUBECTL=$(command -v kubectl)"
kubectl version --client -o json"#,
        )
        .env("REPO", e2e::repo_root())
        .env("PG_DIR", &pg_dir));
    eprintln!("--- allowed to install ({status}):\n{stderr}\n{stdout}");
    let _ = std::fs::remove_dir_all(&work);
    assert!(status.success(), "{stderr}\n{stdout}");
    for expected in [
        "installing: apt-get install -y --no-upgrade --no-install-recommends postgresql-15",
        "using /usr/lib/postgresql/15/bin (postgresql-15)",
        "building kubectl: hack/build-kube.sh kubectl",
        "prereqs: ok: PostgreSQL 15.",
    ] {
        assert!(stderr.contains(expected), "no {expected:?} in:\n{stderr}");
    }
    assert!(
        stdout.contains("PG_BIN=/usr/lib/postgresql/15/bin\nPostgreSQL 15."),
        "{stdout}"
    );
    let version = pinned_kube_version();
    let kubectl = stdout
        .lines()
        .find_map(|l| l.strip_prefix("KUBECTL="))
        .expect("KUBECTL= line");
    // The cached kubectl of the pinned release: bin/kubectl-<version>-<source key>.path/kubectl
    // (hack/build-kube.sh keys every build by version and source hash).
    let dir = kubectl
        .strip_suffix(".path/kubectl")
        .and_then(|d| d.rsplit_once("/bin/"))
        .map(|(_, name)| name);
    let key = dir.and_then(|name| name.strip_prefix(&format!("kubectl-{version}-")));
    assert!(
        key.is_some_and(|k| k.len() == 16 && k.chars().all(|c| c.is_ascii_hexdigit())),
        "kubectl on PATH is {kubectl}, not the cached {version}"
    );
    assert!(
        stdout.contains(&format!("\"gitVersion\": \"{version}\"")),
        "kubectl version --client: {stdout}"
    );
    eprintln!(
        "checks {:?}, install and build {:?}",
        checks,
        started.elapsed() - checks
    );
}

/// `hack/image.sh` builds the four images FROM scratch out of the binaries hack/test.sh built
/// (in a buildah store of the test's own, vfs: no mounts left behind), under the names deploy/
/// uses. Each image holds its binary, what ldd names, the CA bundle, passwd/group and no
/// shell; runs as 65532:65532 with the binary as entrypoint; and its `--help` ran inside a
/// container (`buildah run`). Where containers cannot run, the script says exactly why and the
/// build-and-inspect part is asserted alone.
#[test]
fn image_sh_builds_runs_and_inspects_the_images() {
    let images = [
        ("mcp-access-apiserver", need("MCP_ACCESS_APISERVER_BIN")),
        ("mcp-access-controllers", need("MCP_ACCESS_CONTROLLERS_BIN")),
        ("mcp-access-gateway", need("MCP_ACCESS_GATEWAY_BIN")),
        ("mcp-access-authz", need("MCP_ACCESS_AUTHZ_BIN")),
    ];
    let bin_dir = Path::new(&images[0].1)
        .parent()
        .expect("bin dir")
        .to_path_buf();
    for (name, bin) in &images {
        assert_eq!(Path::new(bin), bin_dir.join(name), "one build directory");
    }
    let work = temp_dir("image");
    let storage = work.join("storage.conf");
    std::fs::write(
        &storage,
        format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{0}/graph\"\nrunroot = \"{0}/run\"\n",
            work.display()
        ),
    )
    .expect("storage.conf");
    let buildah = |args: &[&str]| {
        let out = Command::new("buildah")
            .args(args)
            .env("CONTAINERS_STORAGE_CONF", &storage)
            .output()
            .expect("buildah runs");
        assert!(
            out.status.success(),
            "buildah {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    struct Cleanup(PathBuf, PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            for args in [&["rm", "--all"][..], &["rmi", "--all", "--force"][..]] {
                let _ = Command::new("buildah")
                    .args(args)
                    .env("CONTAINERS_STORAGE_CONF", &self.1)
                    .output();
            }
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(work.clone(), storage.clone());

    let started = Instant::now();
    let out = Command::new("bash")
        .arg(e2e::repo_root().join("hack/image.sh"))
        .arg("--bin-dir")
        .arg(&bin_dir)
        .env("CONTAINERS_STORAGE_CONF", &storage)
        .env_remove("IMAGE_REPO")
        .stdin(Stdio::null())
        .output()
        .expect("bash runs hack/image.sh");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!(
        "--- hack/image.sh ({}, {:.1}s):\n{stdout}\nstderr:\n{stderr}",
        out.status,
        started.elapsed().as_secs_f64()
    );
    assert!(out.status.success(), "hack/image.sh failed");
    let could_not_run = stdout
        .lines()
        .find(|l| l.starts_with("image.sh: cannot run a container here"));
    if let Some(reason) = could_not_run {
        eprintln!("containers cannot run here; build and inspect asserted only: {reason}");
    }

    // The names deploy/ refers to are the images built; the forward-auth sidecar is for
    // proxies people run themselves (docs/gateways.md), so deploy/ names every image but it.
    let root = e2e::repo_root();
    let mut referenced = Vec::new();
    for file in [
        "deploy/base/deployment.yaml",
        "deploy/controllers/deployment.yaml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).expect(file);
        referenced.extend(
            text.split_whitespace()
                .filter(|w| w.starts_with("ghcr.io/mcp-runtime/"))
                .map(str::to_string),
        );
    }
    let mut expected: Vec<String> = images
        .iter()
        .filter(|(name, _)| *name != "mcp-access-authz")
        .map(|(name, _)| format!("ghcr.io/mcp-runtime/{name}:latest"))
        .collect();
    referenced.sort();
    expected.sort();
    assert_eq!(
        referenced, expected,
        "deploy/ names images hack/image.sh does not build"
    );

    for (name, _) in &images {
        let image = format!("ghcr.io/mcp-runtime/{name}:latest");
        let inspect: serde_json::Value =
            serde_json::from_str(&buildah(&["inspect", "--type", "image", &image]))
                .expect("buildah inspect prints JSON");
        let config = &inspect["OCIv1"]["config"];
        assert_eq!(config["User"], "65532:65532", "{image}: {config}");
        assert_eq!(
            config["Entrypoint"],
            serde_json::json!([format!("/usr/local/bin/{name}")]),
            "{image}: {config}"
        );
        assert!(
            stdout.contains(&format!(
                "image.sh: inspect {image}: user=65532:65532 entrypoint=[/usr/local/bin/{name}]"
            )),
            "the script's inspect line for {image}"
        );

        // What is inside: the binary, its libraries and loader, the CA bundle, passwd and
        // group; no shell.
        let container = buildah(&["from", &image]).trim().to_string();
        let mount = PathBuf::from(buildah(&["mount", &container]).trim());
        let ldd = Command::new("ldd")
            .arg(bin_dir.join(name))
            .output()
            .expect("ldd");
        let ldd = String::from_utf8_lossy(&ldd.stdout).into_owned();
        let mut wanted: Vec<String> = ldd
            .split_whitespace()
            .filter(|w| w.starts_with('/'))
            .map(str::to_string)
            .collect();
        assert!(
            wanted.iter().any(|l| l.contains("libc.so")),
            "ldd names no libc: {ldd}"
        );
        wanted.extend([
            format!("/usr/local/bin/{name}"),
            "/etc/ssl/certs/ca-certificates.crt".into(),
            "/etc/passwd".into(),
            "/etc/group".into(),
        ]);
        for path in &wanted {
            assert!(
                mount.join(path.trim_start_matches('/')).is_file(),
                "{image} lacks {path}"
            );
        }
        for shell in ["bin/sh", "bin/bash", "usr/bin/sh"] {
            assert!(!mount.join(shell).exists(), "{image} holds /{shell}");
        }
        let passwd = std::fs::read_to_string(mount.join("etc/passwd")).expect("passwd");
        assert!(
            passwd.contains("nonroot:x:65532:65532:"),
            "{image}: /etc/passwd {passwd}"
        );
        buildah(&["umount", &container]);
        buildah(&["rm", &container]);

        // --help ran inside a container of the image (unless containers cannot run here).
        if could_not_run.is_none() {
            let run_line = format!("image.sh: run {image}: {name} --help (as the image's user");
            let help: Vec<&str> = stdout
                .lines()
                .skip_while(|l| !l.starts_with(&run_line))
                .skip(1)
                .take_while(|l| l.starts_with("    ") || l.is_empty())
                .collect();
            assert!(
                help.iter()
                    .any(|l| l.trim().starts_with(&format!("Usage: {name} "))),
                "no `Usage: {name}` under {run_line:?}:\n{stdout}"
            );
            assert!(
                help.iter().any(|l| l.contains("--help")),
                "{name} --help output lists no options:\n{help:?}"
            );
        }
    }
}
