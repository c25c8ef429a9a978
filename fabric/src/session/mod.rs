//! Tenant sessions on the fabric (design.md §Tenant isolation, rdma-isolation.md §7).
