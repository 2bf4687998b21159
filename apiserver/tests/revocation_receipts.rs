//! Revocation receipts over a real PostgreSQL store: gateway watches on the sync listener
//! (driven through `SyncState::handle`, their bodies read here as a connection would), the
//! receipts reporter of `apiserver::receipts`, and what the Revocation's status then says —
//! how many of the affected server's watches the revocation reached, which it did not (a
//! gateway that stopped reading), and that a fleet of watches costs a few status writes, not
//! one per gateway.

mod support;

use std::sync::Arc;
use std::time::Duration;

use apis::types::RevocationDelivery;
use apis::{Revocation, RevocationTarget};
use apiserver::auth::{AllowAuthenticated, TokenFile};
use apiserver::http::{AppState, HttpConfig, HttpMetrics, SyncState};
use apiserver::receipts::{self, ReceiptsConfig, ReceiptsMetrics};
use apiserver::store::{EventType, PgStore, ResourceVersion, RevokerAuthority, Store};
use axum::body::Body;
use http::Request;
use http_body_util::BodyExt;
use prometheus_client::registry::Registry;
use support::gateways::Gateways;
use support::{mk_revocation, mk_session, StoreExt, TestDb};
use tokio::sync::mpsc;

const NS: &str = "team";
const SERVER_A: &str = "uid-server-a";
const SERVER_B: &str = "uid-server-b";
const SESSIONS: &str = "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/team/accesssessions";

struct Fleet {
    sync: SyncState<PgStore>,
    store: PgStore,
    gateways: Arc<Gateways>,
    _shutdown: tokio::sync::watch::Sender<bool>,
    _db: TestDb,
}

impl Fleet {
    /// A store with sessions of servers A and B, the sync listener over it and this
    /// replica's receipts reporter, at a test's cadence.
    async fn start() -> Self {
        let db = TestDb::new().await;
        let store = db.store().await;
        let (shutdown_tx, shutdown) = tokio::sync::watch::channel(false);
        let app = AppState::new(
            store.clone(),
            Arc::new(
                TokenFile::parse("admin-token,admin,admin-uid\n", "test").expect("token file"),
            ),
            Arc::new(AllowAuthenticated),
            HttpConfig::default(),
            HttpMetrics::register(&mut Registry::default()),
            shutdown,
        );
        let gateways = Arc::new(Gateways::default());
        let sync = SyncState::new(app.clone(), gateways.clone(), Duration::from_secs(3600));
        for (name, uid) in [("a-1", SERVER_A), ("a-2", SERVER_A), ("b-1", SERVER_B)] {
            store
                .create_session(mk_session(NS, name, uid), false)
                .await
                .expect("session created");
        }
        tokio::spawn(receipts::run(
            store.clone(),
            app.deliveries.clone(),
            "replica-1".into(),
            ReceiptsConfig {
                poll: Duration::from_millis(20),
                min_interval: Duration::from_millis(50),
                heartbeat: Duration::from_millis(500),
                ..ReceiptsConfig::default()
            },
            ReceiptsMetrics::register(&mut Registry::default()),
        ));
        Self {
            sync,
            store,
            gateways,
            _shutdown: shutdown_tx,
            _db: db,
        }
    }

    /// Opens the watch of a new gateway of `server_uid`, as an informer does after its list.
    async fn watch(&self, token: &str, server_uid: &str) -> Body {
        self.gateways.add(token, NS, server_uid);
        let from = self.store.current_version().await.expect("head");
        let response = self
            .sync
            .clone()
            .handle(
                Request::builder()
                    .uri(format!(
                        "{SESSIONS}?watch=1&allowWatchBookmarks=true&resourceVersion={from}"
                    ))
                    .header("authorization", format!("Bearer {token}"))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
        assert_eq!(response.status(), 200, "{token}'s watch");
        response.into_body()
    }

    async fn revoke_session(&self, name: &str, revocation: &str) -> (Revocation, ResourceVersion) {
        let target = RevocationTarget {
            session: Some(name.into()),
            ..Default::default()
        };
        let written = self
            .store
            .create_revocation(
                mk_revocation(NS, revocation, target, "compromised"),
                RevokerAuthority::Namespace,
                false,
            )
            .await
            .expect("revocation created");
        let rv = written
            .object
            .metadata
            .resource_version
            .as_deref()
            .map(|v| ResourceVersion::parse(v).expect("a resourceVersion"))
            .expect("written with a resourceVersion");
        (written.object, rv)
    }

    /// The revocation's receipts once `done` holds of them (polled for at most 10 s).
    async fn delivery_when(
        &self,
        name: &str,
        done: impl Fn(&RevocationDelivery) -> bool,
    ) -> RevocationDelivery {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let revocation: Revocation = self.store.get(NS, name).await.expect("revocation");
            let delivery = revocation
                .status
                .and_then(|s| s.delivery)
                .expect("a revocation that changed sessions has receipts");
            if done(&delivery) {
                return delivery;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "receipts never got there: {delivery:#?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Reads a watch's body as a connection would, sending each event's session name on.
fn read(mut body: Body) -> mpsc::UnboundedReceiver<(String, String)> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut buffer = Vec::new();
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                buffer.extend_from_slice(&data);
            }
            while let Some(i) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=i).collect();
                let event: serde_json::Value = serde_json::from_slice(&line).expect("an event");
                let name = event["object"]["metadata"]["name"].as_str().unwrap_or("");
                let _ = tx.send((event["type"].as_str().unwrap_or("").into(), name.into()));
            }
        }
    });
    rx
}

/// The next event that is not a bookmark.
async fn next_event(rx: &mut mpsc::UnboundedReceiver<(String, String)>) -> (String, String) {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("an event within 10 s")
            .expect("the watch goes on");
        if event.0 != "BOOKMARK" {
            return event;
        }
    }
}

#[tokio::test]
async fn receipts_count_the_affected_servers_watches_that_the_revocation_reached() {
    let fleet = Fleet::start().await;
    let mut reading = Vec::new();
    for token in ["a-0", "a-1"] {
        reading.push(read(fleet.watch(token, SERVER_A).await));
    }
    // A gateway that stopped reading: its watch is open, nothing leaves it.
    let stalled = fleet.watch("a-stalled", SERVER_A).await;
    // Another server's gateway is not an affected one.
    let mut other = read(fleet.watch("b-0", SERVER_B).await);

    let (revocation, rv) = fleet.revoke_session("a-1", "a-1-compromised").await;
    let status = revocation.status.clone().expect("status");
    let created = status.delivery.expect("receipts from creation");
    assert_eq!(created.servers.len(), 1, "{created:#?}");
    assert_eq!(created.servers[0].uid, SERVER_A);
    assert_eq!((created.gateways, created.delivered), (0, 0));
    for rx in &mut reading {
        assert_eq!(
            next_event(rx).await,
            ("MODIFIED".to_string(), "a-1".to_string())
        );
    }

    let delivery = fleet
        .delivery_when("a-1-compromised", |d| d.delivered == 2)
        .await;
    assert_eq!(
        (delivery.gateways, delivery.delivered),
        (3, 2),
        "{delivery:#?}"
    );
    assert_eq!(delivery.servers[0].gateways, 3);
    assert_eq!(delivery.resource_version, Some(rv.to_string()));
    assert_eq!(delivery.replicas.len(), 1);
    assert_eq!(delivery.replicas[0].name, "replica-1");
    assert!(
        !delivery.replicas[0].r#final,
        "the stalled watch is pending"
    );
    let (seen, last) = (
        delivery.observed_at.clone().expect("observed").0,
        delivery.last_delivered_at.clone().expect("delivered").0,
    );
    assert!(last >= seen, "delivered {last} before observed {seen}");
    let row = apis::table::TableRow::cells(
        &fleet
            .store
            .get::<Revocation>(NS, "a-1-compromised")
            .await
            .unwrap(),
        k8s_openapi::jiff::Timestamp::now(),
    );
    assert_eq!(row[4], "2/3", "the DELIVERED column: {row:?}");
    assert_eq!(row[5], "<pending>", "the DELIVERED-IN column: {row:?}");

    // The stalled gateway reads again: now every affected watch has it.
    let mut resumed = read(stalled);
    assert_eq!(
        next_event(&mut resumed).await,
        ("MODIFIED".to_string(), "a-1".to_string())
    );
    let delivery = fleet
        .delivery_when("a-1-compromised", |d| d.delivered == 3)
        .await;
    assert_eq!(delivery.gateways, 3);
    assert!(delivery.replicas[0].r#final, "{delivery:#?}");
    // Server B's gateway heard nothing of it.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), next_event(&mut other))
            .await
            .is_err(),
        "server B's gateway got an event"
    );
}

#[tokio::test]
async fn a_fleet_of_watches_costs_a_few_status_writes_not_one_per_gateway() {
    const GATEWAYS: usize = 60;
    let fleet = Fleet::start().await;
    let mut reading = Vec::new();
    for n in 0..GATEWAYS {
        reading.push(read(fleet.watch(&format!("a-{n}"), SERVER_A).await));
    }
    let from = fleet.store.current_version().await.unwrap();
    let mut feed = fleet.store.subscribe(from).await.unwrap();
    fleet.revoke_session("a-2", "a-2-compromised").await;
    let delivery = fleet
        .delivery_when("a-2-compromised", |d| {
            d.delivered as usize == GATEWAYS && d.replicas.iter().all(|r| r.r#final)
        })
        .await;
    assert_eq!(delivery.gateways as usize, GATEWAYS);
    // Positive control: the writes are seen; then, how many there were.
    let mut writes = 0;
    while let Ok(Ok(event)) = tokio::time::timeout(Duration::from_millis(300), feed.next()).await {
        if event.resource == "revocations" && event.event_type == EventType::Modified {
            writes += 1;
        }
    }
    assert!(writes >= 1, "the final report is a write");
    assert!(
        writes <= 5,
        "{writes} status writes for {GATEWAYS} gateways: reports must not follow deliveries one by one"
    );
}

#[tokio::test]
async fn a_revocation_that_changed_no_session_has_no_receipts() {
    let fleet = Fleet::start().await;
    let _watch = read(fleet.watch("a-0", SERVER_A).await);
    // A subject nobody's session has: nothing changes, no gateway has anything to hear.
    let target = RevocationTarget {
        subject: Some("nobody-has-this-user".into()),
        ..Default::default()
    };
    // Receipts a client writes itself are not kept: the server sets the status.
    let mut forged = mk_revocation(NS, "nobody", target, "compromised");
    forged.status = Some(apis::RevocationStatus {
        delivery: Some(RevocationDelivery {
            gateways: 99,
            delivered: 99,
            ..RevocationDelivery::default()
        }),
        ..Default::default()
    });
    let written = fleet
        .store
        .create_revocation(forged, RevokerAuthority::Namespace, false)
        .await
        .expect("revocation created");
    let status = written.object.status.expect("status");
    assert_eq!(status.revoked_sessions, 0);
    assert!(status.delivery.is_none(), "{:#?}", status.delivery);
}
