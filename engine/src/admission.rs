//! Admission of management connections (docs/engine.md, "Slow and silent clients"): the gRPC
//! server gets a connection only once the client has done its part of the setup — the TLS
//! handshake in secure mode, then the HTTP/2 client preface — within a bound, and only so many
//! connections may be setting up at once.
//!
//! Without this a client that connects and sends nothing, half a TLS handshake, or never
//! starts HTTP/2 would hold a task, a socket and its TLS state for as long as it liked, and
//! enough of them would exhaust the engine's descriptors. Now such a client is closed at the
//! bound, and one that arrives while [`AdmissionLimits::max_pending`] others are setting up is
//! closed at once; clients already admitted are not affected either way.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// What every HTTP/2 connection starts with (RFC 9113, 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Bounds on connections that are setting up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// How long a client has from its TCP connect to the end of its HTTP/2 preface.
    pub setup_timeout: Duration,
    /// How many connections may be setting up at once.
    pub max_pending: usize,
}

impl Default for AdmissionLimits {
    fn default() -> Self {
        AdmissionLimits {
            setup_timeout: Duration::from_secs(10),
            max_pending: 256,
        }
    }
}

/// Accepts TCP connections and yields those whose `setup` (TLS, or nothing) and HTTP/2
/// preface finish within the limits; each runs in its own task, so a slow client stalls no
/// other.
pub fn incoming<S, F, Fut>(
    listener: TcpListener,
    limits: AdmissionLimits,
    setup: F,
) -> ReceiverStream<std::io::Result<Prefaced<S>>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<S>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let pending = Arc::new(Semaphore::new(limits.max_pending));
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, say: wait for some to close instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(permit) = pending.clone().try_acquire_owned() else {
                tracing::info!(
                    %peer,
                    "closed at once: {} connections are setting up already",
                    limits.max_pending
                );
                continue;
            };
            let (tx, setup) = (tx.clone(), setup(tcp));
            tokio::spawn(async move {
                let admitted = tokio::time::timeout(limits.setup_timeout, async {
                    prefaced(setup.await?).await
                })
                .await;
                drop(permit);
                match admitted {
                    Ok(Ok(conn)) => {
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => tracing::info!(%peer, error = %e, "connection refused"),
                    Err(_) => tracing::info!(
                        %peer,
                        "closed: no TLS handshake and HTTP/2 preface within {:?}",
                        limits.setup_timeout
                    ),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Reads the client's HTTP/2 preface from `stream`, to be read again by the server.
async fn prefaced<S: AsyncRead + Unpin>(mut stream: S) -> anyhow::Result<Prefaced<S>> {
    let mut preface = [0u8; PREFACE.len()];
    stream.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        anyhow::bail!("not HTTP/2: the connection did not start with its client preface");
    }
    Ok(Prefaced {
        stream,
        replay: PREFACE.len(),
    })
}

/// A stream whose HTTP/2 preface was read during admission: the server reads it first.
#[derive(Debug)]
pub struct Prefaced<S> {
    stream: S,
    /// Bytes of [`PREFACE`] still to be read again.
    replay: usize,
}

impl Connected for Prefaced<TcpStream> {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl<S> Prefaced<S> {
    /// The stream underneath.
    pub fn get_ref(&self) -> &S {
        &self.stream
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefaced<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.replay > 0 {
            let from = PREFACE.len() - self.replay;
            let n = self.replay.min(buf.remaining());
            buf.put_slice(&PREFACE[from..from + n]);
            self.replay -= n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefaced<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A listener admitting plain connections under `limits`, and its address.
    async fn admitting(
        limits: AdmissionLimits,
    ) -> (
        std::net::SocketAddr,
        ReceiverStream<std::io::Result<Prefaced<TcpStream>>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (addr, incoming(listener, limits, |tcp| async { Ok(tcp) }))
    }

    /// Whether the server closed `conn` (EOF or reset) within `wait`.
    async fn closed_within(conn: &mut TcpStream, wait: Duration) -> bool {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(wait, conn.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn the_preface_is_read_again_and_silent_clients_are_closed_at_the_bound() {
        use tokio_stream::StreamExt;
        let limits = AdmissionLimits {
            setup_timeout: Duration::from_millis(300),
            max_pending: 4,
        };
        let (addr, mut admitted) = admitting(limits).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut half = TcpStream::connect(addr).await.unwrap();
        half.write_all(&PREFACE[..10]).await.unwrap();
        let mut good = TcpStream::connect(addr).await.unwrap();
        good.write_all(PREFACE).await.unwrap();
        good.write_all(b"frames").await.unwrap();
        let mut conn = admitted.next().await.unwrap().unwrap();
        let mut read = vec![0u8; PREFACE.len() + 6];
        conn.read_exact(&mut read).await.unwrap();
        assert_eq!(&read[..PREFACE.len()], PREFACE);
        assert_eq!(&read[PREFACE.len()..], b"frames");
        assert!(closed_within(&mut silent, Duration::from_secs(5)).await);
        assert!(closed_within(&mut half, Duration::from_secs(5)).await);
        let mut http1 = TcpStream::connect(addr).await.unwrap();
        http1
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(closed_within(&mut http1, Duration::from_secs(5)).await);
    }

    #[tokio::test]
    async fn beyond_the_pending_limit_a_client_is_closed_at_once() {
        let limits = AdmissionLimits {
            setup_timeout: Duration::from_secs(60),
            max_pending: 2,
        };
        let (addr, _admitted) = admitting(limits).await;
        let mut holding = Vec::new();
        for _ in 0..2 {
            holding.push(TcpStream::connect(addr).await.unwrap());
        }
        // Let the acceptor take both before the third arrives.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut third = TcpStream::connect(addr).await.unwrap();
        assert!(closed_within(&mut third, Duration::from_secs(5)).await);
        for conn in &mut holding {
            assert!(
                !closed_within(conn, Duration::from_millis(200)).await,
                "the first two wait for their bound"
            );
        }
    }
}
