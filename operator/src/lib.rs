//! dpufs-operator: controllers that reconcile DaosPool and DaosContainer
//! resources against the DAOS management service.
//!
//! Not built yet: arrives with the operator issue.
