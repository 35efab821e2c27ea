//! The flags that say how to reach the store, shared by `leasehold agent`,
//! `leasehold controller` and the operator commands so all read a password
//! or a CA the same way. A password belongs in a file (a mounted Secret),
//! not in the URL, where it would show in the pod spec and in `ps`. The
//! URL's scheme picks the store. Each flag keeps its older, deprecated
//! name ([`DeprecatedStoreArgs`]): charts and manifests in use set them.

use std::path::PathBuf;

use leasehold_engine::config::{DEFAULT_PREFIX, REPLICA_WAIT};
use leasehold_engine::{ConnectError, ReplicaAcks, Store};

use crate::error::FlagError;

/// How long the look at the store at start may take: a store that does not
/// answer within it is left to the calls' retries.
const START_CHECK: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// The store holding the engine's state. Redis: redis://[user[:password]@]host[:port][/db] (rediss:// for TLS); behind Sentinel redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/MASTER[/db]; a Redis Cluster redis+cluster://[user[:password]@]host[:port][,host[:port]...] (rediss+sentinel://, rediss+cluster:// for TLS). PostgreSQL: postgres://[user@]host[:port][,host[:port]...]/database[?target_session_attrs=read-write].
    #[arg(long, env = "LEASEHOLD_STORE_URL")]
    pub store_url: Option<String>,
    /// File holding the store's password (a mounted Secret); wins over a password in the URL.
    #[arg(long, env = "LEASEHOLD_STORE_PASSWORD_FILE")]
    pub store_password_file: Option<PathBuf>,
    /// Redis behind Sentinel only: file holding the sentinels' own password, when they require one (a redis+sentinel:// URL's password is the primary's).
    #[arg(long, env = "LEASEHOLD_STORE_SENTINEL_PASSWORD_FILE")]
    pub store_sentinel_password_file: Option<PathBuf>,
    /// PEM file of the CA that signed the store's certificate: a rediss:// server's, if not a public one; PostgreSQL's, which makes TLS required and checked (wins over the URL's sslrootcert).
    #[arg(long, env = "LEASEHOLD_STORE_CA_FILE")]
    pub store_ca_file: Option<PathBuf>,
    /// Key prefix in Redis, schema in PostgreSQL (the same for the controller and every agent).
    #[arg(long, env = "LEASEHOLD_PREFIX", default_value = DEFAULT_PREFIX)]
    pub prefix: String,
    /// Replicas a lease claim or renewal must reach before it counts: `all` (the default: every replica in sync; nothing to wait for without replicas), a number, or `off`.
    #[arg(long, env = "LEASEHOLD_STORE_REPLICA_ACKS", value_parser = parse_replica_acks)]
    pub store_replica_acks: Option<ReplicaAcks>,
    /// Longest wait for those replicas after one lease write, ms (1 to 10000, default 250); never more than half the call's bound (the retry interval).
    #[arg(long, env = "LEASEHOLD_STORE_REPLICA_WAIT_MS")]
    pub store_replica_wait_ms: Option<u64>,
    #[command(flatten)]
    pub deprecated: DeprecatedStoreArgs,
}

/// Where `--help` lists the older names.
const DEPRECATED: &str = "Deprecated names (still honoured; the new name wins)";

/// The store flags' older names, each with its variable.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DeprecatedStoreArgs {
    /// Deprecated: --store-url.
    #[arg(long, env = "LEASEHOLD_REDIS_URL", help_heading = DEPRECATED)]
    pub redis_url: Option<String>,
    /// Deprecated: --store-password-file.
    #[arg(long, env = "LEASEHOLD_REDIS_PASSWORD_FILE", help_heading = DEPRECATED)]
    pub redis_password_file: Option<PathBuf>,
    /// Deprecated: --store-sentinel-password-file.
    #[arg(long, env = "LEASEHOLD_REDIS_SENTINEL_PASSWORD_FILE", help_heading = DEPRECATED)]
    pub redis_sentinel_password_file: Option<PathBuf>,
    /// Deprecated: --store-ca-file.
    #[arg(long, env = "LEASEHOLD_REDIS_CA_FILE", help_heading = DEPRECATED)]
    pub redis_ca_file: Option<PathBuf>,
    /// Deprecated: --store-replica-acks.
    #[arg(long, env = "LEASEHOLD_REDIS_REPLICA_ACKS", help_heading = DEPRECATED, value_parser = parse_replica_acks)]
    pub redis_replica_acks: Option<ReplicaAcks>,
    /// Deprecated: --store-replica-wait-ms.
    #[arg(long, env = "LEASEHOLD_REDIS_REPLICA_WAIT_MS", help_heading = DEPRECATED)]
    pub redis_replica_wait_ms: Option<u64>,
}

/// A `--store-replica-acks` value that is none of the allowed ones.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a replica count: use all, off, or a whole number from 1 to 100")]
pub struct ReplicaAcksError(String);

/// `all`, `off`, or a whole number of replicas from 1 to 100.
fn parse_replica_acks(value: &str) -> Result<ReplicaAcks, ReplicaAcksError> {
    match value {
        "all" => Ok(ReplicaAcks::All),
        "off" | "0" => Ok(ReplicaAcks::Off),
        n => match n.parse::<u32>() {
            Ok(n @ 1..=100) => Ok(ReplicaAcks::AtLeast(n)),
            _ => Err(ReplicaAcksError(value.to_owned())),
        },
    }
}

fn read(flag: &'static str, path: Option<&PathBuf>) -> Result<Option<Vec<u8>>, FlagError> {
    path.map(|p| {
        std::fs::read(p)
            .map_err(|e| FlagError::worded(flag, format!("{flag} {}: {e}", p.display())))
    })
    .transpose()
}

impl StoreArgs {
    /// The store's URL; errors name each flag by its new name.
    pub fn url(&self) -> Result<&str, FlagError> {
        let url = self.store_url.as_ref();
        let url = url.or(self.deprecated.redis_url.as_ref());
        url.map(String::as_str).ok_or_else(|| FlagError::worded(
            "--store-url",
            "--store-url (or LEASEHOLD_STORE_URL) is required: the URL of the store (forms in --help)".to_owned(),
        ))
    }

    /// [`StoreArgs::connect`], then a look at the store now: one that
    /// refuses for a reason a retry will not cure (a database with
    /// bad credentials, without the right to create the schema, a
    /// standby, too old, or a schema of a newer leasehold) is an error at
    /// start that says which, naming the URL's flag; one that does not
    /// answer yet is normal weather, left to the calls' retries.
    pub async fn connect_checked(&self) -> Result<Store, FlagError> {
        let store = self.connect()?;
        let refusal = tokio::time::timeout(START_CHECK, store.refusal()).await;
        if let Ok(Some(why)) = refusal {
            return Err(FlagError::new("--store-url", why));
        }
        Ok(store)
    }

    /// Reads the files and prepares the (lazy) connection; an error names
    /// the flag at fault.
    pub fn connect(&self) -> Result<Store, FlagError> {
        let (url, old) = (self.url()?, &self.deprecated);
        let secret = |p: Vec<u8>| {
            String::from_utf8_lossy(&p)
                .trim_end_matches(['\r', '\n'])
                .to_owned()
        };
        let password = self.store_password_file.as_ref();
        let password = password.or(old.redis_password_file.as_ref());
        let password = read("--store-password-file", password)?.map(secret);
        let sentinel = self.store_sentinel_password_file.as_ref();
        let sentinel = sentinel.or(old.redis_sentinel_password_file.as_ref());
        let sentinel_password = read("--store-sentinel-password-file", sentinel)?.map(secret);
        if sentinel_password.is_some() && !url.contains("+sentinel://") {
            return Err(FlagError::worded(
                "--store-sentinel-password-file",
                "--store-sentinel-password-file is used only with a redis+sentinel:// or rediss+sentinel:// --store-url".to_owned(),
            ));
        }
        let ca = self.store_ca_file.as_ref().or(old.redis_ca_file.as_ref());
        let ca = read("--store-ca-file", ca)?;
        let acks = self.store_replica_acks.or(old.redis_replica_acks);
        let wait = self.store_replica_wait_ms.or(old.redis_replica_wait_ms);
        let wait = wait.unwrap_or(REPLICA_WAIT.as_millis() as u64);
        if !(1..=10_000).contains(&wait) {
            return Err(FlagError::worded(
                "--store-replica-wait-ms",
                format!("--store-replica-wait-ms = {wait} is out of range: it must be a whole number of milliseconds from 1 to 10000"),
            ));
        }
        let options = leasehold_engine::ConnectOptions {
            password: password.as_deref(),
            ca_pem: ca.as_deref(),
            sentinel_password: sentinel_password.as_deref(),
        };
        let store =
            Store::connect_with_options(url, &self.prefix, options).map_err(|e| match e {
                ConnectError::Prefix(e) => FlagError::new("--prefix", e),
                // A CA file that is no CA, or given for a URL without TLS.
                e @ ConnectError::Ca(_) if ca.is_some() => FlagError::new("--store-ca-file", e),
                e => FlagError::new("--store-url", e),
            })?;
        let wait = std::time::Duration::from_millis(wait);
        Ok(store.with_replica_acks(acks.unwrap_or(ReplicaAcks::All), wait))
    }
}
