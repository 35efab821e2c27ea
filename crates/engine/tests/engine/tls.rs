//! `rediss://` against a real redis-server with TLS on, using a CA made for
//! the test with the `openssl` command. Both connections of a node (commands
//! and pub/sub) go over TLS: a step-down handover in milliseconds, with a
//! retry interval of seconds, shows the pub/sub one works too.

use leasehold_testkit as testkit;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_engine::{ElectionConfig, Node, Store};
use testkit::{eventually, node_config, one_leader};

struct TlsRedis {
    dir: PathBuf,
    port: u16,
    child: Child,
}

fn openssl(dir: &std::path::Path, args: &[&str]) {
    testkit::openssl(dir, args).unwrap_or_else(|e| panic!("{e}"));
}

impl TlsRedis {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("leasehold-tls-{:x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        openssl(
            &dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=leasehold-test-ca",
            ],
        );
        openssl(
            &dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "srv.key",
                "-out",
                "srv.csr",
                "-subj",
                "/CN=localhost",
            ],
        );
        std::fs::write(dir.join("ext"), "subjectAltName=DNS:localhost\n").unwrap();
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                "srv.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "srv.pem",
                "-days",
                "2",
                "-extfile",
                "ext",
            ],
        );
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
    let store = || Store::connect_with_ca(&redis.url(), "lh", &redis.ca()).unwrap();
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
