//! What a list asks for and one page of its answer.

use apis::selector::{FieldSelector, LabelSelector};

use super::rv::ResourceVersion;

/// Which snapshot a list reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListAt {
    /// The current state, read consistently.
    Latest,
    /// The state at an exact resourceVersion, starting after `after` (namespace, name).
    Exact {
        rv: ResourceVersion,
        after: Option<(String, String)>,
    },
}

/// What to list.
#[derive(Clone, Debug)]
pub struct ListQuery {
    /// Restricts to one namespace; `None` lists all namespaces.
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// Page size; `None` returns everything.
    pub limit: Option<usize>,
    pub at: ListAt,
}

impl Default for ListQuery {
    fn default() -> Self {
        Self {
            namespace: None,
            labels: LabelSelector::default(),
            fields: FieldSelector::default(),
            limit: None,
            at: ListAt::Latest,
        }
    }
}

/// One page of a list.
#[derive(Clone, Debug)]
pub struct ObjectList<K> {
    pub items: Vec<K>,
    /// The snapshot the page was read at (the same on every page of one list).
    pub resource_version: ResourceVersion,
    /// Set when more items follow.
    pub continue_token: Option<String>,
}
