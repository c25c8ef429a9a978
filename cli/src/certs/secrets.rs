//! `dpufs certs secrets`: the chart's certificates and agent key as Kubernetes Secrets.
//!
//! Made once: a Secret that exists already is kept, whatever it holds, so an upgrade (the hook
//! runs again) or a second release never rotates a certificate the engine and its clients
//! share, and an administrator's own Secret of that name wins.

use crate::output::Out;
use anyhow::Context;
use dpufs_daos::capability::AgentKey;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The files of the certificate Secret: what the engine (`server.*`) and its clients
/// (`admin.*`) mount, and the CA that signed both. The CA's key is not kept anywhere.
pub const TLS_FILES: [&str; 5] = [
    "daosCA.crt",
    "server.crt",
    "server.key",
    "admin.crt",
    "admin.key",
];

#[derive(Debug, clap::Args)]
pub struct SecretsArgs {
    /// Namespace of the Secrets.
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: String,
    /// Name of the certificate Secret.
    #[arg(long, required_unless_present = "agent_key_secret")]
    tls_secret: Option<String>,
    /// Name of the node agent's key Secret (agent.key: Ed25519 PKCS#8 PEM; agent.pub: its
    /// public key, which the engine trusts).
    #[arg(long)]
    agent_key_secret: Option<String>,
    /// Labels of the Secrets (key=value, repeated).
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?}: use key=value"))
}

/// What happened to one Secret.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Outcome {
    Created,
    Kept,
}

pub async fn run(args: SecretsArgs, out: Out) -> anyhow::Result<()> {
    let client = Client::try_default()
        .await
        .context("connecting to the Kubernetes API (kubeconfig or the pod's service account)")?;
    let api: Api<Secret> = Api::namespaced(client, &args.namespace);
    let mut report = BTreeMap::new();
    if let Some(name) = &args.tls_secret {
        let work = tempfile::tempdir().context("a temporary directory")?;
        let data = certificate_files(work.path())?;
        let outcome = create_once(&api, secret(name, &args.labels, data)).await?;
        report.insert(name.clone(), outcome);
    }
    if let Some(name) = &args.agent_key_secret {
        let outcome = create_once(&api, secret(name, &args.labels, agent_key_files()?)).await?;
        report.insert(name.clone(), outcome);
    }
    out.show(&report, |r| {
        for (name, outcome) in r {
            let what = match outcome {
                Outcome::Created => "created",
                Outcome::Kept => "exists, kept as it is",
            };
            println!("secret {}/{name}: {what}", args.namespace);
        }
    })
}

/// A fresh certificate set, as the Secret's data.
fn certificate_files(work: &Path) -> anyhow::Result<BTreeMap<String, ByteString>> {
    let dir = work.join("certs");
    dpufs_daos::certs::generate(&dir)
        .map_err(|e| anyhow::anyhow!("generating certificates: {e}"))?;
    TLS_FILES
        .iter()
        .map(|f| {
            let bytes = std::fs::read(dir.join(f)).with_context(|| format!("reading {f}"))?;
            Ok((f.to_string(), ByteString(bytes)))
        })
        .collect()
}

/// A fresh agent key pair, as the Secret's data.
fn agent_key_files() -> anyhow::Result<BTreeMap<String, ByteString>> {
    let key = AgentKey::generate().context("generating the agent key")?;
    let private = key.to_pem().context("the agent key as PEM")?;
    let public = key
        .public_key()
        .and_then(|k| k.to_pem())
        .context("the agent key's public half")?;
    Ok(BTreeMap::from([
        ("agent.key".to_string(), ByteString(private)),
        ("agent.pub".to_string(), ByteString(public)),
    ]))
}

fn secret(name: &str, labels: &[(String, String)], data: BTreeMap<String, ByteString>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels.iter().cloned().collect()),
            ..Default::default()
        },
        data: Some(data),
        type_: Some("Opaque".to_string()),
        ..Default::default()
    }
}

/// Creates `secret` unless one of its name exists.
async fn create_once(api: &Api<Secret>, secret: Secret) -> anyhow::Result<Outcome> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(Outcome::Created),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Outcome::Kept),
        Err(e) => Err(e).with_context(|| format!("creating secret {name}")),
    }
}
