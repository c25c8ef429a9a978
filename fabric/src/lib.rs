//! The RDMA-first transport of dpufs (design.md §Fabric providers).
//!
//! Not built yet: the provider trait, the software RDMA device, the verbs
//! provider and tenant sessions arrive with the fabric issues. The crate exists
//! so that the dependency direction `daos -> fabric -> proto` is fixed from
//! the start.
