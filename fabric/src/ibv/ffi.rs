//! The C shim's functions (`shim.c`, compiled by build.rs): the `static inline` verbs of
//! `<infiniband/verbs.h>` that bindgen cannot bind. Everything else comes from `ibverbs-sys`.

use std::os::raw::{c_int, c_longlong};

use ibverbs_sys as sys;

unsafe extern "C" {
    /// `ibv_alloc_mw`; null with `errno` set on failure.
    pub fn dpufs_ibv_alloc_mw(pd: *mut sys::ibv_pd, type_: sys::ibv_mw_type) -> *mut sys::ibv_mw;
    /// `ibv_dealloc_mw`; 0 or an errno value.
    pub fn dpufs_ibv_dealloc_mw(mw: *mut sys::ibv_mw) -> c_int;
    /// `ibv_inc_rkey`.
    pub fn dpufs_ibv_inc_rkey(rkey: u32) -> u32;
    /// `ibv_post_send`; 0 or an errno value.
    pub fn dpufs_ibv_post_send(
        qp: *mut sys::ibv_qp,
        wr: *mut sys::ibv_send_wr,
        bad_wr: *mut *mut sys::ibv_send_wr,
    ) -> c_int;
    /// `ibv_post_recv`; 0 or an errno value.
    pub fn dpufs_ibv_post_recv(
        qp: *mut sys::ibv_qp,
        wr: *mut sys::ibv_recv_wr,
        bad_wr: *mut *mut sys::ibv_recv_wr,
    ) -> c_int;
    /// `ibv_poll_cq`; completions written, or negative on error.
    pub fn dpufs_ibv_poll_cq(
        cq: *mut sys::ibv_cq,
        num_entries: c_int,
        wc: *mut sys::ibv_wc,
    ) -> c_int;
    /// `ibv_req_notify_cq`; 0 or an errno value.
    pub fn dpufs_ibv_req_notify_cq(cq: *mut sys::ibv_cq, solicited_only: c_int) -> c_int;
    /// `ibv_query_port`; 0 or an errno value.
    pub fn dpufs_ibv_query_port(
        context: *mut sys::ibv_context,
        port_num: u8,
        port_attr: *mut sys::ibv_port_attr,
    ) -> c_int;
    /// A size or offset of the C structs (the `Layout` codes), or -1.
    pub fn dpufs_ibv_layout(what: c_int) -> c_longlong;
}

/// Codes of `dpufs_ibv_layout`, in the order of `enum dpufs_layout` in shim.c.
#[derive(Clone, Copy, Debug)]
#[repr(i32)]
pub enum Layout {
    SizeofSge,
    SizeofSendWr,
    SizeofRecvWr,
    SizeofWc,
    SizeofMwBindInfo,
    SizeofQpAttr,
    SizeofAsyncEvent,
    OffsetofSendWrOpcode,
    OffsetofSendWrInvalidateRkey,
    OffsetofSendWrRdma,
    OffsetofSendWrBindMw,
    OffsetofWcByteLen,
    OffsetofWcInvalidatedRkey,
    OffsetofWcQpNum,
    OffsetofWcWcFlags,
    OffsetofQpQpNum,
    OffsetofMwRkey,
    OffsetofPortAttrLinkLayer,
    /// Not in [`LAYOUTS`]: C's may be smaller (older headers), never larger.
    SizeofPortAttr,
}

/// What the C compiler says about `what`.
pub fn layout(what: Layout) -> i64 {
    // SAFETY: a pure function of its integer argument.
    unsafe { dpufs_ibv_layout(what as c_int) }
}

/// What the Rust bindings say about `what`, for comparison with [`layout`].
pub fn rust_layout(what: Layout) -> i64 {
    use std::mem::{offset_of, size_of};
    let n = match what {
        Layout::SizeofSge => size_of::<sys::ibv_sge>(),
        Layout::SizeofSendWr => size_of::<sys::ibv_send_wr>(),
        Layout::SizeofRecvWr => size_of::<sys::ibv_recv_wr>(),
        Layout::SizeofWc => size_of::<sys::ibv_wc>(),
        Layout::SizeofMwBindInfo => size_of::<sys::ibv_mw_bind_info>(),
        Layout::SizeofQpAttr => size_of::<sys::ibv_qp_attr>(),
        Layout::SizeofAsyncEvent => size_of::<sys::ibv_async_event>(),
        Layout::OffsetofSendWrOpcode => offset_of!(sys::ibv_send_wr, opcode),
        Layout::OffsetofSendWrInvalidateRkey => offset_of!(sys::ibv_send_wr, __bindgen_anon_1),
        Layout::OffsetofSendWrRdma => offset_of!(sys::ibv_send_wr, wr),
        Layout::OffsetofSendWrBindMw => offset_of!(sys::ibv_send_wr, __bindgen_anon_2),
        // ibverbs-sys declares `ibv_wc` by hand with private fields: byte_len directly follows
        // wr_id (8), status (4), opcode (4) and vendor_err (4); the rkey/immediate union is
        // `imm_data`.
        Layout::OffsetofWcByteLen => 20,
        Layout::OffsetofWcInvalidatedRkey => offset_of!(sys::ibv_wc, imm_data),
        Layout::OffsetofWcQpNum => offset_of!(sys::ibv_wc, qp_num),
        Layout::OffsetofWcWcFlags => offset_of!(sys::ibv_wc, wc_flags),
        Layout::OffsetofQpQpNum => offset_of!(sys::ibv_qp, qp_num),
        Layout::OffsetofMwRkey => offset_of!(sys::ibv_mw, rkey),
        Layout::OffsetofPortAttrLinkLayer => offset_of!(sys::ibv_port_attr, link_layer),
        Layout::SizeofPortAttr => size_of::<sys::ibv_port_attr>(),
    };
    n as i64
}

/// Every [`Layout`] whose C and Rust values must be equal.
pub const LAYOUTS: [Layout; 18] = [
    Layout::SizeofSge,
    Layout::SizeofSendWr,
    Layout::SizeofRecvWr,
    Layout::SizeofWc,
    Layout::SizeofMwBindInfo,
    Layout::SizeofQpAttr,
    Layout::SizeofAsyncEvent,
    Layout::OffsetofSendWrOpcode,
    Layout::OffsetofSendWrInvalidateRkey,
    Layout::OffsetofSendWrRdma,
    Layout::OffsetofSendWrBindMw,
    Layout::OffsetofWcByteLen,
    Layout::OffsetofWcInvalidatedRkey,
    Layout::OffsetofWcQpNum,
    Layout::OffsetofWcWcFlags,
    Layout::OffsetofQpQpNum,
    Layout::OffsetofMwRkey,
    Layout::OffsetofPortAttrLinkLayer,
];
