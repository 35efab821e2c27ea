//! TLS to either store, with a CA made for the test by the `openssl`
//! command. `rediss://` against a real redis-server with TLS on: both
//! connections of a node (commands and pub/sub) go over TLS, and a
//! step-down handover in milliseconds, with a retry interval of seconds,
//! shows the pub/sub one works too. PostgreSQL with `ssl = on`: every
//! connection of a node encrypted, and the certificate checked as libpq's
//! `sslmode` says.

use leasehold_testkit as testkit;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_engine::{ConnectOptions, ElectionConfig, Node, Store};
use testkit::{eventually, node_config, one_leader};

struct TlsRedis {
    dir: PathBuf,
    port: u16,
    child: Child,
}

impl TlsRedis {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("leasehold-tls-{:x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        testkit::make_certificates(&dir).unwrap_or_else(|e| panic!("{e}"));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .args([
                "--tls-cert-file",
                "srv.pem",
                "--tls-key-file",
                "srv.key",
                "--tls-ca-cert-file",
                "ca.pem",
            ])
            .args([
                "--tls-auth-clients",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "TLS redis-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        // An established store, as in testkit::RedisServer (see claim.lua).
        let set = Command::new("redis-cli")
            .args(["--tls", "--cacert", "ca.pem", "-h", "localhost"])
            .args([
                "-p",
                &port.to_string(),
                "MSET",
                "lh:born",
                "0",
                "lh:epoch",
                "0",
            ])
            .current_dir(&dir)
            .output()
            .expect("redis-cli");
        assert_eq!(String::from_utf8_lossy(&set.stdout).trim(), "OK");
        Self { dir, port, child }
    }

    fn url(&self) -> String {
        format!("rediss://localhost:{}", self.port)
    }

    fn ca(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("ca.pem")).unwrap()
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca_works_end_to_end() {
    let redis = TlsRedis::start();
    let cfg = ElectionConfig {
        ttl_ms: 10_000,
        renew_interval_ms: 1_000,
        retry_interval_ms: 5_000,
    };
    let ca = redis.ca();
    let options = || ConnectOptions {
        ca_pem: Some(&ca),
        ..ConnectOptions::default()
    };
    let store = || Store::connect_with_options(&redis.url(), "lh", options()).unwrap();
    store().ping().await.unwrap();
    let a = Node::start(store(), "test/a", node_config()).await.unwrap();
    let b = Node::start(store(), "test/b", node_config()).await.unwrap();
    let ga = a.join("test/g", cfg).unwrap();
    let gb = b.join("test/g", cfg).unwrap();
    let leader = one_leader(&[&ga, &gb], Duration::from_secs(12)).await;
    let (nodes, groups) = ([&a, &b], [&ga, &gb]);
    eventually(Duration::from_secs(12), "the other follows", || {
        matches!(
            groups[1 - leader].role().borrow().clone(),
            leasehold_engine::Role::Follower { .. }
        )
    })
    .await;
    let start = Instant::now();
    nodes[leader].step_down("test/g").await.unwrap();
    eventually(
        Duration::from_millis(500),
        "handover over TLS pub/sub",
        || groups[1 - leader].is_leader(),
    )
    .await;
    assert!(start.elapsed() < Duration::from_millis(500));
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_an_untrusted_certificate_is_an_error_not_a_panic() {
    let redis = TlsRedis::start();
    let store = Store::connect(&redis.url(), "lh").unwrap();
    let err = tokio::time::timeout(Duration::from_secs(5), store.ping())
        .await
        .expect("answers")
        .unwrap_err()
        .to_string();
    assert!(err.to_lowercase().contains("certificate"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tls_checks_the_certificate_as_sslmode_says() {
    use leasehold_engine::store::postgres::PgStore;
    use testkit::postgres::LocalPostgres;
    if let Some(why) = testkit::postgres::missing() {
        testkit::lacks(
            "postgres_tls_checks_the_certificate_as_sslmode_says",
            testkit::Part::Postgres,
            &why,
        );
        return;
    }
    let (pg, ca) = LocalPostgres::start_with_tls().expect("postgres with TLS starts");
    let at =
        |host: &str, query: &str| format!("postgres://postgres@{host}:{}/postgres{query}", pg.port);
    let dir = std::env::temp_dir().join(format!("leasehold-pgtls-{:x}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let rootcert = format!("sslrootcert={}", ca_file.display());

    // The CA given as the processes' --store-ca-file gives it: TLS, the
    // certificate checked for the host name; a node leads over it.
    let options = ConnectOptions {
        ca_pem: Some(&ca),
        ..ConnectOptions::default()
    };
    let store = Store::connect_with_options(&at("localhost", ""), "lh", options).unwrap();
    let node = Node::start(store, "test/a", node_config()).await.unwrap();
    let cfg = ElectionConfig {
        ttl_ms: 2_000,
        renew_interval_ms: 500,
        retry_interval_ms: 500,
    };
    let g = node.join("test/g", cfg).unwrap();
    eventually(Duration::from_secs(5), "a leads over TLS", || g.is_leader()).await;
    // Every connection of the node (commands, the listener) is encrypted.
    let connections = "SELECT count(*) FILTER (WHERE NOT s.ssl) || ',' || count(*) \
         FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'leasehold'";
    let counts = pg.psql(connections).unwrap();
    let (plain, all) = counts.split_once(',').unwrap();
    assert!(
        plain == "0" && all.parse::<u32>().unwrap() >= 2,
        "plain,all = {counts}"
    );
    node.close().await.unwrap();

    // The URL's own sslrootcert, libpq's way.
    PgStore::open(
        &at("localhost", &format!("?sslmode=verify-full&{rootcert}")),
        "lh",
    )
    .await
    .expect("verify-full to the certificate's host");
    // 127.0.0.1 is not the name the certificate was made for ...
    let wrong_name = PgStore::open(
        &at("127.0.0.1", &format!("?sslmode=verify-full&{rootcert}")),
        "lh",
    )
    .await
    .expect_err("verify-full checks the host name")
    .to_string();
    assert!(wrong_name.contains("certificate"), "{wrong_name}");
    // ... which verify-ca does not check, only the chain.
    PgStore::open(
        &at("127.0.0.1", &format!("?sslmode=verify-ca&{rootcert}")),
        "lh",
    )
    .await
    .expect("verify-ca checks the chain only");
    // A CA that did not sign it: refused.
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    testkit::make_certificates(&other).unwrap();
    let other_ca = std::fs::read(other.join("ca.pem")).unwrap();
    let untrusted = PgStore::with_ca(&at("localhost", ""), "lh", None, Some(&other_ca))
        .unwrap()
        .check()
        .await
        .expect_err("another CA's certificate")
        .to_string();
    assert!(untrusted.contains("certificate"), "{untrusted}");
    // A refusal for good: a process refuses it at start, naming the fix.
    let refusal = Store::connect_with_options(
        &at("localhost", ""),
        "lh",
        ConnectOptions {
            ca_pem: Some(&other_ca),
            ..ConnectOptions::default()
        },
    )
    .unwrap()
    .refusal()
    .await
    .expect("a certificate another CA signed is refused at start");
    assert!(refusal.contains("--store-ca-file"), "{refusal}");
    // require without a CA: encrypted, unchecked (libpq's require).
    PgStore::open(&at("127.0.0.1", "?sslmode=require"), "lh")
        .await
        .expect("require without a CA");
    // verify-full without a CA: refused before connecting, saying what to give.
    let no_ca = PgStore::new(&at("localhost", "?sslmode=verify-full"), "lh", None)
        .expect_err("a check with nothing to check against")
        .to_string();
    assert!(
        no_ca.contains("--store-ca-file") && no_ca.contains("sslrootcert"),
        "{no_ca}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
