//! A throwaway Kubernetes API for the tests and `leasehold-bench --scenario
//! controller`: etcd and kube-apiserver (1.20, built from Debian's source
//! package by `scripts/kubernetes/build.sh apiserver`) on free loopback
//! ports. No scheduler, kubelet or controller-manager: pods are objects that
//! stay Pending, which is all the controller reads.
//!
//! The server has TLS from a throwaway CA, static tokens and RBAC on, so a
//! client holding [`User::Controller`] is the chart's ServiceAccount and has
//! only what the chart's RBAC grants it; [`User::Admin`] is in
//! `system:masters`. Every request is written to an audit log
//! ([`ApiServer::audit_since`]), which is how requests are counted per user.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::Deserialize;

/// The chart's ServiceAccount as the README installs it: release
/// `leasehold` in namespace `leasehold-system`.
pub const CONTROLLER_NAMESPACE: &str = "leasehold-system";
pub const CONTROLLER_SERVICE_ACCOUNT: &str = "leasehold";

/// How long a start or restart may take to answer `/readyz`: about ten
/// seconds on two busy cores, most of it the bootstrap of RBAC roles.
const READY_LIMIT: Duration = Duration::from_secs(90);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum User {
    Admin,
    Controller,
}

impl User {
    fn token(self) -> &'static str {
        match self {
            User::Admin => "leasehold-test-admin-token",
            User::Controller => "leasehold-test-controller-token",
        }
    }

    fn name(self) -> &'static str {
        match self {
            User::Admin => "admin",
            User::Controller => "controller",
        }
    }

    /// The user name the API server knows it by (as in its audit log).
    pub fn username(self) -> String {
        match self {
            User::Admin => "leasehold-admin".into(),
            User::Controller => {
                format!("system:serviceaccount:{CONTROLLER_NAMESPACE}:{CONTROLLER_SERVICE_ACCOUNT}")
            }
        }
    }

    fn groups(self) -> String {
        match self {
            User::Admin => "system:masters".into(),
            User::Controller => {
                format!("system:serviceaccounts,system:serviceaccounts:{CONTROLLER_NAMESPACE}")
            }
        }
    }
}

/// One request as the audit log has it (stage `ResponseComplete`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    pub verb: String,
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    pub user: AuditUser,
    #[serde(default)]
    pub object_ref: Option<AuditObject>,
    #[serde(default)]
    pub response_status: Option<AuditStatus>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct AuditUser {
    pub username: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct AuditObject {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub subresource: String,
}

#[derive(Clone, Debug, Deserialize)]
pub struct AuditStatus {
    #[serde(default)]
    pub code: u16,
}

impl AuditRecord {
    /// `verb resource[/subresource]`, e.g. `patch pods`, `list pods`.
    pub fn what(&self) -> String {
        let object = self.object_ref.clone().unwrap_or_default();
        let mut resource = object.resource;
        if !object.subresource.is_empty() {
            resource = format!("{resource}/{}", object.subresource);
        }
        format!("{} {resource}", self.verb)
    }
}

pub struct ApiServer {
    pub dir: PathBuf,
    pub port: u16,
    etcd: Child,
    apiserver: Option<Child>,
    binary: PathBuf,
    args: Vec<String>,
    kept: bool,
}

/// Where `scripts/kubernetes/build.sh` leaves the binaries, or
/// `LEASEHOLD_KUBE_BIN_DIR`.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LEASEHOLD_KUBE_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    cache.join("leasehold-ci/kubernetes-1.20/bin")
}

/// Why an API server cannot be started here, if it cannot.
pub fn missing() -> Option<String> {
    let apiserver = bin_dir().join("kube-apiserver");
    match (crate::on_path("etcd"), apiserver.is_file()) {
        (Some(_), true) => None,
        _ => Some(format!(
            "needs etcd on the PATH and {} (scripts/kubernetes/build.sh apiserver installs and builds both)",
            apiserver.display()
        )),
    }
}

/// A CA, a serving certificate for the API server (127.0.0.1, localhost
/// and the first service IP, as kube-apiserver's own would have), and the
/// service-account signing key pair.
fn make_certificates(dir: &Path) -> anyhow::Result<()> {
    #[rustfmt::skip]
    let steps: [&[&str]; 5] = [
        &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
          "-days", "2", "-subj", "/CN=leasehold-test-ca"],
        &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
          "-subj", "/CN=kube-apiserver"],
        &["x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
          "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "server.ext"],
        &["genrsa", "-out", "sa.key", "2048"],
        &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"],
    ];
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes.default.svc\n",
    )?;
    steps.iter().try_for_each(|step| crate::openssl(dir, step))
}

fn spawn_logged(binary: &Path, args: &[String], log: &Path) -> anyhow::Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| log.display().to_string())?;
    let err = log.try_clone()?;
    Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .with_context(|| format!("spawn {}", binary.display()))
}

fn port() -> anyhow::Result<u16> {
    crate::redis::free_port()
}

impl ApiServer {
    /// Starts etcd and the API server and waits until `/readyz` says yes.
    // Linear: etcd, the certificates, the API server, then the wait for it.
    #[allow(clippy::too_many_lines)]
    pub async fn start() -> anyhow::Result<Self> {
        if let Some(why) = missing() {
            bail!(why);
        }
        let etcd = crate::on_path("etcd").expect("checked");
        // etcd's data on tmpfs where there is one: fsyncs on a shared disk
        // are the slowest part of an API write.
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("leasehold-kube-{:x}", fastrand::u64(..)));
        std::fs::create_dir_all(dir.join("certs"))?;
        make_certificates(&dir)?;
        let tokens: String = [User::Admin, User::Controller]
            .map(|u| {
                let name = u.username();
                format!("{},{name},{name},\"{}\"\n", u.token(), u.groups())
            })
            .concat();
        let write =
            |f: &str, text: &str| std::fs::write(dir.join(f), text).with_context(|| f.to_owned());
        write("tokens.csv", &tokens)?;
        // One audit line per finished request, with who made it: the bench
        // and the tests count the controller's requests from it.
        write(
            "audit-policy.yaml",
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived, ResponseStarted]\nrules:\n- level: Metadata\n",
        )?;

        let (etcd_port, peer_port) = (port()?, port()?);
        let client_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args: Vec<String> = [
            "--name",
            "default",
            "--data-dir",
            &dir.join("etcd").display().to_string(),
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &format!("default={peer_url}"),
            "--log-level",
            "warn",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let etcd = spawn_logged(&etcd, &etcd_args, &dir.join("etcd.log"))?;

        let port = port()?;
        let d = |f: &str| dir.join(f).display().to_string();
        let args: Vec<String> = [
            format!("--etcd-servers={client_url}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            "--insecure-port=0".into(),
            format!("--cert-dir={}", d("certs")),
            format!("--tls-cert-file={}", d("server.crt")),
            format!("--tls-private-key-file={}", d("server.key")),
            format!("--client-ca-file={}", d("ca.crt")),
            format!("--token-auth-file={}", d("tokens.csv")),
            "--authorization-mode=Node,RBAC".into(),
            format!("--service-account-key-file={}", d("sa.pub")),
            format!("--service-account-signing-key-file={}", d("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            "--service-cluster-ip-range=10.96.0.0/12".into(),
            // No controller-manager makes the ServiceAccount tokens.
            "--disable-admission-plugins=ServiceAccount".into(),
            format!("--audit-policy-file={}", d("audit-policy.yaml")),
            format!("--audit-log-path={}", d("audit.log")),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ]
        .into();
        let mut server = Self {
            dir,
            port,
            etcd,
            apiserver: None,
            binary: bin_dir().join("kube-apiserver"),
            args,
            kept: false,
        };
        server.spawn_apiserver()?;
        server.wait_ready(READY_LIMIT).await?;
        Ok(server)
    }

    fn spawn_apiserver(&mut self) -> anyhow::Result<()> {
        let log = self.dir.join("kube-apiserver.log");
        self.apiserver = Some(spawn_logged(&self.binary, &self.args, &log)?);
        Ok(())
    }

    /// Waits until `/readyz` answers `ok` to the admin.
    pub async fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        let client = self.client(User::Admin).await?;
        loop {
            let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
            if let Ok(text) = client.request_text(req).await {
                if text.trim() == "ok" {
                    return Ok(());
                }
            }
            if let Some(status) = self
                .apiserver
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("kube-apiserver exited ({status}):\n{}", self.log_tail(40));
            }
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver not ready within {limit:?}:\n{}",
                    self.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join("kube-apiserver.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// A kubeconfig file for `user`, as kubectl and the controller read it.
    pub fn kubeconfig(&self, user: User) -> PathBuf {
        let path = self.dir.join(format!("kubeconfig-{}", user.name()));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: {ca}\nusers:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: local\n  context:\n    cluster: local\n    user: {name}\ncurrent-context: local\n",
            port = self.port,
            ca = self.dir.join("ca.crt").display(),
            name = user.name(),
            token = user.token(),
        );
        std::fs::write(&path, text).expect("write a kubeconfig");
        path
    }

    pub async fn client(&self, user: User) -> anyhow::Result<kube::Client> {
        // kube's errors write their causes into their messages: taken flat.
        let kubeconfig =
            Kubeconfig::read_from(self.kubeconfig(user)).map_err(anyhow::Error::msg)?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(anyhow::Error::msg)?;
        kube::Client::try_from(config).map_err(anyhow::Error::msg)
    }

    /// SIGKILLs the API server (etcd keeps the data).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.apiserver.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed API server again on the same port and waits until it
    /// is ready.
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn_apiserver()?;
        self.wait_ready(READY_LIMIT).await
    }

    /// Where the audit log ends now; [`ApiServer::audit_since`] reads what
    /// came after.
    pub fn audit_mark(&self) -> u64 {
        std::fs::metadata(self.dir.join("audit.log")).map_or(0, |m| m.len())
    }

    /// Requests finished since `mark` (all of them with `mark` 0).
    pub fn audit_since(&self, mark: u64) -> Vec<AuditRecord> {
        let text = std::fs::read(self.dir.join("audit.log")).unwrap_or_default();
        let start = (mark as usize).min(text.len());
        String::from_utf8_lossy(&text[start..])
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Keeps the directory (logs, etcd data) after the server is dropped.
    pub fn keep(&mut self) {
        self.kept = true;
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.kill();
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
        if !self.kept {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
