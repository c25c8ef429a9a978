//! A delay line for a network namespace's packets: iptables queues them to an NFQUEUE, and a
//! thread of the test lets each one go on after a fixed delay, in the order they came. This is
//! `tc netem delay` without netem, which this kernel is built without (its netfilter queue is
//! built in). The rules use `--queue-bypass`, so a line that is gone passes packets on instead
//! of dropping them.
//!
//! The protocol is nfnetlink_queue's: bind the queue, ask for packet metadata only (ids, no
//! payload), then answer each packet with a verdict; one batch verdict accepts every packet up
//! to an id.

use dpufs_e2e::netns::Netns;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const NETLINK_NETFILTER: i32 = 12;
const SOL_NETLINK: i32 = 270;
const NETLINK_NO_ENOBUFS: i32 = 5;
const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQNL_MSG_VERDICT_BATCH: u16 = 3;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQA_CFG_MASK: u16 = 4;
const NFQA_CFG_FLAGS: u16 = 5;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_META: u8 = 1;
/// Segmentation offload packets queued whole (their payload is never looked at).
const NFQA_CFG_F_GSO: u32 = 4;
const NF_ACCEPT: u32 = 1;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLMSG_ERROR: u16 = 2;
const NLMSG_HDRLEN: usize = 16;
/// nlmsghdr, then nfgenmsg.
const PAYLOAD: usize = NLMSG_HDRLEN + 4;
/// Packets the kernel holds for the line: enough for seconds of a busy link.
const MAX_HELD: u32 = 1 << 16;

/// A running delay line.
pub struct DelayLine {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl DelayLine {
    /// Holds every packet iptables queues to `queue` in `netns` for `delay`.
    pub fn start(netns: &Netns, queue: u16, delay: Duration) -> DelayLine {
        // A netlink socket belongs to the namespace it was made in.
        let socket = netns
            .run(|| bind(queue))
            .expect("enter the namespace")
            .expect("bind the netfilter queue");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("delay-line-{queue}"))
            .spawn(move || serve(&socket, queue, delay, &flag))
            .expect("spawn the delay line");
        DelayLine {
            stop,
            thread: Some(thread),
        }
    }

    /// Lets every held packet go and stops; the packets it delayed.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Release);
        let thread = self.thread.take().expect("running");
        thread.join().expect("the delay line panicked")
    }
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A netlink socket bound to `queue`, which sends packet ids only.
fn bind(queue: u16) -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned from here.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, NETLINK_NETFILTER) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    set_option(&socket, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 16 << 20)?;
    // A burst beyond the buffer loses metadata messages, not the kernel's packets: they stay
    // queued, and the next batch verdict covers them.
    set_option(&socket, SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)?;
    let family = (libc::AF_INET as u16).to_be_bytes();
    let command = [NFQNL_CFG_CMD_BIND, 0, family[0], family[1]];
    request(
        &socket,
        &message(
            NFQNL_MSG_CONFIG,
            NLM_F_ACK,
            queue,
            &[(NFQA_CFG_CMD, &command)],
        ),
    )?;
    let mut params = 0xffff_u32.to_be_bytes().to_vec();
    params.push(NFQNL_COPY_META);
    let config = message(
        NFQNL_MSG_CONFIG,
        NLM_F_ACK,
        queue,
        &[
            (NFQA_CFG_PARAMS, &params),
            (NFQA_CFG_QUEUE_MAXLEN, &MAX_HELD.to_be_bytes()),
            (NFQA_CFG_MASK, &NFQA_CFG_F_GSO.to_be_bytes()),
            (NFQA_CFG_FLAGS, &NFQA_CFG_F_GSO.to_be_bytes()),
        ],
    );
    request(&socket, &config)?;
    Ok(socket)
}

fn set_option(socket: &OwnedFd, level: i32, name: i32, value: i32) -> std::io::Result<()> {
    // SAFETY: setsockopt(2) with an int of the size given.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&value as *const i32).cast(),
            size_of::<i32>() as u32,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A nfnetlink_queue message of `kind` for `queue` with its attributes.
fn message(kind: u16, flags: u16, queue: u16, attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut m = vec![0u8; NLMSG_HDRLEN];
    m.extend([libc::AF_UNSPEC as u8, 0]);
    m.extend(queue.to_be_bytes());
    for (kind, payload) in attrs {
        m.extend(((4 + payload.len()) as u16).to_ne_bytes());
        m.extend(kind.to_ne_bytes());
        m.extend(*payload);
        m.resize(m.len().next_multiple_of(4), 0);
    }
    let len = m.len() as u32;
    m[0..4].copy_from_slice(&len.to_ne_bytes());
    m[4..6].copy_from_slice(&((NFNL_SUBSYS_QUEUE << 8) | kind).to_ne_bytes());
    m[6..8].copy_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
    m
}

fn send(socket: &OwnedFd, m: &[u8]) -> std::io::Result<()> {
    // SAFETY: send(2) of a buffer we own; an unconnected netlink socket sends to the kernel.
    let n = unsafe { libc::send(socket.as_raw_fd(), m.as_ptr().cast(), m.len(), 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Sends a configuration message and waits for the kernel's acknowledgement.
fn request(socket: &OwnedFd, m: &[u8]) -> std::io::Result<()> {
    send(socket, m)?;
    let mut buf = vec![0u8; 8192];
    // SAFETY: recv(2) into a buffer we own.
    let n = unsafe { libc::recv(socket.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let ack = &buf[..n as usize];
    let kind = u16::from_ne_bytes([ack[4], ack[5]]);
    let code = i32::from_ne_bytes(ack[16..20].try_into().expect("4 bytes"));
    match (kind, code) {
        (NLMSG_ERROR, 0) => Ok(()),
        (NLMSG_ERROR, e) => Err(std::io::Error::from_raw_os_error(-e)),
        _ => Err(std::io::Error::other(format!(
            "netlink answered type {kind}"
        ))),
    }
}

/// The delay line's loop: takes packet ids as they are queued, accepts them once their
/// delay has passed, and at the end accepts everything; the packets it delayed.
fn serve(socket: &OwnedFd, queue: u16, delay: Duration, stop: &AtomicBool) -> u64 {
    let mut held: VecDeque<(u32, Instant)> = VecDeque::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut delayed = 0;
    while !stop.load(Ordering::Acquire) {
        let next = held.front().map(|&(_, due)| due);
        let wait = next.map_or(Duration::from_millis(20), |due| {
            due.saturating_duration_since(Instant::now())
        });
        let mut poll = libc::pollfd {
            fd: socket.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = wait.as_millis().clamp(1, 20) as i32;
        // SAFETY: poll(2) on one descriptor we own.
        if unsafe { libc::poll(&mut poll, 1, ms) } > 0 {
            receive(socket, &mut buf, delay, &mut held);
        }
        let now = Instant::now();
        let due = held.iter().take_while(|&&(_, due)| due <= now).count();
        if due > 0 {
            let (last, _) = held[due - 1];
            accept_up_to(socket, queue, last);
            held.drain(..due);
            delayed += due as u64;
        }
    }
    if let Some(&(last, _)) = held.back() {
        accept_up_to(socket, queue, last);
        delayed += held.len() as u64;
    }
    delayed
}

/// Takes the packets waiting on the socket, each due `delay` from now.
fn receive(socket: &OwnedFd, buf: &mut [u8], delay: Duration, held: &mut VecDeque<(u32, Instant)>) {
    loop {
        // SAFETY: recv(2) into a buffer we own, without waiting.
        let n = unsafe {
            libc::recv(
                socket.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            return;
        }
        let due = Instant::now() + delay;
        held.extend(packet_ids(&buf[..n as usize]).map(|id| (id, due)));
    }
}

/// The ids of the packets announced in one datagram of netlink messages.
fn packet_ids(datagram: &[u8]) -> impl Iterator<Item = u32> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        while at + NLMSG_HDRLEN <= datagram.len() {
            let len = u32::from_ne_bytes(datagram[at..at + 4].try_into().ok()?) as usize;
            let kind = u16::from_ne_bytes([datagram[at + 4], datagram[at + 5]]);
            let end = (at + len).min(datagram.len());
            let msg = &datagram[at..end];
            at += len.next_multiple_of(4).max(NLMSG_HDRLEN);
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET
                && let Some(id) = attribute(msg, NFQA_PACKET_HDR)
                    .and_then(|h| Some(u32::from_be_bytes(h.get(0..4)?.try_into().ok()?)))
            {
                return Some(id);
            }
        }
        None
    })
}

/// The payload of attribute `wanted` of a nfnetlink message.
fn attribute(msg: &[u8], wanted: u16) -> Option<&[u8]> {
    let mut at = PAYLOAD;
    while at + 4 <= msg.len() {
        let len = u16::from_ne_bytes([msg[at], msg[at + 1]]) as usize;
        let kind = u16::from_ne_bytes([msg[at + 2], msg[at + 3]]) & 0x3fff;
        if len < 4 || at + len > msg.len() {
            return None;
        }
        if kind == wanted {
            return Some(&msg[at + 4..at + len]);
        }
        at += len.next_multiple_of(4);
    }
    None
}

/// Accepts every packet of the queue up to `id`.
fn accept_up_to(socket: &OwnedFd, queue: u16, id: u32) {
    let mut verdict = NF_ACCEPT.to_be_bytes().to_vec();
    verdict.extend(id.to_be_bytes());
    let m = message(
        NFQNL_MSG_VERDICT_BATCH,
        0,
        queue,
        &[(NFQA_VERDICT_HDR, &verdict)],
    );
    send(socket, &m).expect("a verdict");
}
