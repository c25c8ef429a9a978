//! A conformance suite for any CSI driver, after the community's `csi-sanity`
//! (kubernetes-csi/csi-test v5.5.0): named cases that talk gRPC to a driver's Controller and
//! Node sockets, create and mount real volumes, and check the answers and their codes against
//! the CSI v1.12 specification.
//!
//! [`run`] takes what `csi-sanity` takes on its command line — the controller endpoint
//! (`--csi.controllerendpoint`), the node endpoint (`--csi.endpoint`), the parent of target
//! paths (`--csi.mountdir`), the parent of staging paths (`--csi.stagingdir`), CreateVolume
//! parameters, a volume size and an expansion size — and returns a [`Report`]: every case
//! passed, failed with a message, or skipped with the reason (a capability the driver does not
//! advertise, as `csi-sanity` skips it). Nothing is skipped silently: skipped cases are in the
//! report with their reasons.
//!
//! The suite plays the CO: it creates each staging directory and each target's parent (the
//! driver creates the target itself), and after every case it unpublishes, unstages and deletes
//! what the case left, removes the directories it made, and fails the case when that clean-up
//! fails. Cases run one at a time, in a fixed order.
//!
//! Where `csi-sanity` and the specification disagree, the specification wins; each such case
//! says so in its doc comment.

mod caps;
mod controller;
mod identity;
mod lifecycle;
mod node;
mod snapshots;
mod support;
mod volumes;

use dpufs_proto::csi::v1::controller_client::ControllerClient;
use dpufs_proto::csi::v1::identity_client::IdentityClient;
use dpufs_proto::csi::v1::node_client::NodeClient;
use std::collections::HashMap;
use std::fmt;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{Caps, Ctx, Verdict};

/// What to test and with which parameters.
#[derive(Debug, Clone)]
pub struct Config {
    /// The unix socket of the Identity and Controller services (`unix:///path`, `unix:path`
    /// or a path).
    pub controller_endpoint: String,
    /// The unix socket of the Identity and Node services; `None` skips every Node case
    /// (with that reason in the report).
    pub node_endpoint: Option<String>,
    /// Why there is no node endpoint, for the report.
    pub node_absent_reason: String,
    /// Parent of the target paths: each case gets `<mount_dir>/<unique>/target`.
    pub mount_dir: PathBuf,
    /// Parent of the staging paths: each case gets `<staging_dir>/<unique>`.
    pub staging_dir: PathBuf,
    /// CreateVolume `parameters` (and GetCapacity's).
    pub volume_parameters: HashMap<String, String>,
    /// CreateSnapshot `parameters`.
    pub snapshot_parameters: HashMap<String, String>,
    /// ControllerModifyVolume `mutable_parameters` that the driver accepts (empty: only the
    /// refusals are checked).
    pub mutable_parameters: HashMap<String, String>,
    /// `required_bytes` of the volumes the suite creates.
    pub volume_size: i64,
    /// `required_bytes` of ControllerExpandVolume.
    pub expand_size: i64,
    /// How often the idempotency cases repeat a call or a lifecycle (csi-sanity's
    /// `IdempotentCount`, 10).
    pub idempotent_count: usize,
    /// Run only the cases whose name contains this text.
    pub focus: Option<String>,
    /// Longest a case may take, its clean-up included.
    pub case_timeout: Duration,
}

impl Config {
    /// A configuration with csi-sanity's defaults, except a 1 GiB volume (expanded by 1 GiB).
    pub fn new(
        controller_endpoint: impl Into<String>,
        node_endpoint: Option<String>,
        mount_dir: impl Into<PathBuf>,
        staging_dir: impl Into<PathBuf>,
    ) -> Config {
        Config {
            controller_endpoint: controller_endpoint.into(),
            node_endpoint,
            node_absent_reason: "no node endpoint was given".into(),
            mount_dir: mount_dir.into(),
            staging_dir: staging_dir.into(),
            volume_parameters: HashMap::new(),
            snapshot_parameters: HashMap::new(),
            mutable_parameters: HashMap::new(),
            volume_size: 1 << 30,
            expand_size: 2 << 30,
            idempotent_count: 10,
            focus: None,
            case_timeout: Duration::from_secs(300),
        }
    }
}

impl Config {
    /// A configuration from the environment, for any driver: `CSI_SANITY_ENDPOINT` (the node
    /// endpoint, and the controller's unless `CSI_SANITY_CONTROLLER_ENDPOINT` is set), then
    /// [`Config::apply_env`]. `None` when neither endpoint is set.
    pub fn from_env() -> Result<Option<Config>, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let node = var("CSI_SANITY_ENDPOINT");
        let Some(controller) = var("CSI_SANITY_CONTROLLER_ENDPOINT").or_else(|| node.clone())
        else {
            return Ok(None);
        };
        let tmp = std::env::temp_dir();
        let mut config = Config::new(
            controller,
            node,
            var("CSI_SANITY_MOUNT_DIR").map_or_else(|| tmp.join("csi-mount"), PathBuf::from),
            var("CSI_SANITY_STAGING_DIR").map_or_else(|| tmp.join("csi-staging"), PathBuf::from),
        );
        config.node_absent_reason = "CSI_SANITY_ENDPOINT is not set".into();
        config.apply_env()?;
        Ok(Some(config))
    }

    /// Overrides from the environment: `CSI_SANITY_PARAMS`, `CSI_SANITY_SNAPSHOT_PARAMS`,
    /// `CSI_SANITY_MUTABLE_PARAMS` (JSON objects of strings), `CSI_SANITY_VOLUME_SIZE`,
    /// `CSI_SANITY_EXPAND_SIZE` (bytes), `CSI_SANITY_IDEMPOTENT_COUNT`, `CSI_SANITY_FOCUS`.
    pub fn apply_env(&mut self) -> Result<(), String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let params = |name: &str, into: &mut HashMap<String, String>| -> Result<(), String> {
            if let Some(json) = var(name) {
                *into = serde_json::from_str(&json)
                    .map_err(|e| format!("{name} is not a JSON object of strings: {e}"))?;
            }
            Ok(())
        };
        params("CSI_SANITY_PARAMS", &mut self.volume_parameters)?;
        params("CSI_SANITY_SNAPSHOT_PARAMS", &mut self.snapshot_parameters)?;
        params("CSI_SANITY_MUTABLE_PARAMS", &mut self.mutable_parameters)?;
        let number = |name: &str| -> Result<Option<i64>, String> {
            var(name)
                .map(|v| v.parse::<i64>().map_err(|e| format!("{name}={v}: {e}")))
                .transpose()
        };
        if let Some(n) = number("CSI_SANITY_VOLUME_SIZE")? {
            self.volume_size = n;
        }
        if let Some(n) = number("CSI_SANITY_EXPAND_SIZE")? {
            self.expand_size = n;
        }
        if let Some(n) = number("CSI_SANITY_IDEMPOTENT_COUNT")? {
            self.idempotent_count = usize::try_from(n).map_err(|e| e.to_string())?;
        }
        if let Some(focus) = var("CSI_SANITY_FOCUS") {
            self.focus = Some(focus);
        }
        Ok(())
    }
}

/// How one case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed(String),
    Skipped(String),
}

/// One case of a run.
#[derive(Debug, Clone)]
pub struct CaseReport {
    pub name: String,
    pub outcome: Outcome,
    pub took: Duration,
}

/// Every case of a run, in the order they ran.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub cases: Vec<CaseReport>,
    pub took: Duration,
}

impl Report {
    pub fn passed(&self) -> impl Iterator<Item = &CaseReport> {
        self.cases.iter().filter(|c| c.outcome == Outcome::Passed)
    }

    pub fn failed(&self) -> impl Iterator<Item = &CaseReport> {
        self.cases
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Failed(_)))
    }

    pub fn skipped(&self) -> impl Iterator<Item = &CaseReport> {
        self.cases
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Skipped(_)))
    }

    /// `N cases: P passed, F failed, S skipped in T s`.
    pub fn summary(&self) -> String {
        format!(
            "{} cases: {} passed, {} failed, {} skipped in {:.1} s",
            self.cases.len(),
            self.passed().count(),
            self.failed().count(),
            self.skipped().count(),
            self.took.as_secs_f64()
        )
    }
}

impl fmt::Display for CaseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.took.as_millis();
        match &self.outcome {
            Outcome::Passed => write!(f, "PASS  {} ({ms} ms)", self.name),
            Outcome::Failed(why) => write!(f, "FAIL  {} ({ms} ms)\n      {why}", self.name),
            Outcome::Skipped(why) => write!(f, "SKIP  {}\n      skipped: {why}", self.name),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "csi_sanity report: {}", self.summary())?;
        for case in &self.cases {
            writeln!(f, "{case}")?;
        }
        let skipped: Vec<_> = self.skipped().collect();
        if !skipped.is_empty() {
            writeln!(f, "!!! {} cases SKIPPED:", skipped.len())?;
            for case in skipped {
                if let Outcome::Skipped(why) = &case.outcome {
                    writeln!(f, "!!!   {}: {why}", case.name)?;
                }
            }
        }
        Ok(())
    }
}

/// Runs the suite against the driver `config` names. Each case's line is printed to stderr as
/// it ends.
pub async fn run(config: Config) -> Report {
    let start = Instant::now();
    let mut runner = Runner {
        report: Report::default(),
        focus: config.focus.clone(),
        timeout: config.case_timeout,
        cx: None,
    };
    match connect(config).await {
        Ok(cx) => {
            runner.cx = Some(cx);
            identity::cases(&mut runner).await;
            controller::cases(&mut runner).await;
            snapshots::cases(&mut runner).await;
            node::cases(&mut runner).await;
        }
        Err(why) => runner.report.cases.push(CaseReport {
            name: "connect to the driver".into(),
            outcome: Outcome::Failed(why),
            took: start.elapsed(),
        }),
    }
    runner.report.took = start.elapsed();
    runner.report
}

/// Connects to the endpoints and learns what the driver advertises.
async fn connect(mut config: Config) -> Result<Ctx, String> {
    let wait = Duration::from_secs(30);
    let ctl_socket = socket_path(&config.controller_endpoint)?;
    let ctl_channel = crate::csi_bed::try_connect(&ctl_socket, wait).await?;
    let node_channel = match &config.node_endpoint {
        Some(endpoint) => Some(crate::csi_bed::try_connect(&socket_path(endpoint)?, wait).await?),
        None => None,
    };
    // Canonical, as the mount table names mount points.
    for dir in [&mut config.mount_dir, &mut config.staging_dir] {
        std::fs::create_dir_all(&*dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        *dir = dir
            .canonicalize()
            .map_err(|e| format!("resolving {}: {e}", dir.display()))?;
    }
    let mut cx = Ctx {
        ctl: ControllerClient::new(ctl_channel.clone()),
        ctl_ident: IdentityClient::new(ctl_channel),
        node: node_channel.clone().map(NodeClient::new),
        node_ident: node_channel.map(IdentityClient::new),
        caps: Arc::new(Caps::default()),
        run_id: uuid::Uuid::new_v4().simple().to_string()[..8].to_string(),
        state: Default::default(),
        cfg: Arc::new(config),
    };
    cx.caps = Arc::new(Caps::learn(&cx).await);
    Ok(cx)
}

/// The socket path of a CSI endpoint: `unix:///abs/path`, `unix:path`, or a plain path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, String> {
    let path = match endpoint.strip_prefix("unix://") {
        Some(rest) => rest,
        None => endpoint.strip_prefix("unix:").unwrap_or(endpoint),
    };
    if path.is_empty() || (endpoint.contains("://") && !endpoint.starts_with("unix://")) {
        return Err(format!(
            "{endpoint:?} is not a unix socket endpoint (CSI allows only unix sockets)"
        ));
    }
    Ok(PathBuf::from(path))
}

/// Runs cases one at a time and collects their outcomes.
pub(crate) struct Runner {
    report: Report,
    focus: Option<String>,
    timeout: Duration,
    cx: Option<Ctx>,
}

impl Runner {
    /// Runs the case `name`, then its clean-up.
    pub(crate) async fn case<F, Fut>(&mut self, name: &str, case: F)
    where
        F: FnOnce(Ctx) -> Fut,
        Fut: Future<Output = Result<(), Verdict>>,
    {
        if self
            .focus
            .as_ref()
            .is_some_and(|f| !name.contains(f.as_str()))
        {
            return;
        }
        let cx = self.cx.clone().expect("connected");
        let start = Instant::now();
        let ran = tokio::time::timeout(self.timeout, async {
            let result = case(cx.clone()).await;
            let cleanup = cx.cleanup().await;
            (result, cleanup)
        })
        .await;
        let outcome = match ran {
            Err(_) => Outcome::Failed(format!("did not end within {:?}", self.timeout)),
            Ok((result, cleanup)) => match (result, cleanup) {
                (Ok(()), Ok(())) => Outcome::Passed,
                (Err(Verdict::Skip(why)), Ok(())) => Outcome::Skipped(why),
                (Err(Verdict::Fail(why)), Ok(())) => Outcome::Failed(why),
                (Err(Verdict::Fail(why)), Err(more)) => {
                    Outcome::Failed(format!("{why}; and the clean-up failed: {more}"))
                }
                (_, Err(more)) => Outcome::Failed(format!("clean-up failed: {more}")),
            },
        };
        let report = CaseReport {
            name: name.to_string(),
            outcome,
            took: start.elapsed(),
        };
        // Past libtest's capture: the progress of a long run shows as it happens.
        let _ = writeln!(std::io::stderr(), "csi-sanity: {report}");
        self.report.cases.push(report);
    }
}
