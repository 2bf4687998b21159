//! Startup fails closed, through the real binary: with every required flag valid and one
//! NetworkPolicy or egress setting bad, the process exits non-zero within seconds, before any
//! I/O (the kubeconfig points at 127.0.0.1:1, where nothing listens), naming the bad value.

mod support;
use support::TempDir;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mcp-access-controllers");
/// A bad row must have exited by then.
const EXIT_WITHIN: Duration = Duration::from_secs(10);

const CA_PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
const KUBECONFIG: &str = "\
apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster:
    server: https://127.0.0.1:1
    insecure-skip-tls-verify: true
users:
- name: nobody
  user:
    token: not-a-token
contexts:
- name: nowhere
  context:
    cluster: nowhere
    user: nobody
current-context: nowhere
";

/// One bad setting: the extra arguments or environment, and what stderr must contain.
struct Row {
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    needle: &'static str,
}

const fn flag(args: &'static [&'static str], needle: &'static str) -> Row {
    Row {
        args,
        env: &[],
        needle,
    }
}

const ROWS: &[Row] = &[
    // Broader than /24.
    flag(&["--kube-api-cidr", "10.0.0.0/16"], "10.0.0.0/16"),
    flag(&["--kube-api-cidr", "0.0.0.0/0"], "0.0.0.0/0"),
    // Broader than /120.
    flag(&["--kube-api-cidr", "fd00::/64"], "fd00::/64"),
    // Host bits set.
    flag(&["--kube-api-cidr", "10.96.0.7/24"], "10.96.0.7/24"),
    flag(&["--kube-api-cidr", "kubernetes"], "kubernetes"),
    // One bad entry among good ones fails the whole list.
    flag(
        &["--kube-api-cidr", "10.96.0.1/32,10.0.0.0/8"],
        "10.0.0.0/8",
    ),
    flag(
        &["--node-local-dns-ip", "169.254.20.0/24"],
        "169.254.20.0/24",
    ),
    flag(&["--dns-pod-label", "kube-dns"], "kube-dns"),
    flag(&["--kube-api-access-label", "opt-in"], "opt-in"),
    flag(&["--apiserver-pod-label", "app=a b"], "app=a b"),
    flag(&["--runtime-namespace", "Team_A"], "Team_A"),
    flag(&["--dns-namespace", "Kube_System"], "Kube_System"),
    flag(&["--apiserver-namespace", "mcp access"], "mcp access"),
    flag(&["--orphan-delete-max-percent", "101"], "101"),
    flag(&["--netpol-resync-interval", "0s"], "0s"),
    flag(&["--kube-api-port", "0"], "--kube-api-port"),
    flag(&["--egress-dns-server", "not-an-address"], "not-an-address"),
    flag(&["--egress-dns-server", "0.0.0.0:53"], "0.0.0.0:53"),
    flag(
        &["--egress-dns-timeout", "0s"],
        "--egress-dns-timeout is 0s",
    ),
    flag(
        &[
            "--egress-dns-timeout",
            "10m",
            "--egress-refresh-interval",
            "5m",
        ],
        "600s",
    ),
    Row {
        args: &[],
        env: &[("MCP_ACCESS_KUBE_API_CIDRS", "10.0.0.0/8")],
        needle: "10.0.0.0/8",
    },
    Row {
        args: &[],
        env: &[("MCP_ACCESS_EGRESS_DNS_SERVER", "kube-dns")],
        needle: "kube-dns",
    },
    // Requiring a runtime namespace and naming none would deploy nothing.
    flag(
        &["--require-runtime-namespace"],
        "--require-runtime-namespace without any --runtime-namespace",
    ),
    Row {
        args: &[],
        env: &[("MCP_ACCESS_REQUIRE_RUNTIME_NAMESPACE", "true")],
        needle: "--require-runtime-namespace without any --runtime-namespace",
    },
];

/// The binary with the required flags valid, the given extras, and no inherited environment
/// (an `MCP_ACCESS_*` variable of the caller would change what is tested).
fn start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Child {
    let ca = dir.join("ca.pem");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&ca, CA_PEM).expect("write the CA file");
    std::fs::write(&kubeconfig, KUBECONFIG).expect("write the kubeconfig");
    Command::new(BIN)
        .env_clear()
        .envs(env.iter().copied())
        .args(["--gateway-image", "x"])
        .args(["--gateway-sync-url", "https://127.0.0.1:1"])
        .arg("--gateway-sync-ca-file")
        .arg(&ca)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--metrics-port", "0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {BIN}: {e}"))
}

/// Waits up to `limit` for the child; kills it when it is still running (`None`). Its stderr
/// is read on a thread meanwhile, so a chatty child never blocks on a full pipe.
fn wait(mut child: Child, limit: Duration) -> (Option<ExitStatus>, String, Duration) {
    let mut pipe = child.stderr.take().expect("stderr is piped");
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = pipe.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait().expect("poll the child") {
            Some(status) => break Some(status),
            None if started.elapsed() >= limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let took = started.elapsed();
    (status, reader.join().expect("the stderr reader"), took)
}

fn describe(row: &Row) -> String {
    let env: Vec<String> = row.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{} {}", env.join(" "), row.args.join(" "))
        .trim()
        .to_string()
}

#[test]
fn a_bad_setting_stops_startup_naming_the_value() {
    let dir = TempDir::new("mcp-access-startup-flags");
    let mut failures = Vec::new();
    for row in ROWS {
        let what = describe(row);
        let (status, stderr, took) = wait(start(&dir.0, row.args, row.env), EXIT_WITHIN);
        match status {
            None => failures.push(format!(
                "{what}: still running after {EXIT_WITHIN:?} (killed)\n{stderr}"
            )),
            Some(s) if s.success() => failures.push(format!("{what}: exited 0\n{stderr}")),
            // Refused by the checks, not by clap (2) and not on reaching the cluster.
            Some(s) if s.code() == Some(2) => {
                failures.push(format!("{what}: refused by the flag parser\n{stderr}"))
            }
            Some(_) if stderr.contains("cannot use Lease") => failures.push(format!(
                "{what}: accepted; startup went on to the cluster\n{stderr}"
            )),
            Some(_) if !stderr.contains(row.needle) => failures.push(format!(
                "{what}: stderr does not name {:?}:\n{stderr}",
                row.needle
            )),
            Some(s) => eprintln!("{what}: {s} in {took:?}"),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} bad settings were not refused as they should be:\n{}",
        failures.len(),
        ROWS.len(),
        failures.join("\n")
    );
}

/// The control: the same required flags, every setting valid (one of each kind given
/// explicitly), gets past the checks. Nothing listens on 127.0.0.1:1, so it then fails on the
/// leader Lease: that failure is the proof it got past the checks (a process merely slow to
/// start would otherwise pass by saying nothing), and its stderr names none of the settings.
#[test]
fn valid_settings_get_past_the_checks() {
    let dir = TempDir::new("mcp-access-startup-flags");
    let args = [
        "--kube-api-cidr",
        "10.96.0.1/32,fd00::/120",
        "--node-local-dns-ip",
        "169.254.20.10",
        "--dns-pod-label",
        "k8s-app=kube-dns",
        "--runtime-namespace",
        "team-a",
        "--require-runtime-namespace",
        "--orphan-delete-max-percent",
        "100",
        "--egress-dns-server",
        "127.0.0.1:53",
        "--egress-dns-timeout",
        "2s",
    ];
    let (status, stderr, _) = wait(start(&dir.0, &args, &[]), EXIT_WITHIN);
    let markers = [
        "--kube-api-cidr",
        "--node-local-dns-ip",
        "`key=value` label",
        "--runtime-namespace",
        "--dns-namespace",
        "--apiserver-namespace",
        "--orphan-delete-max-percent",
        "--kube-api-port",
        "--egress-dns-server",
        "--egress-dns-timeout",
        "--egress-refresh-interval",
        "--require-runtime-namespace",
        "the system resolver configuration",
        // clap's own refusals.
        "error: invalid value",
        "error: unexpected argument",
        "error: the following required arguments",
    ];
    let hits: Vec<&str> = markers
        .iter()
        .copied()
        .filter(|m| stderr.contains(m))
        .collect();
    assert!(
        hits.is_empty(),
        "valid settings were refused ({status:?}), stderr names {hits:?}:\n{stderr}"
    );
    // Past the checks the first I/O is the leader Lease, on a cluster that is not there.
    let status = status.unwrap_or_else(|| {
        panic!("still running after {EXIT_WITHIN:?} without reaching the Lease:\n{stderr}")
    });
    assert!(
        !status.success() && status.code() != Some(2) && stderr.contains("cannot use Lease"),
        "expected a failure on the unreachable Lease, got {status}:\n{stderr}"
    );
}
