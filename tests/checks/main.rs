//! Checks of the repository's files without servers: the chart, the CRD,
//! the examples, the crate and module layering, the map of the code, and
//! the error types. One test binary; a
//! module per subject.

mod architecture;
mod boundary;
mod chart;
mod crd;
mod errors;
mod examples;
mod layers;
mod modules;
mod monitoring;
mod replies;
