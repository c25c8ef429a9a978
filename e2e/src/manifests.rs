//! The repository's manifests as tests read them: the generated CRDs
//! (`manifests/crds`) and the samples (`manifests/samples`, valid ones at the
//! top, invalid ones in `invalid/`, each starting with `# expect: <message>`,
//! what the API server's refusal says, and where an offline validator words a
//! schema error differently, `# offline: <message>`; an invalid file with two
//! documents is an update: the stored object, then the change that must be
//! refused).

use serde_json::Value;
use std::path::{Path, PathBuf};

/// The repository's top directory.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ is inside the repository")
        .to_path_buf()
}

/// `*.yaml` files directly in `dir`, sorted.
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
}

/// The YAML documents of a file, as JSON.
pub fn documents(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every object of the valid samples, in the order `kubectl apply -f
/// manifests/samples` applies them (namespaces they need included).
pub fn valid_samples() -> Vec<Value> {
    yaml_files(&repo().join("manifests/samples"))
        .iter()
        .flat_map(|path| documents(path))
        .collect()
}

/// The dpufs objects (group `dpufs.io`) of the valid samples.
pub fn valid_dpufs_samples() -> Vec<Value> {
    valid_samples()
        .into_iter()
        .filter(|o| {
            o["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("dpufs.io/"))
        })
        .collect()
}

/// The files of the invalid samples.
pub fn invalid_sample_files() -> Vec<PathBuf> {
    yaml_files(&repo().join("manifests/samples/invalid"))
}

/// The `# expect:` line of an invalid sample: text the API server's refusal
/// must contain.
pub fn expectation(path: &Path) -> String {
    header(path, "expect")
        .unwrap_or_else(|| panic!("{} must start with `# expect: <message>`", path.display()))
}

/// What the offline validator of the api tests (a JSON Schema library and
/// kube's CEL evaluator) says instead: the `# offline:` line where its words
/// for a schema error differ from the API server's, else [`expectation`].
pub fn offline_expectation(path: &Path) -> String {
    header(path, "offline").unwrap_or_else(|| expectation(path))
}

/// The value of a `# key: value` line among a file's leading comments.
fn header(path: &Path, key: &str) -> Option<String> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let prefix = format!("# {key}: ");
    text.lines()
        .take_while(|line| line.starts_with('#'))
        .find_map(|line| line.strip_prefix(&prefix).map(str::to_string))
}
