//! A TCP proxy between a node and its store that a test can pause (bytes
//! stop flowing both ways while connections stay open, like a paused
//! process or a black-holed network) and resume, make one-way (requests
//! reach the store, replies are held back until the link is mended: a
//! broken NAT or conntrack entry, as TCP sees it), cut (every open
//! connection is closed; new ones are let through), or slow down (each
//! chunk is held back for a while in both directions). It lets one node
//! lose its store while the others keep it.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Mode {
    paused: bool,
    /// Replies (store to client) held back; requests flow.
    one_way: bool,
    delay: Duration,
    /// Bumped by `cut`: connections opened under an older value close.
    cuts: u64,
}

pub struct Proxy {
    pub port: u16,
    mode: watch::Sender<Mode>,
    /// Where new connections go (see [`Proxy::retarget`]).
    upstream: std::sync::Arc<std::sync::atomic::AtomicU16>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let (mode, mode_rx) = watch::channel(Mode::default());
        let target = std::sync::Arc::new(std::sync::atomic::AtomicU16::new(upstream_port));
        let upstream_port = target.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let rx = mode_rx.clone();
                let upstream: SocketAddr = (
                    [127, 0, 0, 1],
                    upstream_port.load(std::sync::atomic::Ordering::SeqCst),
                )
                    .into();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let born = rx.borrow().cuts;
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    // Either direction ending (or a cut) closes both.
                    tokio::select! {
                        _ = pump(cr, sw, rx.clone(), born, Direction::Requests) => {}
                        _ = pump(sr, cw, rx, born, Direction::Replies) => {}
                    }
                });
            }
        });
        Self {
            port,
            mode,
            upstream: target,
            task,
        }
    }

    /// Sends new connections to another port (a failover: clients that
    /// reconnect, after a [`Proxy::cut`], reach the new primary).
    pub fn retarget(&self, upstream_port: u16) {
        self.upstream
            .store(upstream_port, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pause(&self) {
        self.mode.send_modify(|m| m.paused = true);
    }

    pub fn resume(&self) {
        self.mode.send_modify(|m| m.paused = false);
    }

    /// Requests go on reaching the store; its replies are held back (in
    /// order, none lost) until [`Proxy::two_way`].
    pub fn one_way(&self) {
        self.mode.send_modify(|m| m.one_way = true);
    }

    pub fn two_way(&self) {
        self.mode.send_modify(|m| m.one_way = false);
    }

    /// Closes every open connection (the node sees a reset and reconnects).
    pub fn cut(&self) {
        self.mode.send_modify(|m| m.cuts += 1);
    }

    /// Holds every chunk back for `delay` (zero: no delay).
    pub fn delay(&self, delay: Duration) {
        self.mode.send_modify(|m| m.delay = delay);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Requests,
    Replies,
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    born: u64,
    direction: Direction,
) {
    let mut buf = vec![0u8; 16 * 1024];
    // Waits while paused; false once this connection was cut.
    async fn flowing(mode: &mut watch::Receiver<Mode>, born: u64, direction: Direction) -> bool {
        loop {
            let m = *mode.borrow();
            if m.cuts != born {
                return false;
            }
            let held = m.paused || (m.one_way && direction == Direction::Replies);
            if !held {
                return true;
            }
            if mode.changed().await.is_err() {
                return false;
            }
        }
    }
    loop {
        // While paused, read nothing: bytes wait in the kernel buffers.
        if !flowing(&mut mode, born, direction).await {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = mode.changed() => continue,
        };
        let delay = mode.borrow().delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        // Bytes read just before a pause are held back until resume.
        if !flowing(&mut mode, born, direction).await {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
