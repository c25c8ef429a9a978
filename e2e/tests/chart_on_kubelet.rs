//! The Helm chart on a real Kubernetes node, as a user drives it: `helm install` with the
//! defaults (Helm's Go library through `tools/chart/helm.py`), the operator, controller, node
//! plugin and engine Ready; `kubectl apply` of a DaosPool and two DaosTenants →
//! `kubectl wait --for=condition=Ready`; a PVC in each tenant's namespace and a pod writing and
//! reading it back with a checksum; `helm test`; then the claims, the pool and the release go,
//! and the DAOS system has no pool left.
//!
//! Runs when `KUBECONFIG` names a cluster whose node has the dpufs image
//! (`docker.io/library/dpufs:<version>`, docs/deploy.md "The image"); skipped, loudly,
//! otherwise. `DPUFS_E2E_SIDECARS=<repository prefix>` makes the CSI sidecars
//! `<prefix>/<name>:local` images (clusters that cannot pull from registry.k8s.io).
//! docs/testing.md, "The chart on a real node", records a run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const RELEASE: &str = "dpufs";
const NAMESPACE: &str = "dpufs-system";
const IMAGE: &str = concat!("docker.io/library/dpufs:", env!("CARGO_PKG_VERSION"));

fn loud(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{text}");
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs a command, returning its output; panics with its stderr when it fails.
fn run(what: &str, cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    check(what, &out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn check(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn kubectl(args: &[&str]) -> Command {
    let mut c = Command::new("kubectl");
    c.args(args);
    c
}

/// `kubectl apply -f -` of `yaml`.
fn apply(yaml: &str) {
    use std::io::Write;
    let mut child = kubectl(&["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl apply");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    check("kubectl apply", &child.wait_with_output().unwrap());
}

fn helm(args: &[&str]) -> String {
    run(
        &format!("helm {}", args.join(" ")),
        Command::new("python3")
            .arg(repo().join("tools/chart/helm.py"))
            .args(args),
    )
}

/// Why the test cannot run here, if it cannot.
fn absent() -> Option<String> {
    let Some(config) = std::env::var_os("KUBECONFIG") else {
        return Some("KUBECONFIG is not set".into());
    };
    if !Path::new(&config).exists() {
        return Some(format!("KUBECONFIG {config:?} does not exist"));
    }
    let images = match kubectl(&[
        "get",
        "nodes",
        "-o",
        "jsonpath={.items[*].status.images[*].names}",
    ])
    .output()
    {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        Ok(out) => {
            return Some(format!(
                "the cluster does not answer: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Err(e) => return Some(format!("no kubectl: {e}")),
    };
    if !images.contains(IMAGE) {
        return Some(format!(
            "no node has the image {IMAGE} (tools/image/build.sh, then ctr -n k8s.io images import)"
        ));
    }
    let sdk = Command::new("python3")
        .args(["-c", "import helm_python"])
        .output();
    if !sdk.is_ok_and(|o| o.status.success()) {
        return Some("python3 cannot import helm_python (pip install helm-python-sdk)".into());
    }
    None
}

/// Values for the install: the defaults, but for what this cluster lacks: sidecar images it
/// cannot pull, and cluster DNS (without it the DaosSystem names the engine's node address).
fn values() -> Vec<String> {
    let mut args = vec![];
    if !has_cluster_dns() {
        let node = run(
            "kubectl get nodes",
            &mut kubectl(&[
                "get",
                "nodes",
                "-o",
                "jsonpath={.items[0].status.addresses[?(@.type==\"InternalIP\")].address}",
            ]),
        );
        loud(&format!(
            "no cluster DNS: engine.advertiseEndpoints = {node}:10001 (the engine's node)"
        ));
        let set = serde_json::json!({"engine": {"advertiseEndpoints": [format!("{node}:10001")]}});
        args.extend(["--set-json".to_string(), set.to_string()]);
    }
    let Ok(prefix) = std::env::var("DPUFS_E2E_SIDECARS") else {
        return args;
    };
    let image = |name: &str| serde_json::json!({"image": {"repository": format!("{prefix}/{name}"), "tag": "local"}});
    let set = serde_json::json!({"sidecars": {
        "provisioner": image("csi-provisioner"),
        "snapshotter": image("csi-snapshotter"),
        "resizer": image("csi-resizer"),
        "livenessProbe": image("livenessprobe"),
        "nodeDriverRegistrar": image("csi-node-driver-registrar"),
    }});
    args.extend(["--set-json".to_string(), set.to_string()]);
    args
}

/// Whether the cluster runs a DNS service (kube-dns, the name CoreDNS also serves under).
fn has_cluster_dns() -> bool {
    kubectl(&["-n", "kube-system", "get", "service", "kube-dns"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn timed<T>(what: &str, timings: &mut Vec<(String, Duration)>, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    let took = started.elapsed();
    loud(&format!("[{:>6.1}s] {what}", took.as_secs_f64()));
    timings.push((what.to_string(), took));
    out
}

const POOL_AND_TENANTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-b}
---
apiVersion: dpufs.io/v1alpha1
kind: DaosPool
metadata: {name: default}
spec:
  systemRef: dpufs
  size: {totalBytes: 8Gi}
  deletionPolicy: Delete
---
apiVersion: dpufs.io/v1alpha1
kind: DaosTenant
metadata: {name: team-a}
spec: {namespaces: [team-a], allowedPools: [default], principal: team-a@}
---
apiVersion: dpufs.io/v1alpha1
kind: DaosTenant
metadata: {name: team-b}
spec: {namespaces: [team-b], allowedPools: [default], principal: team-b@}
"#;

/// A claim with `access_mode` and a pod that writes 16 MiB of random bytes, reads them back
/// through a fresh open and compares the checksums (and keeps the checksum beside the file,
/// for the snapshot).
fn claim_and_pod(namespace: &str, access_mode: &str) -> String {
    let claim = format!(
        r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data, namespace: {namespace}}}
spec:
  accessModes: [{access_mode}]
  storageClassName: dpufs
  resources: {{requests: {{storage: 1Gi}}}}
---"#
    );
    let script = "set -e
head -c 16777216 /dev/urandom > /tmp/src
cp /tmp/src /data/file
cksum < /tmp/src > /data/sum
sync
a=$(cksum < /tmp/src); b=$(cksum < /data/file)
echo \"wrote $a read $b\"
[ \"$a\" = \"$b\" ]";
    claim + &pod(namespace, "writer", "data", script)
}

/// The two tenants' claims: team-b's ReadWriteOncePod, which the node plugin stages
/// single-writer (docs/csi.md, "Access modes").
const CLAIMS: [(&str, &str); 2] = [("team-a", "ReadWriteMany"), ("team-b", "ReadWriteOncePod")];

/// While a pod holds each claim (kubelet unstages a volume once no pod on the node uses it),
/// the node plugin's records show team-a's volume staged multi-writer and team-b's
/// ReadWriteOncePod one single-writer.
fn claims_staged_by_access_mode() {
    for (ns, _) in CLAIMS {
        apply(&pod(ns, "holder", "data", "sleep 3600"));
    }
    for (ns, _) in CLAIMS {
        wait(Some(ns), "condition=Ready", &["pod/holder"], "120s");
    }
    assert_eq!(staged_accesses(), ["multi-writer", "single-writer"]);
    for (ns, _) in CLAIMS {
        let holder = [
            "-n",
            ns,
            "delete",
            "pod/holder",
            "--wait=true",
            "--grace-period=1",
        ];
        run("kubectl delete", &mut kubectl(&holder));
    }
}

/// How the node plugin staged each volume, sorted, from its stage records on this node
/// (`<node.stateDir>/csi/*.json`, the chart's default state directory).
fn staged_accesses() -> Vec<&'static str> {
    let dir = Path::new("/var/lib/dpufs/csi");
    let mut accesses: Vec<&str> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| {
            let record: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&p).expect("a stage record")).ok()?;
            record.get("volumeId")?;
            Some(match record["singleWriter"].as_bool() {
                Some(true) => "single-writer",
                _ => "multi-writer",
            })
        })
        .collect();
    accesses.sort();
    accesses
}

/// A pod in `namespace` running `script` with the claim `claim` at /data.
fn pod(namespace: &str, name: &str, claim: &str, script: &str) -> String {
    let script = script
        .lines()
        .map(|l| format!("          {l}"))
        .collect::<Vec<_>>()
        .join("\n");
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  restartPolicy: Never
  containers:
    - name: main
      image: {IMAGE}
      imagePullPolicy: IfNotPresent
      securityContext: {{runAsUser: 0}}
      command: [sh, -c]
      args:
        - |
{script}
      volumeMounts: [{{name: data, mountPath: /data}}]
  volumes:
    - name: data
      persistentVolumeClaim: {{claimName: {claim}}}
"#
    )
}

/// `kubectl [-n NAMESPACE] wait --for=CONDITION TARGET... --timeout=TIMEOUT`.
fn wait_command(
    namespace: Option<&str>,
    condition: &str,
    target: &[&str],
    timeout: &str,
) -> Command {
    let mut c = Command::new("kubectl");
    if let Some(ns) = namespace {
        c.args(["-n", ns]);
    }
    c.arg("wait")
        .arg(format!("--for={condition}"))
        .args(target)
        .arg(format!("--timeout={timeout}"));
    c
}

/// Waits as [`wait_command`] says; panics with kubectl's words when it times out.
fn wait(namespace: Option<&str>, condition: &str, target: &[&str], timeout: &str) {
    run(
        &format!("kubectl wait --for={condition} {}", target.join(" ")),
        &mut wait_command(namespace, condition, target, timeout),
    );
}

fn wait_succeeded(namespace: &str, pod: &str, timeout: &str) -> String {
    let done = wait_command(
        Some(namespace),
        "jsonpath={.status.phase}=Succeeded",
        &[&format!("pod/{pod}")],
        timeout,
    )
    .output()
    .expect("kubectl wait");
    let log = run(
        "kubectl logs",
        &mut kubectl(&["-n", namespace, "logs", pod]),
    );
    assert!(
        done.status.success(),
        "pod {namespace}/{pod} did not succeed: {}\nlog:\n{log}",
        String::from_utf8_lossy(&done.stderr)
    );
    log
}

fn jsonpath(args: &[&str], path: &str) -> String {
    let mut all: Vec<&str> = args.to_vec();
    let flag = format!("jsonpath={path}");
    all.extend(["-o", &flag]);
    run("kubectl get", &mut kubectl(&all))
}

/// PVC expansion: the claim grows online (ControllerExpandVolume raises the quota).
fn expand() {
    run(
        "kubectl patch pvc",
        &mut kubectl(&[
            "-n",
            "team-a",
            "patch",
            "pvc/data",
            "-p",
            r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#,
        ]),
    );
    wait(
        Some("team-a"),
        "jsonpath={.status.capacity.storage}=2Gi",
        &["pvc/data"],
        "120s",
    );
}

/// A VolumeSnapshot of team-a's claim and a claim restored from it, whose file has the
/// checksum the writer recorded.
fn snapshot_and_restore() {
    apply(
        r#"
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: snap, namespace: team-a}
spec:
  volumeSnapshotClassName: dpufs
  source: {persistentVolumeClaimName: data}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: restored, namespace: team-a}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: dpufs
  resources: {requests: {storage: 2Gi}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap}
"#,
    );
    wait(
        Some("team-a"),
        "jsonpath={.status.readyToUse}=true",
        &["volumesnapshot/snap"],
        "120s",
    );
    apply(&pod(
        "team-a",
        "reader",
        "restored",
        "set -e\n[ \"$(cksum < /data/file)\" = \"$(cat /data/sum)\" ]\necho restored file matches",
    ));
    let log = wait_succeeded("team-a", "reader", "300s");
    loud(&format!("  snapshot: {}", log.trim()));
}

/// team-a's volume offered to team-b by a PersistentVolume written by hand: the node plugin
/// refuses to publish it into team-b's pod, which never starts.
fn other_tenant_is_refused() {
    let pv = jsonpath(&["-n", "team-a", "get", "pvc/data"], "{.spec.volumeName}");
    let handle = jsonpath(&["get", &format!("pv/{pv}")], "{.spec.csi.volumeHandle}");
    apply(&format!(
        r#"
apiVersion: v1
kind: PersistentVolume
metadata: {{name: stolen}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  claimRef: {{namespace: team-b, name: stolen}}
  csi: {{driver: dfs.dpufs.io, volumeHandle: "{handle}"}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: stolen, namespace: team-b}}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: ""
  volumeName: stolen
  resources: {{requests: {{storage: 1Gi}}}}
"#
    ));
    apply(&pod(
        "team-b",
        "thief",
        "stolen",
        "cat /data/file > /dev/null",
    ));
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let events = run(
            "kubectl get events",
            &mut kubectl(&[
                "-n",
                "team-b",
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=thief,reason=FailedMount",
                "-o",
                "jsonpath={.items[*].message}",
            ]),
        );
        if events.contains("PermissionDenied") {
            loud(&format!(
                "  other tenant refused: {}",
                events.lines().next().unwrap_or("")
            ));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no refusal of team-b's pod: {events:?}"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    let phase = jsonpath(&["-n", "team-b", "get", "pod/thief"], "{.status.phase}");
    assert_eq!(
        phase, "Pending",
        "team-b's pod never runs with team-a's volume"
    );
    run(
        "kubectl delete",
        &mut kubectl(&[
            "-n",
            "team-b",
            "delete",
            "pod/thief",
            "pvc/stolen",
            "--wait=true",
        ]),
    );
    run(
        "kubectl delete",
        &mut kubectl(&["delete", "pv/stolen", "--wait=true"]),
    );
}

/// The node plugin's pod is deleted while a pod writes: the DaemonSet's new plugin adopts the
/// mounts (the keeper serves them meanwhile) and the writer never sees an error.
fn node_plugin_restart_under_io() {
    apply(&pod(
        "team-a",
        "busy",
        "data",
        "set -e\nfor i in $(seq 1 120); do dd if=/dev/urandom of=/data/busy bs=1M count=1 status=none; sleep 0.2; done\necho 120 writes done",
    ));
    wait(Some("team-a"), "condition=Ready", &["pod/busy"], "120s");
    std::thread::sleep(Duration::from_secs(3));
    run(
        "kubectl delete node plugin",
        &mut kubectl(&[
            "-n",
            NAMESPACE,
            "delete",
            "pod",
            "-l",
            "app.kubernetes.io/component=node",
            "--wait=true",
        ]),
    );
    run(
        "kubectl rollout status",
        &mut kubectl(&[
            "-n",
            NAMESPACE,
            "rollout",
            "status",
            "daemonset/dpufs-node",
            "--timeout=120s",
        ]),
    );
    let log = wait_succeeded("team-a", "busy", "300s");
    loud(&format!("  through a node plugin restart: {}", log.trim()));
}

/// The pools of the DAOS system, asked by `dpufs pool list` in a pod with the administrator's
/// certificates (the Secret the install hook made) at the DaosSystem's endpoint.
fn daos_pools() -> Vec<serde_json::Value> {
    let endpoint = run(
        "kubectl get daossystem",
        &mut kubectl(&[
            "get",
            "daossystem/dpufs",
            "-o",
            "jsonpath={.spec.endpoints[0]}",
        ]),
    );
    let pod = format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: daos-pools, namespace: {NAMESPACE}}}
spec:
  restartPolicy: Never
  containers:
    - name: pools
      image: {IMAGE}
      imagePullPolicy: IfNotPresent
      securityContext: {{runAsUser: 0}}
      command: [dpufs, --json, --endpoint, "{endpoint}", --tls-dir, /certs, pool, list]
      volumeMounts: [{{name: certs, mountPath: /certs}}]
  volumes:
    - name: certs
      secret:
        secretName: dpufs-daos-certs
        defaultMode: 0400
        items: [{{key: daosCA.crt, path: daosCA.crt}}, {{key: admin.crt, path: admin.crt}}, {{key: admin.key, path: admin.key}}]
"#
    );
    apply(&pod);
    let out = wait_succeeded(NAMESPACE, "daos-pools", "120s");
    run(
        "kubectl delete daos-pools",
        &mut kubectl(&["-n", NAMESPACE, "delete", "pod/daos-pools"]),
    );
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("dpufs pool list: {e}: {out}"))
}

/// What an earlier run that failed half-way left goes first, while the release that serves
/// it (the operator's finalizers, the CSI driver's deletes) is still there; then the release.
fn clean_start() {
    let leftovers: [&[&str]; 3] = [
        &["delete", "namespace", "team-a", "team-b"],
        &["delete", "pv", "stolen"],
        &[
            "delete",
            "daostenant/team-a",
            "daostenant/team-b",
            "daospool/default",
        ],
    ];
    for args in leftovers {
        let mut all = args.to_vec();
        all.extend(["--ignore-not-found", "--wait=true", "--timeout=180s"]);
        let _ = kubectl(&all).output();
    }
    let _ = Command::new("python3")
        .arg(repo().join("tools/chart/helm.py"))
        .args(["uninstall", RELEASE, NAMESPACE])
        .output();
}

#[test]
fn helm_install_pool_claims_pods_and_uninstall_on_a_real_node() {
    if let Some(why) = absent() {
        loud(&format!(
            "!!!!! SKIPPED helm_install_pool_claims_pods_and_uninstall_on_a_real_node: {why}"
        ));
        return;
    }
    clean_start();
    let mut timings = Vec::new();
    let mut install = vec!["install", RELEASE, NAMESPACE];
    let extra = values();
    install.extend(extra.iter().map(String::as_str));
    timed("helm install (defaults)", &mut timings, || helm(&install));
    timed("every pod of the release Ready", &mut timings, || {
        wait(
            Some(NAMESPACE),
            "condition=Ready",
            &[
                "pod",
                "-l",
                "app.kubernetes.io/instance=dpufs,app.kubernetes.io/component!=secrets-hook",
            ],
            "300s",
        )
    });
    timed("DaosSystem Ready", &mut timings, || {
        wait(None, "condition=Ready", &["daossystem/dpufs"], "120s")
    });
    timed("DaosPool and two DaosTenants Ready", &mut timings, || {
        apply(POOL_AND_TENANTS);
        let objects = ["daospool/default", "daostenant/team-a", "daostenant/team-b"];
        wait(None, "condition=Ready", &objects, "120s");
    });
    timed(
        "a claim and a checksummed write and read in each tenant",
        &mut timings,
        || {
            for (ns, mode) in CLAIMS {
                apply(&claim_and_pod(ns, mode));
            }
            for (ns, _) in CLAIMS {
                let log = wait_succeeded(ns, "writer", "300s");
                loud(&format!("  {ns}: {}", log.trim()));
            }
        },
    );
    timed(
        "each claim staged as its access mode says",
        &mut timings,
        claims_staged_by_access_mode,
    );
    timed("PVC expansion to 2Gi", &mut timings, expand);
    timed(
        "a VolumeSnapshot and a claim restored from it",
        &mut timings,
        snapshot_and_restore,
    );
    timed(
        "team-a's volume refused to team-b's pod",
        &mut timings,
        other_tenant_is_refused,
    );
    timed(
        "node plugin restarted under I/O",
        &mut timings,
        node_plugin_restart_under_io,
    );
    timed("helm test", &mut timings, || {
        helm(&["test", RELEASE, NAMESPACE])
    });
    timed(
        "claims, snapshot, tenants and the pool deleted",
        &mut timings,
        || {
            run(
                "kubectl delete",
                &mut kubectl(&[
                    "-n",
                    "team-a",
                    "delete",
                    "pod/reader",
                    "pod/busy",
                    "pvc/restored",
                    "volumesnapshot/snap",
                    "--wait=true",
                ]),
            );
            for ns in ["team-a", "team-b"] {
                run(
                    "kubectl delete",
                    &mut kubectl(&["-n", ns, "delete", "pod/writer", "pvc/data", "--wait=true"]),
                );
            }
            run(
                "kubectl delete",
                &mut kubectl(&[
                    "delete",
                    "daostenant/team-a",
                    "daostenant/team-b",
                    "daospool/default",
                    "--wait=true",
                    "--timeout=120s",
                ]),
            );
        },
    );
    let pools = timed("DAOS asked for its pools", &mut timings, daos_pools);
    assert!(pools.is_empty(), "pools left in DAOS: {pools:?}");
    timed("helm uninstall", &mut timings, || {
        helm(&["uninstall", RELEASE, NAMESPACE])
    });
    let total: Duration = timings.iter().map(|(_, d)| *d).sum();
    loud(&format!(
        "chart on a real node: {:.1}s in all",
        total.as_secs_f64()
    ));
}
