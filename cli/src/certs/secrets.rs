//! `dpufs certs secrets`: the chart's certificates and agent key as Kubernetes Secrets, and in
//! DPU mode the control channel's certificates (`dpufs certs dpu`, [`super::dpu`]).
//!
//! Made once: a Secret that exists already is kept, whatever it holds, so an upgrade (the hook
//! runs again) or a second release never rotates a certificate the engine and its clients
//! share, and an administrator's own Secret of that name wins.

use super::dpu;
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

/// The files of the DPU control channel's Secret: both sides' pairs and the CA that signed them
/// (its key is kept nowhere). The agents mount the CA and `agent.*`, the hosts the CA and
/// `host.*`.
pub const DPU_FILES: [&str; 5] = [
    dpu::CA_CERT,
    dpu::AGENT_CERT,
    dpu::AGENT_KEY,
    dpu::HOST_CERT,
    dpu::HOST_KEY,
];

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("secrets").required(true).multiple(true).args(["tls_secret", "agent_key_secret", "dpu_secret"]))]
pub struct SecretsArgs {
    /// Namespace of the Secrets.
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: String,
    /// Name of the certificate Secret.
    #[arg(long)]
    tls_secret: Option<String>,
    /// Name of the node agent's key Secret (agent.key: Ed25519 PKCS#8 PEM; agent.pub: its
    /// public key, which the engine trusts).
    #[arg(long)]
    agent_key_secret: Option<String>,
    /// Name of the DPU control channel's Secret (ca.crt, agent.crt, agent.key, host.crt,
    /// host.key of `dpufs certs dpu`).
    #[arg(long, requires = "dpu_agent_hosts")]
    dpu_secret: Option<String>,
    /// With --dpu-secret: a name or address hosts dial the agents by, written into the agents'
    /// certificate (repeat it, or separate with commas), as `dpufs certs dpu --agent-host`.
    #[arg(
        long = "dpu-agent-host",
        value_delimiter = ',',
        requires = "dpu_secret"
    )]
    dpu_agent_hosts: Vec<String>,
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
    if let Some(name) = &args.dpu_secret {
        let work = tempfile::tempdir().context("a temporary directory")?;
        let data = dpu_files(work.path(), &args.dpu_agent_hosts)?;
        let outcome = create_once(&api, secret(name, &args.labels, data)).await?;
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
    read_files(&dir, &TLS_FILES)
}

/// A fresh DPU control channel set whose agent certificate names `agent_hosts`, as the
/// Secret's data.
fn dpu_files(work: &Path, agent_hosts: &[String]) -> anyhow::Result<BTreeMap<String, ByteString>> {
    let names = agent_hosts
        .iter()
        .map(|h| dpu::AltName::parse(h.trim()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let dir = work.join("dpu");
    dpu::write(&dir, &dpu::issue(&names)?)?;
    read_files(&dir, &DPU_FILES)
}

/// The files `names` of `dir`, as a Secret's data.
fn read_files(dir: &Path, names: &[&str]) -> anyhow::Result<BTreeMap<String, ByteString>> {
    names
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
