//! leasehold's Kubernetes side: the `LeaderGroup` resource ([`crd`]), the
//! pure rules that turn the engine's state in the store into pod labels and
//! status ([`plan`]), the I/O around them ([`reconcile`]) and the
//! controller process ([`run`]). It depends on the engine; the engine and
//! the agent never depend on it.
// Production code only (clippy.toml sets the length); a test reads as one scenario.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod conditions;
pub mod crd;
pub mod endpoint;
pub mod endpoint_writer;
pub mod event_log;
pub mod label_writes;
pub mod memory;
pub mod metrics;
pub mod neighbourhood;
pub mod placement;
pub mod plan;
pub mod pod_status;
pub mod pods;
pub mod reconcile;
pub mod run;
pub mod selector;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;
