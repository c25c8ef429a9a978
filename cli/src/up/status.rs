//! `dpufs status`: what the local stack runs — engine, pools, containers, the CSI plugins
//! and their sockets, the mount keeper, the volume worker and its mount — from the state
//! directory, the management API, the keeper's socket and the worker's control socket.

use super::csi::Service;
use super::node::{control, worker_control};
use super::state::{
    CSI, ENDPOINT, ENGINE, ENGINE_PID, KEEPER_PID, MOUNT, StateDir, mounted_fstype,
};
use crate::output::{Out, Table, bytes};
use clap::Args;
use dpufs_daos::{ContainerAdmin, EngineContainers};
use dpufs_node_api::control::{self, Health, WorkerStats};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The directory `dpufs up` uses.
    #[arg(long, default_value = super::DEFAULT_DIR)]
    data_dir: PathBuf,
}

#[derive(Debug, Serialize)]
struct Status {
    engine: Option<Process>,
    pools: Vec<PoolStatus>,
    /// The CSI controller and node plugins, with their sockets as endpoints.
    csi_controller: Option<Process>,
    csi_node: Option<Process>,
    keeper: Option<Process>,
    worker: Option<Process>,
    /// Workers the keeper replaced after they died.
    worker_restarts: Option<u64>,
    /// The worker's health and counters, from its control socket (`worker_health` as the
    /// socket answers it, `"ok": true` included).
    worker_health: Option<control::Reply>,
    #[serde(serialize_with = "sorted")]
    worker_stats: Option<WorkerStats>,
    mount: Option<MountStatus>,
}

#[derive(Debug, Serialize)]
struct Process {
    pid: u32,
    endpoint: Option<String>,
}

#[derive(Debug, Serialize)]
struct PoolStatus {
    label: String,
    uuid: String,
    containers: Vec<String>,
}

#[derive(Debug, Serialize)]
struct MountStatus {
    path: PathBuf,
    /// The file system mounted there, if any.
    fstype: Option<String>,
}

/// Prints the stack's status; an error when nothing of it runs.
pub async fn status(args: StatusArgs, system: &str, out: Out) -> anyhow::Result<()> {
    let state = StateDir::new(&args.data_dir);
    let engine = state.running(ENGINE_PID, ENGINE).map(|pid| Process {
        pid,
        endpoint: state.recorded(ENDPOINT),
    });
    let pools = match engine.as_ref().and_then(|e| e.endpoint.as_deref()) {
        Some(endpoint) => pools(endpoint, system).await?,
        None => Vec::new(),
    };
    let plugin = |service: Service| {
        state.running(service.pid_file(), CSI).map(|pid| Process {
            pid,
            endpoint: Some(format!("unix://{}", service.socket(&state).display())),
        })
    };
    let (csi_controller, csi_node) = (plugin(Service::Controller), plugin(Service::Node));
    let keeper = state.running(KEEPER_PID, CSI).map(|pid| Process {
        pid,
        endpoint: None,
    });
    let served = match keeper {
        Some(_) => worker_control(&state).await,
        None => None,
    };
    let (mut worker, mut worker_restarts, mut worker_health, mut worker_stats) =
        (None, None, None, None);
    if let Some((volume, socket)) = served {
        worker = volume.pid.map(|pid| Process {
            pid,
            endpoint: None,
        });
        worker_restarts = Some(u64::from(volume.restarts));
        worker_health = control(&socket, control::Request::Health)
            .await
            .ok()
            .filter(|r| matches!(r, control::Reply::Health(_)));
        worker_stats = match control(&socket, control::Request::Stats).await {
            Ok(control::Reply::Stats(s)) => Some(s),
            _ => None,
        };
    }
    let mount = state.recorded(MOUNT).map(|path| {
        let path = PathBuf::from(path);
        MountStatus {
            fstype: mounted_fstype(&path),
            path,
        }
    });
    let status = Status {
        engine,
        pools,
        csi_controller,
        csi_node,
        keeper,
        worker,
        worker_restarts,
        worker_health,
        worker_stats,
        mount,
    };
    let nothing = status.engine.is_none()
        && status.keeper.is_none()
        && status.csi_node.is_none()
        && status.csi_controller.is_none();
    out.show(&status, print)?;
    if nothing {
        anyhow::bail!(
            "nothing of `dpufs up` runs (state in {}); start it with `dpufs up`",
            state.dir.display()
        );
    }
    Ok(())
}

async fn pools(endpoint: &str, system: &str) -> anyhow::Result<Vec<PoolStatus>> {
    let mgmt = crate::connect(None, endpoint, system)?;
    let admin = EngineContainers::new(&mgmt);
    let mut out = Vec::new();
    for pool in mgmt.list_pools().await? {
        let containers = admin
            .list(&pool.uuid)
            .await?
            .into_iter()
            .map(|c| format!("{} ({})", c.label, c.uuid))
            .collect();
        out.push(PoolStatus {
            label: pool.label,
            uuid: pool.uuid,
            containers,
        });
    }
    Ok(out)
}

fn print(s: &Status) {
    let process = |p: &Option<Process>| match p {
        Some(p) => format!(
            "running (pid {}{})",
            p.pid,
            p.endpoint
                .as_deref()
                .map_or(String::new(), |e| format!(", {e}"))
        ),
        None => "not running".into(),
    };
    let mut fields = vec![("engine", process(&s.engine))];
    for pool in &s.pools {
        fields.push(("pool", format!("{} ({})", pool.label, pool.uuid)));
        for c in &pool.containers {
            fields.push(("  container", c.clone()));
        }
    }
    fields.push(("CSI controller", process(&s.csi_controller)));
    fields.push(("CSI node", process(&s.csi_node)));
    fields.push(("mount keeper", process(&s.keeper)));
    fields.push(("volume worker", process(&s.worker)));
    if let Some(n) = s.worker_restarts.filter(|&n| n > 0) {
        fields.push(("  replaced", format!("{n} time(s) after a crash")));
    }
    if let Some(control::Reply::Health(h)) = &s.worker_health {
        fields.push(("  state", health_line(h)));
    }
    if let Some(st) = &s.worker_stats {
        // Errors answered to the kernel, by errno (ENOENT of lookups among them).
        let errors: u64 = st.errors.values().sum();
        fields.push((
            "  traffic",
            format!(
                "{} read, {} written, {errors} error replies",
                bytes(st.bytes_read),
                bytes(st.bytes_written),
            ),
        ));
    }
    let mount = match &s.mount {
        Some(m) => match &m.fstype {
            Some(t) => format!("{} ({t})", m.path.display()),
            None => format!("{} (not mounted)", m.path.display()),
        },
        None => "none".into(),
    };
    fields.push(("mount", mount));
    Table::fields(fields).print();
}

fn health_line(h: &Health) -> String {
    let state = match h.state {
        control::WorkerState::Serving => "serving",
        control::WorkerState::Stopping => "stopping",
    };
    format!(
        "{state}, {} reader threads, {} requests in flight",
        h.threads_alive, h.in_flight
    )
}

/// `v` with its keys sorted at every level, as the worker's socket sends it (and as
/// `--json` has always shown it).
fn sorted<T: Serialize, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    serde_json::to_value(v)
        .map_err(serde::ser::Error::custom)?
        .serialize(s)
}
