//! `dpufs pool ...`: dmg's pool verbs over the DAOS management API.

use crate::acl::{self, AceArgs};
use crate::output::{self, Out, Table};
use crate::props::{self, POOL};
use crate::size::{parse_size, parse_tier_bytes, parse_tier_ratio};
use anyhow::bail;
use clap::{ArgGroup, Args, Subcommand};
use dpufs_daos::{DaosError, MgmtClient, PoolCreated, PoolInfo, PoolSize, PoolSpec, PoolSummary};
use dpufs_proto::daos::props::{Access, POOL_LABEL, PropKind};
use serde_json::json;
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum PoolCmd {
    /// Creates a pool.
    Create(CreateArgs),
    /// Lists the pools of the system.
    List,
    /// Shows a pool's state, targets and space.
    Query { pool: String },
    /// Destroys a pool.
    Destroy {
        pool: String,
        /// Destroy even while handles are open.
        #[arg(long)]
        force: bool,
        /// Destroy its containers too (refused otherwise while there are any).
        #[arg(long)]
        recursive: bool,
        /// Succeed when the pool does not exist, e.g. when retrying a destroy
        /// whose answer was lost.
        #[arg(long)]
        if_exists: bool,
    },
    /// Closes every open handle to a pool.
    Evict { pool: String },
    /// Shows pool properties: the named ones, or all of them.
    GetProp { pool: String, names: Vec<String> },
    /// Sets pool properties, all or none: `name:value[,name:value]`.
    SetProp {
        pool: String,
        #[arg(required = true)]
        properties: Vec<String>,
    },
    /// Shows a pool's ACL.
    GetAcl { pool: String },
    /// Adds entries to a pool's ACL, replacing those of the same principal.
    UpdateAcl {
        pool: String,
        #[command(flatten)]
        aces: AceArgs,
    },
    /// Replaces a pool's whole ACL with a file's entries.
    OverwriteAcl {
        pool: String,
        #[arg(long)]
        acl_file: PathBuf,
    },
    /// Removes one principal's entry from a pool's ACL.
    DeleteAcl {
        pool: String,
        /// `u:name@`, `g:group@`, `OWNER@`, `GROUP@` or `EVERYONE@`.
        #[arg(short = 'p', long)]
        principal: String,
    },
}

/// `pool create`: sized by a total (`--size`, split by `--tier-ratio`) or by
/// per-rank tier sizes (`--tier-bytes`), as dmg's auto and manual modes.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("sizing").required(true).args(["size", "tier_bytes"])))]
pub struct CreateArgs {
    /// Pool label: 1-127 characters of A-Z a-z 0-9 . _ : - that is not a UUID.
    label: String,
    /// Total size over all ranks: 10G, 512M, 1T or bytes (binary units).
    #[arg(long, short = 'z', value_parser = parse_size)]
    size: Option<u64>,
    /// How --size splits into metadata and data tiers, in percent [default: 6,94].
    #[arg(long, value_parser = parse_tier_ratio, requires = "size", value_name = "META,DATA")]
    tier_ratio: Option<[f64; 2]>,
    /// Metadata and data tier sizes per rank, e.g. 64M,1G.
    #[arg(long, value_parser = parse_tier_bytes, value_name = "META,DATA")]
    tier_bytes: Option<[u64; 2]>,
    /// Ranks to put the pool on, e.g. 0,1 or 0-3 [default: the server chooses].
    #[arg(long, value_parser = parse_rank_list, conflicts_with = "nranks")]
    ranks: Option<RankList>,
    /// Number of ranks to use [default: all].
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    nranks: u32,
    /// Number of pool-service replicas [default: the server's].
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    nsvc: u32,
    /// Pool properties, `name:value[,name:value]`.
    #[arg(long)]
    properties: Vec<String>,
    /// ACL file, one entry per line [default: DAOS's owner and group entries].
    #[arg(long)]
    acl_file: Option<PathBuf>,
    /// Owning user, `name@`.
    #[arg(long)]
    user: Option<String>,
    /// Owning group, `group@`.
    #[arg(long)]
    group: Option<String>,
    /// Pool UUID [default: a new one]. Repeating a create with the same UUID
    /// returns the same pool.
    #[arg(long)]
    uuid: Option<uuid::Uuid>,
}

/// A rank list argument (a newtype so clap takes it as one value).
#[derive(Debug, Clone)]
pub struct RankList(Vec<u32>);

fn parse_rank_list(text: &str) -> Result<RankList, String> {
    dpufs_proto::daos::ranks::parse_ranks(text)
        .filter(|r| !r.is_empty())
        .map(RankList)
        .ok_or_else(|| format!("{text:?} is not a rank list such as 0,1 or 0-3"))
}

pub async fn run(cmd: PoolCmd, mgmt: &MgmtClient, out: Out) -> anyhow::Result<()> {
    match cmd {
        PoolCmd::Create(args) => {
            let created = mgmt.pool_create(&args.spec()?).await?;
            out.show(&created, |c| print_created(&args.label, c))
        }
        PoolCmd::List => out.show(&mgmt.list_pools().await?, |p| print_list(p)),
        PoolCmd::Query { pool } => out.show(&mgmt.pool_query(&pool).await?, print_info),
        PoolCmd::Destroy {
            pool,
            force,
            recursive,
            if_exists,
        } => {
            let destroyed = match mgmt.pool_destroy(&pool, force, recursive).await {
                Ok(()) => true,
                Err(DaosError::NotFound { .. }) if if_exists => false,
                Err(e) => return Err(e.into()),
            };
            out.show(&json!({ "pool": pool, "destroyed": destroyed }), |_| {
                if destroyed {
                    println!("pool {pool} destroyed");
                } else {
                    println!("pool {pool} does not exist; nothing to destroy");
                }
            })
        }
        PoolCmd::Evict { pool } => {
            let count = mgmt.pool_evict(&pool).await?;
            out.show(&json!({ "pool": pool, "handles_evicted": count }), |_| {
                println!("pool {pool}: {count} handle(s) evicted");
            })
        }
        PoolCmd::GetProp { pool, names } => {
            let numbers = if names.is_empty() {
                shown_by_default()
            } else {
                names
                    .iter()
                    .map(|n| POOL.def(n).map(|d| d.number))
                    .collect::<anyhow::Result<_>>()?
            };
            let rows = POOL.rows(mgmt.pool_get_props(&pool, &numbers).await?);
            out.show(&rows, |r| props::print_rows(r))
        }
        PoolCmd::SetProp { pool, properties } => {
            let values = POOL.parse_list(&properties)?;
            mgmt.pool_set_props(&pool, values.clone()).await?;
            out.show(&POOL.rows(values), |rows| {
                let set: Vec<String> = rows
                    .iter()
                    .map(|r| format!("{}={}", r.name, r.value))
                    .collect();
                println!("pool {pool}: set {}", set.join(", "));
            })
        }
        PoolCmd::GetAcl { pool } => acl::print_acl(out, &mgmt.pool_get_acl(&pool).await?),
        PoolCmd::UpdateAcl { pool, aces } => {
            acl::print_acl(out, &mgmt.pool_update_acl(&pool, aces.entries()?).await?)
        }
        PoolCmd::OverwriteAcl { pool, acl_file } => {
            let entries = acl::read_acl_file(&acl_file)?;
            acl::print_acl(out, &mgmt.pool_overwrite_acl(&pool, entries).await?)
        }
        PoolCmd::DeleteAcl { pool, principal } => {
            acl::print_acl(out, &mgmt.pool_delete_acl(&pool, &principal).await?)
        }
    }
}

impl CreateArgs {
    fn spec(&self) -> anyhow::Result<PoolSpec> {
        let size = match (self.size, self.tier_bytes) {
            (Some(bytes), _) => match self.tier_ratio {
                Some(tier_ratio) => PoolSize::Total { bytes, tier_ratio },
                None => PoolSize::total(bytes),
            },
            (None, Some(tier_bytes)) => PoolSize::PerRank { tier_bytes },
            (None, None) => bail!("give --size or --tier-bytes"),
        };
        let properties = POOL.parse_list(&self.properties)?;
        if properties.iter().any(|(n, _)| *n == POOL_LABEL) {
            bail!("give the pool label as the LABEL argument, not in --properties");
        }
        let mut spec = PoolSpec::new(&self.label, size);
        spec.uuid = self.uuid.unwrap_or(spec.uuid);
        spec.ranks = self.ranks.clone().map_or_else(Vec::new, |r| r.0);
        spec.num_ranks = self.nranks;
        spec.num_svc_reps = self.nsvc;
        spec.properties = properties;
        if let Some(path) = &self.acl_file {
            spec.acl = acl::read_acl_file(path)?;
        }
        spec.owner_user = self.user.as_deref().map(acl::principal).unwrap_or_default();
        spec.owner_group = self
            .group
            .as_deref()
            .map(acl::principal)
            .unwrap_or_default();
        Ok(spec)
    }
}

/// What `get-prop` shows without names: everything but the server's
/// internal bookkeeping (read-only numbers such as layout versions and the
/// upgrade status). The read-only strings (owner, group, svc_list) describe
/// the pool and are shown.
fn shown_by_default() -> Vec<u32> {
    POOL.table
        .iter()
        .filter(|p| p.access != Access::ReadOnly || matches!(p.kind, PropKind::Str))
        .map(|p| p.number)
        .collect()
}

/// Tier names by index, as DAOS orders them.
const TIERS: [&str; 2] = ["Metadata tier", "Data tier"];

fn print_created(label: &str, c: &PoolCreated) {
    let nranks = c.target_ranks.len() as u64;
    let mut fields = vec![
        ("Pool created", label.to_string()),
        ("UUID", c.uuid.clone()),
        ("Leader", c.svc_leader.to_string()),
        ("Ranks", output::ranks(&c.target_ranks)),
        ("Service ranks", output::ranks(&c.svc_replicas)),
    ];
    for (name, per_rank) in TIERS.into_iter().zip(&c.tier_bytes_per_rank) {
        let total = per_rank.saturating_mul(nranks);
        let text = format!(
            "{} per rank, {} in total",
            output::bytes(*per_rank),
            output::bytes(total)
        );
        fields.push((name, text));
    }
    Table::fields(fields).print();
}

fn print_list(pools: &[PoolSummary]) {
    if pools.is_empty() {
        println!("no pools");
        return;
    }
    let mut t = Table::new(&["Pool", "UUID", "State", "Service ranks"]);
    for p in pools {
        t.row([
            p.label.clone(),
            p.uuid.clone(),
            p.state.clone(),
            output::ranks(&p.svc_replicas),
        ]);
    }
    t.print();
}

fn print_info(p: &PoolInfo) {
    let mut fields = vec![
        ("Pool", p.label.clone()),
        ("UUID", p.uuid.clone()),
        ("State", p.state.clone()),
        ("Leader", p.svc_leader.to_string()),
        ("Service ranks", output::ranks(&p.svc_replicas)),
        ("Engines", p.total_engines.to_string()),
        (
            "Targets",
            format!(
                "{} total, {} active, {} disabled",
                p.total_targets, p.active_targets, p.disabled_targets
            ),
        ),
        ("Rebuild", p.rebuild_state.clone()),
    ];
    if !p.disabled_ranks.is_empty() && p.disabled_ranks != "[]" {
        fields.push(("Disabled ranks", p.disabled_ranks.clone()));
    }
    Table::fields(fields).print();
    println!();
    let mut t = Table::new(&["Tier", "Total", "Free", "Used"]);
    for tier in &p.tiers {
        let used = tier.total.saturating_sub(tier.free);
        let percent = if tier.total == 0 {
            0.0
        } else {
            used as f64 * 100.0 / tier.total as f64
        };
        t.row([
            tier.media.clone(),
            output::bytes(tier.total),
            output::bytes(tier.free),
            format!("{percent:.0} %"),
        ]);
    }
    t.print();
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpufs_proto::daos::props::find_by_name;

    #[test]
    fn default_get_prop_skips_internal_counters() {
        let shown = shown_by_default();
        let has = |n: &str| shown.contains(&find_by_name(POOL.table, n).unwrap().number);
        assert!(has("label") && has("reclaim") && has("svc_rf") && has("owner") && has("svc_list"));
        assert!(!has("global_version") && !has("obj_version") && !has("upgrade_status"));
    }

    #[test]
    fn rank_lists() {
        assert_eq!(parse_rank_list("0,1").unwrap().0, vec![0, 1]);
        assert_eq!(parse_rank_list("[0-2,5]").unwrap().0, vec![0, 1, 2, 5]);
        assert!(parse_rank_list("").is_err());
        assert!(parse_rank_list("a").is_err());
    }
}
