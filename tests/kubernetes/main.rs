//! The controller against Kubernetes: the in-process API of `tower-test`,
//! the real API server (etcd + kube-apiserver), and the opt-in end-to-end
//! run on a cluster. One test binary; a module per subject.

#[macro_use]
extern crate leasehold_testkit;

mod apiserver;
mod controller;
mod e2e;
