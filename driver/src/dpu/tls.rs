//! The control channel's mutual TLS, both ends (docs/dpu.md, "Control channel"): TLS 1.3,
//! each side trusting only the channel's own CA (`dpufs certs dpu`), never the system's
//! store. The agent requires a client certificate of that CA for clientAuth and refuses the
//! handshake otherwise; the shim checks that the agent's certificate is for serverAuth and
//! names the address it dialled (a subject alternative name).
//!
//! OpenSSL, as everywhere else in dpufs (the DAOS management channel needs a cipher rustls
//! does not speak), through tokio-openssl.
//!
//! The embedded engine's server (`engine/src/tls.rs`, DAOS's TLS 1.2 with the client's CN per
//! call) accepts connections the same way; the two stay apart on purpose: the engine and the
//! driver share only the wire (`dpufs-proto`), and a TLS accept loop on tokio is no wire
//! vocabulary that crate should carry.

use hyper_util::rt::TokioIo;
use openssl::ssl::{
    AlpnError, Ssl, SslAcceptor, SslConnector, SslFiletype, SslMethod, SslVerifyMode, SslVersion,
};
use openssl::x509::X509PurposeId;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_openssl::SslStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

/// The `--tls-ca`, `--tls-cert` and `--tls-key` flags of the agent and the shim.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// The control channel's CA certificate (`ca.crt` of `dpufs certs dpu`); the only one
    /// trusted.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// This side's certificate: the agent's `agent.crt`, a host's `host.crt`.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// Its key (`agent.key`, `host.key`), readable by its owner only.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
}

/// The certificate files of one side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Why the channel's TLS cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("the DPU control channel needs --tls-ca, --tls-cert and --tls-key (missing: {0})")]
    Missing(&'static str),
    #[error(
        "{0} can be read by other users (mode {1:o}); a key must be its owner's only (chmod 0600; a Kubernetes Secret volume: defaultMode 0400)"
    )]
    KeyMode(PathBuf, u32),
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        source: openssl::error::ErrorStack,
    },
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("TLS setup: {0}")]
    Setup(#[from] openssl::error::ErrorStack),
}

impl TlsArgs {
    /// The files, all three given.
    pub fn files(&self) -> Result<TlsFiles, TlsError> {
        Ok(TlsFiles {
            ca: self.tls_ca.clone().ok_or(TlsError::Missing("--tls-ca"))?,
            cert: self
                .tls_cert
                .clone()
                .ok_or(TlsError::Missing("--tls-cert"))?,
            key: self.tls_key.clone().ok_or(TlsError::Missing("--tls-key"))?,
        })
    }
}

/// ALPN: gRPC is HTTP/2.
const H2: &[u8] = b"\x02h2";

fn check_key_mode(key: &Path) -> Result<(), TlsError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(key)
        .map_err(|e| TlsError::Io(key.to_path_buf(), e))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(TlsError::KeyMode(key.to_path_buf(), mode & 0o777));
    }
    Ok(())
}

/// Loads CA, certificate and key into a context builder: the CA as the only trust anchor.
fn load(
    b: &mut openssl::ssl::SslContextBuilder,
    files: &TlsFiles,
    purpose: X509PurposeId,
) -> Result<(), TlsError> {
    check_key_mode(&files.key)?;
    let at = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TlsError::File { path, source }
    };
    b.set_min_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_ca_file(&files.ca).map_err(at(&files.ca))?;
    b.set_certificate_chain_file(&files.cert)
        .map_err(at(&files.cert))?;
    b.set_private_key_file(&files.key, SslFiletype::PEM)
        .map_err(at(&files.key))?;
    b.check_private_key().map_err(at(&files.key))?;
    // The peer's certificate must be for its role (clientAuth for shims, serverAuth for the
    // agent): a shim cannot pose as an agent with its own pair.
    b.verify_param_mut().set_purpose(purpose)?;
    Ok(())
}

/// The agent's side: a client certificate of the CA is required.
pub fn acceptor(files: &TlsFiles) -> Result<SslAcceptor, TlsError> {
    let mut b = SslAcceptor::mozilla_modern_v5(SslMethod::tls_server())?;
    load(&mut b, files, X509PurposeId::SSL_CLIENT)?;
    b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    b.set_alpn_select_callback(|_, offered| {
        openssl::ssl::select_next_proto(H2, offered).ok_or(AlpnError::NOACK)
    });
    Ok(b.build())
}

/// The shim's side.
pub fn connector(files: &TlsFiles) -> Result<SslConnector, TlsError> {
    let mut b = SslConnector::builder(SslMethod::tls_client())?;
    load(&mut b, files, X509PurposeId::SSL_SERVER)?;
    b.set_alpn_protos(H2)?;
    b.set_verify(SslVerifyMode::PEER);
    Ok(b.build())
}

/// A handshaken connection the agent serves.
#[derive(Debug)]
pub struct TlsConn(SslStream<TcpStream>);

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// How the agent admits connections before their TLS handshake is done.
#[derive(Debug, Clone, Copy)]
pub struct Admission {
    /// Handshakes under way at once; a connection beyond them is closed at once, so clients
    /// that connect and send nothing hold a bounded number of sockets and tasks (the engine's
    /// management port and the fabric's session port bound theirs the same way).
    pub max_pending: usize,
    /// The longest a handshake may take.
    pub timeout: std::time::Duration,
}

impl Default for Admission {
    fn default() -> Admission {
        Admission {
            max_pending: 64,
            timeout: std::time::Duration::from_secs(10),
        }
    }
}

/// The connections of `listener` that complete the handshake, admitted by the default
/// [`Admission`]: see [`incoming_with`].
pub fn incoming(
    listener: TcpListener,
    acceptor: SslAcceptor,
) -> ReceiverStream<std::io::Result<TlsConn>> {
    incoming_with(listener, acceptor, Admission::default())
}

/// The connections of `listener` that complete the handshake. Each handshake runs in a task
/// of its own (a client that stalls holds up nobody) within `admission`'s bounds; a refused
/// one is logged with the peer's address and dropped. Once the stream is dropped (the server
/// stopped), the listener is closed and its port free again.
pub fn incoming_with(
    listener: TcpListener,
    acceptor: SslAcceptor,
    admission: Admission,
) -> ReceiverStream<std::io::Result<TlsConn>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = Arc::new(acceptor);
    let pending = Arc::new(tokio::sync::Semaphore::new(admission.max_pending));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(permit) = pending.clone().try_acquire_owned() else {
                tracing::warn!(%peer, max = admission.max_pending, "too many TLS handshakes at once: closed");
                continue;
            };
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let handshake = tokio::time::timeout(admission.timeout, accept(&acceptor, tcp));
                let done = handshake.await;
                drop(permit);
                match done {
                    Ok(Ok(conn)) => {
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => tracing::warn!(%peer, error = %e, "TLS handshake refused"),
                    Err(_) => tracing::warn!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

async fn accept(acceptor: &SslAcceptor, tcp: TcpStream) -> Result<TlsConn, String> {
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let ssl = Ssl::new(acceptor.context()).map_err(|e| e.to_string())?;
    let mut stream = SslStream::new(ssl, tcp).map_err(|e| e.to_string())?;
    Pin::new(&mut stream)
        .accept()
        .await
        .map_err(|e| e.to_string())?;
    Ok(TlsConn(stream))
}

/// A channel to the agent at `addr` (`HOST:PORT`): connects on first use and again after a
/// failure, each time checking the agent's certificate against the CA and against
/// `server_name` (default: HOST), which one of its subject alternative names must be.
pub fn channel(
    connector: SslConnector,
    addr: &str,
    server_name: Option<&str>,
) -> Result<Channel, String> {
    let host = match server_name {
        Some(name) => name.to_string(),
        None => host_of(addr).ok_or_else(|| format!("{addr:?} is not HOST:PORT"))?,
    };
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("agent address {addr:?}: {e}"))?
        .connect_timeout(std::time::Duration::from_secs(5));
    let (connector, addr) = (Arc::new(connector), addr.to_string());
    Ok(
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
            let (connector, addr, host) = (connector.clone(), addr.clone(), host.clone());
            async move { connect(&connector, &addr, &host).await.map(TokioIo::new) }
        })),
    )
}

async fn connect(
    connector: &SslConnector,
    addr: &str,
    host: &str,
) -> std::io::Result<SslStream<TcpStream>> {
    let refused = |e: String| std::io::Error::new(std::io::ErrorKind::ConnectionRefused, e);
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    // `into_ssl` checks the certificate's names against `host`, an address or a DNS name.
    let ssl = connector
        .configure()
        .and_then(|c| c.into_ssl(host))
        .map_err(|e| refused(e.to_string()))?;
    let mut stream = SslStream::new(ssl, tcp).map_err(|e| refused(e.to_string()))?;
    Pin::new(&mut stream)
        .connect()
        .await
        .map_err(|e| refused(format!("TLS handshake with the DPU agent at {addr}: {e}")))?;
    Ok(stream)
}

/// The host part of `HOST:PORT` or `[V6]:PORT`.
fn host_of(addr: &str) -> Option<String> {
    let (host, port) = addr.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    (!host.is_empty()).then(|| host.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_addresses() {
        assert_eq!(host_of("10.0.2.2:9640").as_deref(), Some("10.0.2.2"));
        assert_eq!(host_of("dpu-1:9640").as_deref(), Some("dpu-1"));
        assert_eq!(host_of("[fd00::1]:9640").as_deref(), Some("fd00::1"));
        for bad in ["dpu-1", ":9640", "dpu-1:x", "dpu-1:99999"] {
            assert_eq!(host_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn all_three_files_or_a_clear_refusal() {
        let args = TlsArgs {
            tls_ca: Some("ca.crt".into()),
            tls_cert: Some("host.crt".into()),
            tls_key: None,
        };
        assert!(matches!(args.files(), Err(TlsError::Missing("--tls-key"))));
    }

    #[tokio::test]
    async fn a_stopped_server_lets_its_port_go() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = SslAcceptor::mozilla_modern_v5(SslMethod::tls_server())
            .unwrap()
            .build();
        let stream = incoming(listener, acceptor);
        assert!(
            TcpListener::bind(addr).await.is_err(),
            "served: the port is taken"
        );
        drop(stream);
        let start = std::time::Instant::now();
        while TcpListener::bind(addr).await.is_err() {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(5),
                "{addr} still taken after the server stopped"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// A client that connects and says nothing: what it reads once the agent closes it, and
    /// when.
    async fn closed_after(addr: std::net::SocketAddr) -> std::time::Duration {
        use tokio::io::AsyncReadExt;
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let start = std::time::Instant::now();
        let mut b = [0u8; 1];
        let read = tokio::time::timeout(std::time::Duration::from_secs(20), tcp.read(&mut b));
        assert_eq!(read.await.expect("never closed").unwrap_or(0), 0);
        start.elapsed()
    }

    #[tokio::test]
    async fn silent_clients_are_closed_at_the_bound_and_beyond_the_limit_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = SslAcceptor::mozilla_modern_v5(SslMethod::tls_server())
            .unwrap()
            .build();
        let admission = Admission {
            max_pending: 2,
            timeout: std::time::Duration::from_millis(1500),
        };
        let _stream = incoming_with(listener, acceptor, admission);
        let silent: Vec<_> = (0..2).map(|_| tokio::spawn(closed_after(addr))).collect();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let third = closed_after(addr).await;
        assert!(
            third < std::time::Duration::from_millis(500),
            "the client beyond the limit was closed after {third:?}"
        );
        for s in silent {
            let held = s.await.unwrap();
            assert!(
                held >= std::time::Duration::from_millis(1000)
                    && held < std::time::Duration::from_secs(5),
                "a silent client within the limit was closed after {held:?}"
            );
        }
        // Their places are free again (a permit goes just after its connection).
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let again = tokio::spawn(closed_after(addr));
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            !again.is_finished(),
            "closed at once with no handshake pending"
        );
        again.abort();
    }

    #[test]
    fn a_key_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("host.key");
        std::fs::write(&key, b"not read").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let files = TlsFiles {
            ca: dir.path().join("ca.crt"),
            cert: dir.path().join("host.crt"),
            key,
        };
        assert!(matches!(
            connector(&files),
            Err(TlsError::KeyMode(_, 0o644))
        ));
    }
}
