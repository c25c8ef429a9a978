// Over 600 lines: the DaosSystem/DaosTenant/DaosContainer scenarios share one bed and its helpers.
//! The DaosSystem and DaosTenant controllers, and the DaosContainer
//! properties that reach DAOS, with the real kube-runtime Controllers and a
//! real `dpufs-engine` process.
//!
//! Each scenario is a plain `async fn` taking a `kube::Client`: it starts its
//! engine and the operator's controllers itself and checks only what any API
//! server shows (objects, their status, Events), so the same functions run
//! against a real kube-apiserver: `on_both_with_client!` makes a `fake` and a
//! `real_api_server` test of each (`support`); tests named `fake_only_*` look
//! inside the fake and run only there.

mod support;

use support::put_admin_secret;

use dpufs_api::{
    DaosContainer, DaosPool, DaosSystem, DaosSystemStatus, DaosTenant, DaosTenantStatus, condition,
};
use dpufs_daos::{ContainerAdmin, EngineContainers, EngineRanks};
use dpufs_e2e::{EngineOpts, EngineProcess};
use dpufs_operator::{Backoff, Context, conditions, container};
use dpufs_proto::daos::props::{CONT_DPUFS_CHUNK_SIZE, CONT_DPUFS_QUOTA, PropValue};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a scenario waits for the operator to get somewhere.
const WAIT: Duration = Duration::from_secs(30);
/// The resync period of the test operator.
const RESYNC: Duration = Duration::from_millis(500);

// ---------------------------------------------------------------------------
// What the scenarios share.

/// A name no other scenario uses, so scenarios can share a real cluster.
fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// The operator's controllers (all of them, as `run_as_leader` runs them)
/// with test timings; stopped on drop.
struct Operator(tokio::task::JoinHandle<()>);

impl Operator {
    fn start(client: &kube::Client, tls: &Path) -> Operator {
        let mut ctx = Context::new(client.clone(), tls.to_path_buf());
        ctx.systems =
            dpufs_operator::systems::SystemClients::new(client.clone(), tls.to_path_buf())
                .with_request_timeout(Duration::from_secs(2));
        ctx.resync = RESYNC;
        ctx.system_probe = RESYNC;
        ctx.blocked_retry = Duration::from_millis(300);
        ctx.backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(1));
        Operator(tokio::spawn(dpufs_operator::run_controllers(Arc::new(ctx))))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A real engine, a DaosSystem for it, and the running operator.
struct Bed {
    client: kube::Client,
    engine: EngineProcess,
    /// The DaosSystem's name.
    system: String,
    _operator: Operator,
    _dir: tempfile::TempDir,
}

impl Bed {
    /// An insecure engine with `ranks` ranks and its DaosSystem.
    async fn start(client: &kube::Client, ranks: u32) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        let engine = EngineProcess::start(
            &dir.path().join("engine"),
            EngineOpts {
                ranks,
                ..Default::default()
            },
        )
        .unwrap();
        let system = unique("daos");
        create_system(client, &system, &engine.addr, json!({"insecure": true})).await;
        let operator = Operator::start(client, &dir.path().join("tls"));
        Bed {
            client: client.clone(),
            engine,
            system,
            _operator: operator,
            _dir: dir,
        }
    }

    fn systems(&self) -> Api<DaosSystem> {
        Api::all(self.client.clone())
    }

    /// Creates a DaosPool in this system and waits until it is Ready.
    async fn ready_pool(&self, name: &str) -> DaosPool {
        let p: DaosPool = serde_json::from_value(json!({
            "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosPool",
            "metadata": {"name": name},
            "spec": {"systemRef": self.system, "size": {"totalBytes": "1Gi"}}
        }))
        .unwrap();
        let pools: Api<DaosPool> = Api::all(self.client.clone());
        pools.create(&PostParams::default(), &p).await.unwrap();
        wait(&pools, name, "DaosPool Ready", |p| {
            is_ready(p.status.as_ref().map(|s| &s.conditions[..]))
        })
        .await
    }
}

async fn create_system(client: &kube::Client, name: &str, addr: &str, security: serde_json::Value) {
    let mut spec = json!({"endpoints": [addr], "version": "2.8.0"});
    dpufs_kube::testing::merge(&mut spec, &security);
    let sys: DaosSystem = serde_json::from_value(json!({
        "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosSystem",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap();
    Api::<DaosSystem>::all(client.clone())
        .create(&PostParams::default(), &sys)
        .await
        .unwrap();
}

/// Creates a namespace (with labels) unless it exists.
async fn create_namespace(client: &kube::Client, name: &str, labels: serde_json::Value) {
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": labels}
    }))
    .unwrap();
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating namespace {name}: {e}"),
    }
}

/// Waits until the object exists and `f` holds.
async fn wait<K>(api: &Api<K>, name: &str, what: &str, f: impl Fn(&K) -> bool) -> K
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = Instant::now() + WAIT;
    loop {
        let got = api.get_opt(name).await.unwrap();
        if let Some(o) = &got
            && f(o)
        {
            return o.clone();
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; {name} is {got:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ready_of(conds: Option<&[Condition]>) -> Option<(String, String, String)> {
    let c = conditions::get(conds?, condition::READY)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn is_ready(conds: Option<&[Condition]>) -> bool {
    ready_of(conds).is_some_and(|r| r.0 == "True")
}

fn sys_ready(s: &DaosSystem) -> Option<(String, String, String)> {
    ready_of(s.status.as_ref().map(|s| &s.conditions[..]))
}

fn sys_status(s: &DaosSystem) -> DaosSystemStatus {
    s.status.clone().unwrap_or_default()
}

fn tenant_ready(t: &DaosTenant) -> Option<(String, String, String)> {
    ready_of(t.status.as_ref().map(|s| &s.conditions[..]))
}

fn tenant_status(t: &DaosTenant) -> DaosTenantStatus {
    t.status.clone().unwrap_or_default()
}

/// Events with `reason` about the object `kind`/`name` (any namespace).
async fn events(client: &kube::Client, kind: &str, name: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                })
        })
        .collect()
}

/// Waits until an event with `reason` about `kind`/`name` exists.
async fn wait_event(client: &kube::Client, kind: &str, name: &str, reason: &str) -> Event {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(e) = events(client, kind, name, reason).await.into_iter().next() {
            return e;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for event {reason} about {kind} {name}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ranks(s: &DaosSystem) -> Vec<(u32, String)> {
    sys_status(s)
        .ranks
        .iter()
        .map(|r| (r.rank, r.state.clone()))
        .collect()
}

fn tenant(name: &str, spec: serde_json::Value) -> DaosTenant {
    serde_json::from_value(json!({
        "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosTenant",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap()
}

// ---------------------------------------------------------------------------
// Scenarios.

/// A running engine: the DaosSystem goes Ready with its leader, replicas and
/// ranks (what `kubectl get daossystems` shows in LEADER and READY), records
/// a Ready event, and quiet resyncs write nothing.
pub async fn system_ready_with_leader_and_ranks(client: kube::Client) {
    let bed = Bed::start(&client, 2).await;
    let systems = bed.systems();
    let sys = wait(&systems, &bed.system, "DaosSystem Ready", |s| {
        sys_ready(s).is_some_and(|r| r.0 == "True")
    })
    .await;
    let st = sys_status(&sys);
    assert_eq!(
        st.leader.as_deref(),
        Some(bed.engine.addr.as_str()),
        "{st:#?}"
    );
    assert_eq!(st.replicas, vec![bed.engine.addr.clone()]);
    assert_eq!(
        ranks(&sys),
        vec![(0, "joined".to_string()), (1, "joined".to_string())]
    );
    for r in &st.ranks {
        assert_eq!(
            r.address.as_deref(),
            Some(bed.engine.addr.as_str()),
            "{r:?}"
        );
        assert_eq!(
            r.fault_domain.as_deref(),
            Some(format!("/rank{}", r.rank).as_str())
        );
    }
    assert_eq!(st.observed_generation, sys.metadata.generation);
    let (_, reason, message) = sys_ready(&sys).unwrap();
    assert_eq!(reason, "Reachable");
    assert!(message.contains("2 of 2 ranks joined"), "{message}");
    wait_event(&client, "DaosSystem", &bed.system, "Ready").await;

    // Quiet resyncs: the management service is asked again, nothing is written.
    let before = sys.resource_version();
    tokio::time::sleep(RESYNC * 5).await;
    let after = systems.get(&bed.system).await.unwrap();
    assert_eq!(
        after.resource_version(),
        before,
        "a quiet resync wrote status"
    );
    assert_eq!(
        events(&client, "DaosSystem", &bed.system, "Ready")
            .await
            .len(),
        1
    );
}

/// A rank stopped in DAOS shows in `status.ranks`; the management service
/// still answers, so the system stays Ready and says how many ranks run.
pub async fn stopped_rank_shows_in_ranks(client: kube::Client) {
    let bed = Bed::start(&client, 2).await;
    let systems = bed.systems();
    wait(&systems, &bed.system, "DaosSystem Ready", |s| {
        sys_ready(s).is_some_and(|r| r.0 == "True")
    })
    .await;
    let state = EngineRanks::new(&bed.engine.client())
        .stop(1)
        .await
        .unwrap();
    assert_eq!(state, "stopped");
    let sys = wait(&systems, &bed.system, "rank 1 Stopped", |s| {
        ranks(s) == vec![(0, "joined".to_string()), (1, "stopped".to_string())]
    })
    .await;
    let (status, reason, message) = sys_ready(&sys).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Reachable"));
    assert!(message.contains("1 of 2 ranks joined"), "{message}");
    EngineRanks::new(&bed.engine.client())
        .start(1)
        .await
        .unwrap();
    wait(&systems, &bed.system, "rank 1 Joined again", |s| {
        ranks(s) == vec![(0, "joined".to_string()), (1, "joined".to_string())]
    })
    .await;
}

/// The engine dies: Ready=False with reason Unreachable naming the endpoint,
/// and the leader, replicas and ranks are cleared (LEADER shows nothing
/// rather than a dead leader). The engine comes back: Ready again.
pub async fn engine_down_is_unreachable_then_ready_again(client: kube::Client) {
    let mut bed = Bed::start(&client, 1).await;
    let systems = bed.systems();
    wait(&systems, &bed.system, "DaosSystem Ready", |s| {
        sys_ready(s).is_some_and(|r| r.0 == "True")
    })
    .await;
    let opts = bed.engine.opts.clone();
    bed.engine.kill();
    let sys = wait(&systems, &bed.system, "Ready=False", |s| {
        sys_ready(s).is_some_and(|r| r.0 == "False")
    })
    .await;
    let (_, reason, message) = sys_ready(&sys).unwrap();
    assert_eq!(reason, "Unreachable", "{message}");
    assert!(
        message.contains(&bed.engine.addr),
        "names the endpoint: {message}"
    );
    let st = sys_status(&sys);
    assert_eq!(st.leader, None, "{st:#?}");
    assert!(st.replicas.is_empty() && st.ranks.is_empty(), "{st:#?}");
    let warning = wait_event(&client, "DaosSystem", &bed.system, "Unreachable").await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));

    bed.engine.restart_with(opts).unwrap();
    let sys = wait(&systems, &bed.system, "Ready again", |s| {
        sys_ready(s).is_some_and(|r| r.0 == "True")
    })
    .await;
    assert_eq!(
        sys_status(&sys).leader.as_deref(),
        Some(bed.engine.addr.as_str())
    );
    assert_eq!(ranks(&sys), vec![(0, "joined".to_string())]);
}

/// Mutual TLS: a missing Secret is SecretMissing; an admin certificate of
/// another CA is TlsRejected; the right certificate makes the system Ready.
pub async fn tls_secret_missing_rejected_then_ready(client: kube::Client) {
    let dir = tempfile::tempdir().unwrap();
    let (good, other) = (dir.path().join("good"), dir.path().join("other"));
    dpufs_daos::certs::generate(&good).unwrap();
    dpufs_daos::certs::generate(&other).unwrap();
    let engine = EngineProcess::start(
        &dir.path().join("engine"),
        EngineOpts {
            tls_dir: Some(good.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let ns = unique("dpufs-tls");
    create_namespace(&client, &ns, json!({})).await;
    let name = unique("secure");
    let secret = "daos-admin-cert";
    create_system(
        &client,
        &name,
        &engine.addr,
        json!({"tls": {"secretRef": {"name": secret, "namespace": ns}}}),
    )
    .await;
    let _operator = Operator::start(&client, &dir.path().join("tls"));
    let systems: Api<DaosSystem> = Api::all(client.clone());
    let sys = wait(&systems, &name, "SecretMissing", |s| {
        sys_ready(s).is_some_and(|r| r.1 == "SecretMissing")
    })
    .await;
    let (status, _, message) = sys_ready(&sys).unwrap();
    assert_eq!(status, "False");
    assert!(message.contains(&format!("{ns}/{secret}")), "{message}");
    assert_eq!(sys_status(&sys).leader, None);

    put_admin_secret(&client, &ns, secret, &other).await;
    let sys = wait(&systems, &name, "TlsRejected", |s| {
        sys_ready(s).is_some_and(|r| r.1 == "TlsRejected")
    })
    .await;
    let (status, _, message) = sys_ready(&sys).unwrap();
    assert_eq!(status, "False");
    assert!(message.contains(&engine.addr), "{message}");

    put_admin_secret(&client, &ns, secret, &good).await;
    let sys = wait(&systems, &name, "Ready with the right certificate", |s| {
        sys_ready(s).is_some_and(|r| r.0 == "True")
    })
    .await;
    assert_eq!(
        sys_status(&sys).leader.as_deref(),
        Some(engine.addr.as_str())
    );
}

/// A tenant whose allowed pool has no DaosPool is Ready=False/PoolNotFound
/// naming it, and Ready once the pool exists; `status.namespaces` lists the
/// named namespaces that exist, and follows namespaces being created.
pub async fn tenant_waits_for_its_pools_and_lists_namespaces(client: kube::Client) {
    let bed = Bed::start(&client, 1).await;
    let (present, later) = (unique("team-a"), unique("team-a-staging"));
    create_namespace(&client, &present, json!({})).await;
    let (pool, other_pool) = (unique("training"), unique("scratch"));
    bed.ready_pool(&other_pool).await;
    let name = unique("team-a");
    let tenants: Api<DaosTenant> = Api::all(client.clone());
    tenants
        .create(
            &PostParams::default(),
            &tenant(
                &name,
                json!({"namespaces": [present, later], "allowedPools": [pool, other_pool],
                       "principal": "team-a@"}),
            ),
        )
        .await
        .unwrap();
    let t = wait(&tenants, &name, "PoolNotFound", |t| {
        tenant_ready(t).is_some_and(|r| r.1 == "PoolNotFound")
    })
    .await;
    let (status, _, message) = tenant_ready(&t).unwrap();
    assert_eq!(status, "False");
    assert!(message.contains(&pool), "names the missing pool: {message}");
    assert!(!message.contains(&other_pool), "{message}");
    assert_eq!(tenant_status(&t).namespaces, vec![present.clone()]);
    assert_eq!(tenant_status(&t).observed_generation, t.metadata.generation);
    wait_event(&client, "DaosTenant", &name, "PoolNotFound").await;

    bed.ready_pool(&pool).await;
    let t = wait(&tenants, &name, "Ready", |t| {
        tenant_ready(t).is_some_and(|r| r.0 == "True")
    })
    .await;
    assert_eq!(tenant_ready(&t).unwrap().1, "TenantReady");
    wait_event(&client, "DaosTenant", &name, "Ready").await;

    create_namespace(&client, &later, json!({})).await;
    let mut both = vec![present.clone(), later.clone()];
    both.sort();
    wait(&tenants, &name, "both namespaces", |t| {
        tenant_status(t).namespaces == both
    })
    .await;

    // The pool goes away (Retain: the DAOS pool stays): PoolNotFound again.
    Api::<DaosPool>::all(client.clone())
        .delete(&pool, &DeleteParams::default())
        .await
        .unwrap();
    let t = wait(
        &tenants,
        &name,
        "PoolNotFound after the pool is deleted",
        |t| tenant_ready(t).is_some_and(|r| r.1 == "PoolNotFound"),
    )
    .await;
    assert!(tenant_ready(&t).unwrap().2.contains(&pool));
}

/// A tenant with a namespaceSelector lists the namespaces whose labels match,
/// following label changes and deletions.
pub async fn tenant_selector_follows_namespace_labels(client: kube::Client) {
    let bed = Bed::start(&client, 1).await;
    let pool = unique("shared");
    bed.ready_pool(&pool).await;
    let value = unique("research");
    let labels = json!({"dpufs.io/tenant": value});
    let (a, b, c) = (unique("ns-a"), unique("ns-b"), unique("ns-c"));
    create_namespace(&client, &a, labels.clone()).await;
    create_namespace(&client, &b, json!({})).await;
    create_namespace(&client, &c, labels.clone()).await;
    let name = unique("research");
    let tenants: Api<DaosTenant> = Api::all(client.clone());
    tenants
        .create(
            &PostParams::default(),
            &tenant(
                &name,
                json!({"namespaceSelector": {"matchLabels": {"dpufs.io/tenant": value}},
                       "allowedPools": [pool], "principal": "research@"}),
            ),
        )
        .await
        .unwrap();
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let t = wait(&tenants, &name, "Ready with a and c", |t| {
        tenant_ready(t).is_some_and(|r| r.0 == "True")
            && tenant_status(t).namespaces == sorted(vec![a.clone(), c.clone()])
    })
    .await;
    assert!(tenant_status(&t).namespaces.iter().all(|n| n != &b));

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let label = json!({"metadata": {"labels": {"dpufs.io/tenant": value}}});
    namespaces
        .patch(&b, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let unlabel = json!({"metadata": {"labels": {"dpufs.io/tenant": null}}});
    namespaces
        .patch(&a, &PatchParams::default(), &Patch::Merge(&unlabel))
        .await
        .unwrap();
    wait(&tenants, &name, "b in, a out", |t| {
        tenant_status(t).namespaces == sorted(vec![b.clone(), c.clone()])
    })
    .await;
    namespaces
        .delete(&c, &DeleteParams::default())
        .await
        .unwrap();
    wait(&tenants, &name, "c gone", |t| {
        tenant_status(t).namespaces == vec![b.clone()]
    })
    .await;
}

/// A DaosContainer's chunkSize and capacity are container properties in
/// DAOS (queried back from the engine); a capacity change and quota drift
/// are corrected; object classes, which cannot be passed, are reported.
pub async fn container_properties_reach_daos(client: kube::Client) {
    let bed = Bed::start(&client, 1).await;
    let pool_name = unique("tank");
    let pool = bed.ready_pool(&pool_name).await;
    let pool_uuid = pool.status.unwrap().uuid.unwrap();
    let ns = unique("team");
    create_namespace(&client, &ns, json!({})).await;
    let conts: Api<DaosContainer> = Api::namespaced(client.clone(), &ns);
    let c: DaosContainer = serde_json::from_value(json!({
        "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosContainer",
        "metadata": {"name": "data", "namespace": ns},
        "spec": {"poolRef": pool_name, "objectClass": "SX", "chunkSize": "64Ki",
                 "capacity": "1Gi"}
    }))
    .unwrap();
    let c = conts.create(&PostParams::default(), &c).await.unwrap();
    let cont_uuid = container::container_uuid(c.metadata.uid.as_deref().unwrap()).to_string();
    wait(&conts, "data", "DaosContainer Ready", |c| {
        is_ready(c.status.as_ref().map(|s| &s.conditions[..]))
    })
    .await;
    let admin = EngineContainers::new(&bed.engine.client());
    let props = admin
        .query(&pool_uuid, &cont_uuid)
        .await
        .unwrap()
        .properties;
    assert_eq!(
        props.get(&CONT_DPUFS_CHUNK_SIZE),
        Some(&PropValue::Num(64 << 10)),
        "{props:?}"
    );
    assert_eq!(props.get(&CONT_DPUFS_QUOTA), Some(&PropValue::Num(1 << 30)));
    let warning = wait_event(&client, "DaosContainer", "data", "ObjectClassNotApplied").await;
    assert!(
        warning
            .note
            .as_deref()
            .unwrap_or("")
            .contains("objectClass"),
        "{warning:?}"
    );

    // capacity may change; the quota follows.
    let patch = json!({"spec": {"capacity": "2Gi"}});
    conts
        .patch("data", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let quota = async || {
        admin
            .query(&pool_uuid, &cont_uuid)
            .await
            .unwrap()
            .properties
            .get(&CONT_DPUFS_QUOTA)
            .cloned()
    };
    let deadline = Instant::now() + WAIT;
    while quota().await != Some(PropValue::Num(2 << 30)) {
        assert!(
            Instant::now() < deadline,
            "quota not raised: {:?}",
            quota().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Drift behind the operator's back is corrected.
    admin
        .set_properties(
            &pool_uuid,
            &cont_uuid,
            vec![(CONT_DPUFS_QUOTA, PropValue::Num(4096))],
        )
        .await
        .unwrap();
    let deadline = Instant::now() + WAIT;
    while quota().await != Some(PropValue::Num(2 << 30)) {
        assert!(
            Instant::now() < deadline,
            "quota drift kept: {:?}",
            quota().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------
// Every scenario on the in-crate fake and on a real kube-apiserver.

on_both_with_client!(system_ready_with_leader_and_ranks);
on_both_with_client!(stopped_rank_shows_in_ranks);
on_both_with_client!(engine_down_is_unreachable_then_ready_again);
on_both_with_client!(tls_secret_missing_rejected_then_ready);
on_both_with_client!(tenant_waits_for_its_pools_and_lists_namespaces);
on_both_with_client!(tenant_selector_follows_namespace_labels);
on_both_with_client!(container_properties_reach_daos);

// ---------------------------------------------------------------------------
// Only on the fake: what needs its request log, or objects a real API server
// would refuse.

/// Quiet resyncs of a Ready system, a Ready tenant and a Ready container send
/// no write at all (no status, no event).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_only_quiet_resyncs_send_no_writes() {
    let fake = dpufs_kube::testing::FakeApiServer::new();
    let client = fake.client();
    let bed = Bed::start(&client, 1).await;
    let pool = unique("quiet");
    bed.ready_pool(&pool).await;
    let tenants: Api<DaosTenant> = Api::all(client.clone());
    tenants
        .create(
            &PostParams::default(),
            &tenant(
                "t",
                json!({"namespaces": ["n"], "allowedPools": [pool], "principal": "t@"}),
            ),
        )
        .await
        .unwrap();
    create_namespace(&client, "n", json!({})).await;
    let conts: Api<DaosContainer> = Api::namespaced(client.clone(), "n");
    let c: DaosContainer = serde_json::from_value(json!({
        "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosContainer",
        "metadata": {"name": "c", "namespace": "n"},
        "spec": {"poolRef": pool, "chunkSize": "64Ki", "capacity": "1Gi"}
    }))
    .unwrap();
    conts.create(&PostParams::default(), &c).await.unwrap();
    wait(&conts, "c", "container Ready", |c| {
        is_ready(c.status.as_ref().map(|s| &s.conditions[..]))
    })
    .await;
    wait(&tenants, "t", "tenant Ready with n", |t| {
        tenant_ready(t).is_some_and(|r| r.0 == "True") && tenant_status(t).namespaces == ["n"]
    })
    .await;
    wait(&bed.systems(), &bed.system, "system Ready", |s| {
        sys_ready(s).is_some_and(|r| r.0 == "True")
    })
    .await;
    // Let the last writes' own watch events settle.
    tokio::time::sleep(RESYNC * 2).await;
    let before = fake.requests().len();
    tokio::time::sleep(RESYNC * 5).await;
    let requests = fake.requests();
    let writes: Vec<&String> = requests[before..]
        .iter()
        .filter(|r| !r.starts_with("GET"))
        .collect();
    assert!(writes.is_empty(), "quiet resyncs wrote {writes:?}");
    let reads = requests[before..]
        .iter()
        .filter(|r| r.contains("/daossystems/"))
        .count();
    assert!(reads > 0, "the system was re-queried during the resyncs");
}

/// `spec.version` of another release than the servers' (the engine is a DAOS 2.8
/// server), then of a release dpufs does not speak (which the CRD's rule refuses, so
/// only the fake accepts such an object): Ready=False, VersionIncompatible, the latter
/// without asking DAOS; fixing the version makes it Ready and shows the servers'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_only_unsupported_version_is_incompatible() {
    let fake = dpufs_kube::testing::FakeApiServer::new();
    let client = fake.client();
    let bed = Bed::start(&client, 1).await;
    let systems = bed.systems();
    let patch = json!({"spec": {"version": "2.6.0"}});
    systems
        .patch(&bed.system, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let sys = wait(&systems, &bed.system, "VersionIncompatible", |s| {
        sys_ready(s).is_some_and(|r| r.1 == "VersionIncompatible")
    })
    .await;
    let (status, _, message) = sys_ready(&sys).unwrap();
    assert_eq!(status, "False");
    assert!(
        message.contains("spec.version is 2.6.0, but the servers run DAOS 2.8"),
        "{message}"
    );
    assert_eq!(sys.status.unwrap().observed_generation, Some(2));
    let patch = json!({"spec": {"version": "2.4.1"}});
    systems
        .patch(&bed.system, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let sys = wait(&systems, &bed.system, "2.4.1 unsupported", |s| {
        sys_ready(s).is_some_and(|r| r.1 == "VersionIncompatible" && r.2.contains("2.4.1"))
    })
    .await;
    let message = sys_ready(&sys).unwrap().2;
    assert!(message.contains("2.6 and 2.8"), "{message}");
    let patch = json!({"spec": {"version": "2.8.1"}});
    systems
        .patch(&bed.system, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let sys = wait(&systems, &bed.system, "Ready with 2.8.1", |s| {
        sys_ready(s).is_some_and(|r| r.0 == "True")
    })
    .await;
    assert_eq!(sys.status.unwrap().server_version.as_deref(), Some("2.8"));
}
