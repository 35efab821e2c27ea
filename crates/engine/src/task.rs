//! A spawned task that is aborted when its handle is dropped, so that dropping
//! an engine handle without closing it stops its loops, like a crash would.

use std::future::Future;

use tokio::task::JoinHandle;

pub(crate) struct Task(JoinHandle<()>);

impl Task {
    pub fn spawn(future: impl Future<Output = ()> + Send + 'static) -> Self {
        Self(tokio::spawn(future))
    }

    /// Waits for the task to end by itself.
    pub async fn join(mut self) {
        let _ = (&mut self.0).await;
    }

    pub fn abort(&self) {
        self.0.abort();
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}
