//! REST verbs on a resource: the reads (get, list) in `read.rs`, the writes (create,
//! update, patch, delete, deletecollection, status) in `write.rs`, server-side apply in
//! `apply.rs`; the request they take in `request.rs`, the object a write sends in
//! `object.rs`. Watch lives in `http/watch.rs`.

mod apply;
mod object;
mod read;
mod request;
mod write;

pub use apply::is_apply;
pub use read::{get, list};
pub use request::ResourceRequest;
pub use write::{create, delete, delete_collection, patch, update, update_status};
