//! The peer process: a loop that executes [`Command`]s against any provider, and the client
//! the suite (and the benchmark) uses to drive it.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

use super::protocol::{Command, PeerWr, Reply};
use crate::error::Result as FabricResult;
use crate::provider::{CompletionQueue, MemoryRegion, QueuePair, RdmaDevice};
use crate::verbs::{
    Access, Endpoint, QpCaps, QpState, QpTransition, RecvWr, SendOp, SendWr, Sge, WorkCompletion,
};

/// Extra time the client allows beyond a command's own timeout.
const REPLY_MARGIN: Duration = Duration::from_secs(20);

/// A QP with its send and receive CQs.
type QpWithCqs<'a, D> = (
    &'a <D as RdmaDevice>::Qp,
    &'a <D as RdmaDevice>::Cq,
    &'a <D as RdmaDevice>::Cq,
);

enum Object<D: RdmaDevice> {
    Device(D),
    Pd(D::Pd),
    Mr(D::Mr),
    Qp { qp: D::Qp, send: D::Cq, recv: D::Cq },
}

struct Objects<D: RdmaDevice> {
    next: u32,
    map: HashMap<u32, Object<D>>,
}

macro_rules! getter {
    ($name:ident, $variant:ident, $ty:ty) => {
        fn $name(&self, id: u32) -> Result<&$ty, String> {
            match self.map.get(&id) {
                Some(Object::$variant(x)) => Ok(x),
                _ => Err(format!("no {} with id {id}", stringify!($variant))),
            }
        }
    };
}

impl<D: RdmaDevice> Objects<D> {
    getter!(device, Device, D);
    getter!(pd, Pd, D::Pd);
    getter!(mr, Mr, D::Mr);

    fn qp(&self, id: u32) -> Result<QpWithCqs<'_, D>, String> {
        match self.map.get(&id) {
            Some(Object::Qp { qp, send, recv }) => Ok((qp, send, recv)),
            _ => Err(format!("no QP with id {id}")),
        }
    }

    fn add(&mut self, object: Object<D>) -> u32 {
        self.next += 1;
        self.map.insert(self.next, object);
        self.next
    }

    fn execute(
        &mut self,
        open: &dyn Fn(&str) -> FabricResult<D>,
        cmd: Command,
    ) -> Result<Reply, String> {
        let s = |e: crate::FabricError| e.to_string();
        Ok(match cmd {
            Command::Open { name } => Reply::Id {
                id: self.add(Object::Device(open(&name).map_err(s)?)),
            },
            Command::AllocPd { dev } => {
                let pd = self.device(dev)?.alloc_pd().map_err(s)?;
                Reply::Id {
                    id: self.add(Object::Pd(pd)),
                }
            }
            Command::RegMr {
                dev,
                pd,
                len,
                access,
                fill,
            } => {
                let mr = self
                    .device(dev)?
                    .reg_mr(self.pd(pd)?, len, access)
                    .map_err(s)?;
                // SAFETY: a new region, not yet known to anyone.
                unsafe { mr.write_at(0, &vec![fill; len]) }.map_err(s)?;
                let (rkey, addr) = (mr.rkey(), mr.addr());
                Reply::Mr {
                    id: self.add(Object::Mr(mr)),
                    rkey,
                    addr,
                }
            }
            Command::CreateQp { dev, pd, access } => {
                let d = self.device(dev)?;
                let send = d.create_cq(256).map_err(s)?;
                let recv = d.create_cq(256).map_err(s)?;
                let qp = d
                    .create_qp(self.pd(pd)?, &send, &recv, QpCaps::default())
                    .map_err(s)?;
                qp.modify(QpTransition::Init { access }).map_err(s)?;
                let (qp_num, endpoint) = (qp.qp_num(), qp.endpoint());
                Reply::Qp {
                    id: self.add(Object::Qp { qp, send, recv }),
                    qp_num,
                    endpoint,
                }
            }
            Command::Rtr { qp, remote } => {
                self.qp(qp)?
                    .0
                    .modify(QpTransition::Rtr { remote })
                    .map_err(s)?;
                Reply::Ok
            }
            Command::Rts { qp } => {
                self.qp(qp)?.0.modify(QpTransition::Rts).map_err(s)?;
                Reply::Ok
            }
            Command::Post { qp, wr_id, wr } => {
                let (qp, _, _) = self.qp(qp)?;
                let sge = |mr: u32, offset, len| -> Result<Sge<'_, D::Mr>, String> {
                    Ok(Sge {
                        mr: self.mr(mr)?,
                        offset,
                        len,
                    })
                };
                let op = match wr {
                    PeerWr::Write {
                        mr,
                        offset,
                        len,
                        remote,
                    } => SendOp::RdmaWrite {
                        sge: sge(mr, offset, len)?,
                        remote,
                    },
                    PeerWr::Read {
                        mr,
                        offset,
                        len,
                        remote,
                    } => SendOp::RdmaRead {
                        sge: sge(mr, offset, len)?,
                        remote,
                    },
                    PeerWr::Send {
                        mr,
                        offset,
                        len,
                        invalidate: None,
                    } => SendOp::Send {
                        sge: Some(sge(mr, offset, len)?),
                    },
                    PeerWr::Send {
                        mr,
                        offset,
                        len,
                        invalidate: Some(invalidate_rkey),
                    } => SendOp::SendWithInv {
                        sge: Some(sge(mr, offset, len)?),
                        invalidate_rkey,
                    },
                };
                qp.post_send(SendWr {
                    wr_id,
                    op,
                    signaled: true,
                })
                .map_err(s)?;
                Reply::Ok
            }
            Command::PostRecv {
                qp,
                wr_id,
                mr,
                offset,
                len,
            } => {
                self.qp(qp)?
                    .0
                    .post_recv(RecvWr {
                        wr_id,
                        sge: Some(Sge {
                            mr: self.mr(mr)?,
                            offset,
                            len,
                        }),
                    })
                    .map_err(s)?;
                Reply::Ok
            }
            Command::Poll {
                qp,
                recv,
                timeout_ms,
            } => {
                let (_, send_cq, recv_cq) = self.qp(qp)?;
                let cq = if recv { recv_cq } else { send_cq };
                Reply::Completion {
                    wc: cq.wait(Duration::from_millis(timeout_ms)),
                }
            }
            Command::ReadMr { mr, offset, len } => {
                let mut data = vec![0; len];
                // SAFETY: the peer serves one command at a time, on one thread.
                unsafe { self.mr(mr)?.read_at(offset, &mut data) }.map_err(s)?;
                Reply::Bytes { data }
            }
            Command::QpState { qp } => Reply::State {
                state: self.qp(qp)?.0.state(),
            },
            Command::Drop { id } => {
                self.map.remove(&id);
                Reply::Ok
            }
            Command::Usage => {
                let (user_us, system_us) = cpu_time_us();
                Reply::Usage { user_us, system_us }
            }
            Command::TcpServe => Reply::Addr {
                addr: super::baseline::serve()
                    .map_err(|e| e.to_string())?
                    .to_string(),
            },
        })
    }
}

/// Serves commands from `input` until it ends, answering on `output`. `open` opens a device
/// of the provider under test by name.
pub fn serve<D: RdmaDevice>(
    open: &dyn Fn(&str) -> FabricResult<D>,
    input: impl BufRead,
    mut output: impl Write,
) -> io::Result<()> {
    let mut objects = Objects::<D> {
        next: 0,
        map: HashMap::new(),
    };
    for line in input.lines() {
        let line = line?;
        let reply = match serde_json::from_str::<Command>(&line) {
            Ok(cmd) => objects
                .execute(open, cmd)
                .unwrap_or_else(|message| Reply::Error { message }),
            Err(e) => Reply::Error {
                message: format!("bad command: {e}"),
            },
        };
        serde_json::to_writer(&mut output, &reply)?;
        output.write_all(b"\n")?;
        output.flush()?;
    }
    Ok(())
}

/// User and system CPU time of this process, in microseconds.
pub fn cpu_time_us() -> (u64, u64) {
    // SAFETY: getrusage fills the zeroed struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage struct.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(usage.ru_utime), us(usage.ru_stime))
}

/// A running peer process.
#[derive(Debug)]
pub struct Peer {
    io: Mutex<(ChildStdin, Receiver<String>)>,
    child: Child,
}

/// QP handle the peer gave out, with its endpoint.
#[derive(Clone, Debug)]
pub struct PeerQp {
    /// Object id.
    pub id: u32,
    /// QP number.
    pub qp_num: u32,
    /// Endpoint for the other side's RTR.
    pub endpoint: Endpoint,
}

/// MR handle the peer gave out.
#[derive(Clone, Copy, Debug)]
pub struct PeerMr {
    /// Object id.
    pub id: u32,
    /// Its rkey.
    pub rkey: u32,
    /// Its address in the rkey's address space.
    pub addr: u64,
}

impl Peer {
    /// Starts `command` (the peer binary, arguments and environment already set) with piped
    /// stdin/stdout.
    pub fn spawn(mut command: std::process::Command) -> io::Result<Peer> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(io::Error::other("peer without pipes"));
        };
        // A reader thread turns the blocking pipe into a channel, so every wait has a deadline.
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("peer-stdout".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Peer {
            io: Mutex::new((stdin, rx)),
            child,
        })
    }

    /// Sends one command and waits for its reply; [`Reply::Error`] becomes `Err`.
    pub fn call(&self, cmd: &Command) -> Result<Reply, String> {
        let wait = match cmd {
            Command::Poll { timeout_ms, .. } => Duration::from_millis(*timeout_ms) + REPLY_MARGIN,
            _ => REPLY_MARGIN,
        };
        let mut io = crate::soft::lock(&self.io);
        let (stdin, replies) = &mut *io;
        let line = serde_json::to_string(cmd).map_err(|e| e.to_string())?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("peer stdin: {e}"))?;
        let reply = match replies.recv_timeout(wait) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => return Err(format!("peer did not answer {cmd:?}")),
            Err(RecvTimeoutError::Disconnected) => return Err("peer exited".into()),
        };
        match serde_json::from_str(&reply).map_err(|e| format!("bad reply {reply:?}: {e}"))? {
            Reply::Error { message } => Err(format!("peer: {message}")),
            reply => Ok(reply),
        }
    }

    fn id(&self, cmd: &Command) -> Result<u32, String> {
        match self.call(cmd)? {
            Reply::Id { id } => Ok(id),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    fn ok(&self, cmd: &Command) -> Result<(), String> {
        match self.call(cmd)? {
            Reply::Ok => Ok(()),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    /// Opens device `name` in the peer.
    pub fn open(&self, name: &str) -> Result<u32, String> {
        self.id(&Command::Open { name: name.into() })
    }

    /// Allocates a PD.
    pub fn alloc_pd(&self, dev: u32) -> Result<u32, String> {
        self.id(&Command::AllocPd { dev })
    }

    /// Registers an MR filled with `fill`.
    pub fn reg_mr(
        &self,
        dev: u32,
        pd: u32,
        len: usize,
        access: Access,
        fill: u8,
    ) -> Result<PeerMr, String> {
        match self.call(&Command::RegMr {
            dev,
            pd,
            len,
            access,
            fill,
        })? {
            Reply::Mr { id, rkey, addr } => Ok(PeerMr { id, rkey, addr }),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    /// Creates a QP in INIT.
    pub fn create_qp(&self, dev: u32, pd: u32, access: Access) -> Result<PeerQp, String> {
        match self.call(&Command::CreateQp { dev, pd, access })? {
            Reply::Qp {
                id,
                qp_num,
                endpoint,
            } => Ok(PeerQp {
                id,
                qp_num,
                endpoint,
            }),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    /// Moves a QP to RTR towards `remote`.
    pub fn rtr(&self, qp: u32, remote: &Endpoint) -> Result<(), String> {
        self.ok(&Command::Rtr {
            qp,
            remote: remote.clone(),
        })
    }

    /// Moves a QP to RTS.
    pub fn rts(&self, qp: u32) -> Result<(), String> {
        self.ok(&Command::Rts { qp })
    }

    /// Posts a work request.
    pub fn post(&self, qp: u32, wr_id: u64, wr: PeerWr) -> Result<(), String> {
        self.ok(&Command::Post { qp, wr_id, wr })
    }

    /// Posts a receive.
    pub fn post_recv(
        &self,
        qp: u32,
        wr_id: u64,
        mr: u32,
        offset: usize,
        len: usize,
    ) -> Result<(), String> {
        self.ok(&Command::PostRecv {
            qp,
            wr_id,
            mr,
            offset,
            len,
        })
    }

    /// Waits for a completion.
    pub fn poll(
        &self,
        qp: u32,
        recv: bool,
        timeout: Duration,
    ) -> Result<Option<WorkCompletion>, String> {
        match self.call(&Command::Poll {
            qp,
            recv,
            timeout_ms: timeout.as_millis() as u64,
        })? {
            Reply::Completion { wc } => Ok(wc),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    /// Reads MR contents.
    pub fn read_mr(&self, mr: u32, offset: usize, len: usize) -> Result<Vec<u8>, String> {
        match self.call(&Command::ReadMr { mr, offset, len })? {
            Reply::Bytes { data } => Ok(data),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    /// A QP's state.
    pub fn qp_state(&self, qp: u32) -> Result<QpState, String> {
        match self.call(&Command::QpState { qp })? {
            Reply::State { state } => Ok(state),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    /// Drops an object.
    pub fn drop_object(&self, id: u32) -> Result<(), String> {
        self.ok(&Command::Drop { id })
    }

    /// The peer's CPU time so far (user, system) in microseconds.
    pub fn usage(&self) -> Result<(u64, u64), String> {
        match self.call(&Command::Usage)? {
            Reply::Usage { user_us, system_us } => Ok((user_us, system_us)),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    /// Starts the plain-TCP baseline server in the peer.
    pub fn tcp_serve(&self) -> Result<String, String> {
        match self.call(&Command::TcpServe)? {
            Reply::Addr { addr } => Ok(addr),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
