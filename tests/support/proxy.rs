//! A TCP proxy between a node and Redis that a test can pause (bytes stop
//! flowing both ways while connections stay open, like a paused process or a
//! black-holed network) and resume. It lets one node lose Redis while the
//! others keep it.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub port: u16,
    paused: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let (paused, paused_rx) = watch::channel(false);
        let upstream: SocketAddr = ([127, 0, 0, 1], upstream_port).into();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let rx = paused_rx.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pump(cr, sw, rx.clone()), pump(sr, cw, rx));
                });
            }
        });
        Self { port, paused, task }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    pub fn resume(&self) {
        self.paused.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut paused: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // While paused, read nothing: bytes wait in the kernel buffers.
        while *paused.borrow() {
            if paused.changed().await.is_err() {
                return;
            }
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = paused.changed() => continue,
        };
        // Bytes read just before a pause are held back until resume.
        while *paused.borrow() {
            if paused.changed().await.is_err() {
                return;
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
