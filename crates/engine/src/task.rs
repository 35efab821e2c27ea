//! The engine's loops run as tasks that are aborted when their handle is
//! dropped (tokio-util's `AbortOnDropHandle`), so that dropping an engine
//! handle without closing it stops its loops, like a crash would.

use std::future::Future;

use tokio_util::task::AbortOnDropHandle;

pub(crate) type Task = AbortOnDropHandle<()>;

pub(crate) fn spawn(future: impl Future<Output = ()> + Send + 'static) -> Task {
    AbortOnDropHandle::new(tokio::spawn(future))
}
