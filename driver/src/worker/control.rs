//! The control socket: `<state-dir>/control.sock`, a unix stream socket speaking
//! line-delimited JSON. Each request is one JSON object on one line; each answer is one line.
//!
//! | request | answer |
//! |---|---|
//! | `{"op":"health"}` | `{"ok":true,"state":"serving","pid":…,"initialized":true,…}` |
//! | `{"op":"stats"}` | `{"ok":true,"stats":{…}}` (see [`super::stats::Stats::snapshot`]) |
//! | `{"op":"stop"}` | `{"ok":true,"state":"stopping"}`, then the worker stops |
//! | anything else | `{"ok":false,"error":"…"}` |
//!
//! The socket is created by root with mode 0600 before the worker drops privileges, so only
//! root (the node plugin) can connect. Clients are served one at a time; a connection idle
//! for 5 s is closed.

use serde_json::{Value, json};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

/// How long a connection may stay idle.
const IDLE: Duration = Duration::from_secs(5);

/// Binds the control socket at `path`, replacing a stale one (nobody answering) and refusing
/// when another worker answers on it.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another worker answers on {}", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// The answer to one request, and what to do once it has been sent.
pub struct Reply {
    /// Sent back as one line.
    pub answer: Value,
    /// Runs after the answer was written (a stop must not race its own answer).
    pub then: Option<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reply")
            .field("answer", &self.answer)
            .field("then", &self.then.is_some())
            .finish()
    }
}

impl From<Value> for Reply {
    fn from(answer: Value) -> Reply {
        Reply { answer, then: None }
    }
}

/// Serves clients forever (run it on its own thread); `handle` answers one request.
pub fn serve(listener: UnixListener, handle: impl Fn(&Value) -> Reply) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if let Err(e) = serve_one(conn, &handle) {
            tracing::debug!("control connection: {e}");
        }
    }
}

fn serve_one(conn: UnixStream, handle: &impl Fn(&Value) -> Reply) -> io::Result<()> {
    conn.set_read_timeout(Some(IDLE))?;
    conn.set_write_timeout(Some(IDLE))?;
    let mut out = conn.try_clone()?;
    let mut lines = BufReader::new(conn);
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(req) => handle(&req),
            Err(e) => json!({"ok": false, "error": format!("not JSON: {e}")}).into(),
        };
        let mut text = reply.answer.to_string();
        text.push('\n');
        let written = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        if let Some(then) = reply.then {
            then();
        }
        written?;
    }
}

/// Sends one request to the control socket at `path` and returns the answer.
pub fn request(path: &Path, req: &Value) -> io::Result<Value> {
    let mut conn = UnixStream::connect(path)?;
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut text = req.to_string();
    text.push('\n');
    conn.write_all(text.as_bytes())?;
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}
