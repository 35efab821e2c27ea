//! Checks of the repository's files without servers: the chart, the CRD,
//! the examples, and the crate and module layering. One test binary; a
//! module per subject.

mod boundary;
mod chart;
mod crd;
mod examples;
mod layers;
mod modules;
mod monitoring;
