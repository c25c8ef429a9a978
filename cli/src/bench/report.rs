//! The report: medians over rounds, ratios to the baseline, as Markdown and JSON.

use super::fio::{Case, Protocol};
use super::{Run, Sample, Target};
use anyhow::Context;
use serde::Serialize;
use std::fmt::Write;
use std::path::Path;

/// The protocol, as printed before the runs and at the top of the report.
pub fn protocol_text(p: &Protocol, targets: &[Target], rounds: usize) -> String {
    let names: Vec<String> = targets
        .iter()
        .map(|t| format!("{} ({})", t.name, t.path.display()))
        .collect();
    format!(
        "Protocol: fio {} iodepth {}, {} bytes per job file, {:.1} s per run, {rounds} rounds \
         (target order rotated each round; medians reported). Page cache dropped before every \
         run; read files laid out once with fsync; a read run reads no block twice (one pass, \
         ended by the runtime at the latest); write runs start from no file, run for the \
         runtime and end with fsync (end_fsync=1). CPU = fio's user+system time plus the serving processes' time.\n\
         Targets: {}",
        p.ioengine,
        p.iodepth,
        p.size,
        p.runtime.as_secs_f64(),
        names.join(", ")
    )
}

/// Medians of one (case, target).
#[derive(Clone, Debug, Serialize)]
struct Row {
    case: String,
    target: String,
    mib_per_s: f64,
    iops: f64,
    p99_us: f64,
    cpu_s_per_gib: f64,
    /// Throughput relative to the baseline's median.
    ratio: Option<f64>,
    /// Why some runs failed.
    errors: Vec<String>,
}

/// The median of `v`; NaN when it is empty (no run succeeded).
pub(super) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The samples of one row's runs, and why the others failed (each reason once in a row).
pub(super) fn outcomes<'a, S: 'a>(
    results: impl Iterator<Item = &'a Result<S, String>>,
) -> (Vec<&'a S>, Vec<String>) {
    let mut ok = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    for result in results {
        match result {
            Ok(s) => ok.push(s),
            Err(e) => errors.push(e.clone()),
        }
    }
    errors.dedup();
    (ok, errors)
}

fn row(case: &Case, target: &str, runs: &[Run]) -> Row {
    let (ok, errors) = outcomes(
        runs.iter()
            .filter(|r| r.case == *case && r.target == target)
            .map(|r| &r.result),
    );
    let med = |f: fn(&Sample) -> f64| median(ok.iter().map(|s| f(s)).collect());
    Row {
        case: case.label(),
        target: target.to_string(),
        mib_per_s: med(|s| s.fio.mib_per_s),
        iops: med(|s| s.fio.iops),
        p99_us: med(|s| s.fio.p99_us),
        cpu_s_per_gib: med(Sample::cpu_s_per_gib),
        ratio: None,
        errors,
    }
}

fn rows(targets: &[Target], baseline: &str, cases: &[Case], runs: &[Run]) -> Vec<Row> {
    let mut out = Vec::new();
    for case in cases {
        let base = row(case, baseline, runs).mib_per_s;
        for t in targets {
            let mut r = row(case, &t.name, runs);
            if base.is_finite() && base > 0.0 && r.mib_per_s.is_finite() {
                r.ratio = Some(r.mib_per_s / base);
            }
            out.push(r);
        }
    }
    out
}

fn markdown(protocol: &str, baseline: &str, rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{protocol}\n");
    let _ = writeln!(
        s,
        "| case | target | MiB/s | IOPS | p99 µs | CPU s/GiB | vs {baseline} |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|");
    for r in rows {
        if r.mib_per_s.is_nan() {
            let why = r.errors.first().map_or("no run", String::as_str);
            let _ = writeln!(
                s,
                "| {} | {} | — | — | — | — | n/a: {why} |",
                r.case, r.target
            );
            continue;
        }
        let ratio = r.ratio.map_or("—".into(), |x| format!("{:.0}%", x * 100.0));
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {:.0} | {:.0} | {:.2} | {ratio} |",
            r.case, r.target, r.mib_per_s, r.iops, r.p99_us, r.cpu_s_per_gib
        );
    }
    s
}

#[derive(Serialize)]
struct Json<'a> {
    protocol: &'a Protocol,
    targets: &'a [Target],
    baseline: &'a str,
    rows: &'a [Row],
    runs: &'a [Run],
}

/// Prints the Markdown table and writes `report.md` and `report.json` under `out`.
pub fn write(
    out: &Path,
    protocol: &Protocol,
    targets: &[Target],
    baseline: &str,
    cases: &[Case],
    runs: &[Run],
) -> anyhow::Result<()> {
    let rounds = runs.iter().map(|r| r.round + 1).max().unwrap_or(0);
    let rows = rows(targets, baseline, cases, runs);
    let md = markdown(&protocol_text(protocol, targets, rounds), baseline, &rows);
    let json = Json {
        protocol,
        targets,
        baseline,
        rows: &rows,
        runs,
    };
    save(out, "report", &md, &json)
}

/// Prints the Markdown table and writes it and the JSON under `out` as NAME.md and NAME.json.
pub(super) fn save(out: &Path, name: &str, md: &str, json: &impl Serialize) -> anyhow::Result<()> {
    println!("{md}");
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let (md_path, json_path) = (
        out.join(format!("{name}.md")),
        out.join(format!("{name}.json")),
    );
    std::fs::write(&md_path, md).with_context(|| format!("write {}", md_path.display()))?;
    std::fs::write(&json_path, serde_json::to_vec_pretty(json)?)
        .with_context(|| format!("write {}", json_path.display()))?;
    eprintln!("wrote {} and {}", md_path.display(), json_path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::fio::{Measured, Pattern};
    use super::*;

    fn run(target: &str, round: usize, mib: f64) -> Run {
        Run {
            target: target.into(),
            case: CASE,
            round,
            result: Ok(Sample {
                fio: Measured {
                    bytes: 1 << 30,
                    mib_per_s: mib,
                    iops: mib,
                    p99_us: 10.0,
                    fio_cpu_s: 1.0,
                },
                server_cpu_s: 1.0,
            }),
        }
    }

    const CASE: Case = Case {
        pattern: Pattern::SeqRead,
        jobs: 1,
        direct: true,
    };

    fn target(name: &str) -> Target {
        Target {
            name: name.into(),
            path: "/x".into(),
            procs: vec![],
        }
    }

    #[test]
    fn ratios_are_of_medians_over_rounds() {
        let runs = vec![
            run("base", 0, 100.0),
            run("base", 1, 300.0),
            run("base", 2, 200.0),
            run("dpufs", 0, 50.0),
            run("dpufs", 1, 1000.0),
            run("dpufs", 2, 150.0),
        ];
        let rows = rows(&[target("dpufs"), target("base")], "base", &[CASE], &runs);
        assert_eq!(rows[0].mib_per_s, 150.0);
        assert_eq!(rows[0].ratio, Some(0.75));
        assert_eq!(rows[0].cpu_s_per_gib, 2.0);
        assert_eq!(rows[1].ratio, Some(1.0));
    }

    #[test]
    fn a_target_that_cannot_run_a_case_says_why() {
        let mut runs = vec![run("base", 0, 100.0)];
        runs.push(Run {
            result: Err("fio failed: O_DIRECT: Invalid argument".into()),
            ..run("peer", 0, 0.0)
        });
        let rows = rows(&[target("peer"), target("base")], "base", &[CASE], &runs);
        let md = markdown("p", "base", &rows);
        assert!(md.contains("n/a: fio failed: O_DIRECT"), "{md}");
    }
}
