//! `dpufs cont ...`: the `daos cont` verbs. Real DAOS creates containers only
//! through libdaos, so everything but `set-owner` goes through the
//! `ContainerAdmin` backend; `set-owner` is the one container call of the
//! management API.

use crate::acl::{self, AceArgs};
use crate::output::{self, Out, Table};
use crate::props::{self, CONT};
use anyhow::bail;
use clap::{ArgGroup, Args, Subcommand};
use dpufs_daos::{
    ContainerAdmin, ContainerInfo, ContainerSpec, EngineContainers, MgmtClient, Snapshot,
    SnapshotRef,
};
use dpufs_proto::daos::props::{CONT_LABEL, CONT_LAYOUT_TYPE, find};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum ContCmd {
    /// Creates a container.
    Create(CreateArgs),
    /// Lists a pool's containers.
    List { pool: String },
    /// Shows a container's properties, owner and ACL.
    Query(ContId),
    /// Destroys a container with its snapshots.
    Destroy {
        #[command(flatten)]
        id: ContId,
        /// Destroy even while it is open.
        #[arg(long)]
        force: bool,
    },
    /// Sets container properties, all or none: `name:value[,name:value]`.
    SetProp {
        #[command(flatten)]
        id: ContId,
        #[arg(required = true)]
        properties: Vec<String>,
    },
    /// Shows a container's ACL.
    GetAcl(ContId),
    /// Adds entries to a container's ACL, replacing those of the same principal.
    UpdateAcl {
        #[command(flatten)]
        id: ContId,
        #[command(flatten)]
        aces: AceArgs,
    },
    /// Replaces a container's whole ACL with a file's entries.
    OverwriteAcl {
        #[command(flatten)]
        id: ContId,
        #[arg(long)]
        acl_file: PathBuf,
    },
    /// Removes one principal's entry from a container's ACL.
    DeleteAcl {
        #[command(flatten)]
        id: ContId,
        /// `u:name@`, `g:group@`, `OWNER@`, `GROUP@` or `EVERYONE@`.
        #[arg(short = 'p', long)]
        principal: String,
    },
    /// Changes a container's owning user and/or group.
    #[command(group(ArgGroup::new("owner").required(true).multiple(true).args(["user", "group"])))]
    SetOwner {
        #[command(flatten)]
        id: ContId,
        /// New owning user, `name@`.
        #[arg(long)]
        user: Option<String>,
        /// New owning group, `group@`.
        #[arg(long)]
        group: Option<String>,
    },
    /// Snapshots: create, list, destroy.
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
}

/// A container: its pool and its label or UUID.
#[derive(Debug, Args)]
pub struct ContId {
    /// Pool label or UUID.
    pool: String,
    /// Container label or UUID.
    cont: String,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Pool label or UUID.
    pool: String,
    /// Container label: 1-127 characters of A-Z a-z 0-9 . _ : - that is not a UUID.
    label: String,
    /// Container properties, `name:value[,name:value]`.
    #[arg(long)]
    properties: Vec<String>,
    /// Layout type, e.g. POSIX for a file system (the `layout_type` property).
    #[arg(long = "type")]
    layout: Option<String>,
    /// Container UUID [default: a new one]. Repeating a create with the same
    /// UUID and label returns the same container.
    #[arg(long)]
    uuid: Option<uuid::Uuid>,
    /// ACL file, one entry per line [default: DAOS's owner and group entries].
    #[arg(long)]
    acl_file: Option<PathBuf>,
    /// A user attribute, `name=value`; repeatable.
    #[arg(long = "attr", value_parser = parse_attr, value_name = "NAME=VALUE")]
    attrs: Vec<(String, String)>,
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCmd {
    /// Takes a snapshot.
    Create {
        #[command(flatten)]
        id: ContId,
        /// Snapshot name [default: none, named by its epoch].
        #[arg(long)]
        name: Option<String>,
    },
    /// Lists a container's snapshots.
    List(ContId),
    /// Destroys a snapshot, named or by epoch.
    #[command(group(ArgGroup::new("which").required(true).args(["name", "epoch"])))]
    Destroy {
        #[command(flatten)]
        id: ContId,
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        epoch: Option<u64>,
    },
}

fn parse_attr(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.into(), v.into())),
        _ => Err(format!("attribute {text:?}: expected name=value")),
    }
}

pub async fn run(cmd: ContCmd, mgmt: &MgmtClient, out: Out) -> anyhow::Result<()> {
    // The engine backend; the libdaos backend for real DAOS is chosen here
    // once it exists.
    let admin: &dyn ContainerAdmin = &EngineContainers::new(mgmt);
    match cmd {
        ContCmd::Create(args) => out.show(&admin.create(&args.spec()?).await?, print_info),
        ContCmd::List { pool } => out.show(&admin.list(&pool).await?, |c| print_list(c)),
        ContCmd::Query(id) => out.show(&admin.query(&id.pool, &id.cont).await?, print_info),
        ContCmd::Destroy { id, force } => {
            admin.destroy(&id.pool, &id.cont, force).await?;
            out.show(
                &json!({ "pool": id.pool, "container": id.cont, "destroyed": true }),
                |_| println!("container {} destroyed", id.cont),
            )
        }
        ContCmd::SetProp { id, properties } => {
            let values = CONT.parse_list(&properties)?;
            let info = admin.set_properties(&id.pool, &id.cont, values).await?;
            out.show(&info, print_info)
        }
        ContCmd::GetAcl(id) => acl::print_acl(out, &admin.get_acl(&id.pool, &id.cont).await?),
        ContCmd::UpdateAcl { id, aces } => {
            let acl = admin
                .update_acl(&id.pool, &id.cont, aces.entries()?)
                .await?;
            acl::print_acl(out, &acl)
        }
        ContCmd::OverwriteAcl { id, acl_file } => {
            let entries = acl::read_acl_file(&acl_file)?;
            let acl = admin.overwrite_acl(&id.pool, &id.cont, entries).await?;
            acl::print_acl(out, &acl)
        }
        ContCmd::DeleteAcl { id, principal } => {
            let acl = admin.delete_acl(&id.pool, &id.cont, &principal).await?;
            acl::print_acl(out, &acl)
        }
        ContCmd::SetOwner { id, user, group } => {
            let user = user.as_deref().map(acl::principal).unwrap_or_default();
            let group = group.as_deref().map(acl::principal).unwrap_or_default();
            mgmt.cont_set_owner(&id.pool, &id.cont, &user, &group)
                .await?;
            let owners =
                json!({ "pool": id.pool, "container": id.cont, "user": user, "group": group });
            out.show(&owners, |_| {
                let changed: Vec<&str> = [user.as_str(), group.as_str()]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect();
                println!("container {} now owned by {}", id.cont, changed.join(" / "));
            })
        }
        ContCmd::Snapshot(cmd) => snapshot(cmd, admin, out).await,
    }
}

async fn snapshot(cmd: SnapshotCmd, admin: &dyn ContainerAdmin, out: Out) -> anyhow::Result<()> {
    match cmd {
        SnapshotCmd::Create { id, name } => {
            let snap = admin
                .snapshot_create(&id.pool, &id.cont, name.as_deref().unwrap_or_default())
                .await?;
            out.show(&snap, |s| {
                println!("snapshot {} taken at epoch {}", snapshot_name(s), s.epoch);
            })
        }
        SnapshotCmd::List(id) => {
            let snaps = admin.snapshot_list(&id.pool, &id.cont).await?;
            out.show(&snaps, |s| print_snapshots(s))
        }
        SnapshotCmd::Destroy { id, name, epoch } => {
            let which = match (name, epoch) {
                (Some(name), _) => SnapshotRef::Name(name),
                (None, Some(epoch)) => SnapshotRef::Epoch(epoch),
                (None, None) => bail!("give --name or --epoch"),
            };
            let left = admin.snapshot_destroy(&id.pool, &id.cont, which).await?;
            out.show(&left, |s| {
                println!("snapshot destroyed; {} left", s.len());
            })
        }
    }
}

impl CreateArgs {
    fn spec(&self) -> anyhow::Result<ContainerSpec> {
        let mut list = self.properties.clone();
        list.extend(self.layout.iter().map(|t| format!("layout_type:{t}")));
        let properties = CONT.parse_list(&list)?;
        if properties.iter().any(|(n, _)| *n == CONT_LABEL) {
            bail!("give the container label as the LABEL argument, not in --properties");
        }
        let acl = match &self.acl_file {
            Some(path) => acl::read_acl_file(path)?,
            None => Vec::new(),
        };
        let attributes: BTreeMap<String, Vec<u8>> = self
            .attrs
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
            .collect();
        Ok(ContainerSpec {
            pool: self.pool.clone(),
            uuid: self.uuid,
            label: self.label.clone(),
            properties,
            acl,
            attributes,
            ..ContainerSpec::default()
        })
    }
}

/// A container's layout type in words (`POSIX`), or `-` when unset.
fn layout(c: &ContainerInfo) -> String {
    match (
        c.properties.get(&CONT_LAYOUT_TYPE),
        find(CONT.table, CONT_LAYOUT_TYPE),
    ) {
        (Some(value), Some(def)) => def.display(value),
        _ => "-".into(),
    }
}

fn print_list(conts: &[ContainerInfo]) {
    if conts.is_empty() {
        println!("no containers");
        return;
    }
    let mut t = Table::new(&["Container", "UUID", "Layout", "Snapshots", "Created"]);
    for c in conts {
        t.row([
            c.label.clone(),
            c.uuid.clone(),
            layout(c),
            c.snapshot_count.to_string(),
            output::utc_time(c.created_unix),
        ]);
    }
    t.print();
}

fn print_info(c: &ContainerInfo) {
    Table::fields([
        ("Container", c.label.clone()),
        ("UUID", c.uuid.clone()),
        ("Pool", c.pool_uuid.clone()),
        ("Layout", layout(c)),
        ("Owner", c.acl.owner_user.clone()),
        ("Group", c.acl.owner_group.clone()),
        ("Snapshots", c.snapshot_count.to_string()),
        ("Created", output::utc_time(c.created_unix)),
        ("ACL", c.acl.entries.join(", ")),
    ])
    .print();
    println!();
    props::print_rows(&CONT.rows(c.properties.clone()));
}

fn snapshot_name(s: &Snapshot) -> &str {
    if s.name.is_empty() {
        "(unnamed)"
    } else {
        &s.name
    }
}

fn print_snapshots(snaps: &[Snapshot]) {
    if snaps.is_empty() {
        println!("no snapshots");
        return;
    }
    let mut t = Table::new(&["Epoch", "Name", "Created"]);
    for s in snaps {
        t.row([
            s.epoch.to_string(),
            snapshot_name(s).to_string(),
            output::utc_time(s.created_unix),
        ]);
    }
    t.print();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_name_value() {
        assert_eq!(parse_attr("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(parse_attr("a").is_err());
        assert!(parse_attr("=b").is_err());
        assert!(parse_attr("a=").is_err());
    }
}
