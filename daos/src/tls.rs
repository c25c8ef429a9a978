//! DAOS's mutual TLS on the client side (docs/engine.md, "Security"): TLS 1.2
//! only, the single cipher suite `TLS_RSA_WITH_AES_256_GCM_SHA384`, a client
//! certificate from the DAOS CA, no hostname checks, and the server's
//! certificate must say CN=`server`. rustls cannot speak that suite, so this
//! is OpenSSL.

use crate::error::{DaosError, Result};
use openssl::nid::Nid;
use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslVerifyMode, SslVersion};
use openssl::x509::X509Ref;
use std::path::{Path, PathBuf};
use tokio::net::TcpStream;
use tokio_openssl::SslStream;

pub use dpufs_proto::daos::tls::{
    CIPHER as DAOS_CIPHER, MAX_CERT_MODE, SERVER_CN, check_mode, max_key_mode,
};

/// Certificate files of one DAOS component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The component the certificate is for (`admin`, `agent`, `server`);
    /// sent as `x-daos-component`, which DAOS requires to match the CN.
    pub component: String,
}

impl TlsFiles {
    /// The DAOS layout: `DIR/daosCA.crt`, `DIR/<component>.crt`, `DIR/<component>.key`.
    pub fn in_dir(dir: &Path, component: &str) -> TlsFiles {
        TlsFiles {
            ca: dir.join("daosCA.crt"),
            cert: dir.join(format!("{component}.crt")),
            key: dir.join(format!("{component}.key")),
            component: component.to_string(),
        }
    }
}

/// The subject Common Name of a certificate.
pub fn common_name(cert: &X509Ref) -> Option<String> {
    let entry = cert.subject_name().entries_by_nid(Nid::COMMONNAME).next()?;
    entry.data().to_string().ok()
}

fn config_err(what: &str, e: impl std::fmt::Display) -> DaosError {
    DaosError::Config(format!("{what}: {e}"))
}

/// Builds the client connector from PEM files, checking their permissions.
pub fn connector(files: &TlsFiles) -> Result<SslConnector> {
    check_mode(&files.key, max_key_mode(&files.component))
        .map_err(|e| config_err("client key", e))?;
    for cert in [&files.cert, &files.ca] {
        check_mode(cert, MAX_CERT_MODE).map_err(|e| config_err("certificate", e))?;
    }
    let ssl = |e: openssl::error::ErrorStack| config_err("TLS setup", e);
    let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(ssl)?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(ssl)?;
    b.set_max_proto_version(Some(SslVersion::TLS1_2))
        .map_err(ssl)?;
    b.set_cipher_list(DAOS_CIPHER).map_err(ssl)?;
    b.set_ca_file(&files.ca)
        .map_err(|e| config_err(&files.ca.display().to_string(), e))?;
    b.set_certificate_chain_file(&files.cert)
        .map_err(|e| config_err(&files.cert.display().to_string(), e))?;
    b.set_private_key_file(&files.key, SslFiletype::PEM)
        .map_err(|e| config_err(&files.key.display().to_string(), e))?;
    b.check_private_key()
        .map_err(|e| config_err("client key does not match its certificate", e))?;
    b.set_alpn_protos(b"\x02h2").map_err(ssl)?;
    b.set_verify(SslVerifyMode::PEER);
    Ok(b.build())
}

/// Start of the error text of a failed handshake (either side refused the
/// other's certificate, or the peer does not speak TLS);
/// [`crate::DaosError::is_tls_rejection`] looks for it.
pub(crate) const HANDSHAKE_FAILED: &str = "TLS handshake with";
/// Error text of a server whose certificate is not a DAOS server's.
pub(crate) const WRONG_SERVER: &str = "presented a certificate for";

/// Connects and handshakes; the chain must verify against the DAOS CA and the
/// server must present CN=`server`. Hostnames are not checked, as in DAOS.
pub async fn connect(
    connector: &SslConnector,
    addr: &str,
) -> std::io::Result<SslStream<TcpStream>> {
    let io_err = |e: String| std::io::Error::new(std::io::ErrorKind::ConnectionRefused, e);
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let mut config = connector.configure().map_err(|e| io_err(e.to_string()))?;
    config.set_verify_hostname(false);
    config.set_use_server_name_indication(false);
    let ssl = config.into_ssl("daos").map_err(|e| io_err(e.to_string()))?;
    let mut stream = SslStream::new(ssl, tcp).map_err(|e| io_err(e.to_string()))?;
    std::pin::Pin::new(&mut stream)
        .connect()
        .await
        .map_err(|e| io_err(format!("{HANDSHAKE_FAILED} {addr} failed: {e}")))?;
    let cn = stream
        .ssl()
        .peer_certificate()
        .and_then(|c| common_name(&c));
    if cn.as_deref() != Some(SERVER_CN) {
        return Err(io_err(format!(
            "{addr} {WRONG_SERVER} {cn:?}, not for {SERVER_CN:?}"
        )));
    }
    Ok(stream)
}
