//! Counts the renewals' hints to followers on Redis: what renew.lua
//! publishes on a group's release channel (`P:g:{G}:released`) when a
//! renewal tells the followers how long the lease stands
//! (docs/behaviour.md X1).

/// How a hint starts (renew.lua); releases publish the holder's id, which
/// holds no spaces.
const RENEWAL_HINT: &[u8] = b"renewed ";

/// The renewals' hints to followers seen since [`RenewalHints::start`].
/// `INFO commandstats` counts them under PUBLISH as if a client had
/// published, but renew.lua sends them: commands inside a script, not
/// calls, so the cost scenario takes them off its client calls.
/// PostgreSQL renewals send none.
pub struct RenewalHints {
    seen: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl RenewalHints {
    /// Listens on the release channels of every group under `prefix`;
    /// `None` on PostgreSQL.
    pub async fn start(url: &str, prefix: &str) -> anyhow::Result<Option<Self>> {
        use futures::StreamExt;
        if leasehold_engine::store::postgres::is_postgres_url(url) {
            return Ok(None);
        }
        let client = redis::Client::open(url).map_err(anyhow::Error::msg)?;
        let mut pubsub = client
            .get_async_pubsub()
            .await
            .map_err(anyhow::Error::msg)?;
        pubsub
            .psubscribe(format!("{prefix}:g:*:released"))
            .await
            .map_err(anyhow::Error::msg)?;
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = seen.clone();
        let task = tokio::spawn(async move {
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                if message.get_payload_bytes().starts_with(RENEWAL_HINT) {
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        Ok(Some(Self { seen, task }))
    }

    pub fn seen(&self) -> u64 {
        self.seen.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for RenewalHints {
    fn drop(&mut self) {
        self.task.abort();
    }
}
