//! The node's unix sockets, shared by the keeper, the worker, the launcher and the tests:
//! binding a socket, the line server behind a worker's control socket, and the clients of
//! both protocols (whose messages are the types of `dpufs_node_api`).
//!
//! - control socket (`<worker state>/control.sock`): one JSON object per line, many per
//!   connection ([`mod@line`], client in [`control`]);
//! - keeper socket (`<keeper state>/keeper.sock`): one request per connection, the answer
//!   may carry a descriptor ([`fdpass`], client in [`keeper`]).

pub mod control;
pub mod fdpass;
pub mod keeper;
pub mod line;

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// Binds a socket at `path` with mode 0600 (only root, the node plugin, may connect),
/// replacing a stale one (nobody answering) and refusing when someone answers on it.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another process answers on {}", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}
