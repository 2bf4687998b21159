//! Bound statement parameters, as the SQL builders of reads and writes hand them over.

use tokio_postgres::types::ToSql;

/// Bound parameters of one statement.
pub(crate) type Params = Vec<Box<dyn ToSql + Sync + Send>>;

/// `params` as a statement takes them.
pub(crate) fn bound(params: &Params) -> Vec<&(dyn ToSql + Sync)> {
    params
        .iter()
        .map(|p| p.as_ref() as &(dyn ToSql + Sync))
        .collect()
}
