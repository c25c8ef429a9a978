//! `dpufs certs secrets` (the chart's install hook) against a real kube-apiserver: the
//! certificate and agent-key Secrets are made once, with what the engine and its clients
//! read, and a second run (an upgrade) keeps them byte for byte; the DPU control channel's
//! Secret likewise, and its files carry a mutual TLS session in which the host checks the
//! agent's name. Skipped, loudly, without the Kubernetes binaries (docs/testing.md).

use dpufs_daos::capability::AgentKey;
use dpufs_e2e::kube_api::KubeApiServer;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use std::collections::BTreeMap;
use std::process::{Command, Output};

fn certs_secrets(server: &KubeApiServer, namespace: &str) -> Output {
    certs_secrets_with(
        server,
        namespace,
        &[
            "--tls-secret",
            "dpufs-daos-certs",
            "--agent-key-secret",
            "dpufs-agent-key",
        ],
    )
}

fn certs_secrets_with(server: &KubeApiServer, namespace: &str, secrets: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpufs"))
        .env("KUBECONFIG", &server.kubeconfig)
        .args(["--json", "certs", "secrets", "--namespace", namespace])
        .args(secrets)
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

/// The chart's DPU mode: `--dpu-secret` with the one name every shim checks
/// (node.dpu.tls.serverName).
const DPU_SECRET: [&str; 4] = [
    "--dpu-secret",
    "dpufs-dpu-certs",
    "--dpu-agent-host",
    "dpufs-dpu-agent",
];

#[tokio::test(flavor = "multi_thread")]
async fn the_dpu_channel_secret_is_made_once_and_its_pairs_talk() {
    let Some(server) =
        KubeApiServer::start("the_dpu_channel_secret_is_made_once_and_its_pairs_talk")
    else {
        return;
    };
    // Refused before anything is made: a name that is neither a DNS name nor an address, and
    // --dpu-secret without the names the agents' certificate must carry.
    let bad = certs_secrets_with(
        &server,
        "default",
        &[
            "--dpu-secret",
            "dpufs-dpu-certs",
            "--dpu-agent-host",
            "not a name",
        ],
    );
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("\"not a name\" is neither an IP address nor a DNS name"),
        "{stderr}"
    );
    let unnamed = certs_secrets_with(&server, "default", &["--dpu-secret", "dpufs-dpu-certs"]);
    assert!(!unnamed.status.success());
    let stderr = String::from_utf8_lossy(&unnamed.stderr);
    assert!(stderr.contains("--dpu-agent-host"), "{stderr}");
    let api: Api<Secret> = Api::namespaced(server.client().await, "default");
    assert!(api.get_opt("dpufs-dpu-certs").await.unwrap().is_none());

    let created = report(&certs_secrets_with(&server, "default", &DPU_SECRET));
    assert_eq!(
        created,
        BTreeMap::from([("dpufs-dpu-certs".to_string(), "created".to_string())])
    );
    let files = data(&api.get("dpufs-dpu-certs").await.unwrap());
    let names: Vec<&str> = files.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["agent.crt", "agent.key", "ca.crt", "host.crt", "host.key"],
        "the CA's key is kept nowhere"
    );
    tls::mutual_session(&files, "dpufs-dpu-agent").expect("the agent and the host talk");
    let wrong_name = tls::mutual_session(&files, "dpu-7.example.com").unwrap_err();
    assert!(
        wrong_name.contains("certificate verify failed"),
        "{wrong_name}"
    );

    let again = report(&certs_secrets_with(&server, "default", &DPU_SECRET));
    assert_eq!(again["dpufs-dpu-certs"], "kept");
    assert_eq!(data(&api.get("dpufs-dpu-certs").await.unwrap()), files);
}

/// A TLS session between the Secret's agent pair and host pair, each trusting only the Secret's
/// CA, as the agent and the shim use them (mutual TLS, the host checking the agent's name).
mod tls {
    use openssl::pkey::PKey;
    use openssl::ssl::{SslAcceptor, SslConnector, SslMethod, SslVerifyMode};
    use openssl::x509::X509;
    use openssl::x509::store::X509StoreBuilder;
    use std::collections::BTreeMap;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    fn store(ca: &[u8]) -> openssl::x509::store::X509Store {
        let mut store = X509StoreBuilder::new().unwrap();
        store.add_cert(X509::from_pem(ca).unwrap()).unwrap();
        store.build()
    }

    /// The host's side: dial the agent as `name`, send a byte, read it back.
    fn dial(host: &SslConnector, addr: std::net::SocketAddr, name: &str) -> Result<(), String> {
        let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        let mut s = host.connect(name, tcp).map_err(|e| e.to_string())?;
        s.write_all(b"x").map_err(|e| e.to_string())?;
        let mut byte = [0u8];
        s.read_exact(&mut byte).map_err(|e| e.to_string())?;
        if &byte != b"x" {
            return Err(format!("the agent echoed {byte:?}"));
        }
        Ok(())
    }

    /// Ok when the host, dialling the agent as `name`, and the agent complete the handshake
    /// and exchange a byte; Err with the host's error otherwise.
    pub fn mutual_session(files: &BTreeMap<String, Vec<u8>>, name: &str) -> Result<(), String> {
        let pem = |f: &str| files[f].as_slice();
        let mut agent = SslAcceptor::mozilla_modern_v5(SslMethod::tls_server()).unwrap();
        agent
            .set_certificate(&X509::from_pem(pem("agent.crt")).unwrap())
            .unwrap();
        agent
            .set_private_key(&PKey::private_key_from_pem(pem("agent.key")).unwrap())
            .unwrap();
        agent.set_cert_store(store(pem("ca.crt")));
        agent.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
        let agent = agent.build();
        let mut host = SslConnector::builder(SslMethod::tls_client()).unwrap();
        host.set_certificate(&X509::from_pem(pem("host.crt")).unwrap())
            .unwrap();
        host.set_private_key(&PKey::private_key_from_pem(pem("host.key")).unwrap())
            .unwrap();
        host.set_cert_store(store(pem("ca.crt")));
        let host = host.build();

        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let served = std::thread::spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            let mut s = agent.accept(tcp).map_err(|e| e.to_string())?;
            let peer = s.ssl().peer_certificate().ok_or("no client certificate")?;
            let mut byte = [0u8];
            s.read_exact(&mut byte).map_err(|e| e.to_string())?;
            s.write_all(&byte).map_err(|e| e.to_string())?;
            Ok::<_, String>(peer.subject_name().to_der().unwrap())
        });
        let dialled = dial(&host, addr, name);
        let agent_side = served.join().unwrap();
        dialled?;
        let client_subject = agent_side?;
        let host_subject = X509::from_pem(pem("host.crt"))
            .unwrap()
            .subject_name()
            .to_der()
            .unwrap();
        assert_eq!(
            client_subject, host_subject,
            "the agent saw the host's certificate"
        );
        Ok(())
    }
}
