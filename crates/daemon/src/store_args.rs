//! The flags that say how to reach the store, shared by `leasehold agent`,
//! `leasehold controller` and the operator commands so all read a password
//! or a CA the same way. A password belongs in a file (a mounted Secret),
//! not in the URL, where it would show in the pod spec and in `ps`. The
//! URL's scheme picks the store. Each flag keeps its older, deprecated
//! names, which charts and manifests in use set: the flag's as a clap
//! alias, its variable through [`adopt_deprecated_variables`].

use std::path::PathBuf;

use leasehold_engine::config::{DEFAULT_PREFIX, REPLICA_WAIT};
use leasehold_engine::{ConnectError, ReplicaAcks, Store};

use crate::error::FlagError;

/// How long the look at the store at start may take: a store that does not
/// answer within it is left to the calls' retries.
const START_CHECK: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// The store holding the engine's state. Redis: redis://[user[:password]@]host[:port][/db] (rediss:// for TLS); behind Sentinel redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/MASTER[/db]; a Redis Cluster redis+cluster://[user[:password]@]host[:port][,host[:port]...] (rediss+sentinel://, rediss+cluster:// for TLS). PostgreSQL: postgres://[user@]host[:port][,host[:port]...]/database[?target_session_attrs=read-write]. Deprecated names: --redis-url, LEASEHOLD_REDIS_URL.
    #[arg(long, alias = "redis-url", env = "LEASEHOLD_STORE_URL")]
    pub store_url: Option<String>,
    /// File holding the store's password (a mounted Secret); wins over a password in the URL. Deprecated names: --redis-password-file, LEASEHOLD_REDIS_PASSWORD_FILE.
    #[arg(long, env = "LEASEHOLD_STORE_PASSWORD_FILE")]
    #[arg(alias = "redis-password-file")]
    pub store_password_file: Option<PathBuf>,
    /// Redis behind Sentinel only: file holding the sentinels' own password, when they require one (a redis+sentinel:// URL's password is the primary's). Deprecated names: --redis-sentinel-password-file, LEASEHOLD_REDIS_SENTINEL_PASSWORD_FILE.
    #[arg(long, env = "LEASEHOLD_STORE_SENTINEL_PASSWORD_FILE")]
    #[arg(alias = "redis-sentinel-password-file")]
    pub store_sentinel_password_file: Option<PathBuf>,
    /// PEM file of the CA that signed the store's certificate: a rediss:// server's, if not a public one; PostgreSQL's, which makes TLS required and checked (wins over the URL's sslrootcert). Deprecated names: --redis-ca-file, LEASEHOLD_REDIS_CA_FILE.
    #[arg(long, alias = "redis-ca-file", env = "LEASEHOLD_STORE_CA_FILE")]
    pub store_ca_file: Option<PathBuf>,
    /// Key prefix in Redis, schema in PostgreSQL (the same for the controller and every agent).
    #[arg(long, env = "LEASEHOLD_PREFIX", default_value = DEFAULT_PREFIX)]
    pub prefix: String,
    /// Replicas a lease claim or renewal must reach before it counts: `all` (the default: every replica in sync; nothing to wait for without replicas), a number, or `off`. Deprecated names: --redis-replica-acks, LEASEHOLD_REDIS_REPLICA_ACKS.
    #[arg(long, alias = "redis-replica-acks", env = "LEASEHOLD_STORE_REPLICA_ACKS", value_parser = parse_replica_acks)]
    pub store_replica_acks: Option<ReplicaAcks>,
    /// Longest wait for those replicas after one lease write, ms (1 to 10000, default 250); never more than half the call's bound (the retry interval). Deprecated names: --redis-replica-wait-ms, LEASEHOLD_REDIS_REPLICA_WAIT_MS.
    #[arg(long, env = "LEASEHOLD_STORE_REPLICA_WAIT_MS")]
    #[arg(alias = "redis-replica-wait-ms")]
    pub store_replica_wait_ms: Option<u64>,
}

/// The store flags' variables (LEASEHOLD_STORE_*) by their deprecated names.
const DEPRECATED_VARIABLES: [&str; 6] = [
    "LEASEHOLD_REDIS_URL",
    "LEASEHOLD_REDIS_PASSWORD_FILE",
    "LEASEHOLD_REDIS_SENTINEL_PASSWORD_FILE",
    "LEASEHOLD_REDIS_CA_FILE",
    "LEASEHOLD_REDIS_REPLICA_ACKS",
    "LEASEHOLD_REDIS_REPLICA_WAIT_MS",
];

/// Sets each store flag's unset variable from its deprecated name, so that
/// clap keeps its order for the old names too: a flag by either name, then
/// its variable, then the deprecated one; the two set to different values
/// are refused, naming both. Before clap and any thread: it sets variables.
pub fn adopt_deprecated_variables() -> Result<(), FlagError> {
    for old in DEPRECATED_VARIABLES {
        let new = old.replace("LEASEHOLD_REDIS_", "LEASEHOLD_STORE_");
        match (std::env::var_os(&new), std::env::var_os(old)) {
            (Some(n), Some(o)) if n != o => {
                let why = format!("{new} and {old} (its deprecated name) are set to different values: set {new} only");
                return Err(FlagError::worded(old, why));
            }
            (None, Some(o)) => std::env::set_var(new, o),
            _ => {}
        }
    }
    Ok(())
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
    /// the flag at fault, by its new name.
    pub fn connect(&self) -> Result<Store, FlagError> {
        let url = self.store_url.as_deref().ok_or_else(|| FlagError::worded(
            "--store-url",
            "--store-url (or LEASEHOLD_STORE_URL) is required: the URL of the store (forms in --help)".to_owned(),
        ))?;
        let secret = |p: Vec<u8>| {
            String::from_utf8_lossy(&p)
                .trim_end_matches(['\r', '\n'])
                .to_owned()
        };
        let password = self.store_password_file.as_ref();
        let password = read("--store-password-file", password)?.map(secret);
        let sentinel = self.store_sentinel_password_file.as_ref();
        let sentinel_password = read("--store-sentinel-password-file", sentinel)?.map(secret);
        if sentinel_password.is_some() && !url.contains("+sentinel://") {
            return Err(FlagError::worded(
                "--store-sentinel-password-file",
                "--store-sentinel-password-file is used only with a redis+sentinel:// or rediss+sentinel:// --store-url".to_owned(),
            ));
        }
        let ca = read("--store-ca-file", self.store_ca_file.as_ref())?;
        let wait = self
            .store_replica_wait_ms
            .unwrap_or(REPLICA_WAIT.as_millis() as u64);
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
        Ok(store.with_replica_acks(self.store_replica_acks.unwrap_or(ReplicaAcks::All), wait))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        store: StoreArgs,
    }

    fn parse(args: &[&str]) -> Result<StoreArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("leasehold").chain(args.iter().copied()))
            .map(|cli| cli.store)
    }

    #[test]
    fn each_deprecated_flag_is_its_new_flag() {
        let args = parse(&[
            "--redis-url=redis://a",
            "--redis-password-file",
            "/pw",
            "--redis-sentinel-password-file=/spw",
            "--redis-ca-file=/ca",
            "--redis-replica-acks=2",
            "--redis-replica-wait-ms=40",
        ])
        .unwrap();
        assert_eq!(args.store_url.as_deref(), Some("redis://a"));
        assert_eq!(args.store_password_file, Some("/pw".into()));
        assert_eq!(args.store_sentinel_password_file, Some("/spw".into()));
        assert_eq!(args.store_ca_file, Some("/ca".into()));
        assert_eq!(args.store_replica_acks, Some(ReplicaAcks::AtLeast(2)));
        assert_eq!(args.store_replica_wait_ms, Some(40));
    }

    #[test]
    fn a_flag_given_by_both_names_is_refused() {
        for (new, old) in [
            ("--store-url=redis://a", "--redis-url=redis://b"),
            ("--store-ca-file=/a", "--redis-ca-file=/b"),
            ("--redis-replica-acks=1", "--store-replica-acks=2"),
        ] {
            let err = parse(&[new, old]).unwrap_err();
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{err}"
            );
            assert!(
                err.to_string().contains("cannot be used multiple times"),
                "{err}"
            );
        }
    }

    #[test]
    fn each_deprecated_variable_is_a_store_flags_under_its_old_name() {
        let flags: Vec<String> = <Cli as clap::CommandFactory>::command()
            .get_arguments()
            .filter_map(|a| {
                a.get_env()?
                    .to_str()?
                    .strip_prefix("LEASEHOLD_STORE_")
                    .map(str::to_owned)
            })
            .collect();
        let old: Vec<&str> = DEPRECATED_VARIABLES
            .iter()
            .map(|v| {
                v.strip_prefix("LEASEHOLD_REDIS_")
                    .expect("a LEASEHOLD_REDIS_ name")
            })
            .collect();
        assert_eq!(flags, old);
    }
}
