//! SQL of the session facts: the sessions a selector selects, active-session counts and name
//! reservations. Each narrows by an index; the typed rule in `apis` decides on the rows.

use apis::locks::SessionSelector;
use apis::strategy::ObjectKey;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::params::Params;

/// Whether a name is reserved by a deleted object.
pub(super) fn name_reserved(key: &ObjectKey) -> (String, Params) {
    (
        "SELECT EXISTS (SELECT 1 FROM name_reservations WHERE resource = $1 AND namespace = $2 AND name = $3)".into(),
        vec![
            Box::new(key.resource.to_string()),
            Box::new(key.namespace.clone()),
            Box::new(key.name.clone()),
        ],
    )
}

/// The sessions a selector selects, in key order, generated from the typed selector so an
/// index serves it; every row is re-checked with [`SessionSelector::matches`].
pub(super) fn selected(selector: &SessionSelector) -> (String, Params) {
    const COLUMNS: &str =
        "SELECT namespace, name, seq, body FROM objects WHERE resource = 'accesssessions'";
    match selector {
        SessionSelector::One { namespace, name } => (
            format!("{COLUMNS} AND namespace = $1 AND name = $2"),
            vec![Box::new(namespace.clone()), Box::new(name.clone())],
        ),
        SessionSelector::Server {
            namespace: Some(ns),
            uid,
        } => (
            format!("{COLUMNS} AND namespace = $1 AND body #>> '{{spec,server,uid}}' = $2 ORDER BY namespace, name"),
            vec![Box::new(ns.clone()), Box::new(uid.clone())],
        ),
        SessionSelector::Server {
            namespace: None,
            uid,
        } => (
            format!("{COLUMNS} AND body #>> '{{spec,server,uid}}' = $1 ORDER BY namespace, name"),
            vec![Box::new(uid.clone())],
        ),
        SessionSelector::Subject { namespace, user } => (
            format!("{COLUMNS} AND namespace = $1 AND body #>> '{{spec,subject,user}}' = $2 ORDER BY namespace, name"),
            vec![Box::new(namespace.clone()), Box::new(user.clone())],
        ),
        SessionSelector::Agent { uid } => (
            format!("{COLUMNS} AND body #>> '{{spec,agent,uid}}' = $1 ORDER BY namespace, name"),
            vec![Box::new(uid.clone())],
        ),
    }
}

/// Counts, per agent uid, the sessions that count as active at `at`: the SQL form of
/// [`apis::rules::counts_as_active`] (phase Active or PendingEnrollment, not expired;
/// RFC 3339 times of second precision compare as strings).
pub(super) fn active_counts(agent_uids: &[String], at: Timestamp) -> (String, Params) {
    let at = stored_time(at);
    (
        "SELECT body #>> '{spec,agent,uid}', count(*) FROM objects
          WHERE resource = 'accesssessions' AND body #>> '{spec,agent,uid}' = ANY($1)
            AND body #>> '{status,phase}' IN ('Active', 'PendingEnrollment')
            AND body #>> '{spec,expiresAt}' > $2
          GROUP BY 1"
            .into(),
        vec![Box::new(agent_uids.to_vec()), Box::new(at)],
    )
}

/// The RFC 3339 spelling of `at` as stored times have it (second precision, so stored times
/// compare as strings; `at` is truncated, which keeps `expiresAt <= at` exact).
fn stored_time(at: Timestamp) -> String {
    serde_json::to_value(Time(at))
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The narrowing predicate of [`apis::rules::expiry_instant`]: sessions that can still
/// expire. The partial index `objects_sessions_by_expiry` (migration 0003) has exactly this
/// predicate, so both queries below are index scans.
macro_rules! can_expire {
    () => {
        "resource = 'accesssessions'
            AND COALESCE(body #>> '{status,phase}', 'Active') IN ('Active', 'PendingEnrollment')"
    };
}
const CAN_EXPIRE: &str = can_expire!();

/// The earliest expiry of a session that can still expire (no row when none): the first
/// entry of the expiry index. Written as `ORDER BY … LIMIT 1`, not `min(…)`: the planner
/// turns `min` into that only when its statistics say so, and before the first ANALYZE of
/// a filling table it read every entry instead (2 ms at 5,000 sessions, on every write).
pub const NEXT_SESSION_EXPIRY_SQL: &str = concat!(
    "SELECT body #>> '{spec,expiresAt}' FROM objects WHERE ",
    can_expire!(),
    " AND body #>> '{spec,expiresAt}' IS NOT NULL ORDER BY body #>> '{spec,expiresAt}' LIMIT 1"
);

/// Up to `limit` sessions due to expire at `at`, in expiry order; every row is re-checked
/// with [`apis::rules::due_for_expiry`].
pub(super) fn due(at: Timestamp, limit: u32) -> (String, Params) {
    (
        format!(
            "SELECT namespace, name, seq, body FROM objects
              WHERE {CAN_EXPIRE} AND body #>> '{{spec,expiresAt}}' <= $1
              ORDER BY body #>> '{{spec,expiresAt}}' LIMIT $2"
        ),
        vec![Box::new(stored_time(at)), Box::new(i64::from(limit))],
    )
}
