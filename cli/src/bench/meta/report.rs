//! The metadata report: medians over rounds with min and max, the CPU spent, and speed ratios
//! to the baseline and to the fastest peer, as Markdown and JSON.

use super::super::Lineup;
use super::super::report::{median, outcomes, save};
use super::measure::Cost;
use super::phase::{Phase, Unit};
use serde::Serialize;
use std::fmt::Write;
use std::path::Path;

/// One phase on one target in one round: measured, or why not.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub target: String,
    pub phase: Phase,
    pub round: usize,
    pub result: Result<Sample, String>,
}

/// What one phase measured.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Sample {
    pub files: u64,
    /// Files/s or seconds, per the phase's unit.
    pub value: f64,
    #[serde(flatten)]
    pub cost: Cost,
}

impl Sample {
    pub fn new(phase: Phase, files: u64, cost: Cost) -> Sample {
        Sample {
            files,
            value: phase.unit().value(files, cost.wall),
            cost,
        }
    }

    pub fn cpu_s(&self) -> f64 {
        self.cost.own_cpu_s + self.cost.server_cpu_s
    }
}

/// The report of one (phase, target).
#[derive(Clone, Debug, Serialize)]
struct Row {
    phase: String,
    unit: Unit,
    target: String,
    median: f64,
    min: f64,
    max: f64,
    /// Median CPU seconds: this process plus the serving processes.
    cpu_s: f64,
    server_cpu_s: f64,
    /// Speed relative to the baseline's median.
    vs_baseline: Option<f64>,
    /// Speed relative to the fastest peer's median (targets only, when there are peers).
    vs_best_peer: Option<f64>,
    /// Why some runs failed.
    errors: Vec<String>,
}

fn row(phase: Phase, target: &str, runs: &[Run]) -> Row {
    let (ok, errors) = outcomes(
        runs.iter()
            .filter(|r| r.phase == phase && r.target == target)
            .map(|r| &r.result),
    );
    let values = ok.iter().map(|s| s.value);
    let med = |f: fn(&Sample) -> f64| median(ok.iter().map(|s| f(s)).collect());
    Row {
        phase: phase.label(),
        unit: phase.unit(),
        target: target.to_string(),
        median: med(|s| s.value),
        min: values.clone().reduce(f64::min).unwrap_or(f64::NAN),
        max: values.reduce(f64::max).unwrap_or(f64::NAN),
        cpu_s: med(Sample::cpu_s),
        server_cpu_s: med(|s| s.cost.server_cpu_s),
        vs_baseline: None,
        vs_best_peer: None,
        errors,
    }
}

/// `a / b` when both are finite speeds.
fn ratio(a: f64, b: Option<f64>) -> Option<f64> {
    b.filter(|b| b.is_finite() && *b > 0.0)
        .map(|b| a / b)
        .filter(|r| r.is_finite())
}

fn rows(phases: &[Phase], lineup: &Lineup, runs: &[Run]) -> Vec<Row> {
    let mut out = Vec::new();
    for &phase in phases {
        let mut rows: Vec<Row> = lineup
            .all
            .iter()
            .map(|t| row(phase, &t.name, runs))
            .collect();
        let speed = |r: &Row| phase.unit().speed(r.median);
        let is_peer = |r: &Row| lineup.peers.contains(&r.target);
        let base = rows.iter().find(|r| r.target == lineup.baseline).map(speed);
        let best_peer = rows
            .iter()
            .filter(|r| is_peer(r))
            .map(speed)
            .filter(|s| s.is_finite())
            .max_by(f64::total_cmp);
        for r in &mut rows {
            r.vs_baseline = ratio(speed(r), base);
            if !is_peer(r) && r.target != lineup.baseline {
                r.vs_best_peer = ratio(speed(r), best_peer);
            }
        }
        out.extend(rows);
    }
    out
}

fn percent(r: Option<f64>) -> String {
    r.map_or("—".into(), |x| format!("{:.0}%", x * 100.0))
}

/// One table per unit; the "vs best peer" column only when there are peers.
fn markdown(header: &str, lineup: &Lineup, rows: &[Row]) -> String {
    let peers = !lineup.peers.is_empty();
    let mut s = format!("{header}\n");
    for (unit, title) in [
        (Unit::FilesPerSecond, "Metadata, mdtest-like"),
        (Unit::Seconds, "Small-file tree"),
    ] {
        let _ = writeln!(s, "\n{title} ({}):\n", unit.label());
        let _ = write!(
            s,
            "| phase | target | {} | min | max | CPU s | vs {} |",
            unit.label(),
            lineup.baseline
        );
        s.push_str(if peers { " vs best peer |\n" } else { "\n" });
        s.push_str("|---|---|---:|---:|---:|---:|---:|");
        s.push_str(if peers { "---:|\n" } else { "\n" });
        for r in rows.iter().filter(|r| r.unit == unit) {
            let _ = write!(s, "| {} | {} | {} |", r.phase, r.target, cells(r));
            if peers {
                let _ = write!(s, " {} |", percent(r.vs_best_peer));
            }
            s.push('\n');
        }
    }
    s
}

/// The measured cells of a row, or why there are none.
fn cells(r: &Row) -> String {
    if r.median.is_nan() {
        let why = r.errors.first().map_or("no run", String::as_str);
        return format!("— | — | — | — | n/a: {why}");
    }
    let n = |v: f64| match r.unit {
        Unit::FilesPerSecond => format!("{v:.0}"),
        Unit::Seconds => format!("{v:.3}"),
    };
    format!(
        "{} | {} | {} | {:.2} | {}",
        n(r.median),
        n(r.min),
        n(r.max),
        r.cpu_s,
        percent(r.vs_baseline)
    )
}

/// This process's command line as a shell would take it back.
pub fn command_line() -> String {
    shell_words(std::env::args())
}

fn shell_words(args: impl Iterator<Item = String>) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-+=/.,:@%".contains(c);
    args.map(|a| {
        if !a.is_empty() && a.chars().all(plain) {
            a
        } else {
            format!("'{}'", a.replace('\'', r"'\''"))
        }
    })
    .collect::<Vec<_>>()
    .join(" ")
}

#[derive(Serialize)]
struct Json<'a, S> {
    command: &'a str,
    protocol: &'a str,
    setup: &'a S,
    targets: &'a [super::super::Target],
    baseline: &'a str,
    peers: &'a [String],
    rows: &'a [Row],
    runs: &'a [Run],
}

/// What the report is of, beyond the runs.
#[derive(Debug)]
pub struct Header<'a, S> {
    pub command: &'a str,
    pub protocol: &'a str,
    /// The run's parameters, for the JSON.
    pub setup: &'a S,
}

/// Prints the tables and writes `meta.md` and `meta.json` under `out`.
pub fn write<S: Serialize>(
    out: &Path,
    header: &Header<'_, S>,
    lineup: &Lineup,
    phases: &[Phase],
    runs: &[Run],
) -> anyhow::Result<()> {
    let rows = rows(phases, lineup, runs);
    let top = format!("Command: `{}`\n\n{}", header.command, header.protocol);
    let md = markdown(&top, lineup, &rows);
    let json = Json {
        command: header.command,
        protocol: header.protocol,
        setup: header.setup,
        targets: &lineup.all,
        baseline: &lineup.baseline,
        peers: &lineup.peers,
        rows: &rows,
        runs,
    };
    save(out, "meta", &md, &json)
}

#[cfg(test)]
mod tests {
    use super::super::super::Target;
    use super::super::phase::{Layout, MdOp, TreeOp};
    use super::*;
    use std::time::Duration;

    const CREATE: Phase = Phase::Md {
        layout: Layout::SharedDir,
        jobs: 1,
        op: MdOp::Create,
    };
    const COPY: Phase = Phase::Tree { op: TreeOp::Copy };

    fn run(target: &str, phase: Phase, round: usize, wall_ms: u64) -> Run {
        let cost = Cost {
            wall: Duration::from_millis(wall_ms),
            own_cpu_s: 0.5,
            server_cpu_s: 0.25,
        };
        Run {
            target: target.into(),
            phase,
            round,
            result: Ok(Sample::new(phase, 1000, cost)),
        }
    }

    fn lineup(peers: &[&str]) -> Lineup {
        let t = |name: &str| Target {
            name: name.into(),
            path: "/x".into(),
            procs: vec![],
        };
        let mut all = vec![t("dpufs"), t("backing")];
        all.extend(peers.iter().map(|p| t(p)));
        Lineup {
            all,
            baseline: "backing".into(),
            peers: peers.iter().map(|p| p.to_string()).collect(),
        }
    }

    /// Three rounds of both phases: dpufs at `dpufs_ms`, the baseline at 100 ms, peers at theirs.
    fn runs(dpufs_ms: [u64; 3], peers: &[(&str, u64)]) -> Vec<Run> {
        let mut out = Vec::new();
        for phase in [CREATE, COPY] {
            for (round, ms) in dpufs_ms.into_iter().enumerate() {
                out.push(run("dpufs", phase, round, ms));
                out.push(run("backing", phase, round, 100));
                out.extend(peers.iter().map(|(p, ms)| run(p, phase, round, *ms)));
            }
        }
        out
    }

    #[test]
    fn medians_min_max_and_ratios_are_of_speed_in_both_units() {
        let rows = rows(&[CREATE, COPY], &lineup(&[]), &runs([400, 200, 250], &[]));
        let (create, copy) = (&rows[0], &rows[2]);
        assert_eq!((create.target.as_str(), create.median), ("dpufs", 4000.0));
        assert_eq!((create.min, create.max), (2500.0, 5000.0));
        assert_eq!(create.vs_baseline, Some(0.4));
        assert_eq!(create.cpu_s, 0.75);
        // Seconds: the median time, and half the speed of a baseline that takes 100 ms.
        assert_eq!((copy.median, copy.min, copy.max), (0.25, 0.2, 0.4));
        assert_eq!(copy.vs_baseline, Some(0.4));
        assert_eq!(rows[1].vs_baseline, Some(1.0));
        assert!(rows.iter().all(|r| r.vs_best_peer.is_none()));
    }

    #[test]
    fn vs_best_peer_compares_targets_with_the_fastest_peer() {
        let peers = [("moosefs", 400), ("glusterfs", 125)];
        let lineup = lineup(&["moosefs", "glusterfs"]);
        let rows = rows(&[CREATE, COPY], &lineup, &runs([250; 3], &peers));
        for r in &rows {
            let expected = (r.target == "dpufs").then_some(0.5);
            assert_eq!(r.vs_best_peer, expected, "{r:?}");
        }
        let md = markdown("head", &lineup, &rows);
        assert!(md.contains("| vs backing | vs best peer |"), "{md}");
        assert!(
            md.contains(
                "| create, one dir, 1 job | dpufs | 4000 | 4000 | 4000 | 0.75 | 40% | 50% |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| cp -a | glusterfs | 0.125 | 0.125 | 0.125 | 0.75 | 80% | — |"),
            "{md}"
        );
    }

    #[test]
    fn without_peers_there_is_no_peer_column_and_failures_say_why() {
        let mut runs = runs([250; 3], &[]);
        runs.retain(|r| !(r.target == "dpufs" && r.phase == COPY));
        runs.push(Run {
            result: Err("cp failed: No space left on device".into()),
            ..run("dpufs", COPY, 0, 1)
        });
        let lineup = lineup(&[]);
        let md = markdown("head", &lineup, &rows(&[CREATE, COPY], &lineup, &runs));
        assert!(!md.contains("best peer"), "{md}");
        assert!(
            md.contains("| files/s | min | max | CPU s | vs backing |\n"),
            "{md}"
        );
        assert!(
            md.contains("| cp -a | dpufs | — | — | — | — | n/a: cp failed: No space"),
            "{md}"
        );
    }

    #[test]
    fn the_command_line_quotes_what_a_shell_would_split() {
        let args = [
            "dpufs", "bench", "meta", "--target", "a b=/x", "--out", "it's",
        ];
        assert_eq!(
            shell_words(args.into_iter().map(String::from)),
            r"dpufs bench meta --target 'a b=/x' --out 'it'\''s'"
        );
    }
}
