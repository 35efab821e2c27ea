//! The controller against Kubernetes: the in-process API of `tower-test`,
//! the real API server (etcd + kube-apiserver), and the opt-in end-to-end
//! run on a cluster. One test binary; a module per subject.

// A test may lock a mutex raw (clippy.toml refuses it elsewhere): a
// poisoned lock means another thread of the test panicked, which fails it.
#![allow(clippy::disallowed_methods)]

#[macro_use]
extern crate leasehold_testkit;

mod apiserver;
mod clusters;
mod controller;
mod e2e;
