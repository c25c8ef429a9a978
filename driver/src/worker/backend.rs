//! Which DFS a worker serves: `--backend local:<dir>` (a directory of this machine),
//! `--backend engine:<host:port>` (a DFS container of an engine's data service, reached over
//! the worker's own tenant session on the fabric with a capability the node agent signed), or
//! `--backend daos:<pool>/<container>` (a POSIX container of a real DAOS system, through
//! DAOS's own libdfs and the node's `daos_agent`; docs/real-daos.md).

use anyhow::{Context, Result, bail};
use dpufs_daos::capability::{SignedCapability, unix_now};
use dpufs_daos::dfs::fabric::{EngineClient, Provider};
use dpufs_daos::dfs::{Dfs, LocalDfs, Oid};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A backend named on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendSpec {
    /// `local:<dir>`: a directory of the local file system ([`LocalDfs`]).
    Local(PathBuf),
    /// `engine:<host:port>`: the data service of a `dpufs-engine` at this fabric address.
    Engine(SocketAddr),
    /// `daos:<pool>/<container>` (labels or UUIDs): a container of a real DAOS system.
    Daos { pool: String, container: String },
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
            "engine" => rest.parse().map(BackendSpec::Engine).with_context(|| {
                format!("backend {s:?}: engine: needs the data service's <ip>:<port>")
            }),
            "daos" => match rest.split_once('/') {
                Some((pool, container))
                    if !pool.is_empty() && !container.is_empty() && !container.contains('/') =>
                {
                    Ok(BackendSpec::Daos {
                        pool: pool.to_string(),
                        container: container.to_string(),
                    })
                }
                _ => bail!("backend {s:?}: daos: needs <pool>/<container> (labels or UUIDs)"),
            },
            other => bail!("backend {s:?}: unknown scheme {other:?} (known: local, engine, daos)"),
        }
    }
}

impl fmt::Display for BackendSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendSpec::Local(dir) => write!(f, "local:{}", dir.display()),
            BackendSpec::Engine(addr) => write!(f, "engine:{addr}"),
            BackendSpec::Daos { pool, container } => write!(f, "daos:{pool}/{container}"),
        }
    }
}

/// What opening a backend needs besides its spec.
#[derive(Clone, Debug)]
pub struct BackendOptions {
    /// `engine:`: the file holding the signed capability (hex). Re-read when it changes: the
    /// node agent renews short-lived capabilities by rewriting it, and the next reconnect
    /// presents the new one.
    pub capability: Option<PathBuf>,
    /// `engine:`: the provider whose device this worker opens (its own context, PD and QPs).
    pub provider: Provider,
    /// `daos:`: the directory holding DAOS's client libraries (`libdfs.so` and the rest).
    pub daos_lib: Option<PathBuf>,
    /// `daos:`: mount the container read-only.
    pub read_only: bool,
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

/// A backend about to be opened: at once, or after the worker's privilege drop.
pub enum PendingBackend {
    /// Opened already.
    Ready(Backend),
    /// Opened by the worker once it runs as its own uid (`--uid`): DAOS's agent identifies a
    /// caller by the uid it connects with, so a tenant's worker connects to its pool as the
    /// tenant. DAOS's libraries are loaded (and `daos_init` has run) before the drop.
    AfterDrop(Box<dyn FnOnce() -> Result<Backend> + Send>),
}

impl fmt::Debug for PendingBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PendingBackend::Ready(b) => f.debug_tuple("Ready").field(b).finish(),
            PendingBackend::AfterDrop(_) => f.write_str("AfterDrop"),
        }
    }
}

impl PendingBackend {
    /// The opened backend.
    pub fn open(self) -> Result<Backend> {
        match self {
            PendingBackend::Ready(b) => Ok(b),
            PendingBackend::AfterDrop(open) => open(),
        }
    }
}

/// Opens the backend `spec` names; a `daos:` backend of a worker that drops to another uid
/// (`run_as`) only loads DAOS's libraries now, and connects later ([`PendingBackend`]).
pub fn prepare_backend(
    spec: &BackendSpec,
    opts: &BackendOptions,
    run_as: Option<(u32, u32)>,
) -> Result<PendingBackend> {
    match spec {
        BackendSpec::Daos { pool, container } if run_as.is_some() => {
            let mount = daos_mounter(pool, container, opts)?;
            Ok(PendingBackend::AfterDrop(Box::new(mount)))
        }
        _ => open_backend(spec, opts).map(PendingBackend::Ready),
    }
}

/// Opens the backend `spec` names.
pub fn open_backend(spec: &BackendSpec, opts: &BackendOptions) -> Result<Backend> {
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
        BackendSpec::Engine(addr) => open_engine(*addr, opts),
        BackendSpec::Daos { pool, container } => daos_mounter(pool, container, opts)?(),
    }
}

/// Loads DAOS's libraries now; the function returned mounts the container (connecting to
/// the pool as whoever calls it).
#[cfg(feature = "daos-ffi")]
fn daos_mounter(
    pool: &str,
    container: &str,
    opts: &BackendOptions,
) -> Result<impl FnOnce() -> Result<Backend> + Send + 'static> {
    use dpufs_daos::libdaos::{LibDaos, LibDfs};
    let dir = opts
        .daos_lib
        .as_deref()
        .context("a daos: backend needs --daos-lib <dir> (where libdfs.so is installed)")?;
    let lib = LibDaos::load(dir)?;
    let (pool, container, read_only) = (pool.to_string(), container.to_string(), opts.read_only);
    Ok(move || {
        let dfs = Arc::new(
            LibDfs::mount(lib, &pool, &container, read_only)
                .with_context(|| format!("mount DAOS container {pool}/{container}"))?,
        );
        let held = dfs.clone();
        Ok(Backend {
            dfs,
            forget: Some(Arc::new(move |oid| held.forget(oid))),
        })
    })
}

#[cfg(not(feature = "daos-ffi"))]
fn daos_mounter(
    _pool: &str,
    _container: &str,
    _opts: &BackendOptions,
) -> Result<fn() -> Result<Backend>> {
    bail!("this build of dpufs has no DAOS client support (cargo feature `daos-ffi`)")
}

fn open_engine(addr: SocketAddr, opts: &BackendOptions) -> Result<Backend> {
    let path = opts
        .capability
        .as_deref()
        .context("an engine: backend needs --capability <file> (signed by the node agent)")?;
    let (capability, mut seen) = read_capability(path)?;
    let client = EngineClient::open(&opts.provider, addr).with_context(|| {
        format!(
            "open a tenant session on the {} fabric provider ({:?})",
            opts.provider.kind(),
            opts.provider
        )
    })?;
    let dfs = client
        .mount(capability.clone())
        .with_context(|| format!("mount the capability's container at engine {addr}"))?;
    let path = path.to_path_buf();
    // The session lives as long as the process; this thread owns it and renews.
    std::thread::Builder::new()
        .name("capability".into())
        .spawn(move || {
            loop {
                std::thread::sleep(RENEW_POLL);
                match changed_capability(&path, seen) {
                    Ok(Some((cap, when))) => {
                        seen = when;
                        match client.renew(cap) {
                            Ok(_) => tracing::info!("capability renewed from {}", path.display()),
                            Err(e) => tracing::warn!("capability renewal: {e}"),
                        }
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!("{e:#}"),
                }
            }
        })?;
    Ok(Backend {
        dfs: Arc::new(dfs),
        forget: None,
    })
}

/// How often the capability file is checked for a renewal.
const RENEW_POLL: Duration = Duration::from_secs(2);

/// Reads and checks a capability file (see [`load_capability`]), with its mtime.
fn read_capability(path: &Path) -> Result<(SignedCapability, SystemTime)> {
    let modified = modified(path)?;
    Ok((load_capability(path)?, modified))
}

/// The capability in `path` if the file changed since `seen`.
fn changed_capability(
    path: &Path,
    seen: SystemTime,
) -> Result<Option<(SignedCapability, SystemTime)>> {
    let modified = modified(path)?;
    if modified == seen {
        return Ok(None);
    }
    Ok(Some((load_capability(path)?, modified)))
}

fn modified(path: &Path) -> Result<SystemTime> {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .with_context(|| format!("capability file {}", path.display()))
}

/// The capability in `path`: it must decode and must not have expired.
fn load_capability(path: &Path) -> Result<SignedCapability> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("read capability file {}", path.display()))?;
    let cap = SignedCapability::from_hex(text.trim())
        .with_context(|| format!("capability file {}", path.display()))?;
    let claims = cap
        .claims()
        .with_context(|| format!("capability file {}", path.display()))?;
    if claims.not_after <= unix_now() {
        bail!(
            "capability in {} expired at {} (unix time); ask the node agent for a new one",
            path.display(),
            claims.not_after
        );
    }
    Ok(cap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpufs_daos::capability::{AgentKey, Capability, Rights};
    use dpufs_daos::dfs::fabric::DeviceOptions;

    #[test]
    fn parses_and_prints_specs() {
        let spec: BackendSpec = "local:/srv/vol".parse().unwrap();
        assert_eq!(spec, BackendSpec::Local("/srv/vol".into()));
        assert_eq!(spec.to_string(), "local:/srv/vol");
        let spec: BackendSpec = "engine:127.0.0.1:4000".parse().unwrap();
        assert_eq!(spec, BackendSpec::Engine("127.0.0.1:4000".parse().unwrap()));
        assert_eq!(spec.to_string(), "engine:127.0.0.1:4000");
        assert!("local:".parse::<BackendSpec>().is_err());
        assert!("/srv/vol".parse::<BackendSpec>().is_err());
        assert!("engine2:x".parse::<BackendSpec>().is_err());
        assert!("engine:localhost".parse::<BackendSpec>().is_err());
        let spec: BackendSpec = "daos:tank/vol".parse().unwrap();
        assert_eq!(
            spec,
            BackendSpec::Daos {
                pool: "tank".into(),
                container: "vol".into()
            }
        );
        assert_eq!(spec.to_string(), "daos:tank/vol");
        for bad in ["daos:tank", "daos:/vol", "daos:tank/", "daos:a/b/c"] {
            let err = bad.parse::<BackendSpec>().unwrap_err();
            assert!(
                format!("{err:#}").contains("<pool>/<container>"),
                "{bad}: {err:#}"
            );
        }
    }

    fn write_cap(path: &Path, ttl: Duration) {
        let key = AgentKey::generate().unwrap();
        let claims = Capability::new("t", "v", "p", "c", Rights::READ_WRITE, ttl);
        std::fs::write(path, key.sign(&claims).unwrap().to_hex()).unwrap();
    }

    #[test]
    fn capability_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cap");
        let err = read_capability(&path).unwrap_err();
        assert!(format!("{err:#}").contains("capability file"), "{err:#}");
        std::fs::write(&path, "zz").unwrap();
        let err = read_capability(&path).unwrap_err();
        assert!(format!("{err:#}").contains("not hex"), "{err:#}");
        write_cap(&path, Duration::ZERO);
        let err = read_capability(&path).unwrap_err();
        assert!(format!("{err:#}").contains("expired"), "{err:#}");
        write_cap(&path, Duration::from_secs(60));
        let (cap, seen) = read_capability(&path).unwrap();
        assert_eq!(cap.claims().unwrap().volume, "v");
        assert!(changed_capability(&path, seen).unwrap().is_none());
        assert!(
            changed_capability(&path, SystemTime::UNIX_EPOCH)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn engine_backend_needs_a_capability() {
        let err = open_backend(&"engine:127.0.0.1:1".parse().unwrap(), &options()).unwrap_err();
        assert!(format!("{err:#}").contains("--capability"), "{err:#}");
    }

    fn options() -> BackendOptions {
        BackendOptions {
            capability: None,
            provider: Provider::Soft(DeviceOptions::new("unused")),
            daos_lib: None,
            read_only: false,
        }
    }

    #[test]
    fn daos_backend_names_what_it_misses() {
        let spec: BackendSpec = "daos:tank/vol".parse().unwrap();
        let err = open_backend(&spec, &options()).unwrap_err();
        assert!(format!("{err:#}").contains("--daos-lib"), "{err:#}");
        let empty = tempfile::tempdir().unwrap();
        let opts = BackendOptions {
            daos_lib: Some(empty.path().to_path_buf()),
            ..options()
        };
        let err = open_backend(&spec, &opts).unwrap_err();
        assert!(format!("{err:#}").contains("libdfs.so"), "{err:#}");
    }
}
