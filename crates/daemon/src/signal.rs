//! Process signals: SIGTERM (what Kubernetes sends) and SIGINT (Ctrl-C) both
//! ask for a graceful stop, which releases leases instead of letting them
//! expire.

use std::future::Future;

/// A future that resolves on the first SIGTERM or SIGINT. The handlers are
/// installed when this is called, not when the future is first polled, so a
/// signal that arrives in between is not missed. Call it inside the runtime.
pub fn shutdown() -> impl Future<Output = ()> + Send + Sync + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let listeners = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        );
        async move {
            let (Ok(mut term), Ok(mut int)) = listeners else {
                return std::future::pending().await;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
