//! A real Kubernetes API server for tests: etcd and kube-apiserver, started
//! from prebuilt binaries, with their data in a temporary directory, killed on
//! drop. Nothing in it is mocked: CRD validation (OpenAPI and CEL, with the
//! server's own cost estimates), server-side apply, the status subresource,
//! resourceVersion conflicts, watches and garbage collection of dependents
//! are the server's.
//!
//! The binaries are not part of the repository (docs/testing.md says where
//! they come from). They are looked up in
//! `$DPUFS_K8S_BIN`, else `$K8S_HOME/bin`, else `~/.cache/dpufs-k8s/bin`.
//! Without them [`KubeApiServer::start`] returns `None` after printing a loud
//! SKIPPED line, unless `DPUFS_REQUIRE_KUBE=1`, which turns the absence into a
//! test failure (for CI machines that must run these tests).

use crate::process::{Detach, free_port, spawn_logged};
use anyhow::{Context, bail};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// How long etcd and the API server get to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// The bearer token of the test's administrator (group system:masters).
const ADMIN_TOKEN: &str = "dpufs-e2e-admin-token";

/// Where the Kubernetes binaries are, if they are there.
pub fn binaries() -> Option<PathBuf> {
    let dir = std::env::var_os("DPUFS_K8S_BIN")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("K8S_HOME").map(|h| PathBuf::from(h).join("bin")))
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/dpufs-k8s/bin"))
        })?;
    ["etcd", "kube-apiserver", "kube-controller-manager"]
        .iter()
        .all(|b| dir.join(b).is_file())
        .then_some(dir)
}

/// Says loudly that a test did not run for want of the binaries, or fails it
/// when `DPUFS_REQUIRE_KUBE=1`.
pub fn skip(test: &str) {
    crate::skip::skip(
        "DPUFS_REQUIRE_KUBE",
        test,
        "no etcd, kube-apiserver and kube-controller-manager in $DPUFS_K8S_BIN, $K8S_HOME/bin or \
         ~/.cache/dpufs-k8s/bin (docs/testing.md)",
    );
}

/// A running etcd and kube-apiserver; both are killed on drop.
#[derive(Debug)]
pub struct KubeApiServer {
    etcd: Child,
    apiserver: Child,
    controller_manager: Option<Child>,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// A kubeconfig for the administrator (token auth, the server's
    /// self-signed certificate not verified).
    pub kubeconfig: PathBuf,
    /// kube-apiserver's version, as `/version` reports it.
    pub version: String,
    dir: tempfile::TempDir,
}

impl KubeApiServer {
    /// Starts etcd and kube-apiserver on free loopback ports, or returns
    /// `None` (after [`skip`]) when the binaries are missing.
    pub fn start(test: &str) -> Option<KubeApiServer> {
        let Some(bin) = binaries() else {
            skip(test);
            return None;
        };
        Some(Self::start_retrying(&bin).expect("starting etcd and kube-apiserver"))
    }

    /// [`KubeApiServer::start_from`], again (up to three times in all) when a port it
    /// picked was taken before the server bound it: a free port is free only until
    /// another process's outgoing connection draws it from the same ephemeral range.
    fn start_retrying(bin: &Path) -> anyhow::Result<KubeApiServer> {
        let mut attempt = 1;
        loop {
            match Self::start_from(bin) {
                Err(e) if attempt < 3 && format!("{e:#}").contains("address already in use") => {
                    eprintln!("kube_api: a port was taken meanwhile, starting again: {e:#}");
                    attempt += 1;
                }
                done => return done,
            }
        }
    }

    fn start_from(bin: &Path) -> anyhow::Result<KubeApiServer> {
        let dir = tempfile::tempdir()?;
        let (etcd_port, peer_port, api_port) = (free_port()?, free_port()?, free_port()?);
        let etcd = spawn_logged(
            Command::new(bin.join("etcd"))
                .arg("--data-dir")
                .arg(dir.path().join("etcd"))
                .arg(format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"))
                .arg(format!(
                    "--advertise-client-urls=http://127.0.0.1:{etcd_port}"
                ))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"
                ))
                .arg(format!(
                    "--initial-cluster=default=http://127.0.0.1:{peer_port}"
                ))
                // Tests write little and never need fsync for durability.
                .arg("--unsafe-no-fsync"),
            &dir.path().join("etcd.log"),
            Detach::DieWithParent,
        )?;
        write_service_account_key(dir.path())?;
        let tokens = dir.path().join("tokens.csv");
        std::fs::write(
            &tokens,
            format!("{ADMIN_TOKEN},dpufs-e2e-admin,1,system:masters\n"),
        )?;
        let apiserver = spawn_logged(
            Command::new(bin.join("kube-apiserver"))
                .arg(format!("--etcd-servers=http://127.0.0.1:{etcd_port}"))
                .arg(format!("--secure-port={api_port}"))
                .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
                .arg(format!("--cert-dir={}", dir.path().join("certs").display()))
                .arg(format!("--token-auth-file={}", tokens.display()))
                .args([
                    "--authorization-mode=RBAC",
                    "--service-cluster-ip-range=10.0.0.0/24",
                ])
                .arg("--service-account-issuer=https://kubernetes.default.svc")
                .arg(format!(
                    "--service-account-key-file={}",
                    dir.path().join("sa.pub").display()
                ))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    dir.path().join("sa.key").display()
                ))
                .arg("--enable-priority-and-fairness=false"),
            &dir.path().join("kube-apiserver.log"),
            Detach::DieWithParent,
        )?;
        let url = format!("https://127.0.0.1:{api_port}");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&url))?;
        let mut server = KubeApiServer {
            etcd,
            apiserver,
            controller_manager: None,
            url,
            kubeconfig,
            version: String::new(),
            dir,
        };
        server.version = server.wait_ready()?;
        Ok(server)
    }

    /// Also runs kube-controller-manager, for scenarios that need what its
    /// controllers do (PersistentVolume protection, garbage collection,
    /// namespace deletion).
    pub fn start_controller_manager(&mut self) -> anyhow::Result<()> {
        let bin = binaries()
            .context("Kubernetes binaries")?
            .join("kube-controller-manager");
        let kubeconfig = self.kubeconfig.display().to_string();
        self.controller_manager = Some(spawn_logged(
            Command::new(&bin)
                .arg(format!("--kubeconfig={kubeconfig}"))
                .arg(format!("--authentication-kubeconfig={kubeconfig}"))
                .arg(format!("--authorization-kubeconfig={kubeconfig}"))
                .args(["--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false"])
                .arg(format!(
                    "--service-account-private-key-file={}",
                    self.dir.path().join("sa.key").display()
                ))
                .arg("--controllers=*,-node-ipam-controller,-cloud-node-lifecycle-controller,-service-lb-controller,-node-route-controller"),
            &self.dir.path().join("kube-controller-manager.log"), Detach::DieWithParent)?);
        Ok(())
    }

    /// A kube-rs client acting as the administrator.
    pub async fn client(&self) -> kube::Client {
        let config = kube::config::Kubeconfig::read_from(&self.kubeconfig)
            .expect("the fixture's kubeconfig parses");
        let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
            .await
            .expect("the fixture's kubeconfig is usable");
        kube::Client::try_from(config).expect("a kube client")
    }

    /// Applies the repository's CRDs (manifests/crds, byte for byte as a user
    /// applies them) with server-side apply, waits until each is Established,
    /// and returns every `Warning` header the server sent.
    pub async fn install_crds(&self, client: &kube::Client) -> anyhow::Result<Vec<String>> {
        let mut warnings = Vec::new();
        let files = crate::manifests::yaml_files(&crate::manifests::repo().join("manifests/crds"));
        for file in &files {
            let name = file
                .file_stem()
                .and_then(|s| s.to_str())
                .context("CRD file name")?;
            let body = std::fs::read(file)?;
            let uri = format!(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}?fieldManager=dpufs-e2e&force=true"
            );
            warnings.extend(
                apply(client, &uri, body)
                    .await
                    .with_context(|| format!("applying {name}"))?,
            );
            self.wait_established(client, name).await?;
        }
        Ok(warnings)
    }

    async fn wait_established(&self, client: &kube::Client, name: &str) -> anyhow::Result<()> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let crds: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let crd = crds.get(name).await?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("CRD {name} not Established after {READY_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last lines of the API server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log =
            std::fs::read_to_string(self.dir.path().join("kube-apiserver.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Polls `/readyz` until it answers `ok`; returns the server's version.
    fn wait_ready(&mut self) -> anyhow::Result<String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let exited = [
                ("etcd", &mut self.etcd),
                ("kube-apiserver", &mut self.apiserver),
            ]
            .into_iter()
            .find_map(|(name, child)| Some((name, child.try_wait().ok()??)));
            if let Some((name, status)) = exited {
                bail!(
                    "{name} exited with {status}; log tail:\n{}",
                    self.log_tail()
                );
            }
            if self.get("/readyz").is_ok_and(|body| body == "ok") {
                let version: serde_json::Value = serde_json::from_str(&self.get("/version")?)?;
                return Ok(version["gitVersion"]
                    .as_str()
                    .unwrap_or("unknown")
                    .to_string());
            }
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver not ready after {READY_TIMEOUT:?}:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// A GET with the administrator's token (curl keeps this crate free of an
    /// HTTP client; the tests themselves use kube-rs).
    fn get(&self, path: &str) -> anyhow::Result<String> {
        let out = Command::new("curl")
            .args(["-ksf", "--max-time", "5", "-H"])
            .arg(format!("Authorization: Bearer {ADMIN_TOKEN}"))
            .arg(format!("{}{path}", self.url))
            .output()
            .context("running curl")?;
        if !out.status.success() {
            bail!("GET {path}: curl exited with {}", out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for KubeApiServer {
    fn drop(&mut self) {
        let children = [
            self.controller_manager.as_mut(),
            Some(&mut self.apiserver),
            Some(&mut self.etcd),
        ];
        for child in children.into_iter().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A server-side apply of a YAML body; returns the server's warnings, or its
/// refusal as an error.
pub async fn apply(client: &kube::Client, uri: &str, yaml: Vec<u8>) -> anyhow::Result<Vec<String>> {
    let request = http::Request::patch(uri)
        .header(http::header::CONTENT_TYPE, "application/apply-patch+yaml")
        .body(kube::client::Body::from(yaml))?;
    let response = client.send(request).await?;
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|w| String::from_utf8_lossy(w.as_bytes()).into_owned())
        .collect();
    let status = response.status();
    if !status.is_success() {
        let body = response.into_body().collect_bytes().await?;
        bail!("{status}: {}", String::from_utf8_lossy(&body));
    }
    Ok(warnings)
}

/// The key pair that signs and checks service account tokens.
fn write_service_account_key(dir: &Path) -> anyhow::Result<()> {
    let key = openssl::rsa::Rsa::generate(2048)?;
    std::fs::File::create(dir.join("sa.key"))?.write_all(&key.private_key_to_pem()?)?;
    std::fs::File::create(dir.join("sa.pub"))?.write_all(&key.public_key_to_pem()?)?;
    Ok(())
}

fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters: [{{name: e2e, cluster: {{server: \"{url}\", insecure-skip-tls-verify: true}}}}]
users: [{{name: admin, user: {{token: \"{ADMIN_TOKEN}\"}}}}]
contexts: [{{name: e2e, context: {{cluster: e2e, user: admin}}}}]
current-context: e2e
"
    )
}
