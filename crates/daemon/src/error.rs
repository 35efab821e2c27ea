//! Why a long-running leasehold process could not start. Every message
//! names the flag (or environment variable) at fault and what it accepts,
//! because it is read by the person who set it.

use std::net::SocketAddr;

/// A refused flag. `flag` names it for programs; the message says, for
/// people, what was wrong and what is allowed.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct FlagError {
    pub flag: &'static str,
    pub message: String,
}

impl FlagError {
    /// An error whose message starts with the flag's name.
    pub fn new(flag: &'static str, reason: impl std::fmt::Display) -> Self {
        Self {
            flag,
            message: format!("{flag}: {reason}"),
        }
    }

    /// An error whose message already names the flag.
    pub fn worded(flag: &'static str, message: impl Into<String>) -> Self {
        Self {
            flag,
            message: message.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Flag(#[from] FlagError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Node(#[from] leasehold_engine::Error),
}
