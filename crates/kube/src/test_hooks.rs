//! Points where leasehold's own tests stop the controller process (feature
//! `test-hooks`, which only a test build has). A signal sent from outside
//! lands wherever the process happens to be; a race the tests must show,
//! such as a label patch sent after the replica's lease ran out, needs the
//! process stopped at one exact line.

use std::ffi::OsString;
use std::path::PathBuf;

use nix::sys::signal::{raise, Signal};

/// The environment variable naming the file that arms
/// [`before_label_patch`].
pub const STOP_BEFORE_LABEL: &str = "LEASEHOLD_TEST_STOP_BEFORE_LABEL";

/// Stops the whole process with SIGSTOP, once, when the file that
/// [`STOP_BEFORE_LABEL`] names exists and its text names this patch's
/// value (`leader`, `follower`, `null`; empty text: any patch). Called
/// after the leadership check and before the patch, so a test can let the
/// lease lapse, and a successor write, in between. Stopping the process,
/// not one task, is what a frozen replica is: nothing of it runs, its
/// lease renewals included. Before stopping it removes the arming file and
/// writes `POD KEY=VALUE` into the file's name with `.stopped` added, so
/// the test knows which patch is held.
pub fn before_label_patch(pod: &str, key: &str, value: Option<&str>) {
    let Some(armed) = std::env::var_os(STOP_BEFORE_LABEL).map(PathBuf::from) else {
        return;
    };
    let Ok(wanted) = std::fs::read_to_string(&armed) else {
        return;
    };
    let value = value.unwrap_or("null");
    let wanted = wanted.trim();
    if !wanted.is_empty() && wanted != value {
        return;
    }
    let mut stopped = OsString::from(armed.as_os_str());
    stopped.push(".stopped");
    if let Err(e) = std::fs::write(&stopped, format!("{pod} {key}={value}\n")) {
        tracing::warn!(error = %e, "test hook: could not say where it stopped");
    }
    if let Err(e) = std::fs::remove_file(&armed) {
        tracing::warn!(error = %e, "test hook: could not disarm");
    }
    tracing::warn!(%pod, %key, %value, "test hook: stopping the process before this label patch");
    if let Err(e) = raise(Signal::SIGSTOP) {
        tracing::warn!(error = %e, "test hook: could not stop");
    }
}
