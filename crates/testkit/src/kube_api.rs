//! The project's throwaway Kubernetes API server ([`crate::kube`])
//! for a test: a failure when its binaries are missing, unless the
//! `kubernetes` part is left out on purpose ([`crate::lacks`]); its directory (logs,
//! audit log) is kept when the test fails.

pub use crate::kube::{
    ApiServer as LocalApiServer, User, CONTROLLER_NAMESPACE, CONTROLLER_SERVICE_ACCOUNT,
};

pub struct ApiServer(LocalApiServer);

impl std::ops::Deref for ApiServer {
    type Target = LocalApiServer;
    fn deref(&self) -> &LocalApiServer {
        &self.0
    }
}

impl std::ops::DerefMut for ApiServer {
    fn deref_mut(&mut self) -> &mut LocalApiServer {
        &mut self.0
    }
}

impl ApiServer {
    pub async fn start(test: &str) -> Option<Self> {
        if let Some(why) = crate::kube::missing() {
            crate::lacks(test, crate::Part::Kubernetes, &why);
            return None;
        }
        let server = LocalApiServer::start().await.expect("kube-apiserver");
        Some(Self(server))
    }

    pub async fn client(&self, user: User) -> kube::Client {
        self.0.client(user).await.expect("kube client")
    }

    /// SIGKILLs the API server, waits `down`, starts it again.
    pub async fn restart(&mut self, down: std::time::Duration) {
        self.0.kill();
        tokio::time::sleep(down).await;
        self.0.start_again().await.expect("kube-apiserver restarts");
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.keep();
            eprintln!(
                "kube-apiserver's directory kept: {} (last lines of its log below)\n{}",
                self.0.dir.display(),
                self.0.log_tail(20)
            );
        }
    }
}
