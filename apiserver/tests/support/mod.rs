//! Test helpers: a fresh database per test on the PostgreSQL that `hack/test.sh` started,
//! and small builders for API objects.
#![allow(dead_code)]

use std::str::FromStr;

use apis::rules::CAUSE_SERVER_RETIRED;
use apis::{
    AccessSession, AccessSessionSpec, Agent, AgentRef, Revocation, RevocationTarget, ServerRef,
    Subject,
};
use apiserver::store::{
    PgStore, Preconditions, RevokerAuthority, Store, StoreConfig, StoreError, Written,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// A database of its own, created for one test and dropped with it.
pub struct TestDb {
    pub config: tokio_postgres::Config,
    pub name: String,
    scratch: e2e::scratch_db::ScratchDatabase,
}

impl TestDb {
    pub async fn new() -> Self {
        let scratch = e2e::scratch_db::ScratchDatabase::for_test("t");
        let config = tokio_postgres::Config::from_str(scratch.dsn()).expect("the test DSN parses");
        Self {
            config,
            name: scratch.name().to_string(),
            scratch,
        }
    }

    /// A libpq DSN of the database.
    pub fn dsn(&self) -> &str {
        self.scratch.dsn()
    }

    pub fn store_config(&self) -> StoreConfig {
        StoreConfig::new(self.config.clone())
    }

    pub async fn store(&self) -> PgStore {
        PgStore::start(self.store_config())
            .await
            .expect("store starts")
    }

    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, conn) = self
            .config
            .connect(tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        client
    }
}

pub fn in_hours(h: i64) -> Time {
    let t = Timestamp::now() + SignedDuration::from_hours(h);
    Time(Timestamp::from_second(t.as_second()).unwrap())
}

/// A team session (no directory checks) for a server.
pub fn mk_session(ns: &str, name: &str, server_uid: &str) -> AccessSession {
    let mut s = AccessSession {
        spec: AccessSessionSpec {
            server: ServerRef {
                name: "github".into(),
                uid: server_uid.into(),
            },
            teams: vec!["payments".into()],
            expires_at: Some(in_hours(1)),
            ..Default::default()
        },
        ..Default::default()
    };
    s.metadata.namespace = Some(ns.into());
    s.metadata.name = Some(name.into());
    s
}

pub fn mk_human_session(ns: &str, name: &str, server_uid: &str, user: &str) -> AccessSession {
    let mut s = mk_session(ns, name, server_uid);
    s.spec.teams.clear();
    s.spec.subject = Some(Subject { user: user.into() });
    s
}

pub fn mk_agent_session(
    ns: &str,
    name: &str,
    server_uid: &str,
    agent: &str,
    teams: &[&str],
) -> AccessSession {
    let mut s = mk_session(ns, name, server_uid);
    s.spec.teams = teams.iter().map(|t| t.to_string()).collect();
    s.spec.agent = Some(AgentRef {
        name: agent.into(),
        uid: None,
        calls_per_minute: None,
    });
    s
}

pub mod gateways;
pub mod kubectl;
pub mod replica;
pub mod server;
pub mod store_ext;
#[allow(unused_imports)]
pub use store_ext::{conflict_message, is_conflict, status_of, StoreExt};
pub mod watch;

/// A Revocation of `target` in `ns`.
pub fn mk_revocation(
    ns: &str,
    name: &str,
    target: apis::RevocationTarget,
    cause: &str,
) -> apis::Revocation {
    let mut r = apis::Revocation {
        spec: apis::RevocationSpec {
            target,
            cause: cause.into(),
            ..Default::default()
        },
        ..Default::default()
    };
    r.metadata.namespace = Some(ns.into());
    r.metadata.name = Some(name.into());
    r
}

pub fn mk_agent(name: &str, teams: &[&str]) -> Agent {
    let mut a = Agent::default();
    a.metadata.name = Some(name.into());
    a.spec.teams = teams.iter().map(|t| t.to_string()).collect();
    a
}

/// A session-target Revocation's name: unique, so revoking, withdrawing and revoking again
/// never collide.
fn revocation_name(session: &str) -> String {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{session}-{}", &suffix[..8])
}

/// Revokes one session the way production does: a Revocation targeting it, created by a
/// namespace revoker. Returns the Revocation's name (what lifts it again, [`withdraw`]).
pub async fn revoke(store: &impl Store, ns: &str, session: &str, cause: &str) -> String {
    let name = revocation_name(session);
    let target = RevocationTarget {
        session: Some(session.into()),
        ..Default::default()
    };
    store
        .create_revocation(
            mk_revocation(ns, &name, target, cause),
            RevokerAuthority::Namespace,
            false,
        )
        .await
        .unwrap_or_else(|e| panic!("revoking {ns}/{session}: {e}"));
    name
}

/// Lifts a revocation the way production does: deletes the Revocation, restoring what no
/// other revocation covers.
pub async fn withdraw(
    store: &impl Store,
    ns: &str,
    revocation: &str,
) -> Result<Revocation, StoreError> {
    store
        .delete_revocation(ns, revocation, true, &Preconditions::default(), false)
        .await
}

/// Retires a server generation the way production does: a `server_retired` Revocation of
/// the server, created by a cluster-wide revoker (its fence and its revocations reach every
/// namespace).
pub async fn retire(
    store: &impl Store,
    ns: &str,
    name: &str,
    server: &ServerRef,
) -> Written<Revocation> {
    let target = RevocationTarget {
        server: Some(server.clone()),
        ..Default::default()
    };
    store
        .create_revocation(
            mk_revocation(ns, name, target, CAUSE_SERVER_RETIRED),
            RevokerAuthority::Cluster,
            false,
        )
        .await
        .unwrap_or_else(|e| panic!("retiring {}: {e}", server.uid))
}

/// Tries to restore a revoked session through the only production path that restores one:
/// withdrawing a revocation that covers it. A revocation of the session is created and
/// deleted again; the session as it then stands is returned (still revoked while anything
/// else covers it, its server is fenced or its agent is unusable), or the refusal.
pub async fn try_restore(
    store: &impl Store,
    ns: &str,
    session: &str,
) -> Result<AccessSession, StoreError> {
    let probe = revoke(store, ns, session, "manual").await;
    withdraw(store, ns, &probe).await?;
    store.get::<AccessSession>(ns, session).await
}

/// A team session of server uid `srv-1` as an HTTP request body.
pub fn session_body(ns: &str, name: &str) -> serde_json::Value {
    let mut v = serde_json::to_value(mk_session(ns, name, "srv-1")).expect("a session serializes");
    v["apiVersion"] = serde_json::json!(apis::API_VERSION);
    v["kind"] = serde_json::json!("AccessSession");
    v
}

/// The fields named by a Status's `details.causes` (what a 422 says was invalid).
pub fn cause_fields(status: &serde_json::Value) -> Vec<&str> {
    status["details"]["causes"]
        .as_array()
        .unwrap_or_else(|| panic!("no details.causes in {status}"))
        .iter()
        .filter_map(|c| c["field"].as_str())
        .collect()
}
