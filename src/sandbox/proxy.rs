//! A TCP proxy between walbox and a server, for network faults (the fault tests and the soak):
//! pass, delay, blackhole, reset.
//!
//! - `Mode::Delay(d)`: every chunk waits `d` before it is forwarded, both ways.
//! - `Mode::Blackhole`: nothing is read or forwarded, both ways, on open connections and new
//!   ones (a new connection is accepted, then hangs). Like a partition where packets are lost:
//!   what the peers sent waits (their TCP buffers fill), and a connection closed meanwhile is
//!   seen closed by the other side only after the blackhole ends. What a proxy cannot do is make
//!   the server's TCP keepalives fail: its peer is this (live) proxy.
//! - [`Proxy::reset`]: every open connection is cut with a TCP RST, both ways.
//! - [`Proxy::partition`]: a blackhole for the client, while the server's side of every open
//!   connection is cut, as a server ends the connections of a peer it found dead.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward at once.
    Pass,
    /// Forward each chunk after this delay.
    Delay(Duration),
    /// Forward nothing (see the module docs).
    Blackhole,
}

/// A running proxy on 127.0.0.1; its connections end when it is dropped.
pub struct Proxy {
    port: u16,
    mode: watch::Sender<Mode>,
    resets: watch::Sender<u64>,
    partitions: watch::Sender<u64>,
    accepted: Arc<AtomicUsize>,
    _rt: tokio::runtime::Runtime,
}

impl Proxy {
    /// Listens on 127.0.0.1 (a free port) and forwards to `upstream`, which is connected to only
    /// when a client connects (it need not listen yet).
    pub fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0"))?;
        let port = listener.local_addr()?.port();
        let (mode, _) = watch::channel(Mode::Pass);
        let (resets, _) = watch::channel(0u64);
        let (partitions, _) = watch::channel(0u64);
        let accepted = Arc::new(AtomicUsize::new(0));
        {
            let (mode, resets, partitions, accepted) = (
                mode.clone(),
                resets.clone(),
                partitions.clone(),
                accepted.clone(),
            );
            rt.spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(serve(
                        client,
                        upstream,
                        mode.subscribe(),
                        resets.subscribe(),
                        partitions.subscribe(),
                    ));
                }
            });
        }
        Ok(Proxy {
            port,
            mode,
            resets,
            partitions,
            accepted,
            _rt: rt,
        })
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Switches every connection, open and future, to `mode`.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Cuts every connection open now with an RST, both ways.
    pub fn reset(&self) {
        self.resets.send_modify(|n| *n += 1);
    }

    /// A partition as the server sees it once it noticed: a [`Mode::Blackhole`] for the client
    /// side, while every server-side connection open now is cut with an RST at once (as the
    /// server's TCP keepalives or `wal_sender_timeout` would end it a few seconds later; a
    /// proxy cannot make them fail). Clients of those connections learn it when the partition
    /// heals (`set(Mode::Pass)`).
    pub fn partition(&self) {
        self.set(Mode::Blackhole);
        self.partitions.send_modify(|n| *n += 1);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

async fn open(mode: &mut watch::Receiver<Mode>) {
    let _ = mode.wait_for(|m| *m != Mode::Blackhole).await;
}

async fn serve(
    client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<Mode>,
    mut resets: watch::Receiver<u64>,
    mut partitions: watch::Receiver<u64>,
) {
    resets.mark_unchanged();
    partitions.mark_unchanged();
    open(&mut mode).await;
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (cr, mut cw) = client.into_split();
    let (sr, mut sw) = server.into_split();
    // SO_LINGER 0: the close that follows is an RST. (tokio deprecates it because a blocking
    // close with a positive linger would stall the runtime; zero does not block.)
    #[allow(deprecated)]
    let rst = |r: &OwnedReadHalf| {
        let _ = r.as_ref().set_linger(Some(Duration::ZERO));
    };
    tokio::select! {
        _ = pump(&cr, &mut sw, mode.clone()) => {}
        _ = pump(&sr, &mut cw, mode.clone()) => {}
        _ = resets.changed() => {
            rst(&cr);
            rst(&sr);
        }
        _ = partitions.changed() => {
            // The server's side is gone at once; the client's hangs until the partition
            // heals, then learns the connection no longer exists.
            rst(&sr);
            drop((sr, sw));
            open(&mut mode).await;
            rst(&cr);
        }
    }
}

/// Forwards `from` → `to` until EOF or an error, honouring the mode.
async fn pump(from: &OwnedReadHalf, to: &mut OwnedWriteHalf, mut mode: watch::Receiver<Mode>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        open(&mut mode).await;
        if from.readable().await.is_err() {
            return;
        }
        let n = match from.try_read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        };
        let current = *mode.borrow();
        if let Mode::Delay(d) = current {
            tokio::time::sleep(d).await;
        }
        // What was read as the blackhole began waits for its end.
        open(&mut mode).await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
