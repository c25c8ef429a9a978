//! DAOS's mutual TLS on the server side (docs/engine.md, "Security"): TLS 1.2
//! only, `TLS_RSA_WITH_AES_256_GCM_SHA384` only, a client certificate chaining
//! to the DAOS CA required, ALPN `h2`. The client certificate's CN reaches each
//! RPC as [`PeerCn`] for the per-method allow-list in [`allowed`].

use crate::admission::{self, AdmissionLimits, Prefaced};
use crate::service::PeerCn;
use dpufs_proto::daos::tls::{CIPHER, MAX_CERT_MODE, check_mode, max_key_mode};
use openssl::nid::Nid;
use openssl::ssl::{AlpnError, SslAcceptor, SslFiletype, SslMethod, SslVerifyMode, SslVersion};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio_openssl::SslStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

/// Which certificate CNs may call which RPC (DAOS's `grpc_authorization.go`
/// for the RPCs the engine serves; the engine's own services are admin-only).
pub fn allowed(method: &str, cn: &str) -> bool {
    match method {
        "PoolEvict" => matches!(cn, "admin" | "agent"),
        _ => cn == "admin",
    }
}

/// The acceptor from `DIR/daosCA.crt`, `DIR/server.crt`, `DIR/server.key`.
pub fn acceptor(dir: &Path) -> anyhow::Result<SslAcceptor> {
    let (ca, cert, key) = (
        dir.join("daosCA.crt"),
        dir.join("server.crt"),
        dir.join("server.key"),
    );
    check_mode(&key, max_key_mode("server"))?;
    check_mode(&cert, MAX_CERT_MODE)?;
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_2))?;
    b.set_cipher_list(CIPHER)?;
    b.set_ca_file(&ca)?;
    b.set_certificate_chain_file(&cert)?;
    b.set_private_key_file(&key, SslFiletype::PEM)?;
    b.check_private_key()?;
    b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    b.set_alpn_select_callback(|_, offered| {
        openssl::ssl::select_next_proto(b"\x02h2", offered).ok_or(AlpnError::NOACK)
    });
    Ok(b.build())
}

/// A TLS connection: accepted, handshaken, and its HTTP/2 preface read.
pub type TlsConn = Prefaced<SslStream<TcpStream>>;

/// Each RPC learns the CN of the client certificate it came with.
impl Connected for TlsConn {
    type ConnectInfo = PeerCn;
    fn connect_info(&self) -> PeerCn {
        let cn = self.get_ref().ssl().peer_certificate().and_then(|c| {
            let entry = c.subject_name().entries_by_nid(Nid::COMMONNAME).next()?;
            entry.data().to_string().ok()
        });
        PeerCn(cn.unwrap_or_default())
    }
}

async fn handshake(acceptor: &SslAcceptor, tcp: TcpStream) -> anyhow::Result<SslStream<TcpStream>> {
    tcp.set_nodelay(true)?;
    let ssl = openssl::ssl::Ssl::new(acceptor.context())?;
    let mut stream = SslStream::new(ssl, tcp)?;
    Pin::new(&mut stream).accept().await?;
    Ok(stream)
}

/// Connections that completed the handshake and started HTTP/2 within `limits`
/// ([`crate::admission`]).
pub fn incoming(
    listener: TcpListener,
    acceptor: SslAcceptor,
    limits: AdmissionLimits,
) -> ReceiverStream<std::io::Result<TlsConn>> {
    let acceptor = Arc::new(acceptor);
    admission::incoming(listener, limits, move |tcp| {
        let acceptor = acceptor.clone();
        async move { handshake(&acceptor, tcp).await }
    })
}

#[cfg(test)]
mod tests {
    use super::allowed;

    #[test]
    fn allow_list_follows_daos() {
        assert!(allowed("PoolCreate", "admin"));
        assert!(!allowed("PoolCreate", "agent"));
        assert!(!allowed("PoolCreate", "server"));
        assert!(allowed("PoolEvict", "agent"));
        assert!(!allowed("ListPools", "agent"));
        assert!(!allowed("ContCreate", "agent"));
    }
}
