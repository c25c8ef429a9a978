// Over 600 lines: every DaosPool/DaosContainer scenario shares one harness, on the fake and a real API server.
//! The DaosPool and DaosContainer controllers (real kube-runtime
//! Controllers) against a real `dpufs-engine` process, each scenario twice:
//! on the in-crate fake API server and on a real kube-apiserver (see
//! `support`).

mod support;

use dpufs_api::{DaosContainer, DaosPool, DaosSystem, POOL_FINALIZER, condition};
use dpufs_daos::{ContainerAdmin, ContainerSpec, DaosError, EngineContainers, EngineRanks};
use dpufs_operator::{Context, conditions, container, pool};
use dpufs_proto::daos::props::PropValue;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{Backend, Cluster, DaosBed, WAIT, context, wait_for};

struct Harness {
    cluster: Cluster,
    client: kube::Client,
    /// The operator's own client: on the fake, its calls are recorded apart from the test's
    /// and checked against the chart's RBAC when the harness goes.
    operator_client: kube::Client,
    bed: DaosBed,
    pools: Api<DaosPool>,
    operator: Option<tokio::task::JoinHandle<()>>,
}

/// The running test's name (libtest names the thread after it).
fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("operator test")
        .to_string()
}

impl Harness {
    async fn new(backend: Backend, ranks: u32) -> Option<Harness> {
        Self::with_tls(backend, ranks, false).await
    }

    async fn with_tls(backend: Backend, ranks: u32, tls: bool) -> Option<Harness> {
        Self::start(backend, ranks, tls, false).await
    }

    /// With kube-controller-manager behind a real API server.
    async fn with_controllers(backend: Backend) -> Option<Harness> {
        Self::start(backend, 1, false, true).await
    }

    async fn start(backend: Backend, ranks: u32, tls: bool, controllers: bool) -> Option<Harness> {
        let (cluster, client) = Cluster::start_with(backend, &test_name(), controllers).await?;
        let bed = DaosBed::start(&client, ranks, tls).await;
        let operator_client = match cluster.fake() {
            Some(fake) => fake.client_as(OPERATOR),
            None => client.clone(),
        };
        Some(Harness {
            pools: Api::all(client.clone()),
            cluster,
            client,
            operator_client,
            bed,
            operator: None,
        })
    }

    fn context(&self, id: &str) -> Arc<Context> {
        context(&self.operator_client, &self.bed.dir.path().join(id))
    }

    fn start_operator(&mut self) {
        let ctx = self.context("tls");
        self.operator = Some(tokio::spawn(async move {
            tokio::join!(pool::run(ctx.clone()), container::run(ctx));
        }));
    }

    fn stop_operator(&mut self) {
        if let Some(h) = self.operator.take() {
            h.abort();
        }
    }

    async fn create_pool(&self, name: &str, extra: serde_json::Value) -> DaosPool {
        let mut spec = json!({"systemRef": "daos", "size": {"totalBytes": "1Gi"}});
        dpufs_kube::testing::merge(&mut spec, &extra);
        let p: DaosPool = serde_json::from_value(json!({
            "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosPool",
            "metadata": {"name": name}, "spec": spec
        }))
        .unwrap();
        self.pools.create(&PostParams::default(), &p).await.unwrap()
    }

    async fn wait_pool(&self, name: &str, what: &str, f: impl Fn(&DaosPool) -> bool) -> DaosPool {
        let found = tokio::time::timeout(
            WAIT,
            wait_for(what, async || {
                self.pools.get_opt(name).await.unwrap().filter(&f)
            }),
        )
        .await;
        match found {
            Ok(p) => p,
            Err(_) => panic!(
                "timed out waiting for {what}; pool is {:#?}",
                self.pools.get_opt(name).await.unwrap()
            ),
        }
    }

    async fn wait_gone(&self, name: &str) {
        wait_for(&format!("{name} to go"), async || {
            self.pools
                .get_opt(name)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await
    }

    async fn events(&self, reason: &str) -> usize {
        support::events(&self.client, reason).await
    }
}

/// The operator's name in the fake's records.
const OPERATOR: &str = "dpufs-operator";

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop_operator();
        if let Some(fake) = self.cluster.fake()
            && !std::thread::panicking()
        {
            dpufs_kube::testing::rbac::assert_granted(&fake.api_calls(OPERATOR), "operator");
        }
    }
}

fn cond(p: &DaosPool, type_: &str) -> Option<(String, String, String)> {
    let c = conditions::get(&p.status.as_ref()?.conditions, type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn is(p: &DaosPool, type_: &str, status: &str) -> bool {
    cond(p, type_).is_some_and(|c| c.0 == status)
}

fn uuid_of(p: &DaosPool) -> String {
    pool::pool_uuid(p.metadata.uid.as_deref().unwrap()).to_string()
}

on_both!(create_ready_idempotent_props_acl_and_blocked_delete);
async fn create_ready_idempotent_props_acl_and_blocked_delete(backend: Backend) {
    let Some(mut h) = Harness::new(backend, 1).await else {
        return;
    };
    h.start_operator();
    let created = h
        .create_pool(
            "tank",
            json!({"deletionPolicy": "Delete",
                   "properties": {"reclaim": "disabled", "rebuildReservedSpacePercent": 7},
                   "acl": ["A::alice@:rw"]}),
        )
        .await;
    let uuid = uuid_of(&created);
    let p = h
        .wait_pool("tank", "Ready", |p| is(p, condition::READY, "True"))
        .await;
    let st = p.status.clone().unwrap();
    assert_eq!(st.uuid.as_deref(), Some(uuid.as_str()));
    assert_eq!(st.label.as_deref(), Some("tank"));
    assert_eq!(st.state.as_deref(), Some("Ready"));
    assert!(!st.tiers.is_empty(), "tiers from PoolQuery");
    assert_eq!(st.observed_generation, Some(1));
    assert!(is(&p, condition::DEGRADED, "False"));
    assert!(p.finalizers().iter().any(|f| f == POOL_FINALIZER));
    let mgmt = h.bed.engine.client();
    assert_eq!(mgmt.list_pools().await.unwrap().len(), 1);
    let props = mgmt.pool_get_props(&uuid, &[3, 5]).await.unwrap();
    assert_eq!(props, vec![(3, PropValue::Num(7)), (5, PropValue::Num(0))]);

    // Idempotent: several resyncs change nothing, in DAOS or in Kubernetes.
    let requests_before = h.cluster.fake().map(|f| f.requests().len());
    let versions_before = support::versions::<DaosPool>(&h.client).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        support::versions::<DaosPool>(&h.client).await,
        versions_before,
        "quiet resyncs wrote to the pool"
    );
    if let (Some(fake), Some(before)) = (h.cluster.fake(), requests_before) {
        let writes: Vec<String> = fake.requests()[before..]
            .iter()
            .filter(|r| !r.starts_with("GET"))
            .cloned()
            .collect();
        assert!(writes.is_empty(), "quiet resyncs wrote {writes:?}");
    }
    assert_eq!(h.events("Created").await, 1);
    assert_eq!(h.events("PropertiesUpdated").await, 0);
    assert_eq!(mgmt.list_pools().await.unwrap().len(), 1);

    // Property change in the spec is applied; drift in DAOS is corrected.
    let patch = json!({"spec": {"properties": {"reclaim": "lazy"}}});
    h.pools
        .patch("tank", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for("reclaim=lazy", async || {
        let p = mgmt.pool_get_props(&uuid, &[5]).await.unwrap();
        (p == vec![(5, PropValue::Num(1))]).then_some(())
    })
    .await;
    mgmt.pool_set_props(&uuid, vec![(3, PropValue::Num(9))])
        .await
        .unwrap();
    wait_for("space_rb drift corrected", async || {
        let p = mgmt.pool_get_props(&uuid, &[3]).await.unwrap();
        (p == vec![(3, PropValue::Num(7))]).then_some(())
    })
    .await;
    let p = h
        .wait_pool("tank", "observedGeneration 2", |p| {
            p.status.as_ref().and_then(|s| s.observed_generation) == Some(2)
        })
        .await;
    assert!(is(&p, condition::READY, "True"));

    // ACL: a foreign entry stays; drift of the operator's own entry is corrected.
    mgmt.pool_update_acl(&uuid, vec!["A::tenant@:rw".into(), "A::alice@:r".into()])
        .await
        .unwrap();
    let acl = wait_for("alice@ back to rw", async || {
        let acl = mgmt.pool_get_acl(&uuid).await.unwrap();
        acl.entries
            .contains(&"A::alice@:rw".to_string())
            .then_some(acl)
    })
    .await;
    assert!(
        acl.entries.contains(&"A::tenant@:rw".to_string()),
        "{acl:?}"
    );
    // Dropping alice from the spec removes alice, and only alice.
    let patch = json!({"spec": {"acl": null}});
    h.pools
        .patch("tank", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let acl = wait_for("alice@ removed", async || {
        let acl = mgmt.pool_get_acl(&uuid).await.unwrap();
        (!acl.entries.iter().any(|e| e.contains("alice@"))).then_some(acl)
    })
    .await;
    assert!(
        acl.entries.contains(&"A::tenant@:rw".to_string()),
        "{acl:?}"
    );
    assert_eq!(acl.entries, vec!["A::tenant@:rw".to_string()]);

    // Delete is blocked while a container exists, and proceeds after.
    let conts = EngineContainers::new(&mgmt);
    let cont = conts
        .create(&ContainerSpec {
            pool: uuid.clone(),
            label: "c1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    h.pools
        .delete("tank", &DeleteParams::default())
        .await
        .unwrap();
    let p = h
        .wait_pool("tank", "DeletionBlocked", |p| {
            is(p, condition::DELETION_BLOCKED, "True")
        })
        .await;
    let (_, reason, msg) = cond(&p, condition::DELETION_BLOCKED).unwrap();
    assert_eq!(reason, "InUse");
    assert!(msg.contains(&cont.uuid), "{msg}");
    assert_eq!(h.events("DeletionBlocked").await, 1);
    mgmt.pool_query(&uuid).await.expect("pool still there");
    conts.destroy(&uuid, &cont.uuid, false).await.unwrap();
    h.wait_gone("tank").await;
    assert!(matches!(
        mgmt.pool_query(&uuid).await,
        Err(DaosError::NotFound { .. })
    ));
}

on_both!(container_created_and_blocks_pool_deletion_until_deleted);
async fn container_created_and_blocks_pool_deletion_until_deleted(backend: Backend) {
    let Some(mut h) = Harness::new(backend, 1).await else {
        return;
    };
    h.start_operator();
    let p = h
        .create_pool("shared", json!({"deletionPolicy": "Delete"}))
        .await;
    let pool_uuid = uuid_of(&p);
    let conts: Api<DaosContainer> = Api::namespaced(h.client.clone(), "team");
    let c: DaosContainer = serde_json::from_value(json!({
        "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosContainer",
        "metadata": {"name": "data", "namespace": "team"},
        "spec": {"poolRef": "shared", "deletionPolicy": "Delete", "acl": ["A::bob@:rw"]}
    }))
    .unwrap();
    let c = conts.create(&PostParams::default(), &c).await.unwrap();
    let cont_uuid = container::container_uuid(c.metadata.uid.as_deref().unwrap()).to_string();
    let deadline = Instant::now() + WAIT;
    let c = loop {
        let c = conts.get("data").await.unwrap();
        if c.status.as_ref().is_some_and(|s| {
            conditions::get(&s.conditions, condition::READY).is_some_and(|r| r.status == "True")
        }) {
            break c;
        }
        assert!(Instant::now() < deadline, "container not Ready: {c:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let st = c.status.unwrap();
    assert_eq!(st.uuid.as_deref(), Some(cont_uuid.as_str()));
    assert_eq!(st.pool_uuid.as_deref(), Some(pool_uuid.as_str()));
    assert_eq!(st.label.as_deref(), Some("team-data"));
    let mgmt = h.bed.engine.client();
    let admin = EngineContainers::new(&mgmt);
    let info = admin.query(&pool_uuid, &cont_uuid).await.unwrap();
    assert!(
        info.acl.entries.contains(&"A::bob@:rw".to_string()),
        "{info:?}"
    );

    h.pools
        .delete("shared", &DeleteParams::default())
        .await
        .unwrap();
    let p = h
        .wait_pool("shared", "DeletionBlocked", |p| {
            is(p, condition::DELETION_BLOCKED, "True")
        })
        .await;
    assert!(
        cond(&p, condition::DELETION_BLOCKED)
            .unwrap()
            .2
            .contains("DaosContainer team/data")
    );
    conts
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_gone("shared").await;
    assert!(conts.get_opt("data").await.unwrap().is_none());
    assert!(matches!(
        mgmt.pool_query(&pool_uuid).await,
        Err(DaosError::NotFound { .. })
    ));
}

on_both!(tls_secret_from_the_daos_system);
async fn tls_secret_from_the_daos_system(backend: Backend) {
    let Some(mut h) = Harness::with_tls(backend, 1, true).await else {
        return;
    };
    h.start_operator();
    h.create_pool("secure", json!({})).await;
    let p = h
        .wait_pool("secure", "Ready", |p| is(p, condition::READY, "True"))
        .await;
    assert_eq!(p.status.unwrap().state.as_deref(), Some("Ready"));
}

on_both!(bound_persistent_volume_blocks_pool_deletion);
async fn bound_persistent_volume_blocks_pool_deletion(backend: Backend) {
    use k8s_openapi::api::core::v1::PersistentVolume;
    let Some(mut h) = Harness::with_controllers(backend).await else {
        return;
    };
    h.start_operator();
    let p = h
        .create_pool("bound", json!({"deletionPolicy": "Delete"}))
        .await;
    let uuid = uuid_of(&p);
    h.wait_pool("bound", "Ready", |p| is(p, condition::READY, "True"))
        .await;
    let pvs: Api<PersistentVolume> = Api::all(h.client.clone());
    let pv = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv1"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                 "csi": {"driver": pool::CSI_DRIVER, "volumeHandle": "h",
                         "volumeAttributes": {"poolUuid": uuid}}}
    }))
    .unwrap();
    pvs.create(&PostParams::default(), &pv).await.unwrap();
    h.pools
        .delete("bound", &DeleteParams::default())
        .await
        .unwrap();
    let p = h
        .wait_pool("bound", "DeletionBlocked", |p| {
            is(p, condition::DELETION_BLOCKED, "True")
        })
        .await;
    let msg = cond(&p, condition::DELETION_BLOCKED).unwrap().2;
    assert!(msg.contains("PersistentVolume pv1"), "{msg}");
    // A real API server keeps the PV (Terminating) until kube-controller-manager's
    // pv-protection controller drops its finalizer; the pool waits for that.
    pvs.delete("pv1", &DeleteParams::default()).await.unwrap();
    h.wait_gone("bound").await;
    assert!(h.bed.engine.client().list_pools().await.unwrap().is_empty());
}

on_both!(retain_keeps_the_pool);
async fn retain_keeps_the_pool(backend: Backend) {
    let Some(mut h) = Harness::new(backend, 1).await else {
        return;
    };
    h.start_operator();
    let created = h.create_pool("keep", json!({})).await;
    let uuid = uuid_of(&created);
    h.wait_pool("keep", "Ready", |p| is(p, condition::READY, "True"))
        .await;
    h.pools
        .delete("keep", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_gone("keep").await;
    let info = h.bed.engine.client().pool_query(&uuid).await.unwrap();
    assert_eq!(info.label, "keep");
    assert_eq!(h.events("Retained").await, 1);
}

on_both!(engine_down_sets_ready_false_and_recovers);
async fn engine_down_sets_ready_false_and_recovers(backend: Backend) {
    let Some(mut h) = Harness::new(backend, 1).await else {
        return;
    };
    h.start_operator();
    h.create_pool("flaky", json!({})).await;
    h.wait_pool("flaky", "Ready", |p| is(p, condition::READY, "True"))
        .await;
    let opts = h.bed.engine.opts.clone();
    h.bed.engine.kill();
    let p = h
        .wait_pool("flaky", "Ready=False", |p| is(p, condition::READY, "False"))
        .await;
    let (_, reason, msg) = cond(&p, condition::READY).unwrap();
    assert_eq!(reason, "DaosUnavailable", "{msg}");
    assert!(
        msg.contains(&h.bed.engine.addr),
        "the DAOS client's text: {msg}"
    );
    h.bed.engine.restart_with(opts).unwrap();
    h.wait_pool("flaky", "Ready again", |p| is(p, condition::READY, "True"))
        .await;
    assert_eq!(h.bed.engine.client().list_pools().await.unwrap().len(), 1);
}

on_both!(crash_between_create_and_status_finds_the_same_pool);
async fn crash_between_create_and_status_finds_the_same_pool(backend: Backend) {
    let Some(mut h) = Harness::new(backend, 1).await else {
        return;
    };
    // A first operator got as far as the finalizer and PoolCreate, then died.
    h.create_pool("crashy", json!({})).await;
    let patch = json!({"metadata": {"finalizers": [POOL_FINALIZER]}});
    let created = h
        .pools
        .patch("crashy", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let uuid = uuid_of(&created);
    let spec = pool::create_spec(&created, uuid.parse().unwrap()).unwrap();
    h.bed.engine.client().pool_create(&spec).await.unwrap();
    assert!(created.status.is_none());

    h.start_operator();
    let p = h
        .wait_pool("crashy", "Ready", |p| is(p, condition::READY, "True"))
        .await;
    assert_eq!(p.status.unwrap().uuid.as_deref(), Some(uuid.as_str()));
    let pools = h.bed.engine.client().list_pools().await.unwrap();
    assert_eq!(pools.len(), 1, "{pools:?}");
    assert_eq!(h.events("Created").await, 0, "no second PoolCreate");
    // A restarted operator changes nothing either.
    h.stop_operator();
    h.start_operator();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(h.bed.engine.client().list_pools().await.unwrap().len(), 1);
}

on_both!(stopped_rank_sets_degraded);
async fn stopped_rank_sets_degraded(backend: Backend) {
    let Some(mut h) = Harness::new(backend, 2).await else {
        return;
    };
    h.start_operator();
    h.create_pool("wide", json!({})).await;
    h.wait_pool("wide", "Ready", |p| is(p, condition::READY, "True"))
        .await;
    EngineRanks::new(&h.bed.engine.client())
        .stop(1)
        .await
        .unwrap();
    let p = h
        .wait_pool("wide", "Degraded", |p| is(p, condition::DEGRADED, "True"))
        .await;
    assert_eq!(p.status.unwrap().state.as_deref(), Some("TargetsExcluded"));
    assert!(h.events("Degraded").await >= 1);
}

on_both!(system_change_rebuilds_the_client);
async fn system_change_rebuilds_the_client(backend: Backend) {
    let Some(mut h) = Harness::new(backend, 1).await else {
        return;
    };
    h.start_operator();
    h.create_pool("moving", json!({})).await;
    h.wait_pool("moving", "Ready", |p| is(p, condition::READY, "True"))
        .await;
    let systems: Api<DaosSystem> = Api::all(h.client.clone());
    let bad = json!({"spec": {"endpoints": ["127.0.0.1:1"]}});
    systems
        .patch("daos", &PatchParams::default(), &Patch::Merge(&bad))
        .await
        .unwrap();
    let p = h
        .wait_pool("moving", "Ready=False", |p| {
            is(p, condition::READY, "False")
        })
        .await;
    assert_eq!(cond(&p, condition::READY).unwrap().1, "DaosUnavailable");
    let good = json!({"spec": {"endpoints": [h.bed.engine.addr]}});
    systems
        .patch("daos", &PatchParams::default(), &Patch::Merge(&good))
        .await
        .unwrap();
    h.wait_pool("moving", "Ready again", |p| is(p, condition::READY, "True"))
        .await;
    systems
        .delete("daos", &DeleteParams::default())
        .await
        .unwrap();
    let p = h
        .wait_pool("moving", "SystemNotFound", |p| {
            is(p, condition::READY, "False")
        })
        .await;
    assert_eq!(cond(&p, condition::READY).unwrap().1, "SystemNotFound");
}

on_both!(only_the_leader_reconciles);
async fn only_the_leader_reconciles(backend: Backend) {
    use dpufs_operator::leader::LeaseLock;
    let Some(h) = Harness::new(backend, 1).await else {
        return;
    };
    let leases = Api::namespaced(h.client.clone(), "dpufs-system");
    let replica = |id: &str| {
        let ctx = h.context(id);
        let lock = LeaseLock::new(leases.clone(), "dpufs-operator", id, Duration::from_secs(3));
        (
            ctx.clone(),
            tokio::spawn(dpufs_operator::run_as_leader(ctx, lock)),
        )
    };
    let (a, ta) = replica("a");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (b, tb) = replica("b");
    h.create_pool("solo", json!({})).await;
    h.wait_pool("solo", "Ready", |p| is(p, condition::READY, "True"))
        .await;
    let count = |ctx: &Arc<Context>| {
        ctx.metrics
            .encode()
            .lines()
            .find(|l| l.starts_with("dpufs_operator_reconciles_total{kind=\"DaosPool\"}"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .unwrap_or(0)
    };
    assert!(count(&a) > 0, "the leader reconciles");
    assert_eq!(count(&b), 0, "the standby does not");
    // The leader goes away; the standby takes over once the Lease expires.
    ta.abort();
    let mgmt = h.bed.engine.client();
    let uuid = h
        .pools
        .get("solo")
        .await
        .unwrap()
        .status
        .unwrap()
        .uuid
        .unwrap();
    mgmt.pool_set_props(&uuid, vec![(3, PropValue::Num(9))])
        .await
        .unwrap();
    let patch = json!({"spec": {"properties": {"rebuildReservedSpacePercent": 6}}});
    h.pools
        .patch("solo", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for("b corrected the property", async || {
        let p = mgmt.pool_get_props(&uuid, &[3]).await.unwrap();
        (p == vec![(3, PropValue::Num(6))]).then_some(())
    })
    .await;
    // A reconcile is counted when it ends, after the property it corrected.
    wait_for("b counted its reconcile", async || {
        (count(&b) > 0).then_some(())
    })
    .await;
    tb.abort();
    let pools = mgmt.list_pools().await.unwrap();
    assert_eq!(pools.len(), 1, "one pool whoever led: {pools:#?}");
}

on_both!(leader_election_over_a_lease);
async fn leader_election_over_a_lease(backend: Backend) {
    use dpufs_operator::leader::LeaseLock;
    let Some((_cluster, client)) = Cluster::start(backend, &test_name()).await else {
        return;
    };
    let leases = Api::default_namespaced(client);
    let a = LeaseLock::new(
        leases.clone(),
        "dpufs-operator",
        "a",
        Duration::from_secs(1),
    );
    let b = LeaseLock::new(leases, "dpufs-operator", "b", Duration::from_secs(1));
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap(), "a holds it");
    assert!(a.try_acquire_or_renew().await.unwrap(), "a renews");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // b counts on its own clock from when it last saw the Lease change: a's renewal is
    // news to it, so it waits a whole lease duration from now, whatever renewTime says.
    assert!(
        !b.try_acquire_or_renew().await.unwrap(),
        "b saw a's renewal only now"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(
        b.try_acquire_or_renew().await.unwrap(),
        "unchanged for a lease duration: b takes over"
    );
    assert!(!a.try_acquire_or_renew().await.unwrap(), "b holds it now");
}

on_both!(a_standby_waits_the_lease_duration_its_holder_declared);
async fn a_standby_waits_the_lease_duration_its_holder_declared(backend: Backend) {
    use dpufs_operator::leader::LeaseLock;
    let Some((_cluster, client)) = Cluster::start(backend, &test_name()).await else {
        return;
    };
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::default_namespaced(client);
    let lock = |id: &str, secs: u64| {
        LeaseLock::new(
            leases.clone(),
            "dpufs-operator",
            id,
            Duration::from_secs(secs),
        )
    };
    // A holder of 3 s and a standby configured for 1 s: the standby waits the holder's 3 s.
    let (a, b) = (lock("a", 3), lock("b", 1));
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap(), "a holds it");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !b.try_acquire_or_renew().await.unwrap(),
        "unchanged for b's 1 s but not for the 3 s a declared"
    );
    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert!(b.try_acquire_or_renew().await.unwrap(), "after a's 3 s");
    // The other way round: a standby of 30 s takes over from a holder of 1 s after 1 s.
    let c = lock("c", 30);
    let b = lock("b", 1);
    assert!(b.try_acquire_or_renew().await.unwrap(), "b renews with 1 s");
    assert!(!c.try_acquire_or_renew().await.unwrap(), "b holds it");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        c.try_acquire_or_renew().await.unwrap(),
        "unchanged for the 1 s b declared"
    );
}

/// A leader whose renewals hang (an API server that accepts connections and never
/// answers) stops leading at the renew deadline, before its Lease could expire for the
/// others.
#[tokio::test]
async fn a_hung_renewal_ends_leadership_at_the_renew_deadline() {
    use dpufs_operator::leader::{LeaseLock, LeaseLost};
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let config = kube::Config::new(url.parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let lock = LeaseLock::new(
        Api::namespaced(client, "default"),
        "dpufs-operator",
        "a",
        Duration::from_millis(900),
    );
    let started = Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(20), lock.hold())
        .await
        .expect("hold() returns instead of hanging with its renewal");
    assert!(
        matches!(&lost, LeaseLost::RenewDeadline { last, .. } if last.contains("unanswered")),
        "{lost:?}"
    );
    // Not before the deadline: a slow renewal is given its time.
    assert!(
        started.elapsed() >= lock.renew_deadline(),
        "{:?}",
        started.elapsed()
    );
    drop(silent);
}

#[test]
fn names_are_stable() {
    let p: DaosPool = serde_json::from_value(json!({
        "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosPool",
        "metadata": {"name": "n", "uid": "u"},
        "spec": {"systemRef": "s", "size": {"totalBytes": "1Gi"}}
    }))
    .unwrap();
    assert_eq!(pool::pool_label(&p), p.name_any());
}
