//! The small-file tree's steps, run with the real tools (what users run), output discarded.

use super::phase::TreeOp;
use super::tree::{Source, TREE_NAME};
use anyhow::{Context, bail};
use std::path::Path;
use std::process::{Command, Stdio};

/// The command for `op` with the tree at `dir`/tree on the target.
fn command(op: TreeOp, source: &Source, dir: &Path) -> Command {
    let tree = dir.join(TREE_NAME);
    let mut cmd;
    match op {
        TreeOp::Copy => {
            cmd = Command::new("cp");
            cmd.arg("-a").arg(&source.tree).arg(tree);
        }
        TreeOp::List => {
            cmd = Command::new("ls");
            cmd.arg("-lR").arg(tree);
        }
        TreeOp::Find => {
            cmd = Command::new("find");
            cmd.arg(tree);
        }
        TreeOp::Remove => {
            cmd = Command::new("rm");
            cmd.arg("-rf").arg(tree);
        }
        TreeOp::Untar => {
            cmd = Command::new("tar");
            cmd.arg("-x").arg("-f").arg(&source.tar).arg("-C").arg(dir);
        }
    }
    cmd
}

/// Runs `op` to completion; an error carries the tool's own words.
pub fn run(op: TreeOp, source: &Source, dir: &Path) -> anyhow::Result<()> {
    checked(command(op, source, dir))
}

/// Runs a tool to completion, its output discarded; an error carries the tool's own words.
pub fn checked(mut cmd: Command) -> anyhow::Result<()> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("run {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tree::Tree;
    use super::*;

    #[test]
    fn the_steps_copy_list_remove_and_unpack_the_tree() {
        let scratch = tempfile::tempdir().unwrap();
        let planned = Tree::source_like(30);
        let source = Source::write(&planned, scratch.path()).unwrap();
        let target = tempfile::tempdir().unwrap();
        let tree = target.path().join(TREE_NAME);
        run(TreeOp::Copy, &source, target.path()).unwrap();
        assert!(tree.join(&planned.files[0].0).is_file());
        run(TreeOp::List, &source, target.path()).unwrap();
        run(TreeOp::Find, &source, target.path()).unwrap();
        run(TreeOp::Remove, &source, target.path()).unwrap();
        assert!(!tree.exists());
        run(TreeOp::Untar, &source, target.path()).unwrap();
        assert!(tree.join(&planned.links[0].0).is_symlink());
        let e = run(TreeOp::Copy, &source, Path::new("/no/such/dir")).unwrap_err();
        assert!(e.to_string().contains("cp failed"), "{e}");
    }
}
