//! The strategy of every served kind, one file each, and the issuance steps sessions and
//! enrollments share. Adding a kind: a file here and a line in `apiserver::http::serve`.

mod access_session;
mod agent;
mod enrollment;
pub use enrollment::{due_for_collection, pending_session};
mod revocation;
mod tool_policy;
pub use revocation::{
    delivery_cells, merge_report, DeliveryReport, MAX_REPLICA_REPORTS, STALE_REPORT,
    TRACKED_SERVERS,
};

use k8s_openapi::jiff::Timestamp;

use crate::locks;
use crate::rules::{self, Admission, IssuanceContext, RevokeEffect};
use crate::strategy::{revocations_read, Context, Facts, ObjectKey, Read, Rejection, Stop, Write};
use crate::types::{AccessSession, AccessSessionSpec, Agent};

/// The facts issuing a session `name` with `spec` in `namespace` reads: the name (in use,
/// reserved), the server's fence, the revocations that may stand for it and its agent.
pub(crate) fn issuance_reads(namespace: &str, name: &str, spec: &AccessSessionSpec) -> Vec<Read> {
    let key = ObjectKey::of::<AccessSession>(namespace, name);
    let mut reads = vec![
        Read::Object(key.clone()),
        Read::NameReserved(key),
        Read::Fenced {
            server_uid: spec.server.uid.clone(),
            namespace: namespace.to_string(),
        },
        revocations_read(namespace, name, spec),
    ];
    if let Some(agent) = &spec.agent {
        reads.push(Read::Object(ObjectKey::of::<Agent>("", &agent.name)));
    }
    reads
}

/// Refuses a session name in use or used before (names are never reused).
pub(crate) fn check_session_name(facts: &Facts, namespace: &str, name: &str) -> Result<(), Stop> {
    if facts.object::<AccessSession>(namespace, name)?.is_some() {
        return Err(Rejection::AlreadyExists.into());
    }
    if facts.name_reserved(&ObjectKey::of::<AccessSession>(namespace, name))? {
        return Err(Rejection::NameReserved.into());
    }
    Ok(())
}

/// Applies the issuance rules to a new session's spec with what storage read under its lock.
pub(crate) fn admit_issuance(
    facts: &Facts,
    namespace: &str,
    name: &str,
    spec: &AccessSessionSpec,
    ctx: &Context,
) -> Result<Admission, Stop> {
    let server_fenced = facts.fenced(&spec.server.uid, namespace)?;
    let revocations = facts.revocations_for(namespace, name, spec)?;
    let standing = locks::standing_revocation(revocations, namespace, name, spec, ctx.now);
    let agent = match &spec.agent {
        Some(agent) => facts.object::<Agent>("", &agent.name)?,
        None => None,
    };
    let agent_active_sessions = match &agent {
        Some(a) if a.spec.max_active_sessions.is_some() => {
            facts.active_sessions(a.metadata.uid.as_deref().unwrap_or_default(), ctx.now)?
        }
        _ => 0,
    };
    Ok(rules::admit_session(
        spec,
        &IssuanceContext {
            agent: agent.as_ref(),
            agent_active_sessions,
            server_max_ttl: ctx.max_session_ttl,
            server_fenced,
            standing_revocation: standing,
            now: ctx.now,
        },
    )?)
}

/// Records a revocation on every session `selector` selects and returns the writes: usable
/// sessions are revoked, revoked ones are covered by it too. Also counts them and names
/// their servers.
pub(crate) fn revoke_selected(
    facts: &Facts,
    selector: &locks::SessionSelector,
    cause: &str,
    revocation_name: Option<&str>,
    now: Timestamp,
) -> Result<Revoked, Stop> {
    let mut out = Revoked::default();
    for session in facts.sessions(selector)? {
        let mut session = session.clone();
        let effect = rules::revoke_session(&mut session, cause, revocation_name, now);
        match effect {
            RevokeEffect::Revoked => out.newly += 1,
            RevokeEffect::AlsoCovered | RevokeEffect::Unchanged => out.already += 1,
        }
        if effect.changed() {
            out.servers.insert(session.spec.server.uid.clone());
            out.writes.push(Write::put(&session, false)?);
        }
    }
    Ok(out)
}

/// What revoking selected sessions writes and counts.
#[derive(Default)]
pub(crate) struct Revoked {
    /// The sessions it changed.
    pub writes: Vec<Write>,
    /// Sessions it revoked.
    pub newly: usize,
    /// Sessions already revoked (now also covered, or unchanged).
    pub already: usize,
    /// The server uids of the sessions it changed: whose gateways must hear of it.
    pub servers: std::collections::BTreeSet<String>,
}

#[cfg(test)]
mod tests;
