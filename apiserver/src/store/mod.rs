//! Storage: the port the HTTP layer uses ([`Store`] in `port.rs`, with its error in
//! `error.rs`, list queries in `query.rs`, streamed lists in `raw.rs`, resourceVersions in
//! `rv.rs`), the one generic write transaction (`transact.rs`), the watch fan-out
//! (`fanout.rs`), the in-memory store (`memory.rs`) and the PostgreSQL adapter (`pg/`).
//!
//! All SQL of the apiserver lives under `pg/`; nothing outside it knows PostgreSQL. This file
//! only names the modules and what they export: modules import each other directly, never
//! through it, so their imports form no circle.

mod error;
mod fanout;
mod memory;
mod pg;
mod port;
mod query;
mod raw;
pub mod rv;
mod transact;

pub use error::{Result, StoreError};
pub use fanout::{Event, EventRenderings, EventType, FeedMetrics, Subscription};
pub use memory::MemoryStore;
pub use pg::connect::{parse_dsn, ConnectError, PgTls, SessionLimits, SslMode};
pub use pg::migrate::apply_migrations;
pub use pg::tail::FEED_APPLICATION_NAME;
pub use pg::{ListMetrics, PgStore, StoreConfig, NEXT_SESSION_EXPIRY_SQL};
pub use port::{now, Preconditions, SessionChanges, SessionEvent, SessionSignals, Store, Written};
pub use query::{ListAt, ListQuery, ObjectList};
pub use raw::{RawItems, RawList};

pub(crate) use port::fold_earliest;
pub use rv::{ContinueToken, ResourceVersion};
pub use transact::{collect_completed_enrollments, transact, EXPIRY_BATCH};

pub use apis::locks::RevokerAuthority;
pub use apis::strategy::{Context, Refusal, Requester, Withdrawal};
