//! Serving the CSI services on a unix socket (CSI allows no other transport), with one log
//! line per call: the RPC, its gRPC code and how long it took.

use crate::csi::controller::ControllerService;
use crate::csi::directory::Directory;
use crate::csi::identity::IdentityService;
use dpufs_proto::csi::v1::controller_server::ControllerServer;
use dpufs_proto::csi::v1::identity_server::IdentityServer;
use dpufs_proto::csi::v1::node_server::{Node, NodeServer};
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::Code;
use tonic::service::Routes;
use tower::{Layer, Service};

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("CSI endpoint {endpoint:?}: {reason} (expected unix:///path/to/csi.sock or unix:path)")]
    Endpoint { endpoint: String, reason: String },
    #[error("{0} is in use by another running server")]
    InUse(PathBuf),
    #[error("{0} exists and is not a socket; not removing it")]
    NotASocket(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The socket path of a CSI endpoint, in gRPC's naming: `unix:///absolute/path` or
/// `unix:path` (relative or absolute).
pub fn parse_endpoint(endpoint: &str) -> Result<PathBuf, ServeError> {
    let bad = |reason: &str| ServeError::Endpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let Some(rest) = endpoint.strip_prefix("unix:") else {
        return Err(bad("only unix sockets are supported"));
    };
    let path = match rest.strip_prefix("//") {
        Some(abs) if abs.starts_with('/') => abs,
        Some(_) => {
            return Err(bad(
                "unix:// must be followed by an absolute path (three slashes)",
            ));
        }
        None => rest,
    };
    if path.is_empty() {
        return Err(bad("no socket path"));
    }
    Ok(PathBuf::from(path))
}

/// Binds the socket, removing a stale socket file a previous run left (one no server
/// answers on); a live socket or a file that is not a socket is left alone.
pub fn bind(path: &Path) -> Result<UnixListener, ServeError> {
    use std::os::unix::fs::FileTypeExt;
    let io_err = |source| ServeError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io_err)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => return Err(ServeError::InUse(path.to_path_buf())),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    tracing::info!(path = %path.display(), "removing a stale socket");
                    std::fs::remove_file(path).map_err(io_err)?;
                }
                Err(e) => return Err(io_err(e)),
            }
        }
        Ok(_) => return Err(ServeError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(e)),
    }
    UnixListener::bind(path).map_err(io_err)
}

/// Serves Identity and Controller on `endpoint` until SIGINT or SIGTERM.
pub async fn serve_controller(
    endpoint: &str,
    directory: Arc<dyn Directory>,
) -> Result<(), ServeError> {
    serve_controller_until(endpoint, directory, stop_signal()).await
}

/// Serves Identity and Controller on `endpoint` until `shutdown` completes; removes the
/// socket file afterwards.
pub async fn serve_controller_until(
    endpoint: &str,
    directory: Arc<dyn Directory>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let ready = directory.clone();
    let identity = IdentityService::new(move || ready.ready());
    let routes = Routes::new(IdentityServer::new(identity))
        .add_service(ControllerServer::new(ControllerService::new(directory)));
    serve_routes(endpoint, "Identity and Controller", routes, shutdown).await
}

/// Serves Identity and Node (host mode's [`crate::csi::NodeService`], or DPU mode's host shim) on
/// `endpoint` until `shutdown` completes; removes the socket file afterwards. Identity's Probe reports `ready` (the plugin's own state only).
pub async fn serve_node_until<N: Node>(
    endpoint: &str,
    node: N,
    ready: impl Fn() -> bool + Send + Sync + 'static,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let routes = Routes::new(IdentityServer::new(IdentityService::node(ready)))
        .add_service(NodeServer::new(node));
    serve_routes(endpoint, "Identity and Node", routes, shutdown).await
}

/// Serves `routes` on the unix socket of `endpoint`, one log line per call, until
/// `shutdown`; the socket file is removed afterwards.
async fn serve_routes(
    endpoint: &str,
    services: &str,
    routes: Routes,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let path = parse_endpoint(endpoint)?;
    let listener = bind(&path)?;
    tracing::info!(
        endpoint,
        driver = crate::csi::DRIVER_NAME,
        "serving CSI {services}"
    );
    let served = tonic::transport::Server::builder()
        .layer(CallLogLayer)
        .add_routes(routes)
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await;
    let _ = std::fs::remove_file(&path);
    tracing::info!(endpoint, "CSI server stopped");
    Ok(served?)
}

/// Resolves on SIGINT or SIGTERM.
pub async fn stop_signal() {
    stop_signal_inner().await
}

async fn stop_signal_inner() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!("cannot watch SIGTERM ({e}); stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// A tower layer that logs every call: RPC path, gRPC code, duration (to the response
/// headers, which for these unary calls is the whole call), and the message of errors.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallLogLayer;

impl<S> Layer<S> for CallLogLayer {
    type Service = CallLog<S>;

    fn layer(&self, inner: S) -> CallLog<S> {
        CallLog { inner }
    }
}

/// The service [`CallLogLayer`] wraps around the routes.
#[derive(Debug, Clone)]
pub struct CallLog<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<http::Request<B>> for CallLog<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let rpc = req.uri().path().to_string();
        let start = Instant::now();
        let call = self.inner.call(req);
        Box::pin(async move {
            let result = call.await;
            let ms = start.elapsed().as_secs_f64() * 1e3;
            match &result {
                Ok(response) => {
                    // Errors come as trailers-only responses (grpc-status in the headers);
                    // a unary success carries its status in the trailers.
                    match tonic::Status::from_header_map(response.headers()) {
                        Some(s) if s.code() != Code::Ok => tracing::warn!(
                            rpc,
                            code = ?s.code(),
                            duration_ms = ms,
                            message = s.message(),
                            "CSI call failed"
                        ),
                        _ if rpc.ends_with("/Probe") => {
                            tracing::debug!(rpc, code = ?Code::Ok, duration_ms = ms, "CSI call")
                        }
                        _ => tracing::info!(rpc, code = ?Code::Ok, duration_ms = ms, "CSI call"),
                    }
                }
                Err(e) => {
                    tracing::warn!(rpc, duration_ms = ms, error = %e, "CSI call failed in transport")
                }
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoint("unix:///csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            parse_endpoint("unix:/csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            parse_endpoint("unix:csi.sock").unwrap(),
            PathBuf::from("csi.sock")
        );
        for bad in [
            "",
            "/csi/csi.sock",
            "tcp://127.0.0.1:10000",
            "unix://",
            "unix:",
            "unix://host/csi.sock",
        ] {
            assert!(
                matches!(parse_endpoint(bad), Err(ServeError::Endpoint { .. })),
                "{bad:?}"
            );
        }
    }

    /// A writer for a tracing subscriber that keeps what it is given.
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn every_call_is_logged_with_its_code_and_duration() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let inner = tower::service_fn(|req: http::Request<()>| async move {
            let mut resp = http::Response::new(());
            if req.uri().path().ends_with("/DeleteVolume") {
                // What tonic sends for an error: a trailers-only response.
                resp.headers_mut()
                    .insert("grpc-status", http::HeaderValue::from_static("5"));
                resp.headers_mut().insert(
                    "grpc-message",
                    http::HeaderValue::from_static("no%20such%20volume"),
                );
            }
            Ok::<_, std::convert::Infallible>(resp)
        });
        let mut svc = CallLogLayer.layer(inner);
        for path in [
            "/csi.v1.Controller/CreateVolume",
            "/csi.v1.Controller/DeleteVolume",
            "/csi.v1.Identity/Probe",
        ] {
            let req = http::Request::builder().uri(path).body(()).unwrap();
            std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
            svc.call(req).await.unwrap();
        }
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let line = |rpc: &str| {
            log.lines()
                .find(|l| l.contains(rpc))
                .unwrap_or_else(|| panic!("no line for {rpc} in {log}"))
                .to_string()
        };
        let create = line("/csi.v1.Controller/CreateVolume");
        assert!(
            create.contains("INFO") && create.contains("code=Ok"),
            "{create}"
        );
        assert!(create.contains("duration_ms="), "{create}");
        let delete = line("/csi.v1.Controller/DeleteVolume");
        assert!(
            delete.contains("WARN") && delete.contains("code=NotFound"),
            "{delete}"
        );
        assert!(delete.contains("no such volume"), "{delete}");
        assert!(line("/csi.v1.Identity/Probe").contains("DEBUG"));
    }

    #[tokio::test]
    async fn stale_sockets_are_replaced_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("csi.sock");
        let live = bind(&path).unwrap();
        assert!(matches!(bind(&path), Err(ServeError::InUse(_))));
        drop(live);
        // The file is still there, but nobody listens: stale.
        assert!(path.exists());
        let _again = bind(&path).unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(bind(&file), Err(ServeError::NotASocket(_))));
        assert_eq!(std::fs::read(&file).unwrap(), b"x");
    }
}
