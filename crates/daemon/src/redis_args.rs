//! The flags that say how to reach the store (Redis or PostgreSQL), shared
//! by `leasehold agent`, `leasehold controller` and the operator commands
//! so all read a password or a CA the same way. A password belongs in a
//! file (a mounted Secret), not in the URL, where it would show in the pod
//! spec and in `ps`. The URL's scheme picks the store: `--store-url`, or
//! `--redis-url` by its older name (both kept: charts and manifests in use
//! set `LEASEHOLD_REDIS_URL`).

use std::path::PathBuf;

use leasehold_engine::config::{DEFAULT_PREFIX, REPLICA_WAIT};
use leasehold_engine::store::postgres::{PgStartError, TlsError};
use leasehold_engine::{ReplicaAcks, Store};

use crate::error::FlagError;

/// How long the look at the store at start may take: a store that does not
/// answer within it is left to the calls' retries.
const START_CHECK: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, Clone, clap::Args)]
pub struct RedisArgs {
    /// The store holding the engine's state. Redis: redis://[user[:password]@]host[:port][/db] (rediss:// for TLS); behind Sentinel redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/MASTER[/db]; a Redis Cluster redis+cluster://[user[:password]@]host[:port][,host[:port]...] (rediss+sentinel://, rediss+cluster:// for TLS). PostgreSQL: postgres://[user@]host[:port][,host[:port]...]/database[?target_session_attrs=read-write].
    #[arg(long, env = "LEASEHOLD_STORE_URL")]
    pub store_url: Option<String>,
    /// The same as --store-url, by its older name.
    #[arg(long, env = "LEASEHOLD_REDIS_URL")]
    pub redis_url: Option<String>,
    /// File holding the store's password (a mounted Secret); wins over a password in the URL.
    #[arg(
        long,
        visible_alias = "store-password-file",
        env = "LEASEHOLD_REDIS_PASSWORD_FILE"
    )]
    pub redis_password_file: Option<PathBuf>,
    /// File holding the sentinels' own password, when they require one (a redis+sentinel:// URL's password is the primary's).
    #[arg(long, env = "LEASEHOLD_REDIS_SENTINEL_PASSWORD_FILE")]
    pub redis_sentinel_password_file: Option<PathBuf>,
    /// PEM file of the CA that signed the store's certificate: a rediss:// server's, if not a public one; PostgreSQL's, which makes TLS required and checked (wins over the URL's sslrootcert).
    #[arg(long, visible_alias = "store-ca-file", env = "LEASEHOLD_REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,
    /// Key prefix in Redis, schema in PostgreSQL (the same for the controller and every agent).
    #[arg(long, env = "LEASEHOLD_PREFIX", default_value = DEFAULT_PREFIX)]
    pub prefix: String,
    /// Replicas a lease claim or renewal must reach before it counts: `all` (every replica in sync; nothing to wait for without replicas), a number, or `off`.
    #[arg(long, env = "LEASEHOLD_REDIS_REPLICA_ACKS", default_value = "all", value_parser = parse_replica_acks)]
    pub redis_replica_acks: ReplicaAcks,
    /// Longest wait for those replicas after one lease write, ms (1 to 10000); never more than half the call's bound (the retry interval).
    #[arg(long, env = "LEASEHOLD_REDIS_REPLICA_WAIT_MS", default_value_t = REPLICA_WAIT.as_millis() as u64)]
    pub redis_replica_wait_ms: u64,
}

/// A `--redis-replica-acks` value that is none of the allowed ones.
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

fn read(flag: &'static str, path: &Option<PathBuf>) -> Result<Option<Vec<u8>>, FlagError> {
    path.as_ref()
        .map(|p| {
            std::fs::read(p)
                .map_err(|e| FlagError::worded(flag, format!("{flag} {}: {e}", p.display())))
        })
        .transpose()
}

impl RedisArgs {
    /// The store's URL, from either flag.
    pub fn url(&self) -> Result<&str, FlagError> {
        match (&self.store_url, &self.redis_url) {
            (Some(a), Some(b)) if a != b => Err(FlagError::worded(
                "--store-url",
                "--store-url and --redis-url name different stores: give one of them".to_owned(),
            )),
            (Some(url), _) | (None, Some(url)) => Ok(url),
            (None, None) => Err(FlagError::worded(
                "--store-url",
                "--store-url (or LEASEHOLD_STORE_URL) is required: the Redis or PostgreSQL URL of the store".to_owned(),
            )),
        }
    }

    /// [`RedisArgs::connect`], then a look at the store now: one that
    /// refuses for a reason a retry will not cure (a PostgreSQL database
    /// with bad credentials, without the right to create the schema, a
    /// standby, too old, or a schema of a newer leasehold) is an error at
    /// start that says which, naming the URL's flag; one that does not
    /// answer yet is normal weather, left to the calls' retries.
    pub async fn connect_checked(&self) -> Result<Store, FlagError> {
        let store = self.connect()?;
        let refusal = tokio::time::timeout(START_CHECK, store.refusal()).await;
        if let Ok(Some(why)) = refusal {
            let flag = self.url_flag();
            return Err(FlagError::worded(flag, format!("{flag}: {why}")));
        }
        Ok(store)
    }

    /// The URL's flag by the name it was given.
    fn url_flag(&self) -> &'static str {
        if self.store_url.is_some() {
            "--store-url"
        } else {
            "--redis-url"
        }
    }

    /// Reads the files and prepares the (lazy) connection; an error names
    /// the flag at fault.
    pub fn connect(&self) -> Result<Store, FlagError> {
        let url = self.url()?;
        let url_flag = self.url_flag();
        let secret = |p: Vec<u8>| {
            String::from_utf8_lossy(&p)
                .trim_end_matches(['\r', '\n'])
                .to_owned()
        };
        let password = read("--redis-password-file", &self.redis_password_file)?.map(secret);
        let sentinel_password = read(
            "--redis-sentinel-password-file",
            &self.redis_sentinel_password_file,
        )?
        .map(secret);
        if sentinel_password.is_some() && !url.contains("+sentinel://") {
            return Err(FlagError::worded(
                "--redis-sentinel-password-file",
                "--redis-sentinel-password-file is used only with a redis+sentinel:// or rediss+sentinel:// --redis-url".to_owned(),
            ));
        }
        let ca = read("--redis-ca-file", &self.redis_ca_file)?;
        if !(1..=10_000).contains(&self.redis_replica_wait_ms) {
            return Err(FlagError::worded(
                "--redis-replica-wait-ms",
                format!(
                    "--redis-replica-wait-ms = {} is out of range: it must be a whole number of milliseconds from 1 to 10000",
                    self.redis_replica_wait_ms
                ),
            ));
        }
        let options = leasehold_engine::ConnectOptions {
            password: password.as_deref(),
            ca_pem: ca.as_deref(),
            sentinel_password: sentinel_password.as_deref(),
        };
        let store =
            Store::connect_with_options(url, &self.prefix, options).map_err(|e| match e {
                leasehold_engine::ConnectError::Prefix(e) => FlagError::new("--prefix", e),
                e @ (leasehold_engine::ConnectError::CaWithoutTls
                | leasehold_engine::ConnectError::InvalidCa(_)) => {
                    FlagError::new("--redis-ca-file", e)
                }
                // A CA file that is no CA, or one given with sslmode=disable.
                leasehold_engine::ConnectError::Postgres(e)
                    if ca.is_some()
                        && matches!(
                            *e,
                            PgStartError::Tls {
                                source: TlsError::InvalidCa(_) | TlsError::CaWithoutTls,
                                ..
                            }
                        ) =>
                {
                    FlagError::new("--redis-ca-file", e)
                }
                e => FlagError::new(url_flag, e),
            })?;
        Ok(store.with_replica_acks(
            self.redis_replica_acks,
            std::time::Duration::from_millis(self.redis_replica_wait_ms),
        ))
    }
}
