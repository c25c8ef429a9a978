//! Two `dpufs-operator run` processes against a real kube-apiserver and a real
//! engine: one holds the Lease and reconciles; killed with SIGKILL (no chance
//! to release anything), the other takes over once the Lease expires and
//! applies a change made after the kill. Needs a real API server: processes
//! cannot reach the in-crate fake.

mod support;

use dpufs_api::{DaosPool, condition};
use dpufs_proto::daos::props::PropValue;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::process::{Child, Command, Stdio};
use support::{Backend, Cluster, DaosBed, wait_for};

struct Operator {
    id: &'static str,
    child: Child,
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn operator(id: &'static str, kubeconfig: &std::path::Path, tls: &std::path::Path) -> Operator {
    let child = Command::new(dpufs_e2e::binary("dpufs-operator", "dpufs-operator"))
        .args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--lease-namespace",
            "dpufs-system",
        ])
        .args(["--lease-seconds", "3", "--identity", id])
        .arg("--tls-dir")
        .arg(tls.join(id))
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawning dpufs-operator");
    Operator { id, child }
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("dpufs-operator")
        .await
        .unwrap()
        .and_then(|l| l.spec?.holder_identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_election_between_two_operator_processes() {
    let Some((cluster, client)) = Cluster::start(
        Backend::Real,
        "leader_election_between_two_operator_processes",
    )
    .await
    else {
        return;
    };
    let Cluster::Real(server) = &cluster else {
        unreachable!("started a real API server")
    };
    let bed = DaosBed::start(&client, 1, false).await;
    let tls = bed.dir.path().join("tls");
    let mut operators = vec![operator("a", &server.kubeconfig, &tls)];
    let leases: Api<Lease> = Api::namespaced(client.clone(), "dpufs-system");
    wait_for("a to take the Lease", async || {
        (holder(&leases).await? == "a").then_some(())
    })
    .await;
    operators.push(operator("b", &server.kubeconfig, &tls));

    let pools: Api<DaosPool> = Api::all(client.clone());
    let pool: DaosPool = serde_json::from_value(json!({
        "apiVersion": "dpufs.io/v1alpha1", "kind": "DaosPool", "metadata": {"name": "ha"},
        "spec": {"systemRef": "daos", "size": {"totalBytes": "1Gi"}}
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    let uuid = wait_for("the pool Ready", async || {
        let p = pools.get("ha").await.unwrap();
        let st = p.status?;
        let ready = dpufs_operator::conditions::get(&st.conditions, condition::READY)?;
        (ready.status == "True").then_some(st.uuid?)
    })
    .await;
    assert_eq!(holder(&leases).await.as_deref(), Some("a"), "b stood by");

    // The leader dies without a word; the change made after is b's to apply.
    let a = operators.remove(0);
    assert_eq!(a.id, "a");
    drop(a);
    let patch = json!({"spec": {"properties": {"rebuildReservedSpacePercent": 9}}});
    pools
        .patch("ha", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let mgmt = bed.engine.client();
    wait_for("b to apply space_rb=9", async || {
        let props = mgmt.pool_get_props(&uuid, &[3]).await.unwrap();
        (props == vec![(3, PropValue::Num(9))]).then_some(())
    })
    .await;
    assert_eq!(holder(&leases).await.as_deref(), Some("b"));
}
