//! Where SQL filters for speed it must decide as the pure rules do. The same varied data set
//! is written through the same production `Store` calls into a `PgStore` (SQL narrows by
//! index: selected sessions, active-session counts, revocation candidates, fences, list
//! selectors) and a `MemoryStore` (the pure rules decide directly), and every outcome is
//! compared: revocations' `status.revokedSessions`, warnings and the sessions they change,
//! every agent's `status.activeSessions`, issuance refusals and lists with selectors.

mod support;

use apis::selector::{FieldSelector, LabelSelector};
use apis::strategy::Strategy;
use apis::{AccessSession, Agent, AgentRef, Enrollment, Revocation, RevocationTarget, ServerRef};
use apiserver::store::{
    ListAt, ListQuery, MemoryStore, PgStore, Preconditions, Result, RevokerAuthority, Store,
    Written,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::Serialize;
use serde_json::{json, Value};
use support::{mk_agent, mk_human_session, mk_revocation, mk_session, StoreExt, TestDb};

/// The same call on both stores, PostgreSQL first: `both!(w, |s| s.call(..))`.
macro_rules! both {
    ($w:expr, |$s:ident| $call:expr) => {{
        let pg = {
            let $s = &$w.pg;
            $call.await
        };
        let mem = {
            let $s = &$w.mem;
            $call.await
        };
        (pg, mem)
    }};
}

/// Both stores and the database behind the PostgreSQL one.
struct World {
    _db: TestDb,
    pg: PgStore,
    mem: MemoryStore,
}

/// An object as compared: identities, versions and times differ between the stores (uids
/// are random, times are taken when each store writes) and are dropped.
fn normalize(mut v: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(map) => {
                map.retain(|k, _| {
                    !matches!(
                        k.as_str(),
                        "uid" | "resourceVersion" | "creationTimestamp" | "lastTransitionTime"
                    ) && !k.ends_with("At")
                });
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

fn norm<T: Serialize>(object: &T) -> Value {
    normalize(serde_json::to_value(object).expect("object encodes"))
}

/// A write's outcome as compared: the object and warnings, or the error.
fn outcome<K: Serialize>(r: &Result<Written<K>>) -> Value {
    match r {
        Ok(w) => json!({"object": norm(&w.object), "warnings": w.warnings}),
        Err(e) => json!({"error": format!("{e:?}")}),
    }
}

fn at(hours: i64, seconds: i64) -> Time {
    let t =
        Timestamp::now() + SignedDuration::from_hours(hours) + SignedDuration::from_secs(seconds);
    Time(Timestamp::from_second(t.as_second()).expect("in range"))
}

fn labelled<K: apis::Kind>(mut object: K, labels: &[(&str, &str)]) -> K {
    object.meta_mut().labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    object
}

fn agent_session(ns: &str, name: &str, server: &str, agent: &str) -> AccessSession {
    let mut s = mk_session(ns, name, server);
    s.spec.agent = Some(AgentRef {
        name: agent.into(),
        uid: None,
        calls_per_minute: None,
    });
    s
}

fn enrollment_of(session: AccessSession) -> Enrollment {
    Enrollment {
        metadata: session.metadata,
        spec: session.spec,
        ..Default::default()
    }
}

fn target_session(name: &str) -> RevocationTarget {
    RevocationTarget {
        session: Some(name.into()),
        ..Default::default()
    }
}

fn target_subject(user: &str) -> RevocationTarget {
    RevocationTarget {
        subject: Some(user.into()),
        ..Default::default()
    }
}

fn target_server(uid: &str) -> RevocationTarget {
    RevocationTarget {
        server: Some(ServerRef {
            name: "github".into(),
            uid: uid.into(),
        }),
        ..Default::default()
    }
}

const NAMESPACES: [&str; 3] = ["n1", "n2", "n3"];
const SERVERS: [&str; 4] = ["srv-a", "srv-b", "srv-c", "srv-d"];

impl World {
    /// Both stores holding the same data set: agents with and without quotas (one inactive),
    /// active, pending, completed, revoked and expired sessions over several namespaces,
    /// subjects, servers and agents, and standing revocations of every target kind, an
    /// expired one and fences (namespace and cluster-wide).
    async fn seeded() -> Self {
        let db = TestDb::new().await;
        let w = World {
            pg: db.store().await,
            mem: MemoryStore::new(),
            _db: db,
        };
        w.seed().await;
        w
    }

    /// Writes on both and asserts the same outcome.
    async fn expect_same<K: Serialize>(
        &self,
        what: &str,
        pg: Result<Written<K>>,
        mem: Result<Written<K>>,
    ) -> Value {
        let (a, b) = (outcome(&pg), outcome(&mem));
        assert_eq!(
            a, b,
            "{what}: PostgreSQL (left) and the rules (right) differ"
        );
        a
    }

    async fn seed(&self) {
        let mut quota = mk_agent("quota", &["payments", "infra"]);
        quota.spec.max_active_sessions = Some(5);
        let mut tight = mk_agent("tight", &["payments"]);
        tight.spec.max_active_sessions = Some(1);
        let agents = [
            quota,
            tight,
            mk_agent("free", &["payments"]),
            mk_agent("doomed", &["payments"]),
            mk_agent("sleepy", &["payments"]),
        ];
        for agent in agents {
            let (a, b) = both!(self, |s| s.create_agent(agent.clone(), false));
            self.expect_same("create agent", a, b).await;
        }

        let mut sessions = Vec::new();
        for (i, ns) in NAMESPACES.iter().enumerate() {
            for (j, srv) in SERVERS.iter().enumerate() {
                let tier = if (i + j) % 2 == 0 { "gold" } else { "silver" };
                sessions.push(labelled(
                    mk_session(ns, &format!("team-{srv}"), srv),
                    &[("tier", tier), ("ns", ns)],
                ));
            }
            for (user, srv) in [
                ("alice", "srv-a"),
                ("bob", "srv-a"),
                ("alice", "srv-b"),
                ("carol", "srv-d"),
            ] {
                sessions.push(labelled(
                    mk_human_session(ns, &format!("human-{user}-{srv}"), srv, user),
                    &[("user", user)],
                ));
            }
            sessions.push(agent_session(ns, "free-1", "srv-a", "free"));
            sessions.push(agent_session(ns, "sleepy-1", "srv-b", "sleepy"));
        }
        sessions.push(agent_session("n1", "quota-1", "srv-a", "quota"));
        sessions.push(agent_session("n2", "quota-2", "srv-b", "quota"));
        sessions.push(agent_session("n3", "tight-1", "srv-c", "tight"));
        sessions.push(agent_session("n1", "doomed-1", "srv-b", "doomed"));
        sessions.push(agent_session("n2", "doomed-2", "srv-a", "doomed"));
        // Expire within seconds: counted until then, never after. Nothing is compared
        // between the two stores until it has lapsed, so no comparison straddles it; and it
        // is far enough ahead that every seed write (each store in turn, reading its own
        // clock) is done before it: a lapse between the two halves of one write would make
        // one store refuse what the other took.
        let lapse = at(0, 6);
        let mut short = agent_session("n1", "quota-short", "srv-a", "quota");
        short.spec.expires_at = Some(lapse.clone());
        sessions.push(short);
        let mut short = mk_human_session("n2", "human-short", "srv-b", "dave");
        short.spec.expires_at = Some(lapse.clone());
        sessions.push(short);
        for session in sessions {
            let (a, b) = both!(self, |s| s.create_session(session.clone(), false));
            self.expect_same("seed session", a, b).await;
        }

        // Pending enrollments (they count as active), and a completed one.
        let owner = apis::strategy::Requester {
            name: "alice".into(),
            uid: "alice-uid".into(),
        };
        for session in [
            mk_human_session("n1", "enr-alice", "srv-a", "alice"),
            agent_session("n2", "enr-quota", "srv-b", "quota"),
            agent_session("n3", "enr-done", "srv-a", "quota"),
        ] {
            let e = enrollment_of(session);
            let (a, b) = both!(self, |s| s.create_enrollment(e.clone(), &owner, false));
            self.expect_same("seed enrollment", a, b).await;
        }
        let (a, b) = both!(self, |s| s
            .complete_enrollment("n3", "enr-done", None, false));
        assert_eq!(
            a.map(|e| norm(&e)).map_err(|e| format!("{e:?}")),
            b.map(|e| norm(&e)).map_err(|e| format!("{e:?}"))
        );

        // Standing revocations of every target kind, one expiring, and fences.
        let mut expiring =
            mk_revocation("n3", "pre-expiring", target_server("srv-b"), "compromised");
        expiring.spec.expires_at = Some(lapse.clone());
        let revocations = [
            (
                mk_revocation("n1", "pre-subject", target_subject("bob"), "compromised"),
                RevokerAuthority::Namespace,
            ),
            (
                mk_revocation(
                    "n2",
                    "pre-one",
                    target_session("human-alice-srv-a"),
                    "compromised",
                ),
                RevokerAuthority::Namespace,
            ),
            (
                mk_revocation("n1", "pre-server", target_server("srv-c"), "compromised"),
                RevokerAuthority::Cluster,
            ),
            (expiring, RevokerAuthority::Namespace),
            (
                mk_revocation(
                    "n2",
                    "fence-local",
                    target_server("srv-c"),
                    "server_retired",
                ),
                RevokerAuthority::Namespace,
            ),
            (
                mk_revocation(
                    "n3",
                    "fence-global",
                    target_server("srv-d"),
                    "server_retired",
                ),
                RevokerAuthority::Cluster,
            ),
        ];
        for (r, authority) in revocations {
            let (a, b) = both!(self, |s| s.create_revocation(r.clone(), authority, false));
            self.expect_same("seed revocation", a, b).await;
        }

        // An inactive agent (its sessions revoked by the agent selector).
        self.set_active("sleepy", false).await;
        // Let the short sessions and the expiring revocation lapse: the stores read the
        // time at second precision, so a second past it.
        let lapsed = lapse.0 + SignedDuration::from_millis(1050);
        if let Ok(wait) = std::time::Duration::try_from(lapsed.duration_since(Timestamp::now())) {
            tokio::time::sleep(wait).await;
        }
    }

    async fn set_active(&self, name: &str, active: bool) {
        let (a, b) = both!(self, |s| async {
            let mut agent: Agent = s.get("", name).await?;
            agent.spec.active = active;
            agent.metadata.resource_version = None;
            s.update_agent(agent, false).await
        });
        self.expect_same(&format!("set agent {name} active={active}"), a, b)
            .await;
    }

    /// Every object of `K` in both stores, normalized.
    async fn all<K: Strategy + Serialize>(&self, query: &ListQuery) -> (Vec<Value>, Vec<Value>) {
        let (a, b) = both!(self, |s| s.list::<K>(query));
        let a = a.expect("PostgreSQL lists");
        let b = b.expect("memory lists");
        (
            a.items.iter().map(norm).collect(),
            b.items.iter().map(norm).collect(),
        )
    }

    /// The whole state is the same in both: every session (so the same sessions changed),
    /// every agent's `status.activeSessions`, every revocation and enrollment.
    async fn assert_same_state(&self, when: &str) {
        let all = ListQuery::default();
        let (a, b) = self.all::<AccessSession>(&all).await;
        assert!(!a.is_empty());
        assert_eq!(a, b, "sessions {when}");
        let (a, b) = self.all::<Agent>(&all).await;
        assert_eq!(a, b, "agents (activeSessions) {when}");
        let (a, b) = self.all::<Revocation>(&all).await;
        assert_eq!(a, b, "revocations {when}");
        let (a, b) = self.all::<Enrollment>(&all).await;
        assert_eq!(a, b, "enrollments {when}");
        for agent in ["quota", "tight", "free", "doomed", "sleepy"] {
            let (a, b) = both!(self, |s| s.get::<Agent>("", agent));
            if let (Ok(a), Ok(b)) = (&a, &b) {
                assert_eq!(
                    a.status.as_ref().and_then(|s| s.active_sessions),
                    b.status.as_ref().and_then(|s| s.active_sessions),
                    "{agent}.status.activeSessions {when}"
                );
            } else {
                assert_eq!(a.is_err(), b.is_err(), "get agent {agent} {when}");
            }
        }
    }

    async fn revoke(&self, r: Revocation, authority: RevokerAuthority) -> Value {
        let name = r.metadata.name.clone().unwrap_or_default();
        let (a, b) = both!(self, |s| s.create_revocation(r.clone(), authority, false));
        let out = self.expect_same(&format!("revocation {name}"), a, b).await;
        self.assert_same_state(&format!("after revocation {name}"))
            .await;
        out
    }

    async fn withdraw(&self, ns: &str, name: &str) {
        let (a, b) = both!(self, |s| s.delete_revocation(
            ns,
            name,
            true,
            &Preconditions::default(),
            false
        ));
        assert_eq!(
            a.map(|r| norm(&r)).map_err(|e| format!("{e:?}")),
            b.map(|r| norm(&r)).map_err(|e| format!("{e:?}")),
            "withdrawal of {ns}/{name}"
        );
        self.assert_same_state(&format!("after withdrawing {ns}/{name}"))
            .await;
    }
}

#[tokio::test]
async fn revocations_select_and_restore_the_same_sessions() {
    let w = World::seeded().await;
    w.assert_same_state("after expiry").await;

    // SessionSelector::One, on usable, already revoked, expired and missing sessions.
    let mut revoked_counts = Vec::new();
    for (ns, session) in [
        ("n1", "team-srv-a"),
        ("n1", "human-bob-srv-a"),
        ("n1", "quota-short"),
        ("n2", "sleepy-1"),
        ("n3", "nope"),
    ] {
        let r = mk_revocation(
            ns,
            &format!("one-{session}"),
            target_session(session),
            "compromised",
        );
        let out = w.revoke(r, RevokerAuthority::Namespace).await;
        revoked_counts.push(out["object"]["status"]["revokedSessions"].clone());
    }
    // The rules did run: they revoked, covered and refused.
    assert_eq!(
        revoked_counts,
        [json!(1), json!(1), json!(1), json!(1), Value::Null]
    );

    // SessionSelector::Subject.
    for (ns, user) in [
        ("n1", "alice"),
        ("n2", "alice"),
        ("n3", "bob"),
        ("n2", "dave"),
        ("n3", "nobody"),
    ] {
        let r = mk_revocation(
            ns,
            &format!("subject-{user}"),
            target_subject(user),
            "compromised",
        );
        w.revoke(r, RevokerAuthority::Namespace).await;
    }
    // SessionSelector::Server in one namespace (also for a cluster-wide creator when it
    // does not fence), and everywhere for a cluster-wide fence.
    for (ns, srv, authority) in [
        ("n1", "srv-b", RevokerAuthority::Namespace),
        ("n3", "srv-a", RevokerAuthority::Cluster),
        ("n2", "srv-z", RevokerAuthority::Namespace),
    ] {
        let r = mk_revocation(
            ns,
            &format!("server-{srv}"),
            target_server(srv),
            "compromised",
        );
        w.revoke(r, authority).await;
    }
    let fence = mk_revocation(
        "n1",
        "fence-a-local",
        target_server("srv-a"),
        "server_retired",
    );
    w.revoke(fence, RevokerAuthority::Namespace).await;
    let fence = mk_revocation(
        "n2",
        "fence-b-global",
        target_server("srv-b"),
        "server_retired",
    );
    let out = w.revoke(fence, RevokerAuthority::Cluster).await;
    assert_eq!(out["object"]["status"]["clusterWide"], true);

    // SessionSelector::Agent: deactivating and deleting agents.
    w.set_active("free", false).await;
    w.assert_same_state("after deactivating free").await;
    let (a, b) = both!(w, |s| s.remove::<Agent>(
        "",
        "doomed",
        &Preconditions::default(),
        false
    ));
    assert_eq!(
        a.map(|x| norm(&x)).map_err(|e| format!("{e:?}")),
        b.map(|x| norm(&x)).map_err(|e| format!("{e:?}"))
    );
    w.assert_same_state("after deleting doomed").await;
    // Re-created under the same name it is another agent (another uid): the old sessions
    // are not its sessions, neither counted nor issuable against it.
    let (a, b) = both!(w, |s| s
        .create_agent(mk_agent("doomed", &["payments"]), false));
    w.expect_same("re-creating doomed", a, b).await;
    let (a, b) = both!(w, |s| s
        .create_session(agent_session("n3", "doomed-3", "srv-a", "doomed"), false));
    w.expect_same("issuing for the re-created doomed", a, b)
        .await;
    w.assert_same_state("after re-creating doomed").await;
    // Reactivating restores nothing.
    w.set_active("free", true).await;
    w.assert_same_state("after reactivating free").await;

    // Withdrawals restore the same sessions (or refuse the same way).
    for (ns, name) in [
        ("n1", "subject-alice"),
        ("n1", "pre-subject"),
        ("n1", "one-human-bob-srv-a"),
        ("n1", "server-srv-b"),
        ("n3", "server-srv-a"),
        ("n2", "one-sleepy-1"),
        ("n1", "one-quota-short"),
        ("n2", "fence-b-global"),
        ("n3", "pre-expiring"),
        ("n2", "pre-one"),
    ] {
        w.withdraw(ns, name).await;
    }
}

#[tokio::test]
async fn issuance_refusals_and_quotas_match() {
    let w = World::seeded().await;
    // Every namespace × server × kind of session: fences (local and cluster-wide), standing
    // revocations (subject, server, an expired one), inactive agents, quotas counted by SQL.
    let mut refused = 0;
    for ns in NAMESPACES.iter().chain(&["n4"]) {
        for srv in SERVERS {
            let mut candidates = vec![
                mk_session(ns, &format!("p-{srv}-team"), srv),
                mk_human_session(ns, &format!("p-{srv}-alice"), srv, "alice"),
                mk_human_session(ns, &format!("p-{srv}-bob"), srv, "bob"),
                agent_session(ns, &format!("p-{srv}-quota"), srv, "quota"),
                agent_session(ns, &format!("p-{srv}-tight"), srv, "tight"),
                agent_session(ns, &format!("p-{srv}-free"), srv, "free"),
                agent_session(ns, &format!("p-{srv}-sleepy"), srv, "sleepy"),
            ];
            // Names in use, reserved, or targeted by a revocation.
            candidates.push(mk_session(ns, "team-srv-a", srv));
            candidates.push(mk_human_session(ns, "human-alice-srv-a", srv, "erin"));
            for session in candidates {
                let name = session.metadata.name.clone().unwrap_or_default();
                let (a, b) = both!(w, |s| s.create_session(session.clone(), false));
                refused += usize::from(a.is_err());
                w.expect_same(&format!("issuing {ns}/{name}"), a, b).await;
                let e = enrollment_of({
                    let mut s = session.clone();
                    s.metadata.name = Some(format!("e{name}"));
                    s
                });
                let owner = support::store_ext::admin();
                let (a, b) = both!(w, |s| s.create_enrollment(e.clone(), &owner, false));
                w.expect_same(&format!("enrolling {ns}/e{name}"), a, b)
                    .await;
            }
        }
    }
    assert!(refused > 20, "the matrix exercises refusals: {refused}");
    w.assert_same_state("after issuance").await;
}

#[tokio::test]
async fn lists_with_selectors_match() {
    let w = World::seeded().await;
    let session_labels = [
        "",
        "tier=gold",
        "tier!=gold",
        "!tier",
        "tier in (gold,silver)",
        "user",
        "ns=n2,tier=silver",
    ];
    let session_fields = [
        "",
        "spec.server.uid=srv-a",
        "spec.server.uid!=srv-a",
        "status.phase=Revoked",
        "status.phase!=Active",
        "status.phase=PendingEnrollment",
        "spec.subject.user=alice",
        "spec.subject.user=",
        "spec.subject.user!=",
        "spec.agent.name=quota",
        "spec.agent.name!=",
        "metadata.name=team-srv-a",
        "metadata.namespace=n2,status.phase=Active",
        "spec.server.name=github",
    ];
    for ns in [None, Some("n1"), Some("n2"), Some("n9")] {
        // Each selector alone, and a few together (labels are matched in Rust, fields in SQL).
        let pairs = session_labels
            .iter()
            .map(|l| (*l, ""))
            .chain(session_fields.iter().map(|f| ("", *f)))
            .chain([
                ("tier=gold", "spec.server.uid=srv-a"),
                ("user", "status.phase=Revoked"),
                ("!tier", "spec.subject.user!="),
            ]);
        for (labels, fields) in pairs {
            let query = ListQuery {
                namespace: ns.map(str::to_string),
                labels: LabelSelector::parse(labels).expect("label selector parses"),
                fields: FieldSelector::parse(fields, <AccessSession as apis::Kind>::FIELDS)
                    .expect("field selector parses"),
                ..Default::default()
            };
            let (a, b) = w.all::<AccessSession>(&query).await;
            assert_eq!(a, b, "sessions in {ns:?} with {labels:?} and {fields:?}");
        }
    }
    async fn check<K: Strategy + Serialize>(w: &World, fields: &[&str]) {
        for ns in [None, Some("n1"), Some("n2"), Some("n3")] {
            for f in fields {
                let query = ListQuery {
                    namespace: ns.map(str::to_string),
                    fields: FieldSelector::parse(f, K::FIELDS).expect("field selector parses"),
                    ..Default::default()
                };
                let (a, b) = w.all::<K>(&query).await;
                assert_eq!(a, b, "{} in {ns:?} with {f:?}", K::PLURAL);
            }
        }
    }
    check::<Revocation>(
        &w,
        &[
            "",
            "spec.cause=server_retired",
            "spec.cause!=server_retired",
            "spec.target.session=human-alice-srv-a",
            "spec.target.session=",
        ],
    )
    .await;
    check::<Enrollment>(
        &w,
        &[
            "",
            "status.phase=Pending",
            "status.phase=Completed",
            "status.owner=alice",
            "spec.server.name!=github",
        ],
    )
    .await;
    check::<Agent>(&w, &["", "metadata.name=quota", "metadata.name!=quota"]).await;

    // Pages: limit and continue walk the same items in the same order.
    for limit in [1, 2, 3, 7, 100] {
        let mut pages = [Vec::new(), Vec::new()];
        for (i, pages) in pages.iter_mut().enumerate() {
            let mut query = ListQuery {
                limit: Some(limit),
                ..Default::default()
            };
            loop {
                let page = if i == 0 {
                    w.pg.list::<AccessSession>(&query).await
                } else {
                    w.mem.list::<AccessSession>(&query).await
                }
                .expect("page lists");
                let last = page.items.last().map(|s| {
                    (
                        s.metadata.namespace.clone().unwrap_or_default(),
                        s.metadata.name.clone().unwrap_or_default(),
                    )
                });
                pages.push(page.items.iter().map(norm).collect::<Vec<_>>());
                if page.continue_token.is_none() {
                    break;
                }
                query.at = ListAt::Exact {
                    rv: page.resource_version,
                    after: last,
                };
            }
        }
        let [a, b] = pages;
        assert_eq!(a, b, "pages of {limit}");
    }

    // A list continued after writes reads the snapshot of its first page in both, its
    // field selector applied to the state then (PostgreSQL: to the log's before-images).
    let active = FieldSelector::parse("status.phase=Active", <AccessSession as apis::Kind>::FIELDS)
        .expect("field selector parses");
    let first = ListQuery {
        limit: Some(5),
        fields: active.clone(),
        ..Default::default()
    };
    let (a, b) = both!(w, |s| s.list::<AccessSession>(&first));
    let (a, b) = (a.expect("PostgreSQL lists"), b.expect("memory lists"));
    let next = |page: &apiserver::store::ObjectList<AccessSession>| ListQuery {
        limit: Some(1000),
        at: ListAt::Exact {
            rv: page.resource_version,
            after: page.items.last().map(|s| {
                (
                    s.metadata.namespace.clone().unwrap_or_default(),
                    s.metadata.name.clone().unwrap_or_default(),
                )
            }),
        },
        fields: active.clone(),
        ..Default::default()
    };
    let (rest_a, rest_b) = (next(&a), next(&b));
    let (x, y) = both!(w, |s| s.remove::<AccessSession>(
        "n1",
        "team-srv-b",
        &Preconditions::default(),
        false
    ));
    assert_eq!(x.is_ok(), y.is_ok());
    let r = mk_revocation("n2", "late", target_subject("alice"), "compromised");
    w.revoke(r, RevokerAuthority::Namespace).await;
    let (x, y) = (
        w.pg.list::<AccessSession>(&rest_a)
            .await
            .expect("PostgreSQL continues"),
        w.mem
            .list::<AccessSession>(&rest_b)
            .await
            .expect("memory continues"),
    );
    let (x, y): (Vec<Value>, Vec<Value>) = (
        x.items.iter().map(norm).collect(),
        y.items.iter().map(norm).collect(),
    );
    assert!(x.iter().any(|s| s["metadata"]["name"] == "team-srv-b"));
    // Revoked by `late` since, listed as they were.
    assert!(x.iter().any(|s| s["metadata"]["namespace"] == "n2"
        && s["spec"]["subject"]["user"] == "alice"
        && s["status"]["phase"] == "Active"));
    assert_eq!(x, y, "the rest of a list continued after writes");
}
