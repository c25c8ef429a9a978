//! The checks the responder NIC makes on every incoming RDMA READ/WRITE, in the NIC's order
//! (after rxe's `check_op_valid`, `check_length` and `check_rkey`; the numbered steps are listed
//! in docs/fabric.md, "The responder's checks"), and the test-only switches that turn single
//! checks off to prove each one is necessary.

use std::fmt;
use std::str::FromStr;

use crate::Access;
use crate::keys::key_index;

/// A set of responder checks. [`NicChecks::ALL`] is the only setting for real use, and the
/// only one a build without the cargo feature `testing` has; the switches of a test build exist
/// so the conformance suite can show that each check is needed (every switched off check makes
/// a named test fail).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NicChecks(u32);

impl NicChecks {
    /// No checks.
    pub const NONE: NicChecks = NicChecks(0);
    /// Step 1: the QP's own access flags must allow the remote operation.
    pub const OPCODE: NicChecks = NicChecks(1);
    /// Step 3: the full key must equal the object's current key (not just the index).
    pub const KEY_BYTE: NicChecks = NicChecks(1 << 1);
    /// Steps 4/5: PD of the MR or window equals PD of the QP.
    pub const PD: NicChecks = NicChecks(1 << 2);
    /// Step 5: a type-2 window is bound to this QP.
    pub const MW_QP_BINDING: NicChecks = NicChecks(1 << 3);
    /// Steps 4/5: the object is VALID (and a window has a non-zero length).
    pub const STATE: NicChecks = NicChecks(1 << 4);
    /// Steps 4/5: the requested right is granted.
    pub const RIGHTS: NicChecks = NicChecks(1 << 5);
    /// Step 6: the range lies inside the MR or window.
    pub const BOUNDS: NicChecks = NicChecks(1 << 6);
    /// Every check.
    pub const ALL: NicChecks = NicChecks((1 << 7) - 1);

    const NAMES: [(NicChecks, &'static str); 7] = [
        (NicChecks::OPCODE, "opcode"),
        (NicChecks::KEY_BYTE, "key_byte"),
        (NicChecks::PD, "pd"),
        (NicChecks::MW_QP_BINDING, "mw_qp_binding"),
        (NicChecks::STATE, "state"),
        (NicChecks::RIGHTS, "rights"),
        (NicChecks::BOUNDS, "bounds"),
    ];

    /// Each single check with its switch name, in the NIC's order.
    pub fn each() -> impl Iterator<Item = (NicChecks, &'static str)> {
        Self::NAMES.into_iter()
    }

    /// The raw bits (stored in the device header).
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// From raw bits; unknown bits are dropped.
    pub const fn from_bits_truncate(bits: u32) -> NicChecks {
        NicChecks(bits & Self::ALL.0)
    }

    /// Whether every check of `other` is in this set.
    pub const fn contains(self, other: NicChecks) -> bool {
        self.0 & other.0 == other.0
    }

    /// Union.
    pub const fn union(self, other: NicChecks) -> NicChecks {
        NicChecks(self.0 | other.0)
    }

    /// This set without the checks of `other`.
    pub const fn without(self, other: NicChecks) -> NicChecks {
        NicChecks(self.0 & !other.0)
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Debug for NicChecks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Comma-separated switch names, as taken by `DPUFS_FABRIC_DISABLE_CHECKS`.
impl fmt::Display for NicChecks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Self::each()
            .filter(|(c, _)| self.contains(*c))
            .map(|(_, n)| n)
            .collect();
        f.write_str(&names.join(","))
    }
}

impl FromStr for NicChecks {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .try_fold(NicChecks::NONE, |acc, name| {
                if name == "all" {
                    return Ok(NicChecks::ALL);
                }
                Self::each()
                    .find(|(_, n)| *n == name)
                    .map(|(c, _)| acc.union(c))
                    .ok_or_else(|| format!("unknown NIC check {name:?}"))
            })
    }
}

/// What a key names in the device table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ObjectKind {
    /// Memory region.
    Mr,
    /// Type-2 memory window.
    Mw,
}

/// Life-cycle state of a table object (rxe's `RXE_MR_STATE_*` / `RXE_MW_STATE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ObjectState {
    /// Allocated window that is not bound (at alloc and after invalidation).
    Free,
    /// Usable.
    Valid,
    /// Being torn down.
    Invalid,
}

/// A consistent copy of one table entry, as the responder sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyedObject {
    pub kind: ObjectKind,
    pub state: ObjectState,
    /// Current full key.
    pub key: u32,
    /// Device-wide PD id.
    pub pd: u32,
    /// Granted rights.
    pub access: Access,
    /// Windows: device-wide id of the QP the window is bound to (0: none).
    pub bound_qp: u32,
    /// First remote address (0 when zero-based).
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// Offset of `base` inside the backing memory.
    pub mem_offset: u64,
    /// Id of the backing memory (the MR's registration).
    pub mem_id: u64,
}

/// The responder QP as the checks need it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ResponderQp {
    /// Device-wide PD id.
    pub pd: u32,
    /// Device-wide QP id.
    pub qp_id: u32,
    /// The QP's remote access flags.
    pub access: Access,
}

/// Incoming one-sided operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RmaOp {
    Read,
    Write,
}

impl RmaOp {
    fn right(self) -> Access {
        match self {
            RmaOp::Read => Access::REMOTE_READ,
            RmaOp::Write => Access::REMOTE_WRITE,
        }
    }
}

/// Where an accepted request lands: `len` bytes at `offset` of backing memory `mem_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub mem_id: u64,
    pub offset: u64,
    pub len: u64,
}

/// NAK class of a rejected request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Nak {
    /// NAK invalid request: requester sees `RemInvReqErr`.
    InvalidRequest,
    /// NAK remote access error: requester sees `RemAccessErr`.
    RemoteAccess,
}

/// A rejected request: the NAK and which check failed (for logs and audit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rejection {
    pub nak: Nak,
    pub check: &'static str,
}

/// Largest DMA length of one request (IBTA: 2³¹).
pub(crate) const MAX_MESSAGE: u64 = 1 << 31;

/// Runs the responder's checks for an RDMA READ or WRITE of `len` bytes at `addr` with `rkey`,
/// in the NIC's order. `lookup` returns the table entry at a key index, or `None` if the index
/// holds no object. `Ok(None)` is a zero-length request, which skips the key checks as on the
/// NIC.
pub(crate) fn check_rma(
    enabled: NicChecks,
    qp: &ResponderQp,
    op: RmaOp,
    rkey: u32,
    addr: u64,
    len: u64,
    lookup: impl FnOnce(u32) -> Option<KeyedObject>,
) -> Result<Option<Target>, Rejection> {
    let on = |c: NicChecks| enabled.contains(c);
    let reject = |nak, check| Err(Rejection { nak, check });
    let access_error = |check| reject(Nak::RemoteAccess, check);

    // 1. Transport: the QP must serve this opcode at all.
    if on(NicChecks::OPCODE) && !qp.access.contains(op.right()) {
        return reject(Nak::InvalidRequest, "qp access flags");
    }
    // 2. Length.
    if len > MAX_MESSAGE {
        return reject(Nak::InvalidRequest, "length");
    }
    if len == 0 {
        return Ok(None);
    }
    // 3. Key → object, then the key byte.
    let Some(obj) = lookup(key_index(rkey)) else {
        return access_error("key index");
    };
    if on(NicChecks::KEY_BYTE) && obj.key != rkey {
        return access_error("key byte");
    }
    // 4./5. Object checks: PD, window's QP, rights, state (rxe's order).
    if on(NicChecks::PD) && obj.pd != qp.pd {
        return access_error("pd");
    }
    if obj.kind == ObjectKind::Mw && on(NicChecks::MW_QP_BINDING) && obj.bound_qp != qp.qp_id {
        return access_error("window bound to another qp");
    }
    if on(NicChecks::RIGHTS) && !obj.access.contains(op.right()) {
        return access_error("rights");
    }
    if on(NicChecks::STATE) && (obj.state != ObjectState::Valid || obj.len == 0) {
        return access_error("state");
    }
    // 6. Bounds. Without the check the offset is computed anyway (wrapping), as a NIC would
    // translate it; the memory layer still refuses anything outside the backing memory.
    let rel = addr.wrapping_sub(obj.base);
    if on(NicChecks::BOUNDS)
        && (addr < obj.base || rel.checked_add(len).is_none_or(|end| end > obj.len))
    {
        return access_error("bounds");
    }
    Ok(Some(Target {
        mem_id: obj.mem_id,
        offset: obj.mem_offset.wrapping_add(rel),
        len,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::make_key;

    fn window() -> KeyedObject {
        KeyedObject {
            kind: ObjectKind::Mw,
            state: ObjectState::Valid,
            key: make_key(7, 0x42),
            pd: 3,
            access: Access::REMOTE_READ,
            bound_qp: 11,
            base: 0x1000,
            len: 0x100,
            mem_offset: 0x40,
            mem_id: 99,
        }
    }

    const QP: ResponderQp = ResponderQp {
        pd: 3,
        qp_id: 11,
        access: Access::REMOTE_READ,
    };

    fn run(
        enabled: NicChecks,
        qp: ResponderQp,
        op: RmaOp,
        rkey: u32,
        addr: u64,
        len: u64,
    ) -> Result<Option<Target>, Rejection> {
        check_rma(enabled, &qp, op, rkey, addr, len, |i| (i == 7).then(window))
    }

    #[test]
    fn accepts_and_translates() {
        let t = run(
            NicChecks::ALL,
            QP,
            RmaOp::Read,
            make_key(7, 0x42),
            0x1010,
            0x10,
        )
        .unwrap();
        assert_eq!(
            t,
            Some(Target {
                mem_id: 99,
                offset: 0x50,
                len: 0x10
            })
        );
    }

    #[test]
    fn order_follows_the_nic() {
        // Several things wrong at once: the earliest check in the NIC's order is reported.
        let mut qp = QP;
        qp.access = Access::NONE;
        qp.pd = 4;
        let r = run(NicChecks::ALL, qp, RmaOp::Read, make_key(7, 0x41), 0, 1).unwrap_err();
        assert_eq!(r.nak, Nak::InvalidRequest);
        qp.access = Access::REMOTE_READ;
        let r = run(NicChecks::ALL, qp, RmaOp::Read, make_key(7, 0x41), 0, 1).unwrap_err();
        assert_eq!(r.check, "key byte");
        let r = run(NicChecks::ALL, qp, RmaOp::Read, make_key(7, 0x42), 0, 1).unwrap_err();
        assert_eq!(r.check, "pd");
        let r = run(
            NicChecks::ALL,
            QP,
            RmaOp::Read,
            make_key(8, 0x42),
            0x1000,
            1,
        )
        .unwrap_err();
        assert_eq!(r.check, "key index");
        let r = run(
            NicChecks::ALL,
            QP,
            RmaOp::Read,
            make_key(7, 0x42),
            0x10ff,
            2,
        )
        .unwrap_err();
        assert_eq!(r.check, "bounds");
        // Zero length skips the key checks.
        assert_eq!(run(NicChecks::ALL, QP, RmaOp::Read, 0, 0, 0), Ok(None));
    }

    #[test]
    fn switches_parse_and_print() {
        let c: NicChecks = "pd, bounds".parse().unwrap();
        assert_eq!(c, NicChecks::PD.union(NicChecks::BOUNDS));
        assert_eq!(c.to_string(), "pd,bounds");
        assert_eq!("all".parse::<NicChecks>().unwrap(), NicChecks::ALL);
        assert!("nope".parse::<NicChecks>().is_err());
        assert_eq!(NicChecks::each().count(), 7);
    }
}
