//! The summary `up` prints once the stack runs: what runs where, and how to reach it.

use super::csi::PluginProcess;
use super::provision::{DEFAULT_LABEL, Stack};
use super::state::StateDir;
use super::{DEFAULT_DIR, Running};

/// Says what runs where, once everything is up.
pub(super) fn print(state: &StateDir, running: &Running, stack: &Stack) {
    println!("\ndpufs is up:");
    let process = |p: Option<&PluginProcess>| {
        p.map_or("not running".into(), |p| {
            format!(
                "{} (pid {}, log {})",
                p.socket.display(),
                p.pid,
                p.log.0.display()
            )
        })
    };
    let mount = match &running.published {
        Some(p) => format!(
            "{} (volume {}; mount keeper pid {})",
            p.target.display(),
            p.volume_id,
            running.keeper_pid.unwrap_or_default(),
        ),
        None => "none".into(),
    };
    let mut fields = Vec::new();
    if let Some(engine) = &running.engine {
        fields.push((
            "engine",
            format!(
                "{} (pid {}, log {})",
                engine.addr,
                engine.pid,
                engine.log.0.display()
            ),
        ));
        fields.push((
            "fabric",
            engine.fabric_addr.map_or("not serving".into(), |a| {
                format!("{a} (software RDMA device)")
            }),
        ));
    }
    fields.extend([
        ("pool", format!("{DEFAULT_LABEL} ({})", stack.pool)),
        ("CSI controller", process(running.controller.as_ref())),
        ("CSI node", process(running.node.as_ref())),
        ("mount", mount),
    ]);
    crate::output::Table::fields(fields).print();
    // Only the default directory's endpoint file is looked for by other commands.
    let here = std::env::current_dir()
        .unwrap_or_default()
        .join(DEFAULT_DIR);
    let (reach, flags) = if state.dir == here {
        ("run in this directory find it", String::new())
    } else {
        (
            "reach it with",
            format!(
                "--insecure --endpoint {} ",
                running.engine.as_ref().map_or("", |e| e.addr.as_str())
            ),
        )
    };
    println!(
        "Other dpufs commands {reach}, e.g.\n  dpufs {flags}status\n  dpufs {flags}pool query {DEFAULT_LABEL}\n\
         Any CSI client can use the two sockets. Ctrl-C stops the stack."
    );
}
