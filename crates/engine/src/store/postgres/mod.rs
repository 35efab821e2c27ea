//! The PostgreSQL store: leases, terms, the node registry and the inboxes
//! in tables of one schema (the prefix), every read-compare-write one
//! statement or one call of a function of that schema (sql/v1.sql), with
//! the database's clock. Wake-ups come through LISTEN/NOTIFY on one
//! connection per process (listener.rs); commands share one pipelined
//! connection (session.rs), made on first use and made again after it
//! failed, each time checked and migrated as at start. The handle is
//! [`PgStore`] (handle.rs); the operations are in lease.rs, registry.rs and
//! messaging.rs.
//!
//! Every check at start changes nothing when it fails: the credentials,
//! the server's version and role (a standby is refused) are read before the
//! schema is touched, and the schema is created or migrated in one
//! transaction under an advisory lock.

mod endpoint;
mod error;
mod handle;
mod history;
mod lease;
mod listener;
mod messaging;
mod registry;
mod schema;
mod session;

pub use endpoint::TlsError;
pub use error::{PgStartError, Target, MAX_PREFIX_BYTES};
pub use handle::{is_postgres_url, PgStore};
pub use history::History;
pub(crate) use messaging::PgReader;
#[cfg(feature = "test-hooks")]
pub use schema::rendered as schema_migration;
pub use schema::SCHEMA_VERSION;
pub use session::MIN_SERVER_VERSION;
