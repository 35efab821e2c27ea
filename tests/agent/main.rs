//! The `leasehold` binary as a user runs it: the agent's processes and
//! local API (leadership and messaging), exec mode with a stalled agent,
//! the operator commands, and the demo. One test binary; a module per subject.

#[macro_use]
extern crate leasehold_testkit;

mod agent;
mod agent_messaging;
mod cli;
mod demo;
mod stall;
