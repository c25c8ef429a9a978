//! A line server: each request is one line, each answer one line; clients are served one at
//! a time and a connection idle for 5 s is closed. What a worker's control socket runs on.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

/// How long a connection may stay idle.
const IDLE: Duration = Duration::from_secs(5);

/// The answer to one request, and what to do once it has been sent.
pub struct Reply {
    /// Sent back as one line (without the newline).
    pub answer: String,
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

impl From<String> for Reply {
    fn from(answer: String) -> Reply {
        Reply { answer, then: None }
    }
}

/// Serves clients forever (run it on its own thread); `handle` answers one request line.
pub fn serve(listener: UnixListener, handle: impl Fn(&str) -> Reply) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if let Err(e) = serve_one(conn, &handle) {
            tracing::debug!("control connection: {e}");
        }
    }
}

fn serve_one(conn: UnixStream, handle: &impl Fn(&str) -> Reply) -> io::Result<()> {
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
        let reply = handle(&line);
        let mut text = reply.answer;
        text.push('\n');
        let written = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        if let Some(then) = reply.then {
            then();
        }
        written?;
    }
}

/// Sends one line to the line server at `path` and returns its answer line (without the
/// newline).
pub fn exchange(path: &std::path::Path, line: &str) -> io::Result<String> {
    let mut conn = UnixStream::connect(path)?;
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut text = line.to_string();
    text.push('\n');
    conn.write_all(text.as_bytes())?;
    let mut answer = String::new();
    BufReader::new(conn).read_line(&mut answer)?;
    if answer.pop() != Some('\n') {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection without an answer",
        ));
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_answered_in_turn_and_then_runs_after_the_answer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = super::super::bind(&path).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            serve(listener, move |line| {
                let tx = tx.clone();
                let echoed = line.trim().to_string();
                Reply {
                    answer: format!("got {echoed}"),
                    then: Some(Box::new(move || tx.send(echoed).unwrap())),
                }
            })
        });
        assert_eq!(exchange(&path, "a").unwrap(), "got a");
        assert_eq!(rx.recv().unwrap(), "a");
        assert_eq!(exchange(&path, "b").unwrap(), "got b");
        // A second server on the same path is refused while this one answers.
        assert_eq!(
            super::super::bind(&path).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
    }
}
