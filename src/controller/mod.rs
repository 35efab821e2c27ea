//! The Kubernetes side: the `LeaderGroup` resource, and the rules that turn
//! the engine's state in Redis into pod labels and status ([`plan`]).
//! Everything here depends on the engine; the engine never depends on it.

pub mod crd;
pub mod plan;
pub mod reconcile;
pub mod run;
pub mod selector;
