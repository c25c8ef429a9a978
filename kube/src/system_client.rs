//! DaosSystem → DAOS management client, cached per DaosSystem and rebuilt
//! when the DaosSystem's spec (its uid and generation) or its TLS Secret (its
//! resourceVersion) changes.
//!
//! The Secret holds the files DAOS's `gen_certificates.sh` writes; they are
//! written out under `<tls root>/<DaosSystem name>/` because the DAOS client
//! reads certificates from files, as DAOS tools do.

use dpufs_api::{DaosBackend, DaosSystem};
use dpufs_daos::{ClientConfig, ContainerAdmin, DaosError, EngineContainers, MgmtClient, TlsFiles};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, ResourceExt};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The clients of one DaosSystem, and what they were built from.
#[derive(Debug, Clone)]
pub struct SystemClient {
    pub mgmt: MgmtClient,
    /// The DaosSystem's `backend`: the engine's container service, or libdaos.
    pub containers: Arc<dyn ContainerAdmin>,
    /// uid/generation of the DaosSystem and resourceVersion of its Secret.
    version: String,
}

/// Why no client can be built for a DaosSystem.
#[derive(Debug, thiserror::Error)]
pub enum SystemClientError {
    /// The Kubernetes API refused or failed reading the Secret.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The DaosSystem's TLS Secret does not exist.
    #[error("DaosSystem {system:?}: TLS Secret {secret} not found")]
    SecretMissing { system: String, secret: String },
    /// The TLS Secret exists but its contents are unusable (a key missing, a
    /// certificate that does not parse, a key that does not match).
    #[error("DaosSystem {system:?}: TLS Secret {secret}: {message}")]
    SecretInvalid {
        system: String,
        secret: String,
        message: String,
    },
    /// The DaosSystem cannot be turned into a client (bad endpoints, a TLS
    /// directory that cannot be written).
    #[error("DaosSystem {system:?}: {message}")]
    Config { system: String, message: String },
    /// `spec.version` is not a release whose management wire dpufs speaks.
    #[error(
        "DaosSystem {system:?}: version {version} is incompatible: dpufs speaks the DAOS {} management APIs",
        dpufs_daos::Wire::supported()
    )]
    VersionUnsupported { system: String, version: String },
    /// The servers run another release than `spec.version` names.
    #[error(
        "DaosSystem {system:?}: spec.version is {version}, but the servers run DAOS {servers}: set spec.version to the servers' release"
    )]
    VersionMismatch {
        system: String,
        version: String,
        servers: String,
    },
    /// The DAOS client refused the configuration for another reason.
    #[error("{0}")]
    Daos(#[from] DaosError),
}

/// Checks the servers' release, as a call learned it, against `spec.version`: the same
/// major.minor. (`spec.version` itself passed [`check_version`].)
pub fn check_servers(
    system: &str,
    version: &str,
    servers: dpufs_daos::ServerVersion,
) -> Result<(), SystemClientError> {
    let spec = dpufs_daos::ServerVersion::parse(version);
    if spec.is_some_and(|v| (v.major, v.minor) == (servers.major, servers.minor)) {
        Ok(())
    } else {
        Err(SystemClientError::VersionMismatch {
            system: system.to_string(),
            version: version.to_string(),
            servers: servers.to_string(),
        })
    }
}

/// Checks `spec.version` against the DAOS releases whose management wires dpufs
/// speaks: the same major.minor as one of them (DAOS's rule for admin tools), any patch.
pub fn check_version(system: &str, version: &str) -> Result<(), SystemClientError> {
    let spoken = dpufs_daos::ServerVersion::parse(version)
        .and_then(|v| dpufs_daos::Wire::of(&v))
        .is_some();
    if spoken {
        Ok(())
    } else {
        Err(SystemClientError::VersionUnsupported {
            system: system.to_string(),
            version: version.to_string(),
        })
    }
}

/// A built client and when its Secret was last read.
#[derive(Debug)]
struct Cached {
    client: SystemClient,
    /// uid/generation of the DaosSystem the client was built from.
    system_version: String,
    secret_read: Instant,
}

/// Clients per DaosSystem name.
#[derive(Debug)]
pub struct SystemClientCache {
    cache: Mutex<HashMap<String, Cached>>,
    tls_root: PathBuf,
    request_timeout: Duration,
    secret_refresh: Option<Duration>,
    /// Where DAOS's client libraries are, for DaosSystems with `backend: daos`.
    daos_lib: Option<PathBuf>,
}

impl SystemClientCache {
    /// `tls_root` is where TLS Secrets are written out, one directory per
    /// DaosSystem. Every [`SystemClientCache::client`] reads the Secret again
    /// unless [`SystemClientCache::with_secret_refresh`] says otherwise.
    pub fn new(tls_root: PathBuf) -> SystemClientCache {
        SystemClientCache {
            cache: Mutex::default(),
            tls_root,
            request_timeout: Duration::from_secs(30),
            secret_refresh: None,
            daos_lib: None,
        }
    }

    /// Where DAOS's client libraries (`libdfs.so` and libdaos) are, for DaosSystems with
    /// `backend: daos`; without it those DaosSystems get no container client.
    pub fn with_daos_lib(mut self, dir: Option<PathBuf>) -> SystemClientCache {
        self.daos_lib = dir;
        self
    }

    /// Where DAOS's client libraries are ([`SystemClientCache::with_daos_lib`]).
    pub fn daos_lib(&self) -> Option<&Path> {
        self.daos_lib.as_deref()
    }

    /// How long one DAOS call may take, retries included (default 30 s).
    pub fn with_request_timeout(mut self, timeout: Duration) -> SystemClientCache {
        self.request_timeout = timeout;
        self
    }

    /// Reads an unchanged DaosSystem's Secret at most once per `interval`
    /// (a changed DaosSystem is always rebuilt at once). For callers that
    /// build a client on every request, as the CSI driver does: a rotated
    /// certificate is picked up within `interval`, like a Secret volume's.
    pub fn with_secret_refresh(mut self, interval: Duration) -> SystemClientCache {
        self.secret_refresh = Some(interval);
        self
    }

    /// The client of `sys`: the cached one while neither the DaosSystem's
    /// spec nor its Secret changed, else a new one.
    pub async fn client(
        &self,
        kube: &Client,
        sys: &DaosSystem,
    ) -> Result<SystemClient, SystemClientError> {
        let name = sys.name_any();
        check_version(&name, &sys.spec.version)?;
        // The spec (generation), not the resourceVersion: the DaosSystem
        // controller's status writes must not rebuild every client.
        let system_version = format!(
            "{}/{}",
            sys.metadata.uid.clone().unwrap_or_default(),
            sys.metadata.generation.unwrap_or_default()
        );
        if let Some(refresh) = self.secret_refresh
            && let Some(c) = self.cache.lock().expect("lock").get(&name)
            && c.system_version == system_version
            && c.secret_read.elapsed() < refresh
        {
            return Ok(c.client.clone());
        }
        let secret = read_secret(kube, &name, sys).await?;
        let version = format!(
            "{system_version}/{}",
            secret
                .as_ref()
                .and_then(|s| s.metadata.resource_version.clone())
                .unwrap_or_default()
        );
        if let Some(c) = self.cache.lock().expect("lock").get_mut(&name)
            && c.client.version == version
        {
            c.secret_read = Instant::now();
            return Ok(c.client.clone());
        }
        let client = self.build(&name, sys, secret.as_ref(), version)?;
        self.cache.lock().expect("lock").insert(
            name,
            Cached {
                client: client.clone(),
                system_version,
                secret_read: Instant::now(),
            },
        );
        Ok(client)
    }

    fn build(
        &self,
        name: &str,
        sys: &DaosSystem,
        secret: Option<&Secret>,
        version: String,
    ) -> Result<SystemClient, SystemClientError> {
        let cfg_err = |message: String| SystemClientError::Config {
            system: name.to_string(),
            message,
        };
        let secret_err = |message: String| SystemClientError::SecretInvalid {
            system: name.to_string(),
            secret: secret_name(sys),
            message,
        };
        let mut cfg = ClientConfig::new(sys.spec.endpoints.clone());
        cfg.system = sys.spec.name.clone();
        cfg.request_timeout = self.request_timeout;
        // Endpoints first, so that a configuration error found once the TLS
        // files are in place is about the Secret.
        MgmtClient::new(cfg.clone()).map_err(|e| cfg_err(e.to_string()))?;
        if let Some(secret) = secret {
            let dir = self.tls_root.join(name);
            private_dir(&dir).map_err(|e| cfg_err(e.to_string()))?;
            for (key, mode) in [
                ("daosCA.crt", 0o644),
                ("admin.crt", 0o644),
                ("admin.key", dpufs_daos::tls::max_key_mode("admin")),
            ] {
                let data = secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .ok_or_else(|| secret_err(format!("lacks key {key}")))?;
                // The Secret's keys are the file names DAOS expects.
                replace_file(&dir.join(key), &data.0, mode).map_err(|e| cfg_err(e.to_string()))?;
            }
            cfg = cfg.with_tls(TlsFiles::in_dir(&dir, "admin"));
        }
        let mgmt = MgmtClient::new(cfg).map_err(|e| match e {
            DaosError::Config(m) => secret_err(m),
            e => e.into(),
        })?;
        let containers: Arc<dyn ContainerAdmin> = match sys.spec.backend {
            DaosBackend::Engine => Arc::new(EngineContainers::new(&mgmt)),
            DaosBackend::Daos => libdaos_containers(self.daos_lib.as_deref()).map_err(cfg_err)?,
        };
        Ok(SystemClient {
            containers,
            mgmt,
            version,
        })
    }
}

/// Containers through DAOS's client libraries in `dir` (also the CSI driver's static
/// directory's, for a system with `backend: daos`).
#[cfg(feature = "daos-ffi")]
pub fn libdaos_containers(dir: Option<&Path>) -> Result<Arc<dyn ContainerAdmin>, String> {
    let dir = dir.ok_or(
        "backend: daos needs DAOS's client libraries: start this process with --daos-lib DIR (the directory of libdfs.so)",
    )?;
    let lib = dpufs_daos::libdaos::LibDaos::load(dir).map_err(|e| e.to_string())?;
    Ok(Arc::new(dpufs_daos::libdaos::LibDaosContainers::new(lib)))
}

/// Without the feature, `backend: daos` is refused with what is missing.
#[cfg(not(feature = "daos-ffi"))]
pub fn libdaos_containers(_dir: Option<&Path>) -> Result<Arc<dyn ContainerAdmin>, String> {
    Err("backend: daos needs DAOS's client libraries, and this build of dpufs has no support for them (cargo feature daos-ffi)".into())
}

/// `namespace/name` of the DaosSystem's TLS Secret; empty without TLS.
fn secret_name(sys: &DaosSystem) -> String {
    sys.spec
        .tls
        .as_ref()
        .map(|tls| format!("{}/{}", tls.secret_ref.namespace, tls.secret_ref.name))
        .unwrap_or_default()
}

/// The DaosSystem's TLS Secret (`get`, never list or watch: only the
/// Secrets DaosSystems name are read); `None` without TLS.
async fn read_secret(
    kube: &Client,
    name: &str,
    sys: &DaosSystem,
) -> Result<Option<Secret>, SystemClientError> {
    let Some(tls) = &sys.spec.tls else {
        return Ok(None);
    };
    let api: Api<Secret> = Api::namespaced(kube.clone(), &tls.secret_ref.namespace);
    match api.get_opt(&tls.secret_ref.name).await? {
        Some(secret) => Ok(Some(secret)),
        None => Err(SystemClientError::SecretMissing {
            system: name.to_string(),
            secret: secret_name(sys),
        }),
    }
}

/// Makes `dir` (and missing parents) with mode 0700 and checks that it is this process's alone:
/// a directory, not a symlink, owned by our user, that group and others may not enter. The TLS
/// root defaults to a path under /tmp, where another local user could have made the directory
/// first, to read the admin key written into it or to swap the CA the client trusts.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no failure mode and touches no memory.
    let me = unsafe { libc::geteuid() };
    let mode = meta.permissions().mode() & 0o7777;
    if !meta.is_dir() || meta.uid() != me || mode & 0o077 != 0 {
        let kind = if meta.file_type().is_symlink() {
            "a symlink"
        } else if meta.is_dir() {
            "a directory"
        } else {
            "not a directory"
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} must be a private directory of uid {me} for the DaosSystem's keys, but it is \
                 {kind} owned by uid {} with mode {mode:o}: remove it, or choose another --tls-dir",
                dir.display(),
                meta.uid()
            ),
        ));
    }
    Ok(())
}

/// Writes `path` whole, with `mode`, by renaming a new file over it: key
/// files are read-only, and a client being built at the same moment reads
/// either the old file or the new one, never half of one.
fn replace_file(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let file_name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(
        ".{file_name}.{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(data)?;
        // The umask may have taken bits the mode asked for.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_directories_are_private_or_refused() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let made = root.path().join("tls/system-a");
        private_dir(&made).unwrap();
        let mode = std::fs::metadata(&made).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // Made earlier, open to others: refused, naming the fix.
        let open = root.path().join("tls/system-b");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = private_dir(&open).unwrap_err().to_string();
        assert!(
            err.contains("mode 755") && err.contains("--tls-dir"),
            "{err}"
        );
        // A symlink to a directory someone else controls: refused.
        let elsewhere = root.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = root.path().join("tls/system-c");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let err = private_dir(&link).unwrap_err().to_string();
        assert!(err.contains("a symlink"), "{err}");
    }

    #[test]
    fn the_servers_must_run_the_release_of_the_spec() {
        let v = |s: &str| dpufs_daos::ServerVersion::parse(s).unwrap();
        assert!(check_servers("s", "2.6.1", v("2.6.5")).is_ok());
        let eight = dpufs_daos::ServerVersion::of_wire(dpufs_daos::Wire::V2_8);
        assert!(check_servers("s", "2.8.1", eight).is_ok());
        let e = check_servers("s", "2.6.5", eight).unwrap_err();
        assert_eq!(
            e.to_string(),
            "DaosSystem \"s\": spec.version is 2.6.5, but the servers run DAOS 2.8: set spec.version to the servers' release"
        );
    }

    #[test]
    fn versions_need_the_major_minor_of_a_spoken_wire() {
        for good in ["2.8.0", "2.8.5", "2.6.5", "2.6.0"] {
            assert!(check_version("s", good).is_ok(), "{good}");
        }
        for bad in ["2.4.1", "2.7.0", "3.8.0", "2", "2.8", "", "x.y.z"] {
            let e = check_version("s", bad).unwrap_err();
            assert!(
                matches!(&e, SystemClientError::VersionUnsupported { version, .. } if version == bad),
                "{bad}: {e}"
            );
        }
    }

    /// `backend: daos` needs the libraries' directory, and the libraries in it; the
    /// default backend needs neither.
    #[tokio::test]
    async fn the_daos_backend_needs_daos_libraries() {
        let fake = crate::testing::FakeApiServer::new();
        // A changed backend is a new generation of the DaosSystem.
        let sys = |backend: &str| -> DaosSystem {
            let generation = if backend == "daos" { 2 } else { 1 };
            serde_json::from_value(serde_json::json!({
                "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosSystem",
                "metadata": {"name": "real", "uid": "u1", "generation": generation},
                "spec": {"endpoints": ["127.0.0.1:1"], "version": "2.6.5", "insecure": true,
                         "backend": backend}
            }))
            .unwrap()
        };
        let root = tempfile::tempdir().unwrap();
        let cache = SystemClientCache::new(root.path().join("tls"));
        assert!(cache.client(&fake.client(), &sys("engine")).await.is_ok());
        let err = cache
            .client(&fake.client(), &sys("daos"))
            .await
            .unwrap_err()
            .to_string();
        let wanted = if cfg!(feature = "daos-ffi") {
            "start this process with --daos-lib DIR"
        } else {
            "cargo feature daos-ffi"
        };
        assert!(err.contains(wanted), "{err}");
        if cfg!(feature = "daos-ffi") {
            let empty = root.path().join("no-daos");
            std::fs::create_dir(&empty).unwrap();
            let cache = SystemClientCache::new(root.path().join("tls")).with_daos_lib(Some(empty));
            let err = cache
                .client(&fake.client(), &sys("daos"))
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains("no-daos/libdfs.so"), "{err}");
        }
    }

    /// A DaosSystem `daos` with mutual TLS from Secret `ns/admin`, in the fake API server.
    async fn tls_system(fake: &crate::testing::FakeApiServer, certs: &Path) -> DaosSystem {
        use kube::api::PostParams;
        dpufs_daos::certs::generate(certs).unwrap();
        let secret = crate::testing::admin_secret("ns", "admin", certs);
        Api::<Secret>::namespaced(fake.client(), "ns")
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let sys: DaosSystem = serde_json::from_value(serde_json::json!({
            "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosSystem",
            "metadata": {"name": "daos"},
            "spec": {"endpoints": ["127.0.0.1:1"], "version": "2.8.0",
                     "tls": {"secretRef": {"name": "admin", "namespace": "ns"}}}
        }))
        .unwrap();
        Api::<DaosSystem>::all(fake.client())
            .create(&PostParams::default(), &sys)
            .await
            .unwrap()
    }

    fn secret_reads(fake: &crate::testing::FakeApiServer) -> usize {
        let read = "GET /api/v1/namespaces/ns/secrets/admin";
        fake.requests().iter().filter(|r| *r == read).count()
    }

    #[tokio::test]
    async fn secrets_are_written_out_and_read_again_as_configured() {
        use std::os::unix::fs::PermissionsExt;
        let fake = crate::testing::FakeApiServer::new();
        let kube = fake.client();
        let dir = tempfile::tempdir().unwrap();
        let sys = tls_system(&fake, &dir.path().join("certs")).await;

        // The operator's way: the Secret on every call, one client while it is unchanged.
        let every_call = SystemClientCache::new(dir.path().join("tls"));
        let first = every_call.client(&kube, &sys).await.unwrap();
        let second = every_call.client(&kube, &sys).await.unwrap();
        assert_eq!(secret_reads(&fake), 2);
        assert_eq!(first.version, second.version);
        let key = dir.path().join("tls/daos/admin.key");
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, dpufs_daos::tls::max_key_mode("admin"));
        for file in ["daosCA.crt", "admin.crt"] {
            assert_eq!(
                std::fs::read(dir.path().join("tls/daos").join(file)).unwrap(),
                std::fs::read(dir.path().join("certs").join(file)).unwrap()
            );
        }

        // The CSI driver's way: at most once per refresh interval...
        let refreshed = SystemClientCache::new(dir.path().join("tls2"))
            .with_secret_refresh(Duration::from_secs(3600));
        refreshed.client(&kube, &sys).await.unwrap();
        refreshed.client(&kube, &sys).await.unwrap();
        assert_eq!(secret_reads(&fake), 3, "one read for two clients");
        // ...and at once when the DaosSystem's spec changed.
        let mut changed = sys.clone();
        changed.metadata.generation = Some(2);
        let rebuilt = refreshed.client(&kube, &changed).await.unwrap();
        assert_eq!(secret_reads(&fake), 4);
        assert!(rebuilt.version.contains("/2/"), "{}", rebuilt.version);
    }

    #[tokio::test]
    async fn missing_and_incomplete_secrets_are_named() {
        let fake = crate::testing::FakeApiServer::new();
        let kube = fake.client();
        let dir = tempfile::tempdir().unwrap();
        let sys = tls_system(&fake, &dir.path().join("certs")).await;
        let cache = SystemClientCache::new(dir.path().join("tls"));
        let patch = serde_json::json!({"data": {"admin.key": null}});
        Api::<Secret>::namespaced(kube.clone(), "ns")
            .patch(
                "admin",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
        let e = cache.client(&kube, &sys).await.unwrap_err();
        assert!(
            matches!(&e, SystemClientError::SecretInvalid { secret, message, .. }
                if secret == "ns/admin" && message == "lacks key admin.key"),
            "{e}"
        );
        Api::<Secret>::namespaced(kube.clone(), "ns")
            .delete("admin", &Default::default())
            .await
            .unwrap();
        let e = cache.client(&kube, &sys).await.unwrap_err();
        assert!(
            matches!(&e, SystemClientError::SecretMissing { system, secret }
                if system == "daos" && secret == "ns/admin"),
            "{e}"
        );
    }

    #[test]
    fn replaced_files_get_exactly_their_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.key");
        replace_file(&path, b"one", 0o400).unwrap();
        // A read-only file is replaced, not rewritten.
        replace_file(&path, b"two", 0o400).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o400);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["admin.key"], "no temporary file left");
    }
}
