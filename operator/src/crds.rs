//! `dpufs-operator crds`: the CRD manifests, printed or written to files.

use anyhow::Context;
use std::io::Write;
use std::path::Path;

/// Prints all CRDs as one multi-document YAML stream.
pub fn print(out: &mut impl Write) -> anyhow::Result<()> {
    for (i, (_, yaml)) in dpufs_api::crd_manifests()?.iter().enumerate() {
        if i > 0 {
            out.write_all(b"---\n")?;
        }
        out.write_all(yaml.as_bytes())?;
    }
    Ok(out.flush()?)
}

/// Writes each CRD to `dir/<plural>.<group>.yaml`, creating `dir` if needed.
pub fn write(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (file, yaml) in dpufs_api::crd_manifests()? {
        let path = dir.join(file);
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn writes_one_file_per_kind_and_prints_the_same_documents() {
        let dir = tempfile::tempdir().unwrap();
        super::write(dir.path()).unwrap();
        let mut files: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        assert_eq!(
            files,
            [
                "daoscontainers.dpufs.io.yaml",
                "daospools.dpufs.io.yaml",
                "daossystems.dpufs.io.yaml",
                "daostenants.dpufs.io.yaml",
            ]
        );

        let mut printed = Vec::new();
        super::print(&mut printed).unwrap();
        let printed = String::from_utf8(printed).unwrap();
        assert_eq!(printed.matches("\n---\n").count(), 3);
        for file in files {
            let yaml = std::fs::read_to_string(dir.path().join(&file)).unwrap();
            assert!(printed.contains(&yaml), "{file} is printed as written");
        }
    }
}
