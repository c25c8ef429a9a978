//! `dpufs certs secrets` (the chart's install hook) against a real kube-apiserver: the
//! certificate and agent-key Secrets are made once, with what the engine and its clients
//! read, and a second run (an upgrade) keeps them byte for byte. Skipped, loudly, without the
//! Kubernetes binaries (docs/testing.md).

use dpufs_daos::capability::AgentKey;
use dpufs_e2e::kube_api::KubeApiServer;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use std::collections::BTreeMap;
use std::process::{Command, Output};

fn certs_secrets(server: &KubeApiServer, namespace: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpufs"))
        .env("KUBECONFIG", &server.kubeconfig)
        .args(["--json", "certs", "secrets", "--namespace", namespace])
        .args([
            "--tls-secret",
            "dpufs-daos-certs",
            "--agent-key-secret",
            "dpufs-agent-key",
        ])
        .args(["--label", "app.kubernetes.io/name=dpufs"])
        .output()
        .expect("run dpufs")
}

fn report(out: &Output) -> BTreeMap<String, String> {
    assert!(
        out.status.success(),
        "dpufs certs secrets failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

fn data(secret: &Secret) -> BTreeMap<String, Vec<u8>> {
    secret
        .data
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn certs_secrets_are_made_once_and_then_kept() {
    let Some(server) = KubeApiServer::start("certs_secrets_are_made_once_and_then_kept") else {
        return;
    };
    let created = report(&certs_secrets(&server, "default"));
    assert_eq!(
        created,
        BTreeMap::from([
            ("dpufs-agent-key".to_string(), "created".to_string()),
            ("dpufs-daos-certs".to_string(), "created".to_string()),
        ])
    );
    let api: Api<Secret> = Api::namespaced(server.client().await, "default");
    let tls = api.get("dpufs-daos-certs").await.unwrap();
    let agent = api.get("dpufs-agent-key").await.unwrap();
    assert_eq!(
        tls.metadata.labels.as_ref().unwrap()["app.kubernetes.io/name"],
        "dpufs"
    );
    let files = data(&tls);
    let names: Vec<&str> = files.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "admin.crt",
            "admin.key",
            "daosCA.crt",
            "server.crt",
            "server.key"
        ],
        "the CA's key is kept nowhere"
    );
    for (name, pem) in &files {
        assert!(pem.starts_with(b"-----BEGIN "), "{name} is PEM");
    }
    let keys = data(&agent);
    let public = AgentKey::from_pem(&keys["agent.key"])
        .unwrap()
        .public_key()
        .unwrap()
        .to_pem()
        .unwrap();
    assert_eq!(
        public, keys["agent.pub"],
        "agent.pub is agent.key's public half"
    );

    let again = report(&certs_secrets(&server, "default"));
    assert!(again.values().all(|o| o == "kept"), "{again:?}");
    assert_eq!(data(&api.get("dpufs-daos-certs").await.unwrap()), files);
    assert_eq!(data(&api.get("dpufs-agent-key").await.unwrap()), keys);

    let failed = certs_secrets(&server, "no-such-namespace");
    assert!(!failed.status.success());
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(
        stderr.contains("creating secret dpufs-daos-certs") && stderr.contains("not found"),
        "{stderr}"
    );
}
