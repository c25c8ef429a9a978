//! The CRDs and the sample manifests on a real kube-apiserver (etcd behind it,
//! nothing mocked): the CRDs apply with server-side apply and without
//! warnings, every valid sample is accepted by a server-side dry run, and every
//! invalid one — updates applied over their stored object — is refused with
//! the message its `# expect:` line records. Skipped, loudly, where the
//! Kubernetes binaries are not built (`dpufs_e2e::kube_api`).

use dpufs_e2e::kube_api::{KubeApiServer, apply};
use dpufs_e2e::manifests::{documents, expectation, invalid_sample_files, valid_samples};
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::Instant;

/// The URI that applies `object` (its kind's plural and scope come from the CRDs).
fn apply_uri(object: &Value, dry_run: bool) -> String {
    let kind = object["kind"].as_str().expect("kind");
    let name = object["metadata"]["name"].as_str().expect("metadata.name");
    if kind == "Namespace" {
        return format!("/api/v1/namespaces/{name}?fieldManager=dpufs-e2e");
    }
    let crd = dpufs_api::crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for kind {kind}"));
    let scope = match object["metadata"]["namespace"].as_str() {
        Some(ns) if crd.spec.scope == "Namespaced" => format!("namespaces/{ns}/"),
        None if crd.spec.scope == "Namespaced" => "namespaces/default/".to_string(),
        _ => String::new(),
    };
    let query = if dry_run { "&dryRun=All" } else { "" };
    format!(
        "/apis/{}/{}/{scope}{}/{name}?fieldManager=dpufs-e2e&fieldValidation=Strict{query}",
        crd.spec.group, crd.spec.versions[0].name, crd.spec.names.plural
    )
}

async fn apply_object(
    client: &kube::Client,
    object: &Value,
    dry_run: bool,
) -> anyhow::Result<Vec<String>> {
    let body = serde_json::to_vec(object)?;
    apply(client, &apply_uri(object, dry_run), body).await
}

async fn delete_object(client: &kube::Client, object: &Value) {
    let uri = apply_uri(object, false);
    let path = uri.split('?').next().expect("a path");
    let request = http::Request::delete(path)
        .body(Vec::new())
        .expect("a request");
    client
        .request_text(request)
        .await
        .expect("deleting the stored object");
}

/// The message of the API server's refusal (a `metav1.Status` after the HTTP status).
fn refusal_message(error: &anyhow::Error) -> String {
    let text = error.to_string();
    let json = text
        .split_once(": ")
        .map_or(text.as_str(), |(_, body)| body);
    serde_json::from_str::<Value>(json)
        .ok()
        .and_then(|status| status["message"].as_str().map(str::to_string))
        .unwrap_or(text)
}

/// Creates the namespaces the samples live in.
async fn create_namespaces(client: &kube::Client, objects: &[Value]) {
    let namespaces: BTreeSet<&str> = objects
        .iter()
        .filter_map(|o| o["metadata"]["namespace"].as_str())
        .collect();
    for ns in namespaces {
        let body =
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        let uri = format!("/api/v1/namespaces/{ns}?fieldManager=dpufs-e2e");
        apply(client, &uri, serde_json::to_vec(&body).unwrap())
            .await
            .unwrap_or_else(|e| panic!("creating namespace {ns}: {e:#}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crds_and_samples_on_a_real_api_server() {
    let started = Instant::now();
    let Some(server) = KubeApiServer::start("crds_and_samples_on_a_real_api_server") else {
        return;
    };
    eprintln!(
        "kube-apiserver {} ready in {:.1?}",
        server.version,
        started.elapsed()
    );
    let client = server.client().await;

    // The CRDs apply, twice (the second apply changes nothing), without warnings.
    let t = Instant::now();
    for round in ["first", "second"] {
        let warnings = server
            .install_crds(&client)
            .await
            .unwrap_or_else(|e| panic!("{round} apply of manifests/crds refused: {e:#}"));
        assert!(
            warnings.is_empty(),
            "{round} apply of the CRDs warned: {warnings:#?}"
        );
    }
    eprintln!("CRDs applied twice and Established in {:.1?}", t.elapsed());

    // The valid samples apply as they are, in order, as `kubectl apply
    // --server-side -f manifests/samples` applies them.
    let t = Instant::now();
    let samples = valid_samples();
    let invalid: Vec<(std::path::PathBuf, Vec<Value>)> = invalid_sample_files()
        .into_iter()
        .map(|path| {
            let docs = documents(&path);
            (path, docs)
        })
        .collect();
    for object in &samples {
        let name = format!("{}/{}", object["kind"], object["metadata"]["name"]);
        let warnings = apply_object(&client, object, false)
            .await
            .unwrap_or_else(|e| panic!("valid sample {name} refused: {}", refusal_message(&e)));
        assert!(warnings.is_empty(), "{name}: {warnings:?}");
    }
    eprintln!(
        "{} valid samples applied in {:.1?}",
        samples.len(),
        t.elapsed()
    );

    // Every invalid sample is refused with its message.
    let t = Instant::now();
    let invalid_objects: Vec<Value> = invalid.iter().flat_map(|(_, d)| d).cloned().collect();
    create_namespaces(&client, &invalid_objects).await;
    let mut failures = Vec::new();
    for (path, docs) in &invalid {
        let expected = expectation(path);
        let file = path.file_name().unwrap().to_string_lossy();
        let outcome = match docs.as_slice() {
            [object] => apply_object(&client, object, true).await,
            [stored, update] => {
                apply_object(&client, stored, false)
                    .await
                    .unwrap_or_else(|e| {
                        panic!("{file}: stored object refused: {}", refusal_message(&e))
                    });
                let outcome = apply_object(&client, update, false).await;
                delete_object(&client, stored).await;
                outcome
            }
            _ => panic!("{file}: one object, or a stored object and its update"),
        };
        match outcome {
            Ok(_) => failures.push(format!(
                "{file}: accepted; expected a refusal containing {expected:?}"
            )),
            Err(e) if !refusal_message(&e).contains(&expected) => failures.push(format!(
                "{file}: refused with {:?}; expected a message containing {expected:?}",
                refusal_message(&e)
            )),
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!(
        "{} invalid samples refused with their messages in {:.1?}",
        invalid.len(),
        t.elapsed()
    );
}
