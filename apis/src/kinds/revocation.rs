//! Revocation: a standing lock (see `locks`). Creating it revokes what its target selects and
//! (for `server_retired`) installs the fence; deleting it withdraws it, restoring only the
//! sessions nothing else covers.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::locks::{self, Uncovered};
use crate::resources::{ResourceInfo, REVOCATIONS};
use crate::rules::{self, CAUSE_AGENT_DEACTIVATED, CAUSE_SERVER_RETIRED};
use crate::strategy::{
    Context, Facts, ObjectKey, Plan, Read, Refusal, Rejection, Stop, Strategy, Withdrawal, Write,
};
use crate::table::{age, or_none, Column, TableRow, AGE, NAME};
use crate::types::{
    AccessSession, Agent, Kind, ReplicaDelivery, Revocation, RevocationDelivery, RevocationStatus,
    ServerDelivery,
};
use crate::validation::FieldError;

use super::revoke_selected;

fn key_of(revocation: &Revocation) -> (String, String) {
    (
        revocation.metadata.namespace.clone().unwrap_or_default(),
        revocation.metadata.name.clone().unwrap_or_default(),
    )
}

impl TableRow for Revocation {
    const COLUMNS: &'static [Column] = &[
        NAME,
        Column::new(
            "Target",
            "string",
            "",
            "What was revoked: session/NAME, server/NAME or subject/USER.",
            0,
        ),
        Column::new("Cause", "string", "", "Why.", 0),
        Column::new(
            "Revoked",
            "integer",
            "",
            "Sessions this revocation revoked.",
            0,
        ),
        Column::new(
            "Delivered",
            "string",
            "",
            "Gateway watches of the affected servers it was written to, of those connected.",
            0,
        ),
        Column::new(
            "Delivered-In",
            "string",
            "",
            "From the change feed seeing it committed to the last delivery.",
            0,
        ),
        AGE,
        Column::new("Message", "string", "", "Explanation.", 1),
    ];

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let t = &self.spec.target;
        let target = match (&t.session, &t.server, &t.subject) {
            (Some(s), _, _) => format!("session/{s}"),
            (_, Some(s), _) => format!("server/{}", s.name),
            (_, _, Some(u)) => format!("subject/{u}"),
            _ => "<none>".into(),
        };
        let delivery = self.status.as_ref().and_then(|s| s.delivery.as_ref());
        vec![
            or_none(self.metadata.name.as_deref()),
            Value::String(target),
            or_none(Some(&self.spec.cause)),
            json!(self.status.as_ref().map_or(0, |s| s.revoked_sessions)),
            delivered_cell(delivery),
            delivered_in_cell(delivery),
            age(self.metadata.creation_timestamp.as_ref().map(|t| t.0), now),
            or_none(self.spec.message.as_deref()),
        ]
    }
}

impl Strategy for Revocation {
    const INFO: ResourceInfo = REVOCATIONS;
    const ASKS_CLUSTER_AUTHORITY: bool = true;

    fn validate_create(&self) -> Vec<FieldError> {
        rules::validate_revocation_spec(&self.spec)
    }

    fn create_reads(&self, ctx: &Context) -> Vec<Read> {
        let (ns, _) = key_of(self);
        let mut reads = Vec::new();
        if let Some(session) = &self.spec.target.session {
            reads.push(Read::Object(ObjectKey::of::<AccessSession>(&ns, session)));
        }
        if let Ok(plan) = locks::plan_revocation(&ns, &self.spec, ctx.authority, ctx.now) {
            reads.push(Read::Sessions(plan.sessions));
        }
        reads
    }

    fn admit_create(
        mut revocation: Self,
        ctx: &Context,
        facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        let (ns, name) = key_of(&revocation);
        let plan = locks::plan_revocation(&ns, &revocation.spec, ctx.authority, ctx.now)
            .map_err(Rejection::Invalid)?;
        if facts.object::<Revocation>(&ns, &name)?.is_some() {
            return Err(Rejection::AlreadyExists.into());
        }
        if let Some(session) = &revocation.spec.target.session {
            if facts.object::<AccessSession>(&ns, session)?.is_none() {
                return Err(Rejection::Invalid(vec![FieldError::invalid(
                    "spec.target.session",
                    format!("session {session:?} not found in namespace {ns:?}"),
                )])
                .into());
            }
        }
        let mut writes = Vec::new();
        if let Some(fence) = &plan.fence {
            writes.push(Write::Fence {
                fence: fence.clone(),
                revocation: name.clone(),
            });
        }
        let revoked = revoke_selected(
            facts,
            &plan.sessions,
            &revocation.spec.cause,
            Some(&name),
            ctx.now,
        )?;
        let (newly, already) = (revoked.newly, revoked.already);
        writes.extend(revoked.writes);
        revocation.status = Some(RevocationStatus {
            revoked_sessions: (newly + already) as u32,
            cluster_wide: plan.fence.as_ref().is_some_and(|f| f.cluster_wide),
            completed_at: Some(Time(ctx.now)),
            delivery: tracked_servers(revoked.servers),
        });
        revocation.set_type_meta();
        writes.push(Write::put(&revocation, true)?);
        let mut warnings = Vec::new();
        if already > 0 {
            warnings.push(format!(
                "{already} of the sessions it covers were already revoked; they now stay revoked until every revocation covering them is deleted"
            ));
        }
        Ok(Plan {
            object: revocation,
            writes,
            warnings,
        })
    }

    /// A replica's receipts (a [`DeliveryReport`]; served to nobody: revocations have no
    /// status subresource, only the apiserver's own receipts task writes this way), merged
    /// into what the other replicas reported.
    fn admit_status(
        mut revocation: Self,
        requested: &Value,
        _ctx: &Context,
        _facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        let report: DeliveryReport = serde_json::from_value(requested.clone())
            .map_err(|e| Rejection::Unreadable(format!("delivery report: {e}")))?;
        let Some(delivery) = revocation.status.as_mut().and_then(|s| s.delivery.as_mut()) else {
            return Ok(Plan::unchanged(revocation));
        };
        if !merge_report(delivery, report) {
            return Ok(Plan::unchanged(revocation));
        }
        let write = Write::put(&revocation, false)?;
        Ok(Plan {
            object: revocation,
            writes: vec![write],
            warnings: Vec::new(),
        })
    }

    /// Withdrawal: every session the revocation covers loses that cover, and those nothing
    /// else covers are restored when their agent and server are still usable. Tearing the
    /// namespace down restores nothing. Fences are permanent.
    fn admit_delete(
        current: Self,
        by: &Withdrawal,
        _ctx: &Context,
        facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        let (ns, name) = key_of(&current);
        if current.spec.cause == CAUSE_SERVER_RETIRED {
            // The fence lives on in the store's fence table; only the namespace's own
            // teardown may take the record with it (else a namespace that ever held a retired
            // server could never be deleted). Nobody withdraws a fence.
            if !matches!(by, Withdrawal::NamespaceTeardown) {
                return Err(Refusal::FencePermanent(name).into());
            }
            return Ok(Plan {
                writes: vec![Write::Remove {
                    key: ObjectKey::for_object(&current),
                }],
                object: current,
                warnings: Vec::new(),
            });
        }
        let refuse = |why: String| -> Stop {
            Refusal::Withdrawal {
                revocation: name.clone(),
                why,
            }
            .into()
        };
        let single = current.spec.target.session.is_some();
        let restore = matches!(by, Withdrawal::ByCaller(_));
        let mut writes = Vec::new();
        if let (true, Some(selector)) = (
            restore,
            locks::revocation_selector(&ns, &current.spec, false),
        ) {
            let mut uncovered = Vec::new();
            for session in facts.sessions(&selector)? {
                let mut session = session.clone();
                let effect = locks::uncover(&mut session, &name);
                if effect != Uncovered::NotCovered {
                    uncovered.push((session, effect));
                }
            }
            // Everything restoring needs, in one round trip.
            let needed: Vec<Read> = uncovered
                .iter()
                .filter(|(_, e)| *e == Uncovered::Restore)
                .flat_map(|(s, _)| restore_reads(s))
                .filter(|r| !facts.contains(r))
                .collect();
            if !needed.is_empty() {
                return Err(Stop::Need(needed));
            }
            for (mut session, effect) in uncovered {
                if effect == Uncovered::Restore {
                    let session_ns = session.metadata.namespace.clone().unwrap_or_default();
                    let fenced = facts.fenced(&session.spec.server.uid, &session_ns)?;
                    let agent = match &session.spec.agent {
                        Some(a) => facts.object::<Agent>("", &a.name)?,
                        None => None,
                    };
                    match (fenced, rules::check_session_agent(&session, agent.as_ref())) {
                        (false, Ok(())) => locks::restore(&mut session),
                        // A single-session withdrawal says why it cannot restore.
                        (true, _) if single => {
                            return Err(refuse(format!(
                                "server uid {:?} was retired",
                                session.spec.server.uid
                            )))
                        }
                        (_, Err(why)) if single => return Err(refuse(why)),
                        // Among many, the unusable ones stay revoked for their reason.
                        (true, _) => locks::keep_revoked(&mut session, CAUSE_SERVER_RETIRED),
                        (_, Err(_)) => locks::keep_revoked(&mut session, CAUSE_AGENT_DEACTIVATED),
                    }
                }
                writes.push(Write::put(&session, false)?);
            }
        }
        writes.push(Write::Remove {
            key: ObjectKey::for_object(&current),
        });
        Ok(Plan {
            object: current,
            writes,
            warnings: Vec::new(),
        })
    }
}

/// What deciding whether a session can be restored reads: its server's fence and its agent.
fn restore_reads(session: &AccessSession) -> Vec<Read> {
    let mut reads = vec![Read::Fenced {
        server_uid: session.spec.server.uid.clone(),
        namespace: session.metadata.namespace.clone().unwrap_or_default(),
    }];
    if let Some(agent) = &session.spec.agent {
        reads.push(Read::Object(ObjectKey::of::<Agent>("", &agent.name)));
    }
    reads
}

/// Most servers a revocation keeps receipts for, in uid order; the rest are counted.
pub const TRACKED_SERVERS: usize = 16;
/// Most replica reports kept on one revocation (the newest).
pub const MAX_REPLICA_REPORTS: usize = 32;
/// A report not final and this old (against the newest report) is from a replica that went
/// away: its watches have reconnected to another replica, which reports them.
pub const STALE_REPORT: SignedDuration = SignedDuration::from_secs(10);

/// The receipts a new revocation starts with: its servers, nothing delivered yet. None when
/// it changed no session (no gateway has anything to hear).
fn tracked_servers(servers: std::collections::BTreeSet<String>) -> Option<RevocationDelivery> {
    if servers.is_empty() {
        return None;
    }
    let untracked = servers.len().saturating_sub(TRACKED_SERVERS) as u32;
    Some(RevocationDelivery {
        servers: servers
            .into_iter()
            .take(TRACKED_SERVERS)
            .map(|uid| ServerDelivery {
                uid,
                ..ServerDelivery::default()
            })
            .collect(),
        untracked_servers: untracked,
        ..RevocationDelivery::default()
    })
}

/// One replica's receipts for one revocation, as its receipts task writes them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryReport {
    /// The resourceVersion the replica counted deliveries against (the revocation's, as its
    /// change feed saw it created).
    pub resource_version: String,
    pub replica: ReplicaDelivery,
}

/// Merges `report` into `delivery` and sums the replicas again; returns whether anything
/// changed. Only the tracked servers count; stale reports are dropped; the first
/// resourceVersion reported stays.
pub fn merge_report(delivery: &mut RevocationDelivery, report: DeliveryReport) -> bool {
    let before = delivery.clone();
    let mut replica = report.replica;
    replica
        .servers
        .retain(|s| delivery.servers.iter().any(|t| t.uid == s.uid));
    replica.servers.sort_by(|a, b| a.uid.cmp(&b.uid));
    delivery
        .resource_version
        .get_or_insert(report.resource_version);
    let newest = replica.reported_at.as_ref().map(|t| t.0);
    delivery.replicas.retain(|r| r.name != replica.name);
    delivery.replicas.push(replica);
    if let Some(newest) = newest {
        delivery.replicas.retain(|r| {
            r.r#final
                || r.reported_at
                    .as_ref()
                    .is_some_and(|t| newest.duration_since(t.0) < STALE_REPORT)
        });
    }
    delivery.replicas.sort_by(|a, b| {
        b.reported_at
            .as_ref()
            .map(|t| t.0)
            .cmp(&a.reported_at.as_ref().map(|t| t.0))
    });
    delivery.replicas.truncate(MAX_REPLICA_REPORTS);
    delivery.replicas.sort_by(|a, b| a.name.cmp(&b.name));
    sum_replicas(delivery);
    *delivery != before
}

/// The per-server and overall counts, from the replicas' reports.
fn sum_replicas(delivery: &mut RevocationDelivery) {
    let later = |a: Option<MicroTime>, b: Option<&MicroTime>| match (a, b) {
        (Some(a), Some(b)) => Some(if b.0 > a.0 { b.clone() } else { a }),
        (a, b) => a.or_else(|| b.cloned()),
    };
    for server in &mut delivery.servers {
        let (mut gateways, mut delivered, mut last) = (0, 0, None);
        for reported in delivery
            .replicas
            .iter()
            .flat_map(|r| &r.servers)
            .filter(|s| s.uid == server.uid)
        {
            gateways += reported.gateways;
            delivered += reported.delivered.min(reported.gateways);
            last = later(last, reported.last_delivered_at.as_ref());
        }
        server.gateways = gateways;
        server.delivered = delivered;
        server.last_delivered_at = last;
    }
    delivery.gateways = delivery.servers.iter().map(|s| s.gateways).sum();
    delivery.delivered = delivery.servers.iter().map(|s| s.delivered).sum();
    delivery.last_delivered_at = delivery
        .servers
        .iter()
        .fold(None, |last, s| later(last, s.last_delivered_at.as_ref()));
    delivery.observed_at = delivery
        .replicas
        .iter()
        .filter_map(|r| r.observed_at.clone())
        .min_by_key(|t| t.0);
}

/// The `DELIVERED` and `DELIVERED-IN` cells of `kubectl get revocations`, as text.
pub fn delivery_cells(delivery: Option<&RevocationDelivery>) -> (String, String) {
    let text = |v: Value| v.as_str().unwrap_or_default().to_string();
    (
        text(delivered_cell(delivery)),
        text(delivered_in_cell(delivery)),
    )
}

fn delivered_cell(delivery: Option<&RevocationDelivery>) -> Value {
    match delivery {
        Some(d) => Value::String(format!("{}/{}", d.delivered, d.gateways)),
        None => Value::String("<none>".into()),
    }
}

/// How long after the change feed saw the revocation the last delivery was, while every
/// connected watch has it; `<pending>` until then.
fn delivered_in_cell(delivery: Option<&RevocationDelivery>) -> Value {
    let Some(d) = delivery else {
        return Value::String("<none>".into());
    };
    if d.delivered < d.gateways {
        return Value::String("<pending>".into());
    }
    match (&d.observed_at, &d.last_delivered_at) {
        (Some(seen), Some(last)) => {
            let micros = last.0.duration_since(seen.0).as_micros().max(0);
            Value::String(if micros < 10_000 {
                format!("{:.1}ms", micros as f64 / 1e3)
            } else if micros < 1_000_000 {
                format!("{}ms", micros / 1000)
            } else {
                format!("{:.1}s", micros as f64 / 1e6)
            })
        }
        _ => Value::String("<none>".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Option<MicroTime> {
        Some(MicroTime(
            Timestamp::from_second(1_800_000_000 + second).unwrap(),
        ))
    }

    fn server(uid: &str, gateways: u32, delivered: u32, last: Option<MicroTime>) -> ServerDelivery {
        ServerDelivery {
            uid: uid.into(),
            gateways,
            delivered,
            last_delivered_at: last,
        }
    }

    fn report(
        name: &str,
        reported: i64,
        fin: bool,
        servers: Vec<ServerDelivery>,
    ) -> DeliveryReport {
        DeliveryReport {
            resource_version: "42".into(),
            replica: ReplicaDelivery {
                name: name.into(),
                reported_at: at(reported),
                r#final: fin,
                observed_at: at(reported - 1),
                servers,
            },
        }
    }

    fn tracked(uids: &[&str]) -> RevocationDelivery {
        tracked_servers(uids.iter().map(|u| u.to_string()).collect()).expect("servers")
    }

    #[test]
    fn replicas_are_summed_per_tracked_server() {
        let mut d = tracked(&["a", "b"]);
        assert!(merge_report(
            &mut d,
            report(
                "r1",
                0,
                false,
                vec![server("a", 3, 2, at(1)), server("b", 1, 1, at(2))]
            )
        ));
        assert!(merge_report(
            &mut d,
            report(
                "r2",
                1,
                true,
                vec![server("a", 2, 2, at(3)), server("zz", 9, 9, at(9))]
            )
        ));
        assert_eq!((d.gateways, d.delivered), (6, 5));
        assert_eq!(d.servers[0], server("a", 5, 4, at(3)));
        assert_eq!(d.servers[1], server("b", 1, 1, at(2)));
        assert_eq!(d.last_delivered_at, at(3));
        assert_eq!(d.observed_at, at(-1), "the earliest replica to see it");
        assert_eq!(d.resource_version.as_deref(), Some("42"));
        // An untracked server in a report counts nowhere.
        assert!(d
            .replicas
            .iter()
            .all(|r| r.servers.iter().all(|s| s.uid != "zz")));
        // The same report again changes nothing (no write).
        let again = report("r2", 1, true, vec![server("a", 2, 2, at(3))]);
        assert!(!merge_report(&mut d, again));
        // A replica's newer report replaces its older one.
        assert!(merge_report(
            &mut d,
            report(
                "r1",
                2,
                true,
                vec![server("a", 3, 3, at(4)), server("b", 1, 1, at(2))]
            )
        ));
        assert_eq!((d.gateways, d.delivered), (6, 6));
        assert_eq!(delivered_cell(Some(&d)), json!("6/6"));
        assert_eq!(delivered_in_cell(Some(&d)), json!("4.0s"));
    }

    #[test]
    fn a_replica_that_went_away_stops_counting_unless_it_was_final() {
        let mut d = tracked(&["a"]);
        merge_report(
            &mut d,
            report("gone", 0, false, vec![server("a", 4, 1, at(0))]),
        );
        merge_report(
            &mut d,
            report("done", 0, true, vec![server("a", 2, 2, at(0))]),
        );
        assert_eq!((d.gateways, d.delivered), (6, 3));
        assert_eq!(delivered_in_cell(Some(&d)), json!("<pending>"));
        // Eleven seconds on, a live replica reports: the silent non-final one is dropped,
        // the final one stays.
        merge_report(
            &mut d,
            report("live", 11, false, vec![server("a", 4, 4, at(11))]),
        );
        let names: Vec<_> = d.replicas.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["done", "live"]);
        assert_eq!((d.gateways, d.delivered), (6, 6));
    }

    #[test]
    fn receipts_stay_bounded() {
        let many: Vec<String> = (0..40).map(|n| format!("uid-{n:02}")).collect();
        let d = tracked_servers(many.into_iter().collect()).expect("servers");
        assert_eq!(d.servers.len(), TRACKED_SERVERS);
        assert_eq!(d.untracked_servers, 40 - TRACKED_SERVERS as u32);
        let mut d = tracked(&["a"]);
        for n in 0..100 {
            merge_report(
                &mut d,
                report(&format!("r{n:03}"), 0, true, vec![server("a", 1, 1, at(0))]),
            );
        }
        assert_eq!(d.replicas.len(), MAX_REPLICA_REPORTS);
        assert!(tracked_servers(Default::default()).is_none());
    }

    #[test]
    fn a_delivery_time_reads_in_the_unit_that_fits() {
        let mut d = tracked(&["a"]);
        d.observed_at = at(0);
        d.last_delivered_at = Some(MicroTime(
            at(0).unwrap().0 + SignedDuration::from_micros(1_500),
        ));
        assert_eq!(delivered_in_cell(Some(&d)), json!("1.5ms"));
        d.last_delivered_at = Some(MicroTime(
            at(0).unwrap().0 + SignedDuration::from_millis(250),
        ));
        assert_eq!(delivered_in_cell(Some(&d)), json!("250ms"));
        assert_eq!(delivered_cell(None), json!("<none>"));
    }
}
