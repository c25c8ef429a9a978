//! The storage plugin's gRPC server on its unix socket.

use crate::csi::server::{CallLogLayer, ServeError, bind};
use crate::dpf::backend::DeviceBackend;
use crate::dpf::service::{PLUGIN_NAME, PluginIdentity, StoragePlugin};
use dpufs_proto::nvidia::storage::plugins::v1::identity_service_server::IdentityServiceServer;
use dpufs_proto::nvidia::storage::plugins::v1::storage_plugin_service_server::StoragePluginServiceServer;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use tokio_stream::wrappers::UnixListenerStream;

/// Where DPF's SNAP node driver looks for a vendor's plugin,
/// `/var/lib/nvidia/storage/snap/plugins/<plugin name>/dpu.sock`, for this plugin's name.
pub const DEFAULT_SOCKET: &str = "/var/lib/nvidia/storage/snap/plugins/dfs.dpufs.io/dpu.sock";

/// Serves IdentityService and StoragePluginService on the unix socket `socket` until
/// `shutdown` completes, then removes the socket file. A stale socket a previous run left is
/// replaced; a live one, or a file that is not a socket, is an error.
pub async fn serve_until(
    socket: &Path,
    backend: Arc<dyn DeviceBackend>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let listener = bind(socket)?;
    tracing::info!(socket = %socket.display(), name = PLUGIN_NAME, "serving the DPF storage plugin");
    let served = tonic::transport::Server::builder()
        .layer(CallLogLayer)
        .add_service(IdentityServiceServer::new(PluginIdentity::new(
            backend.clone(),
        )))
        .add_service(StoragePluginServiceServer::new(StoragePlugin::new(backend)))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await;
    let _ = std::fs::remove_file(socket);
    tracing::info!(socket = %socket.display(), "DPF storage plugin stopped");
    Ok(served?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_socket_is_where_snap_looks_for_it() {
        let plugin_dir =
            std::path::Path::new("/var/lib/nvidia/storage/snap/plugins").join(super::PLUGIN_NAME);
        assert_eq!(
            std::path::Path::new(super::DEFAULT_SOCKET),
            plugin_dir.join("dpu.sock")
        );
    }
}
