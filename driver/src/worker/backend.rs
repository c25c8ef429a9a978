//! Which DFS a worker serves: `--backend local:<dir>` today; `engine:…` (the embedded engine
//! over the fabric) plugs in here as one more [`BackendSpec`] variant and one more arm of
//! [`open_backend`].

use anyhow::{Context, Result, bail};
use dpufs_daos::dfs::{Dfs, LocalDfs, Oid};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

/// A backend named on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendSpec {
    /// `local:<dir>`: a directory of the local file system ([`LocalDfs`]).
    Local(PathBuf),
}

impl FromStr for BackendSpec {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<BackendSpec> {
        let (scheme, rest) = s.split_once(':').with_context(|| {
            format!("backend {s:?}: expected <scheme>:<address>, e.g. local:/srv/vol")
        })?;
        match scheme {
            "local" => {
                if rest.is_empty() {
                    bail!("backend {s:?}: local: needs a directory");
                }
                Ok(BackendSpec::Local(PathBuf::from(rest)))
            }
            other => bail!("backend {s:?}: unknown scheme {other:?} (known: local)"),
        }
    }
}

impl fmt::Display for BackendSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendSpec::Local(dir) => write!(f, "local:{}", dir.display()),
        }
    }
}

/// Releases what a backend holds for an object the kernel has forgotten.
pub type ForgetHook = Arc<dyn Fn(Oid) + Send + Sync>;

/// An opened backend.
#[derive(Clone)]
pub struct Backend {
    /// The namespace served.
    pub dfs: Arc<dyn Dfs>,
    /// For backends that hold a resource per object the kernel knows (LocalDfs keeps one
    /// O_PATH descriptor per object): called once the kernel's lookup count of an object
    /// drops to zero. `None` (the engine) means the worker keeps no per-inode state at all.
    pub forget: Option<ForgetHook>,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("forget", &self.forget.is_some())
            .finish_non_exhaustive()
    }
}

/// Opens the backend `spec` names.
pub fn open_backend(spec: &BackendSpec) -> Result<Backend> {
    match spec {
        BackendSpec::Local(dir) => {
            let dfs = Arc::new(
                LocalDfs::open(dir)
                    .with_context(|| format!("open local backend {}", dir.display()))?,
            );
            let held = dfs.clone();
            Ok(Backend {
                dfs,
                forget: Some(Arc::new(move |oid| held.forget(oid))),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_specs() {
        let spec: BackendSpec = "local:/srv/vol".parse().unwrap();
        assert_eq!(spec, BackendSpec::Local("/srv/vol".into()));
        assert_eq!(spec.to_string(), "local:/srv/vol");
        assert!("local:".parse::<BackendSpec>().is_err());
        assert!("/srv/vol".parse::<BackendSpec>().is_err());
        assert!("engine2:x".parse::<BackendSpec>().is_err());
    }
}
