//! Two small things every crate of the project shares: the one policy for
//! a poisoned mutex, and the local wall clock in milliseconds.
//!
//! Mutexes are std's, locked only through [`locked`] (clippy.toml refuses
//! `Mutex::lock` elsewhere; a test crate may allow it). parking_lot would
//! change every mutex's type and add a dependency, for nothing this lacks.

/// The project's one policy for a poisoned mutex: go on with the data.
/// Every critical section leaves it consistent (plain assignments), so a
/// panic in another task must not take the process down with it.
#[allow(clippy::disallowed_methods)] // The one place `Mutex::lock` is called.
pub fn locked<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Milliseconds since the Unix epoch on this machine's clock: for what is
/// shown to people and for local bookkeeping, never for a lease (leases
/// run on the store's clock). 0 if the clock is set before 1970.
pub fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
