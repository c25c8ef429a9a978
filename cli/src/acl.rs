//! ACL arguments and output shared by the pool and container verbs, in
//! dmg's forms: ACEs as `TYPE:FLAGS:PRINCIPAL:PERMS`, ACL files with one ACE
//! per line, principals as `name@`.

use crate::output::Out;
use anyhow::Context;
use clap::Args;
use dpufs_daos::Acl;
use std::path::{Path, PathBuf};

/// The entries `update-acl` adds: given inline or in a file.
#[derive(Debug, Args)]
pub struct AceArgs {
    /// An access-control entry, e.g. `A::alice@:rw` or `A:G:staff@:r`; repeatable.
    #[arg(short = 'e', long = "entry", required_unless_present = "acl_file")]
    entries: Vec<String>,
    /// A file of entries, one per line (`#` starts a comment).
    #[arg(long, conflicts_with = "entries")]
    acl_file: Option<PathBuf>,
}

impl AceArgs {
    pub fn entries(&self) -> anyhow::Result<Vec<String>> {
        match &self.acl_file {
            Some(path) => read_acl_file(path),
            None => Ok(self.entries.clone()),
        }
    }
}

/// Reads an ACL file as dmg writes and reads them: one ACE per line, blank
/// lines and `#` comments ignored (so `get-acl` output can be fed back).
pub fn read_acl_file(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading ACL file {}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect())
}

/// A user or group principal as DAOS wants it, `name@`; dmg adds the `@` too.
pub fn principal(name: &str) -> String {
    if name.ends_with('@') {
        name.to_string()
    } else {
        format!("{name}@")
    }
}

/// Prints an ACL in dmg's format, which is also a valid ACL file.
pub fn print_acl(out: Out, acl: &Acl) -> anyhow::Result<()> {
    out.show(acl, |a| {
        println!("# Owner: {}", a.owner_user);
        println!("# Owner Group: {}", a.owner_group);
        println!("# Entries:");
        for e in &a.entries {
            println!("{e}");
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acl_files_skip_comments_and_blanks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acl");
        std::fs::write(&path, "# Owner: x@\n\nA::OWNER@:rw\n  A:G:GROUP@:r  \n").unwrap();
        assert_eq!(
            read_acl_file(&path).unwrap(),
            vec!["A::OWNER@:rw", "A:G:GROUP@:r"]
        );
        assert!(read_acl_file(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn principals_end_in_at() {
        assert_eq!(principal("alice"), "alice@");
        assert_eq!(principal("alice@"), "alice@");
    }
}
