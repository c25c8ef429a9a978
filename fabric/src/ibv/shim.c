/*
 * C shim of the verbs provider (dpufs-fabric feature `rdma`).
 *
 * libibverbs defines these verbs as `static inline` functions in <infiniband/verbs.h> that jump
 * through the context's ops table, so bindgen (ibverbs-sys) emits no function for them
 * (docs/fabric.md, "Verbs provider"). Each wrapper here is one call to the inline verb,
 * nothing more; the Rust side (src/ibv/ffi.rs) declares them with ibverbs-sys types.
 *
 * Compiled by build.rs with the `cc` crate against the system's libibverbs headers, i.e. the
 * headers of the libibverbs the crate links. dpufs_ibv_layout() reports the sizes and offsets the
 * Rust bindings rely on, so a test can prove both sides agree without any RDMA device.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

/* ibv_alloc_mw; NULL with errno set on failure. */
struct ibv_mw *dpufs_ibv_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	return ibv_alloc_mw(pd, type);
}

/* ibv_dealloc_mw; 0 or an errno value. */
int dpufs_ibv_dealloc_mw(struct ibv_mw *mw)
{
	return ibv_dealloc_mw(mw);
}

/* ibv_inc_rkey: the next key byte for the same index. */
uint32_t dpufs_ibv_inc_rkey(uint32_t rkey)
{
	return ibv_inc_rkey(rkey);
}

/* ibv_post_send (SEND, SEND_WITH_INV, RDMA_WRITE, RDMA_READ, BIND_MW, LOCAL_INV); 0 or errno. */
int dpufs_ibv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	return ibv_post_send(qp, wr, bad_wr);
}

/* ibv_post_recv; 0 or an errno value. */
int dpufs_ibv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	return ibv_post_recv(qp, wr, bad_wr);
}

/* ibv_poll_cq; the number of completions, or a negative value on error. */
int dpufs_ibv_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, num_entries, wc);
}

/* ibv_req_notify_cq; 0 or an errno value. */
int dpufs_ibv_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq, solicited_only);
}

/*
 * ibv_query_port (a macro over an inline function since rdma-core v16); 0 or an errno value.
 * Only fills as many bytes as this header's struct ibv_port_attr has, which is never more than
 * the bindings' (newer) struct the caller passes.
 */
int dpufs_ibv_query_port(struct ibv_context *context, uint8_t port_num,
			 struct ibv_port_attr *port_attr)
{
	return ibv_query_port(context, port_num, port_attr);
}

/* Layout facts the Rust side checks against its bindings (see the `layout` test). */
enum dpufs_layout {
	DPUFS_SIZEOF_SGE,
	DPUFS_SIZEOF_SEND_WR,
	DPUFS_SIZEOF_RECV_WR,
	DPUFS_SIZEOF_WC,
	DPUFS_SIZEOF_MW_BIND_INFO,
	DPUFS_SIZEOF_QP_ATTR,
	DPUFS_SIZEOF_ASYNC_EVENT,
	DPUFS_OFFSETOF_SEND_WR_OPCODE,
	DPUFS_OFFSETOF_SEND_WR_INVALIDATE_RKEY,
	DPUFS_OFFSETOF_SEND_WR_RDMA,
	DPUFS_OFFSETOF_SEND_WR_BIND_MW,
	DPUFS_OFFSETOF_WC_BYTE_LEN,
	DPUFS_OFFSETOF_WC_INVALIDATED_RKEY,
	DPUFS_OFFSETOF_WC_QP_NUM,
	DPUFS_OFFSETOF_WC_WC_FLAGS,
	DPUFS_OFFSETOF_QP_QP_NUM,
	DPUFS_OFFSETOF_MW_RKEY,
	DPUFS_OFFSETOF_PORT_ATTR_LINK_LAYER,
	DPUFS_SIZEOF_PORT_ATTR,
};

long long dpufs_ibv_layout(int what)
{
	switch (what) {
	case DPUFS_SIZEOF_SGE: return sizeof(struct ibv_sge);
	case DPUFS_SIZEOF_SEND_WR: return sizeof(struct ibv_send_wr);
	case DPUFS_SIZEOF_RECV_WR: return sizeof(struct ibv_recv_wr);
	case DPUFS_SIZEOF_WC: return sizeof(struct ibv_wc);
	case DPUFS_SIZEOF_MW_BIND_INFO: return sizeof(struct ibv_mw_bind_info);
	case DPUFS_SIZEOF_QP_ATTR: return sizeof(struct ibv_qp_attr);
	case DPUFS_SIZEOF_ASYNC_EVENT: return sizeof(struct ibv_async_event);
	case DPUFS_OFFSETOF_SEND_WR_OPCODE: return offsetof(struct ibv_send_wr, opcode);
	case DPUFS_OFFSETOF_SEND_WR_INVALIDATE_RKEY:
		return offsetof(struct ibv_send_wr, invalidate_rkey);
	case DPUFS_OFFSETOF_SEND_WR_RDMA: return offsetof(struct ibv_send_wr, wr.rdma);
	case DPUFS_OFFSETOF_SEND_WR_BIND_MW: return offsetof(struct ibv_send_wr, bind_mw);
	case DPUFS_OFFSETOF_WC_BYTE_LEN: return offsetof(struct ibv_wc, byte_len);
	case DPUFS_OFFSETOF_WC_INVALIDATED_RKEY: return offsetof(struct ibv_wc, invalidated_rkey);
	case DPUFS_OFFSETOF_WC_QP_NUM: return offsetof(struct ibv_wc, qp_num);
	case DPUFS_OFFSETOF_WC_WC_FLAGS: return offsetof(struct ibv_wc, wc_flags);
	case DPUFS_OFFSETOF_QP_QP_NUM: return offsetof(struct ibv_qp, qp_num);
	case DPUFS_OFFSETOF_MW_RKEY: return offsetof(struct ibv_mw, rkey);
	case DPUFS_OFFSETOF_PORT_ATTR_LINK_LAYER: return offsetof(struct ibv_port_attr, link_layer);
	case DPUFS_SIZEOF_PORT_ATTR: return sizeof(struct ibv_port_attr);
	default: return -1;
	}
}
