//! SQL of the revocation facts: retirement fences and the Revocations that may stand for a
//! session. [`apis::locks::standing_revocation`] decides among the candidates.

use apis::locks::Fence;
use apis::Revocation;

use super::params::Params;
use crate::store::error::{Result, StoreError};

/// Whether a fence covers the server uid in a namespace: one installed there, or a
/// cluster-wide one.
pub(super) fn fenced(server_uid: &str, namespace: &str) -> (String, Params) {
    (
        "SELECT EXISTS (SELECT 1 FROM server_fences WHERE server_uid = $1 AND (cluster_wide OR namespace = $2))".into(),
        vec![Box::new(server_uid.to_string()), Box::new(namespace.to_string())],
    )
}

/// The bodies of the Revocations of a namespace whose target could select a session (by
/// name, subject or server uid): a prefilter. Cluster-wide reach exists only for fences,
/// which `server_fences` carries.
pub(super) fn candidates(
    namespace: &str,
    session: &str,
    subject: Option<&str>,
    server_uid: &str,
) -> (String, Params) {
    (
        "SELECT body FROM objects WHERE resource = 'revocations' AND namespace = $1
           AND (body #>> '{spec,target,session}' = $2
                OR body #>> '{spec,target,subject}' = $3
                OR body #>> '{spec,target,server,uid}' = $4)
         ORDER BY name"
            .into(),
        vec![
            Box::new(namespace.to_string()),
            Box::new(session.to_string()),
            Box::new(subject.map(str::to_string)),
            Box::new(server_uid.to_string()),
        ],
    )
}

/// Decodes the rows [`candidates`] returns.
pub(super) fn decode(rows: &[tokio_postgres::Row]) -> Result<Vec<Revocation>> {
    rows.iter()
        .map(|row| {
            serde_json::from_value(row.get(0))
                .map_err(|e| StoreError::Internal(format!("stored Revocation is unreadable: {e}")))
        })
        .collect()
}

/// Installs a fence; a cluster-wide one widens an existing namespace fence, never narrows.
pub(super) fn install_fence(fence: &Fence, revocation: &str) -> (&'static str, Params) {
    (
        "INSERT INTO server_fences (server_uid, server_name, namespace, revocation_name, cluster_wide)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (server_uid, namespace) DO UPDATE
           SET cluster_wide = server_fences.cluster_wide OR EXCLUDED.cluster_wide",
        vec![
            Box::new(fence.server_uid.clone()),
            Box::new(fence.server_name.clone()),
            Box::new(fence.namespace.clone()),
            Box::new(revocation.to_string()),
            Box::new(fence.cluster_wide),
        ],
    )
}
