//! The SIGTERM drain as a client of kube-apiserver sees it: a kube-rs watch of AccessSessions
//! goes through the aggregator (kube-apiserver → `mcp-access-apiserver`, HTTP/2 over TLS).
//! docs/operations.md promises that on SIGTERM "watches end cleanly and their clients
//! re-watch", and that "a restart keeps the epoch: … clients of the restarted one resume
//! from their resourceVersion. A rolling update makes nobody relist." So the watch's stream
//! ends without an error, the process exits 0, and after the restart a watch from the last
//! resourceVersion seen is accepted (no 410) and delivers what is written next.
//! `apiserver/tests/lifecycle_h2.rs` checks the HTTP/2 frames on a direct connection.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use apis::AccessSession;
use e2e::LocalCluster;
use futures::StreamExt;
use kube::api::{Api, WatchEvent, WatchParams};
use kube::ResourceExt;

use super::{create_namespace, ok, session_yaml};

const NS: &str = "drain-agg";

/// What a watch reader reports: each event as `TYPE name`, then how the stream ended.
enum Seen {
    Event(String, String),
    /// The stream ended: `None` cleanly, `Some(error)` otherwise.
    End(Option<String>),
}

/// Reads a watch in the background, reporting on `tx`.
fn follow(
    rt: &tokio::runtime::Runtime,
    api: Api<AccessSession>,
    rv: String,
    tx: mpsc::Sender<Seen>,
) -> Result<(), String> {
    let stream = rt
        .block_on(api.watch(&WatchParams::default().timeout(290), &rv))
        .map_err(|e| format!("watch from {rv}: {e}"))?;
    rt.spawn(async move {
        let mut stream = stream.boxed();
        while let Some(item) = stream.next().await {
            let seen = match item {
                Ok(WatchEvent::Added(s)) => Seen::Event(
                    format!("ADDED {}", s.name_any()),
                    s.resource_version().unwrap_or_default(),
                ),
                Ok(WatchEvent::Modified(s)) => Seen::Event(
                    format!("MODIFIED {}", s.name_any()),
                    s.resource_version().unwrap_or_default(),
                ),
                Ok(WatchEvent::Deleted(s)) => Seen::Event(
                    format!("DELETED {}", s.name_any()),
                    s.resource_version().unwrap_or_default(),
                ),
                Ok(WatchEvent::Bookmark(b)) => {
                    Seen::Event("BOOKMARK".into(), b.metadata.resource_version)
                }
                Ok(WatchEvent::Error(e)) => {
                    Seen::Event(format!("ERROR {} {}", e.code, e.message), String::new())
                }
                Err(e) => {
                    let _ = tx.send(Seen::End(Some(e.to_string())));
                    return;
                }
            };
            let _ = tx.send(seen);
        }
        let _ = tx.send(Seen::End(None));
    });
    Ok(())
}

/// Waits for `want` (an event as `TYPE name`) on `rx`; the resourceVersion it carried.
fn expect_event(rx: &mpsc::Receiver<Seen>, want: &str, within: Duration) -> Result<String, String> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Seen::Event(event, rv)) if event == want => return Ok(rv),
            Ok(Seen::Event(event, _)) if event.starts_with("ERROR") => {
                return Err(format!("waiting for {want}: {event}"))
            }
            Ok(Seen::Event(..)) => {}
            Ok(Seen::End(how)) => {
                return Err(format!("waiting for {want}: the watch ended ({how:?})"))
            }
            Err(_) => return Err(format!("no {want} within {within:?}")),
        }
    }
}

fn create(c: &LocalCluster, name: &str) -> Result<(), String> {
    let kubeconfig = c.kubeconfig.clone();
    ok(
        &c.kubectl_as(
            &kubeconfig,
            &["apply", "-n", NS, "-f", "-"],
            Some(&session_yaml(name, "srv-drain")),
        ),
        &format!("create session {name}"),
    )
    .map(|_| ())
}

/// SIGTERM with a watch open through the aggregator: the stream ends without an error, the
/// process exits 0, and after the restart the watch resumes from its resourceVersion.
pub fn a_watch_through_the_aggregator_ends_cleanly_and_resumes_after_a_restart(
    c: &mut LocalCluster,
) -> Result<(), String> {
    create_namespace(c, NS)?;
    create(c, "before")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let kubeconfig = c.kubeconfig.clone();
    let client = rt
        .block_on(async move {
            let kubeconfig = kube::config::Kubeconfig::read_from(&kubeconfig)?;
            let config = kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await?;
            anyhow::Ok(kube::Client::try_from(config)?)
        })
        .map_err(|e| format!("kube client: {e:#}"))?;
    let api: Api<AccessSession> = Api::namespaced(client, NS);
    let listed = rt
        .block_on(api.list(&Default::default()))
        .map_err(|e| format!("list: {e}"))?;
    let rv = listed.metadata.resource_version.unwrap_or_default();

    let (tx, rx) = mpsc::channel();
    follow(&rt, api.clone(), rv, tx)?;
    create(c, "watched")?;
    let mut last_rv = expect_event(&rx, "ADDED watched", Duration::from_secs(20))?;

    // SIGTERM to the only replica.
    let pid = c.apiserver_pid().ok_or("the apiserver is not running")?;
    let sent = Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let end = loop {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Seen::Event(event, rv)) => {
                if event.starts_with("ERROR") {
                    return Err(format!("the watch ended with an error event: {event}"));
                }
                if !rv.is_empty() {
                    last_rv = rv;
                }
            }
            Ok(Seen::End(how)) => break how,
            Err(_) => return Err("the watch outlived the drain by 20 s".into()),
        }
    };
    let ended_after = sent.elapsed();
    ensure!(
        end.is_none(),
        "the watch through the aggregator ended with an error: {end:?}"
    );
    let exited = loop {
        match c.ensure_apiserver_running() {
            Err(e) => break e.to_string(),
            Ok(()) if sent.elapsed() > Duration::from_secs(20) => {
                return Err("the apiserver still runs 20 s after SIGTERM".into())
            }
            Ok(()) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    ensure!(
        exited.contains("exit status: 0"),
        "the apiserver did not exit 0 after SIGTERM: {exited}"
    );

    // The replica comes back; the client resumes from the last resourceVersion it saw.
    c.start_apiserver().map_err(|e| format!("{e:#}"))?;
    c.wait_available(Duration::from_secs(60))
        .map_err(|e| format!("{e:#}"))?;
    let (tx, rx) = mpsc::channel();
    let resumed = Instant::now();
    // The aggregator may take a moment to route to the new process again.
    loop {
        match follow(&rt, api.clone(), last_rv.clone(), tx.clone()) {
            Ok(()) => break,
            Err(e) if e.contains("410") || e.contains("Expired") || e.contains("Gone") => {
                return Err(format!(
                    "the restarted replica refused the resourceVersion: {e}"
                ))
            }
            Err(e) if resumed.elapsed() > Duration::from_secs(30) => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
    create(c, "after")?;
    expect_event(&rx, "ADDED after", Duration::from_secs(20))?;
    eprintln!(
        "drain through the aggregator: watch ended cleanly {ended_after:?} after SIGTERM; resumed from {last_rv} after the restart"
    );
    let _ = c.kubectl(&["delete", "namespace", NS, "--wait=false"]);
    Ok(())
}
