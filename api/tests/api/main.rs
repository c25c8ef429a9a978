//! The dpufs CRDs: generated manifests, schema structure, and the validation
//! users meet through the API server, checked on the sample manifests.

mod crds;
mod samples;
mod support;
