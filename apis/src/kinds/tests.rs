//! The strategies driven as storage drives them, over a small in-test world: every fact a
//! hook asks for is answered from the world's objects, and the plan is checked.

use std::collections::HashMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use crate::locks::RevokerAuthority;
use crate::rules::{self, SessionRuleError, CAUSE_SERVER_RETIRED};
use crate::strategy::{
    Context, Fact, Facts, ObjectKey, Plan, Read, Refusal, Rejection, Requester, Stop, Strategy,
    Withdrawal, Write,
};
use crate::types::*;

fn now() -> Timestamp {
    "2026-11-30T12:00:00Z".parse().unwrap()
}

fn ctx(user: &str) -> Context {
    Context::new(
        now(),
        Requester {
            name: user.into(),
            uid: format!("{user}-uid"),
        },
    )
}

/// What storage holds, as the facts it would answer.
#[derive(Default)]
struct World {
    objects: std::collections::BTreeMap<ObjectKey, Value>,
    reserved: Vec<ObjectKey>,
    fenced: Vec<(String, String)>,
}

impl World {
    fn put<K: Kind>(&mut self, object: &K) {
        let mut body = serde_json::to_value(object).unwrap();
        body["metadata"]["resourceVersion"] = "1".into();
        self.objects.insert(ObjectKey::for_object(object), body);
    }

    fn all<K: Kind>(&self) -> Vec<K> {
        self.objects
            .iter()
            .filter(|(k, _)| k.resource == K::PLURAL)
            .map(|(_, v)| serde_json::from_value(v.clone()).unwrap())
            .collect()
    }

    fn answer(&self, read: &Read) -> Fact {
        match read {
            Read::Object(key) => Fact::Object(self.objects.get(key).cloned()),
            Read::NameReserved(key) => Fact::Flag(self.reserved.contains(key)),
            Read::Fenced {
                server_uid,
                namespace,
            } => Fact::Flag(
                self.fenced
                    .contains(&(server_uid.clone(), namespace.clone())),
            ),
            Read::Revocations { namespace, .. } => Fact::Revocations(
                self.all::<Revocation>()
                    .into_iter()
                    .filter(|r| r.metadata.namespace.as_deref() == Some(namespace))
                    .collect(),
            ),
            Read::Sessions(selector) => Fact::Sessions(
                self.all::<AccessSession>()
                    .into_iter()
                    .filter(|s| {
                        selector.matches(
                            s.metadata.namespace.as_deref().unwrap(),
                            s.metadata.name.as_deref().unwrap(),
                            &s.spec,
                        )
                    })
                    .collect(),
            ),
            Read::DueSessions { at, limit } => Fact::Sessions(
                self.all::<AccessSession>()
                    .into_iter()
                    .filter(|s| rules::due_for_expiry(s, *at))
                    .take(*limit as usize)
                    .collect(),
            ),
            Read::PolicySizes { namespace, server } => {
                Fact::Counts(crate::tool_policy::policy_sizes(
                    self.all::<crate::types::ToolPolicy>(),
                    namespace,
                    server,
                ))
            }
            Read::ActiveSessions { agent_uids, at } => {
                let mut counts = HashMap::new();
                for s in self.all::<AccessSession>() {
                    let uid = s.spec.agent.as_ref().and_then(|a| a.uid.clone());
                    if let Some(uid) = uid.filter(|u| agent_uids.contains(u)) {
                        if rules::counts_as_active(&s, *at) {
                            *counts.entry(uid).or_insert(0) += 1;
                        }
                    }
                }
                Fact::Counts(counts)
            }
        }
    }

    /// Runs a hook as the generic transaction does; also returns how many rounds of reads
    /// it took.
    fn run<K>(
        &self,
        first: Vec<Read>,
        decide: impl Fn(&Facts) -> Result<Plan<K>, Stop>,
    ) -> (Result<Plan<K>, Rejection>, usize) {
        let mut facts = Facts::default();
        let mut reads = first;
        for round in 1..10 {
            for read in reads {
                let fact = self.answer(&read);
                facts.insert(read, fact);
            }
            match decide(&facts) {
                Ok(plan) => return (Ok(plan), round),
                Err(Stop::Rejected(r)) => return (Err(r), round),
                Err(Stop::Need(more)) => {
                    assert!(
                        more.iter().any(|r| !facts.contains(r)),
                        "asked again for {more:?}"
                    );
                    reads = more;
                }
            }
        }
        panic!("no plan after 10 rounds");
    }

    fn create<K: Strategy>(&self, object: K, ctx: &Context) -> Result<Plan<K>, Rejection> {
        let mut first = vec![Read::Object(ObjectKey::for_object(&object))];
        first.extend(object.create_reads(ctx));
        self.run(first, |f| K::admit_create(object.clone(), ctx, f))
            .0
    }

    fn delete<K: Strategy>(&self, object: &K, by: &Withdrawal) -> Result<Plan<K>, Rejection> {
        self.run(Vec::new(), |f| {
            K::admit_delete(object.clone(), by, &ctx("admin"), f)
        })
        .0
    }
}

fn meta(
    ns: &str,
    name: &str,
    uid: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: Some(name.into()),
        namespace: (!ns.is_empty()).then(|| ns.into()),
        uid: Some(uid.into()),
        ..Default::default()
    }
}

fn session(ns: &str, name: &str, server_uid: &str, agent: Option<(&str, &str)>) -> AccessSession {
    AccessSession {
        metadata: meta(ns, name, &format!("{name}-uid")),
        spec: AccessSessionSpec {
            server: ServerRef {
                name: "github".into(),
                uid: server_uid.into(),
            },
            agent: agent.map(|(n, uid)| AgentRef {
                name: n.into(),
                uid: Some(uid.into()),
                calls_per_minute: None,
            }),
            subject: agent.is_none().then(|| Subject {
                user: "alice".into(),
            }),
            teams: Vec::new(),
            tools: None,
            calls_per_minute: None,
            grant: None,
            expires_at: Some(Time(now() + SignedDuration::from_hours(1))),
        },
        status: Some(AccessSessionStatus {
            phase: SessionPhase::Active,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn agent(name: &str, uid: &str, max: Option<u32>) -> Agent {
    let mut a = Agent {
        metadata: meta("", name, uid),
        ..Default::default()
    };
    a.spec.active = true;
    a.spec.max_active_sessions = max;
    a
}

fn revocation(ns: &str, name: &str, target: RevocationTarget, cause: &str) -> Revocation {
    Revocation {
        metadata: meta(ns, name, &format!("{name}-uid")),
        spec: RevocationSpec {
            target,
            cause: cause.into(),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn server_target(uid: &str) -> RevocationTarget {
    RevocationTarget {
        server: Some(ServerRef {
            name: "github".into(),
            uid: uid.into(),
        }),
        ..Default::default()
    }
}

fn session_target(name: &str) -> RevocationTarget {
    RevocationTarget {
        session: Some(name.into()),
        ..Default::default()
    }
}

fn kinds_written(plan: &[Write]) -> Vec<String> {
    plan.iter()
        .map(|w| match w {
            Write::Create { key, .. } => format!("create {}/{}", key.resource, key.name),
            Write::Replace { key, .. } => format!("replace {}/{}", key.resource, key.name),
            Write::Remove { key } => format!("remove {}/{}", key.resource, key.name),
            Write::ReserveName { key, .. } => format!("reserve {}/{}", key.resource, key.name),
            Write::Fence { fence, .. } => format!("fence {}", fence.server_uid),
        })
        .collect()
}

#[test]
fn a_hook_asks_for_what_it_lacks_and_issuance_reads_in_one_round() {
    let world = World::default();
    let s = session("ns", "s1", "srv-1", None);
    // Without facts the hook names the fact it needs first.
    let need = AccessSession::admit_create(s.clone(), &ctx("alice"), &Facts::default());
    assert!(
        matches!(need, Err(Stop::Need(ref r)) if r.contains(&Read::Object(ObjectKey::for_object(&s))))
    );
    // With the reads it declares, one round suffices for a human session.
    let mut first = vec![Read::Object(ObjectKey::for_object(&s))];
    first.extend(s.create_reads(&ctx("alice")));
    let (plan, rounds) = world.run(first, |f| {
        AccessSession::admit_create(s.clone(), &ctx("alice"), f)
    });
    let plan = plan.unwrap();
    assert_eq!(rounds, 1);
    assert_eq!(kinds_written(&plan.writes), ["create accesssessions/s1"]);
    assert_eq!(plan.object.phase(), SessionPhase::Active);
}

#[test]
fn session_names_are_never_reused_and_fences_refuse_issuance() {
    let mut world = World::default();
    world
        .reserved
        .push(ObjectKey::of::<AccessSession>("ns", "gone"));
    world.fenced.push(("srv-old".into(), "ns".into()));
    assert_eq!(
        world
            .create(session("ns", "gone", "srv-1", None), &ctx("alice"))
            .unwrap_err(),
        Rejection::NameReserved
    );
    world.put(&session("ns", "taken", "srv-1", None));
    assert_eq!(
        world
            .create(session("ns", "taken", "srv-1", None), &ctx("alice"))
            .unwrap_err(),
        Rejection::AlreadyExists
    );
    assert!(matches!(
        world.create(session("ns", "new", "srv-old", None), &ctx("alice")),
        Err(Rejection::Refused(Refusal::Session(
            SessionRuleError::ServerFenced(_)
        )))
    ));
}

#[test]
fn agent_quota_counts_active_sessions_in_a_second_round() {
    let mut world = World::default();
    world.put(&agent("bot", "bot-uid", Some(1)));
    let s = session("ns", "s1", "srv-1", Some(("bot", "bot-uid")));
    let mut first = vec![Read::Object(ObjectKey::for_object(&s))];
    first.extend(s.create_reads(&ctx("alice")));
    let (plan, rounds) = world.run(first.clone(), |f| {
        AccessSession::admit_create(s.clone(), &ctx("alice"), f)
    });
    assert!(plan.is_ok());
    assert_eq!(
        rounds, 2,
        "the count depends on the agent read in round one"
    );
    world.put(&plan.unwrap().object);
    let s2 = session("ns", "s2", "srv-1", Some(("bot", "bot-uid")));
    assert!(matches!(
        world.create(s2, &ctx("alice")),
        Err(Rejection::Refused(Refusal::Session(
            SessionRuleError::QuotaExceeded {
                active: 1,
                max: 1,
                ..
            }
        )))
    ));
}

#[test]
fn a_revocation_revokes_what_it_selects_and_a_fence_reaches_as_far_as_its_creator() {
    let mut world = World::default();
    world.put(&session("ns", "a", "srv-1", None));
    world.put(&session("ns", "b", "srv-1", None));
    world.put(&session("other", "c", "srv-1", None));
    let mut already = session("ns", "d", "srv-1", None);
    rules::revoke_session(&mut already, "manual", Some("earlier"), now());
    world.put(&already);

    let fence = revocation("ns", "retire", server_target("srv-1"), CAUSE_SERVER_RETIRED);
    let plan = world.create(fence.clone(), &ctx("admin")).unwrap();
    assert_eq!(
        kinds_written(&plan.writes),
        [
            "fence srv-1",
            "replace accesssessions/a",
            "replace accesssessions/b",
            "replace accesssessions/d",
            "create revocations/retire"
        ]
    );
    let status = plan.object.status.clone().unwrap();
    assert_eq!((status.revoked_sessions, status.cluster_wide), (3, false));
    assert_eq!(
        plan.warnings.len(),
        1,
        "d was already revoked: {:?}",
        plan.warnings
    );

    let mut cluster = ctx("admin");
    cluster.authority = RevokerAuthority::Cluster;
    let plan = world.create(fence, &cluster).unwrap();
    assert!(plan.object.status.unwrap().cluster_wide);
    assert!(kinds_written(&plan.writes).contains(&"replace accesssessions/c".to_string()));
}

#[test]
fn withdrawing_restores_only_what_nothing_else_covers_and_asks_once_for_restore_facts() {
    let mut world = World::default();
    world.put(&agent("bot", "bot-uid", None));
    let mut one = session("ns", "one", "srv-1", Some(("bot", "bot-uid")));
    rules::revoke_session(&mut one, "manual", Some("r1"), now());
    let mut two = session("ns", "two", "srv-1", Some(("bot", "bot-uid")));
    rules::revoke_session(&mut two, "manual", Some("r1"), now());
    rules::revoke_session(&mut two, "manual", Some("r2"), now());
    world.put(&one);
    world.put(&two);
    let r1 = revocation("ns", "r1", server_target("srv-1"), "manual");
    let (plan, rounds) = world.run(Vec::new(), |f| {
        Revocation::admit_delete(
            r1.clone(),
            &Withdrawal::ByCaller(Requester::default()),
            &ctx("admin"),
            f,
        )
    });
    let plan = plan.unwrap();
    assert_eq!(rounds, 3, "sessions, then every restore fact at once");
    let written: Vec<AccessSession> = plan
        .writes
        .iter()
        .filter_map(|w| match w {
            Write::Replace { body, .. } => serde_json::from_value(body.clone()).ok(),
            _ => None,
        })
        .collect();
    let phase = |name: &str| {
        written
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some(name))
            .unwrap()
            .phase()
    };
    assert_eq!(phase("one"), SessionPhase::Active);
    assert_eq!(phase("two"), SessionPhase::Revoked);

    // Tearing the namespace down restores nothing.
    let plan = world.delete(&r1, &Withdrawal::NamespaceTeardown).unwrap();
    assert_eq!(kinds_written(&plan.writes), ["remove revocations/r1"]);
    // A fence is permanent: nobody withdraws it; the namespace's teardown takes only the
    // record (the fence itself is kept by the store), restoring nothing.
    let fence = revocation("ns", "f", server_target("srv-1"), CAUSE_SERVER_RETIRED);
    assert_eq!(
        world
            .delete(&fence, &Withdrawal::ByCaller(Requester::default()))
            .unwrap_err(),
        Rejection::Refused(Refusal::FencePermanent("f".into()))
    );
    let plan = world
        .delete(&fence, &Withdrawal::NamespaceTeardown)
        .unwrap();
    assert_eq!(kinds_written(&plan.writes), ["remove revocations/f"]);
    // A single-session withdrawal says why it cannot restore.
    world.fenced.push(("srv-1".into(), "ns".into()));
    let single = revocation("ns", "r1", session_target("one"), "manual");
    assert!(matches!(
        world.delete(&single, &Withdrawal::ByCaller(Requester::default())),
        Err(Rejection::Refused(Refusal::Withdrawal { ref why, .. })) if why.contains("retired")
    ));
}

#[test]
fn deactivating_an_agent_revokes_its_sessions_in_the_same_plan() {
    let mut world = World::default();
    let bot = agent("bot", "bot-uid", None);
    world.put(&bot);
    world.put(&session("ns", "s1", "srv-1", Some(("bot", "bot-uid"))));
    world.put(&session("ns", "s2", "srv-1", Some(("other", "other-uid"))));
    let mut off = bot.clone();
    off.spec.active = false;
    let (plan, _) = world.run(Vec::new(), |f| {
        Agent::admit_update(bot.clone(), off.clone(), &ctx("admin"), f)
    });
    let plan = plan.unwrap();
    assert_eq!(
        kinds_written(&plan.writes),
        ["replace accesssessions/s1", "replace agents/bot"]
    );
    assert!(plan.object.status.unwrap().deactivated_at.is_some());
}

#[test]
fn only_the_owner_withdraws_a_pending_enrollment_and_completion_checks_its_session() {
    let mut world = World::default();
    let mut e = Enrollment {
        metadata: meta("ns", "e1", "e1-uid"),
        spec: session("ns", "e1", "srv-1", None).spec,
        ..Default::default()
    };
    let plan = world.create(e.clone(), &ctx("alice")).unwrap();
    assert_eq!(
        kinds_written(&plan.writes),
        ["create accesssessions/e1", "create enrollments/e1"]
    );
    e = plan.object;
    let pending = crate::kinds::pending_session(&e, &ctx("alice").requester, now());
    world.put(&pending);
    world.put(&e);
    assert_eq!(
        world
            .delete(&e, &Withdrawal::ByCaller(ctx("mallory").requester))
            .unwrap_err(),
        Rejection::Refused(Refusal::NotOwner("alice".into()))
    );
    let plan = world
        .delete(&e, &Withdrawal::ByCaller(ctx("alice").requester))
        .unwrap();
    assert_eq!(
        kinds_written(&plan.writes),
        [
            "remove accesssessions/e1",
            "reserve accesssessions/e1",
            "remove enrollments/e1"
        ]
    );
    // Retention leaves a pending enrollment alone.
    assert!(world
        .delete(&e, &Withdrawal::Retention)
        .unwrap()
        .writes
        .is_empty());

    // Completion activates the session; a revoked one cannot be.
    let requested = serde_json::to_value(&e).unwrap();
    let (plan, _) = world.run(Vec::new(), |f| {
        Enrollment::admit_status(e.clone(), &requested, &ctx("approver"), f)
    });
    let plan = plan.unwrap();
    assert_eq!(plan.object.phase(), EnrollmentPhase::Completed);
    let mut revoked = pending.clone();
    rules::revoke_session(&mut revoked, "manual", Some("r"), now());
    world.put(&revoked);
    let (refused, _) = world.run(Vec::new(), |f| {
        Enrollment::admit_status(e.clone(), &requested, &ctx("approver"), f)
    });
    assert!(
        matches!(refused, Err(Rejection::Refused(Refusal::Completion { ref why, .. })) if why.contains("revoked"))
    );
}

#[test]
fn completion_changes_status_phase_only() {
    let e = serde_json::json!({"metadata": {"uid": "u", "resourceVersion": "1"}, "spec": {"x": 1}, "status": {"phase": "Pending"}});
    let mut ok = e.clone();
    ok["status"]["phase"] = "Completed".into();
    assert_eq!(Enrollment::check_status(&e, &ok), Ok(()));
    let mut spec = ok.clone();
    spec["spec"]["x"] = 2.into();
    assert!(
        matches!(Enrollment::check_status(&e, &spec), Err(Rejection::Invalid(ref errs)) if errs[0].field == "spec.x")
    );
    let mut uid = ok.clone();
    uid["metadata"]["uid"] = "other".into();
    assert!(matches!(
        Enrollment::check_status(&e, &uid),
        Err(Rejection::UidPrecondition { .. })
    ));
    let mut rv = ok;
    rv["metadata"]["resourceVersion"] = "0".into();
    assert_eq!(Enrollment::check_status(&e, &rv), Err(Rejection::Modified));
}

#[test]
fn kinds_with_a_fixed_spec_change_metadata_only() {
    let r = revocation("ns", "r", session_target("s"), "manual");
    let mut changed = r.clone();
    changed.spec.cause = "other".into();
    assert!(matches!(
        Revocation::admit_update(r.clone(), changed, &ctx("a"), &Facts::default()),
        Err(Stop::Rejected(Rejection::Invalid(_)))
    ));
    let mut labelled = r.clone();
    labelled.metadata.labels = Some([("k".to_string(), "v".to_string())].into());
    let plan = Revocation::admit_update(r.clone(), labelled, &ctx("a"), &Facts::default()).unwrap();
    assert_eq!(plan.writes.len(), 1);
    let same = Revocation::admit_update(r.clone(), r, &ctx("a"), &Facts::default()).unwrap();
    assert!(same.writes.is_empty());
}

#[test]
fn completed_enrollments_are_due_after_their_retention() {
    let mut e = Enrollment::default();
    assert!(!crate::kinds::due_for_collection(
        &e,
        now(),
        SignedDuration::ZERO
    ));
    e.status = Some(EnrollmentStatus {
        phase: EnrollmentPhase::Completed,
        completed_at: Some(Time(now())),
        ..Default::default()
    });
    assert!(crate::kinds::due_for_collection(
        &e,
        now(),
        SignedDuration::ZERO
    ));
    assert!(!crate::kinds::due_for_collection(
        &e,
        now(),
        SignedDuration::from_hours(1)
    ));
}
