//! What is measured: the phases, how each one starts and ends, and the number it reports.

use serde::Serialize;
use std::time::Duration;

/// Where the mdtest-like phases put their files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// Every job's files in one shared directory (contention on one directory).
    SharedDir,
    /// Per job its own subtree of [`super::mdtest::TREE_DIRS`] directories.
    Tree,
}

/// One mdtest-like operation, applied to every file of a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MdOp {
    /// open(O_CREAT|O_EXCL) + write the file size + close.
    Create,
    Stat,
    /// open + read to the end + close.
    Read,
    Unlink,
}

/// One step of the small-file tree, run with the real tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TreeOp {
    Copy,
    List,
    Find,
    Remove,
    Untar,
}

/// One timed phase; a row of the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Phase {
    Md { layout: Layout, jobs: u32, op: MdOp },
    Tree { op: TreeOp },
}

/// How a phase is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unit {
    FilesPerSecond,
    Seconds,
}

impl Unit {
    /// The phase's number: files per wall second, or the wall seconds themselves.
    pub fn value(self, files: u64, wall: Duration) -> f64 {
        match self {
            Unit::FilesPerSecond => files as f64 / wall.as_secs_f64(),
            Unit::Seconds => wall.as_secs_f64(),
        }
    }

    /// A value as speed, so ratios read the same way for both units: higher is faster.
    pub fn speed(self, value: f64) -> f64 {
        match self {
            Unit::FilesPerSecond => value,
            Unit::Seconds => 1.0 / value,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Unit::FilesPerSecond => "files/s",
            Unit::Seconds => "seconds",
        }
    }
}

/// How a phase begins and ends on every target alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Page cache, dentries and inodes dropped first, so lookups and reads reach the target.
    /// Otherwise only sync(2), so the warm local source of a copy stays cached.
    pub cold: bool,
    /// Ends with syncfs(2) on the target, counted in the time, so the kernel's write-back
    /// cannot hide work.
    pub syncs: bool,
}

impl Phase {
    pub fn unit(self) -> Unit {
        match self {
            Phase::Md { .. } => Unit::FilesPerSecond,
            Phase::Tree { .. } => Unit::Seconds,
        }
    }

    pub fn rules(self) -> Rules {
        let (cold, syncs) = match self {
            Phase::Md { op, .. } => match op {
                MdOp::Create => (false, true),
                MdOp::Stat | MdOp::Read => (true, false),
                MdOp::Unlink => (true, true),
            },
            Phase::Tree { op } => match op {
                TreeOp::Copy | TreeOp::Untar => (false, true),
                TreeOp::List | TreeOp::Find => (true, false),
                TreeOp::Remove => (true, true),
            },
        };
        Rules { cold, syncs }
    }

    pub fn label(self) -> String {
        match self {
            Phase::Md { layout, jobs, op } => {
                let op = match op {
                    MdOp::Create => "create",
                    MdOp::Stat => "stat",
                    MdOp::Read => "read",
                    MdOp::Unlink => "unlink",
                };
                let layout = match layout {
                    Layout::SharedDir => "one dir",
                    Layout::Tree => "tree",
                };
                let s = if jobs == 1 { "" } else { "s" };
                format!("{op}, {layout}, {jobs} job{s}")
            }
            Phase::Tree { op } => match op {
                TreeOp::Copy => "cp -a",
                TreeOp::List => "ls -lR",
                TreeOp::Find => "find",
                TreeOp::Remove => "rm -rf",
                TreeOp::Untar => "tar x",
            }
            .to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_files_per_wall_second_and_tree_steps_report_seconds() {
        let wall = Duration::from_millis(250);
        assert_eq!(Unit::FilesPerSecond.value(2000, wall), 8000.0);
        assert_eq!(Unit::Seconds.value(2000, wall), 0.25);
        // Faster reads higher in both units.
        assert!(Unit::Seconds.speed(0.25) > Unit::Seconds.speed(0.5));
        assert!(Unit::FilesPerSecond.speed(8000.0) > Unit::FilesPerSecond.speed(4000.0));
    }

    #[test]
    fn lookups_start_cold_and_writes_end_synced() {
        let md = |op| Phase::Md {
            layout: Layout::Tree,
            jobs: 4,
            op,
        };
        assert_eq!(
            md(MdOp::Read).rules(),
            Rules {
                cold: true,
                syncs: false
            }
        );
        assert_eq!(
            md(MdOp::Create).rules(),
            Rules {
                cold: false,
                syncs: true
            }
        );
        assert_eq!(
            md(MdOp::Unlink).rules(),
            Rules {
                cold: true,
                syncs: true
            }
        );
        let copy = Phase::Tree { op: TreeOp::Copy };
        assert_eq!(
            copy.rules(),
            Rules {
                cold: false,
                syncs: true
            }
        );
        assert_eq!(md(MdOp::Stat).label(), "stat, tree, 4 jobs");
    }
}
