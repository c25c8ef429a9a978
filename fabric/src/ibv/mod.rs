//! The verbs provider: real ibverbs behind cargo feature `rdma` (design.md §Fabric providers).
