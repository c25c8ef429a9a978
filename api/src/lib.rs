//! Kubernetes resource types of dpufs, shared by the CSI driver and the
//! operator so that neither depends on the other.
//!
//! Not built yet: DaosSystem, DaosPool, DaosContainer and DaosTenant arrive
//! with the Kubernetes API issue.
