// Over 600 lines: one fake API server: routing, storage, watch and apply share one state and one lock.
//! Test support: an in-memory, stateful fake Kubernetes API server.
//!
//! [`FakeApiServer`] is a `tower::Service` that `kube::Client::new` accepts.
//! It keeps objects in a map keyed by (group, plural, namespace, name) and
//! implements what the operator and kube-runtime use: GET and LIST with a
//! `resourceVersion`, WATCH (`watch=true`, JSON lines, replaying history after
//! the requested `resourceVersion`), POST, PUT (with optimistic concurrency),
//! PATCH, DELETE with finalizers and `deletionTimestamp`, and the `status`
//! subresource. Events and Leases are ordinary objects here.
//!
//! Server-side apply (`application/apply-patch+yaml`) is applied as a JSON
//! merge patch plus the part of field management a single-writer controller
//! relies on: the server remembers which fields each field manager applied
//! (per object and per subresource), and a field that manager applied before
//! and leaves out now is removed, unless another manager applied it too. An
//! apply to an object that does not exist creates it. Lists are atomic.
//!
//! [`FakeApiServer::serve_http`] serves the same state over HTTP, for binaries
//! under test.
//!
//! Simplifications (documented, deliberate): merge and strategic-merge
//! patches are both applied as JSON merge patches and take no field
//! ownership; applies never conflict (as with `force`); label and field
//! selectors are ignored; watches never time out on the server side.

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody, combinators::UnsyncBoxBody};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::sync::broadcast;

mod over_http;
pub mod rbac;

/// Response body of the fake: whole documents or a watch stream.
pub type FakeBody = UnsyncBoxBody<Bytes, Infallible>;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    group: String,
    plural: String,
    namespace: String,
    name: String,
}

#[derive(Debug, Clone)]
struct WatchEvent {
    rv: u64,
    group: String,
    plural: String,
    namespace: String,
    kind: &'static str,
    object: Value,
}

#[derive(Debug, Default)]
struct State {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: Vec<WatchEvent>,
    /// Every request as `METHOD path`, for assertions.
    requests: Vec<String>,
    /// The API calls of each named client ([`FakeApiServer::client_as`]), for RBAC checks.
    calls: BTreeSet<rbac::ApiCall>,
    /// Server-side apply: what each field manager last applied, per object.
    managed: BTreeMap<Key, Managed>,
}

/// The leaf paths each (field manager, status subresource?) last applied to
/// one object.
type Managed = BTreeMap<(String, bool), BTreeSet<Vec<String>>>;

/// The fake API server; clones share state.
#[derive(Debug, Clone)]
pub struct FakeApiServer {
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<WatchEvent>,
    /// Who this handle's requests are recorded for ([`FakeApiServer::client_as`]).
    user: Option<Arc<str>>,
}

impl Default for FakeApiServer {
    fn default() -> Self {
        Self::new()
    }
}

struct Target {
    key: Key,
    /// `None` for collection requests.
    named: bool,
    status: bool,
    all_namespaces: bool,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match *segs.first()? {
        "api" if segs.len() >= 2 => (String::new(), &segs[2..]),
        "apis" if segs.len() >= 3 => (segs[1].to_string(), &segs[3..]),
        _ => return None,
    };
    let (namespace, rest) = if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        (rest[1].to_string(), &rest[2..])
    } else {
        (String::new(), rest)
    };
    let all_namespaces = namespace.is_empty();
    Some(Target {
        key: Key {
            group,
            plural: rest.first()?.to_string(),
            namespace,
            name: rest.get(1).map(|s| s.to_string()).unwrap_or_default(),
        },
        named: rest.len() >= 2,
        status: rest.get(2) == Some(&"status"),
        all_namespaces,
    })
}

fn query(uri: &http::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn full(status: StatusCode, body: &Value) -> Response<FakeBody> {
    let bytes = Bytes::from(serde_json::to_vec(body).expect("JSON"));
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes).boxed_unsync())
        .expect("response")
}

fn failure(code: StatusCode, reason: &str, message: String) -> Response<FakeBody> {
    full(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code.as_u16()}),
    )
}

/// A `409 Conflict` when `body` names a resourceVersion other than `old`'s
/// (the optimistic-concurrency precondition of PUT and PATCH).
fn stale_write(old: &Value, body: &Value, key: &Key) -> Option<Response<FakeBody>> {
    let rv = |v: &Value| {
        v.pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let want = rv(body)?;
    (Some(want) != rv(old)).then(|| {
        failure(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "the object has been modified; {} \"{}\"",
                key.plural, key.name
            ),
        )
    })
}

/// The TLS Secret `namespace/name` an administrator makes from the files
/// `dpufs certs generate` (DAOS's `gen_certificates.sh`) wrote to `certs`:
/// the CA and the admin certificate and key, under their file names.
pub fn admin_secret(
    namespace: &str,
    name: &str,
    certs: &std::path::Path,
) -> k8s_openapi::api::core::v1::Secret {
    let data = ["daosCA.crt", "admin.crt", "admin.key"]
        .iter()
        .map(|f| {
            let bytes = std::fs::read(certs.join(f))
                .unwrap_or_else(|e| panic!("reading {}: {e}", certs.join(f).display()));
            (f.to_string(), k8s_openapi::ByteString(bytes))
        })
        .collect();
    k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The leaf paths of an applied configuration: object members are followed,
/// anything else (scalars, lists) is a leaf and empty objects own nothing.
/// Lists are atomic, as for a CRD list without `x-kubernetes-list-type`.
fn leaf_paths(v: &Value, prefix: &mut Vec<String>, out: &mut BTreeSet<Vec<String>>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                prefix.push(k.clone());
                leaf_paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {
            out.insert(prefix.clone());
        }
    }
}

/// Removes the member at `path`, if it is there.
fn remove_path(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = v;
    for p in parents {
        match node.get_mut(p) {
            Some(child) => node = child,
            None => return,
        }
    }
    if let Some(m) = node.as_object_mut() {
        m.remove(last);
    }
}

/// The part of an applied object its field manager owns: not the type, the
/// identity or what the server sets.
fn applied_fields(body: &Value, status: bool) -> Value {
    if status {
        return json!({"status": body.get("status").cloned().unwrap_or_else(|| json!({}))});
    }
    let mut v = body.clone();
    if let Some(m) = v.as_object_mut() {
        for f in ["apiVersion", "kind", "status"] {
            m.remove(f);
        }
    }
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for f in [
            "name",
            "namespace",
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
            "managedFields",
        ] {
            meta.remove(f);
        }
    }
    v
}

fn finalizers_empty(obj: &Value) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_none_or(|f| f.is_empty())
}

impl FakeApiServer {
    pub fn new() -> FakeApiServer {
        FakeApiServer {
            state: Arc::default(),
            events: broadcast::channel(1024).0,
            user: None,
        }
    }

    /// A client whose API calls are recorded under `user` ([`FakeApiServer::api_calls`]):
    /// what a component of ours does, apart from what the test itself does.
    pub fn client_as(&self, user: &str) -> kube::Client {
        kube::Client::new(self.as_user(user), "default")
    }

    /// This fake, recording what is asked through the returned handle under `user` (to serve
    /// over HTTP to a process of ours, [`FakeApiServer::serve_http`]).
    pub fn as_user(&self, user: &str) -> FakeApiServer {
        let mut named = self.clone();
        named.user = Some(user.into());
        named
    }

    /// The API calls the clients of `user` made.
    pub fn api_calls(&self, user: &str) -> BTreeSet<rbac::ApiCall> {
        let st = self.state.lock().expect("lock");
        st.calls
            .iter()
            .filter(|c| c.user == user)
            .cloned()
            .collect()
    }

    /// A `kube::Client` talking to this fake, default namespace `default`.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.clone(), "default")
    }

    /// The requests seen so far, as `METHOD path`.
    pub fn requests(&self) -> Vec<String> {
        self.state.lock().expect("lock").requests.clone()
    }

    /// All stored objects of a plural (any group, any namespace).
    pub fn objects(&self, plural: &str) -> Vec<Value> {
        let st = self.state.lock().expect("lock");
        st.objects
            .iter()
            .filter(|(k, _)| k.plural == plural)
            .map(|(_, v)| v.clone())
            .collect()
    }

    fn emit(
        st: &mut State,
        tx: &broadcast::Sender<WatchEvent>,
        key: &Key,
        kind: &'static str,
        object: Value,
    ) {
        let ev = WatchEvent {
            rv: st.rv,
            group: key.group.clone(),
            plural: key.plural.clone(),
            namespace: key.namespace.clone(),
            kind,
            object,
        };
        st.history.push(ev.clone());
        let _ = tx.send(ev);
    }

    fn bump(st: &mut State, obj: &mut Value) {
        st.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
    }

    /// Stores `obj` under `key` (bumping its resourceVersion) or, when it is
    /// being deleted and has no finalizers left, removes it.
    fn store(&self, st: &mut State, key: &Key, mut obj: Value) -> Value {
        Self::bump(st, &mut obj);
        if obj.pointer("/metadata/deletionTimestamp").is_some() && finalizers_empty(&obj) {
            st.objects.remove(key);
            st.managed.remove(key);
            Self::emit(st, &self.events, key, "DELETED", obj.clone());
        } else {
            let existed = st.objects.insert(key.clone(), obj.clone()).is_some();
            let kind = if existed { "MODIFIED" } else { "ADDED" };
            Self::emit(st, &self.events, key, kind, obj.clone());
        }
        obj
    }

    fn handle(
        &self,
        method: Method,
        uri: http::Uri,
        content_type: &str,
        body: Bytes,
    ) -> Response<FakeBody> {
        let Some(t) = parse_path(uri.path()) else {
            return failure(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("no route {}", uri.path()),
            );
        };
        let q = query(&uri);
        let mut st = self.state.lock().expect("lock");
        st.requests.push(format!("{method} {}", uri.path()));
        if let Some(user) = &self.user {
            let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
            st.calls.insert(rbac::ApiCall::of(user, &method, &t, watch));
        }
        let key = t.key.clone();
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return failure(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
            }
        };
        let not_found = || {
            failure(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("{} \"{}\" not found", key.plural, key.name),
            )
        };
        match (method, t.named) {
            (Method::GET, false) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
                let from: u64 = q
                    .get("resourceVersion")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let rx = self.events.subscribe();
                let matches = {
                    let key = key.clone();
                    move |e: &WatchEvent| {
                        e.rv > from
                            && e.group == key.group
                            && e.plural == key.plural
                            && (t.all_namespaces || e.namespace == key.namespace)
                    }
                };
                let backlog: Vec<WatchEvent> =
                    st.history.iter().filter(|e| matches(e)).cloned().collect();
                drop(st);
                let line = |e: WatchEvent| {
                    let mut v = serde_json::to_vec(&json!({"type": e.kind, "object": e.object}))
                        .expect("JSON");
                    v.push(b'\n');
                    Ok::<_, Infallible>(http_body::Frame::data(Bytes::from(v)))
                };
                let live = futures::stream::unfold(rx, |mut rx| async move {
                    loop {
                        match rx.recv().await {
                            Ok(e) => return Some((e, rx)),
                            Err(broadcast::error::RecvError::Lagged(_)) => continue,
                            Err(broadcast::error::RecvError::Closed) => return None,
                        }
                    }
                })
                .filter(move |e| std::future::ready(matches(e)));
                let stream = futures::stream::iter(backlog).chain(live).map(line);
                Response::builder()
                    .status(StatusCode::OK)
                    .header("content-type", "application/json")
                    .body(StreamBody::new(stream).boxed_unsync())
                    .expect("response")
            }
            (Method::GET, false) => {
                let items: Vec<Value> = st
                    .objects
                    .iter()
                    .filter(|(k, _)| {
                        k.group == key.group
                            && k.plural == key.plural
                            && (t.all_namespaces || k.namespace == key.namespace)
                    })
                    .map(|(_, v)| v.clone())
                    .collect();
                full(
                    StatusCode::OK,
                    &json!({"apiVersion": "v1", "kind": "List",
                            "metadata": {"resourceVersion": st.rv.to_string()}, "items": items}),
                )
            }
            (Method::GET, true) => match st.objects.get(&key) {
                Some(o) => full(StatusCode::OK, o),
                None => not_found(),
            },
            (Method::POST, false) => {
                let name = body
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                let name = match (
                    name,
                    body.pointer("/metadata/generateName")
                        .and_then(Value::as_str),
                ) {
                    (Some(n), _) => n,
                    (None, Some(prefix)) => format!("{prefix}{}", st.rv + 1),
                    (None, None) => {
                        return failure(
                            StatusCode::BAD_REQUEST,
                            "BadRequest",
                            "name required".into(),
                        );
                    }
                };
                let key = Key { name, ..key };
                self.create(&mut st, key, body)
            }
            (Method::PUT, true) => {
                let Some(old) = st.objects.get(&key).cloned() else {
                    return not_found();
                };
                if let Some(conflict) = stale_write(&old, &body, &key) {
                    return conflict;
                }
                let new = if t.status {
                    let mut o = old.clone();
                    o["status"] = body.get("status").cloned().unwrap_or(Value::Null);
                    o
                } else {
                    let mut o = body;
                    Self::keep_server_fields(&old, &mut o);
                    o
                };
                let obj = self.store(&mut st, &key, new);
                full(StatusCode::OK, &obj)
            }
            (Method::PATCH, true) => {
                let apply = content_type.starts_with("application/apply-patch");
                let Some(old) = st.objects.get(&key).cloned() else {
                    // An apply creates what does not exist yet.
                    if apply && !t.status {
                        let manager = q.get("fieldManager").cloned().unwrap_or_default();
                        let mut paths = BTreeSet::new();
                        leaf_paths(&applied_fields(&body, false), &mut Vec::new(), &mut paths);
                        let response = self.create(&mut st, key.clone(), body);
                        st.managed
                            .entry(key)
                            .or_default()
                            .insert((manager, false), paths);
                        return response;
                    }
                    return not_found();
                };
                // As the real server: a resourceVersion in a patch is a precondition.
                if let Some(conflict) = stale_write(&old, &body, &key) {
                    return conflict;
                }
                let mut new = old.clone();
                if apply {
                    let manager = q.get("fieldManager").cloned().unwrap_or_default();
                    let slot = (manager, t.status);
                    let mut paths = BTreeSet::new();
                    leaf_paths(
                        &applied_fields(&body, t.status),
                        &mut Vec::new(),
                        &mut paths,
                    );
                    let owners = st.managed.entry(key.clone()).or_default();
                    let before = owners.get(&slot).cloned().unwrap_or_default();
                    for gone in before.difference(&paths) {
                        let shared = owners
                            .iter()
                            .filter(|(s, _)| **s != slot)
                            .any(|(_, set)| set.iter().any(|p| p.starts_with(gone)));
                        if !shared {
                            remove_path(&mut new, gone);
                        }
                    }
                    owners.insert(slot, paths);
                }
                if t.status {
                    if let Some(s) = body.get("status") {
                        merge(&mut new["status"], s);
                    }
                } else {
                    let mut patch = body;
                    if let Some(p) = patch.as_object_mut() {
                        p.remove("status");
                    }
                    merge(&mut new, &patch);
                    Self::keep_server_fields(&old, &mut new);
                }
                let obj = self.store(&mut st, &key, new);
                full(StatusCode::OK, &obj)
            }
            (Method::DELETE, true) => {
                let Some(mut obj) = st.objects.get(&key).cloned() else {
                    return not_found();
                };
                if obj.pointer("/metadata/deletionTimestamp").is_none() {
                    obj["metadata"]["deletionTimestamp"] = json!(now());
                    let obj = self.store(&mut st, &key, obj);
                    full(StatusCode::OK, &obj)
                } else {
                    full(StatusCode::OK, &obj)
                }
            }
            (m, _) => failure(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("{m} {}", uri.path()),
            ),
        }
    }

    /// Creates `obj` under `key` (POST, or an apply to a missing object).
    fn create(&self, st: &mut State, key: Key, mut obj: Value) -> Response<FakeBody> {
        if st.objects.contains_key(&key) {
            return failure(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{} \"{}\" already exists", key.plural, key.name),
            );
        }
        st.managed.remove(&key);
        let meta = &mut obj["metadata"];
        meta["name"] = json!(key.name);
        if !key.namespace.is_empty() {
            meta["namespace"] = json!(key.namespace);
        }
        meta["uid"] = json!(uuid::Uuid::new_v4().to_string());
        meta["creationTimestamp"] = json!(now());
        meta["generation"] = json!(1);
        let obj = self.store(st, &key, obj);
        full(StatusCode::CREATED, &obj)
    }

    /// Fields only the server sets survive a client's PUT or PATCH; the
    /// generation moves when the spec does.
    fn keep_server_fields(old: &Value, new: &mut Value) {
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "name",
            "namespace",
        ] {
            match old["metadata"].get(f) {
                Some(v) => new["metadata"][f] = v.clone(),
                None => {
                    if let Some(m) = new["metadata"].as_object_mut() {
                        m.remove(f);
                    }
                }
            }
        }
        if let Some(s) = old.get("status") {
            new["status"] = s.clone();
        }
        let generation = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let changed = old.get("spec") != new.get("spec");
        new["metadata"]["generation"] = json!(if changed { generation + 1 } else { generation });
    }
}

impl tower::Service<Request<kube::client::Body>> for FakeApiServer {
    type Response = Response<FakeBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<FakeBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<kube::client::Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let content_type = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            Ok(this.handle(parts.method, parts.uri, &content_type, bytes))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

    #[tokio::test]
    async fn crud_finalizers_and_watch() {
        let fake = FakeApiServer::new();
        let api: Api<ConfigMap> = Api::default_namespaced(fake.client());
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("a".into());
        cm.metadata.finalizers = Some(vec!["x/y".into()]);
        let created = api.create(&PostParams::default(), &cm).await.unwrap();
        assert!(created.metadata.uid.is_some());
        let list = api.list(&Default::default()).await.unwrap();
        assert_eq!(list.items.len(), 1);
        api.delete("a", &DeleteParams::default()).await.unwrap();
        let got = api.get("a").await.unwrap();
        assert!(
            got.metadata.deletion_timestamp.is_some(),
            "finalizer keeps it"
        );
        let patch = json!({"metadata": {"finalizers": null}});
        api.patch("a", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        assert!(
            api.get_opt("a").await.unwrap().is_none(),
            "gone once finalizers are"
        );
        let mut stale = created.clone();
        stale.metadata.resource_version = Some("1".into());
        api.create(&PostParams::default(), &cm).await.unwrap();
        assert!(
            api.replace("a", &PostParams::default(), &stale)
                .await
                .is_err(),
            "conflict"
        );
    }

    #[tokio::test]
    async fn apply_removes_fields_its_manager_dropped() {
        let fake = FakeApiServer::new();
        let api: Api<ConfigMap> = Api::default_namespaced(fake.client());
        let apply = |data: Value| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "c"}, "data": data})
        };
        // An apply creates the object.
        let p = apply(json!({"a": "1", "b": "2"}));
        let cm = api
            .patch("c", &PatchParams::apply("m1"), &Patch::Apply(&p))
            .await
            .unwrap();
        assert_eq!(cm.data.unwrap().len(), 2);
        // Another manager's field stays when m1 leaves it out; m1's own goes.
        let other = json!({"data": {"c": "3"}});
        api.patch("c", &PatchParams::apply("m2"), &Patch::Apply(&other))
            .await
            .unwrap();
        let shared = json!({"data": {"a": "1"}});
        api.patch("c", &PatchParams::apply("m2"), &Patch::Apply(&shared))
            .await
            .unwrap();
        let p = apply(json!({"a": "1"}));
        api.patch("c", &PatchParams::apply("m1"), &Patch::Apply(&p))
            .await
            .unwrap();
        let data = api.get("c").await.unwrap().data.unwrap();
        assert_eq!(
            data.keys().collect::<Vec<_>>(),
            vec!["a"],
            "b dropped by m1; c dropped by m2 (its last apply left it out): {data:?}"
        );
        // m2 no longer applies a: m1 still does, so it stays.
        api.patch("c", &PatchParams::apply("m2"), &Patch::Apply(&json!({})))
            .await
            .unwrap();
        let data = api.get("c").await.unwrap().data.unwrap();
        assert_eq!(data.get("a").map(String::as_str), Some("1"));
        // A merge patch takes no ownership and is not undone.
        let merge = json!({"data": {"d": "4"}});
        api.patch("c", &PatchParams::default(), &Patch::Merge(&merge))
            .await
            .unwrap();
        api.patch("c", &PatchParams::apply("m1"), &Patch::Apply(&p))
            .await
            .unwrap();
        let data = api.get("c").await.unwrap().data.unwrap();
        assert_eq!(data.get("d").map(String::as_str), Some("4"));
    }
}
