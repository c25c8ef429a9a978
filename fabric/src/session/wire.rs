//! Wire formats of the session protocol: the control-message headers carried by SEND, and the
//! out-of-band handshake (the rdma_cm part) carried over TCP. All integers little endian.

use std::io::{Read, Write};

use crate::verbs::{Access, Endpoint};

/// Version of the session protocol (handshake and control messages).
pub const PROTOCOL_VERSION: u16 = 2;

/// Largest control message (request or reply body), in bytes.
pub const MAX_CONTROL_MESSAGE: usize = 64 * 1024;

/// Length of a request header.
pub(crate) const REQUEST_HEADER_LEN: usize = 40;
/// Length of a reply header.
pub(crate) const REPLY_HEADER_LEN: usize = 24;
/// One control buffer: the longer header plus the largest body.
pub(crate) const CONTROL_SLOT: usize = REQUEST_HEADER_LEN + MAX_CONTROL_MESSAGE;

const REQUEST_MAGIC: u8 = 0xd1;
const REPLY_MAGIC: u8 = 0xd2;
/// Request flag: invalidate the lease with the reply (SEND_WITH_INV).
pub(crate) const FLAG_INVALIDATE_WITH_REPLY: u8 = 1;

/// The one right a scoped rkey grants the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeaseRight {
    /// The server may RDMA READ (it pulls data the worker writes).
    RemoteRead,
    /// The server may RDMA WRITE (it pushes data the worker reads).
    RemoteWrite,
}

impl LeaseRight {
    /// The window access flag.
    pub fn access(self) -> Access {
        match self {
            LeaseRight::RemoteRead => Access::REMOTE_READ,
            LeaseRight::RemoteWrite => Access::REMOTE_WRITE,
        }
    }

    fn code(right: Option<LeaseRight>) -> u8 {
        match right {
            None => 0,
            Some(LeaseRight::RemoteRead) => 1,
            Some(LeaseRight::RemoteWrite) => 2,
        }
    }

    fn from_code(code: u8) -> Option<Option<LeaseRight>> {
        match code {
            0 => Some(None),
            1 => Some(Some(LeaseRight::RemoteRead)),
            2 => Some(Some(LeaseRight::RemoteWrite)),
            _ => None,
        }
    }
}

/// The bulk part of a request as the server sees it: memory of the worker named by a scoped
/// rkey, zero-based.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseClaim {
    /// rkey of the worker's memory window.
    pub rkey: u32,
    /// First address (an offset: windows are zero-based).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// The one right granted.
    pub right: LeaseRight,
}

/// Header of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RequestHeader {
    pub flags: u8,
    pub tag: u16,
    pub request_id: u64,
    pub lease: Option<LeaseClaim>,
    pub msg_len: u32,
}

impl RequestHeader {
    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut b = [0u8; REQUEST_HEADER_LEN];
        b[0] = REQUEST_MAGIC;
        b[1] = self.flags;
        b[2] = LeaseRight::code(self.lease.map(|l| l.right));
        b[4..6].copy_from_slice(&self.tag.to_le_bytes());
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        if let Some(l) = self.lease {
            b[16..20].copy_from_slice(&l.rkey.to_le_bytes());
            b[20..24].copy_from_slice(&l.len.to_le_bytes());
            b[24..32].copy_from_slice(&l.addr.to_le_bytes());
        }
        b[32..36].copy_from_slice(&self.msg_len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<RequestHeader> {
        if b.len() < REQUEST_HEADER_LEN || b[0] != REQUEST_MAGIC {
            return None;
        }
        let right = LeaseRight::from_code(b[2])?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        Some(RequestHeader {
            flags: b[1],
            tag: u16::from_le_bytes([b[4], b[5]]),
            request_id: u64_at(8),
            lease: right.map(|right| LeaseClaim {
                rkey: u32_at(16),
                len: u32_at(20),
                addr: u64_at(24),
                right,
            }),
            msg_len: u32_at(32),
        })
    }
}

/// Outcome of a request as the reply states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReplyStatus {
    /// The handler ran; the body is its reply.
    Ok = 0,
    /// Refused before any RMA; the body is the reason (UTF-8).
    Refused = 1,
}

/// Header of a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReplyHeader {
    pub status: ReplyStatus,
    pub tag: u16,
    pub request_id: u64,
    pub bulk_len: u32,
    pub msg_len: u32,
}

impl ReplyHeader {
    pub fn encode(&self) -> [u8; REPLY_HEADER_LEN] {
        let mut b = [0u8; REPLY_HEADER_LEN];
        b[0] = REPLY_MAGIC;
        b[1] = self.status as u8;
        b[4..6].copy_from_slice(&self.tag.to_le_bytes());
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.bulk_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.msg_len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<ReplyHeader> {
        if b.len() < REPLY_HEADER_LEN || b[0] != REPLY_MAGIC {
            return None;
        }
        let status = match b[1] {
            0 => ReplyStatus::Ok,
            1 => ReplyStatus::Refused,
            _ => return None,
        };
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some(ReplyHeader {
            status,
            tag: u16::from_le_bytes([b[4], b[5]]),
            request_id: u64::from_le_bytes(b[8..16].try_into().unwrap_or([0; 8])),
            bulk_len: u32_at(16),
            msg_len: u32_at(20),
        })
    }
}

// ---- Handshake ------------------------------------------------------------------------------

const HELLO_MAGIC: &[u8; 4] = b"DPSS";
/// Longest handshake field (capability, endpoint, reason).
const MAX_FIELD: usize = 16 * 1024;

const CHALLENGE_MAGIC: &[u8; 4] = b"DPSC";

/// Server → client, first: fresh random bytes the client's proof must sign, so a proof
/// captured on the wire proves nothing at the next handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Challenge(pub [u8; 32]);

/// Client → server: who I am and how to reach my QP, and the proof that I hold the
/// capability's holder key: its signature of the challenge and of everything above it in
/// the hello (so neither the endpoint nor the capability can be swapped under it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub version: u16,
    pub depth: u16,
    pub max_bulk: u32,
    pub capability: Vec<u8>,
    pub endpoint: Endpoint,
    /// Empty when the client has no holder key.
    pub proof: Vec<u8>,
}

/// Server → client: accepted (with the server QP's endpoint) or refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    Accept {
        depth: u16,
        max_bulk: u32,
        endpoint: Endpoint,
    },
    Refuse {
        reason: String,
    },
}

/// Client → server after its QP is RTS, and server → client after its QP is RTS.
pub(crate) const READY: u8 = b'R';

fn put_field(out: &mut Vec<u8>, field: &[u8]) {
    out.extend_from_slice(&(field.len() as u32).to_le_bytes());
    out.extend_from_slice(field);
}

fn read_exact<const N: usize>(r: &mut impl Read) -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

fn read_field(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let len = u32::from_le_bytes(read_exact(r)?) as usize;
    if len > MAX_FIELD {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("handshake field of {len} bytes"),
        ));
    }
    let mut v = vec![0; len];
    r.read_exact(&mut v)?;
    Ok(v)
}

impl Challenge {
    pub fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&[&CHALLENGE_MAGIC[..], &self.0].concat())
    }

    pub fn read(r: &mut impl Read) -> std::io::Result<Challenge> {
        if &read_exact::<4>(r)? != CHALLENGE_MAGIC {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not a dpufs session server (no challenge)",
            ));
        }
        Ok(Challenge(read_exact(r)?))
    }
}

impl Hello {
    /// What the proof signs: the challenge, then the hello up to the proof.
    pub fn proof_message(&self, challenge: &Challenge) -> Vec<u8> {
        [&challenge.0[..], &self.unproved_bytes()].concat()
    }

    /// The hello's bytes before its proof.
    fn unproved_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.capability.len() + self.endpoint.0.len());
        out.extend_from_slice(HELLO_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.depth.to_le_bytes());
        out.extend_from_slice(&self.max_bulk.to_le_bytes());
        put_field(&mut out, &self.capability);
        put_field(&mut out, &self.endpoint.0);
        out
    }

    pub fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        let mut out = self.unproved_bytes();
        put_field(&mut out, &self.proof);
        w.write_all(&out)
    }

    pub fn read(r: &mut impl Read) -> std::io::Result<Hello> {
        if &read_exact::<4>(r)? != HELLO_MAGIC {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not a dpufs session handshake",
            ));
        }
        Ok(Hello {
            version: u16::from_le_bytes(read_exact(r)?),
            depth: u16::from_le_bytes(read_exact(r)?),
            max_bulk: u32::from_le_bytes(read_exact(r)?),
            capability: read_field(r)?,
            endpoint: Endpoint(read_field(r)?),
            proof: read_field(r)?,
        })
    }
}

impl Answer {
    pub fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        let mut out = Vec::with_capacity(64);
        match self {
            Answer::Accept {
                depth,
                max_bulk,
                endpoint,
            } => {
                out.push(0);
                out.extend_from_slice(&depth.to_le_bytes());
                out.extend_from_slice(&max_bulk.to_le_bytes());
                put_field(&mut out, &endpoint.0);
            }
            Answer::Refuse { reason } => {
                out.push(1);
                put_field(&mut out, reason.as_bytes());
            }
        }
        w.write_all(&out)
    }

    pub fn read(r: &mut impl Read) -> std::io::Result<Answer> {
        match read_exact::<1>(r)?[0] {
            0 => Ok(Answer::Accept {
                depth: u16::from_le_bytes(read_exact(r)?),
                max_bulk: u32::from_le_bytes(read_exact(r)?),
                endpoint: Endpoint(read_field(r)?),
            }),
            1 => Ok(Answer::Refuse {
                reason: String::from_utf8_lossy(&read_field(r)?).into_owned(),
            }),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "unknown handshake answer",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let req = RequestHeader {
            flags: FLAG_INVALIDATE_WITH_REPLY,
            tag: 7,
            request_id: 1 << 40,
            lease: Some(LeaseClaim {
                rkey: 0x1234_5678,
                addr: 0,
                len: 1 << 20,
                right: LeaseRight::RemoteWrite,
            }),
            msg_len: 99,
        };
        assert_eq!(RequestHeader::decode(&req.encode()), Some(req));
        let none = RequestHeader { lease: None, ..req };
        assert_eq!(RequestHeader::decode(&none.encode()), Some(none));
        let reply = ReplyHeader {
            status: ReplyStatus::Refused,
            tag: 3,
            request_id: 5,
            bulk_len: 4096,
            msg_len: 12,
        };
        assert_eq!(ReplyHeader::decode(&reply.encode()), Some(reply));
        assert_eq!(ReplyHeader::decode(&req.encode()), None);
    }

    #[test]
    fn handshake_round_trips() {
        let hello = Hello {
            version: PROTOCOL_VERSION,
            depth: 16,
            max_bulk: 1 << 20,
            capability: vec![1, 2, 3],
            endpoint: Endpoint(b"tcp:1.2.3.4:5/qp=1/psn=2".to_vec()),
            proof: vec![4; 64],
        };
        let mut buf = Vec::new();
        hello.write(&mut buf).unwrap();
        assert_eq!(Hello::read(&mut buf.as_slice()).unwrap(), hello);
        // The proof signs everything before it, after the challenge.
        let challenge = Challenge([5; 32]);
        let message = hello.proof_message(&challenge);
        assert_eq!(&message[..32], &[5; 32]);
        assert_eq!(&message[32..], &buf[..buf.len() - 4 - 64]);
        let mut buf = Vec::new();
        challenge.write(&mut buf).unwrap();
        assert_eq!(Challenge::read(&mut buf.as_slice()).unwrap(), challenge);
        for answer in [
            Answer::Refuse {
                reason: "expired".into(),
            },
            Answer::Accept {
                depth: 8,
                max_bulk: 4096,
                endpoint: Endpoint(vec![9; 10]),
            },
        ] {
            let mut buf = Vec::new();
            answer.write(&mut buf).unwrap();
            assert_eq!(Answer::read(&mut buf.as_slice()).unwrap(), answer);
        }
    }
}
