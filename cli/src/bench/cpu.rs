//! CPU time of the processes that serve a target (FUSE daemon, engine, chunk servers), read
//! from /proc so peers are charged the same way as dpufs; and of the benchmark's own work
//! (its threads and the tools it runs), from getrusage.

use std::collections::HashMap;

/// Clock ticks per second of /proc/PID/stat times.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// (command name, user + system ticks) from the text of /proc/PID/stat.
fn parse_stat(stat: &str) -> Option<(&str, u64)> {
    // The name is in parentheses and may itself hold spaces or parentheses.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = &stat[open + 1..close];
    let mut fields = stat[close + 1..].split_whitespace();
    // After the name: state is field 3; utime and stime are fields 14 and 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((name, utime + stime))
}

/// CPU seconds so far of every live process whose command name is in `names`, by pid.
pub fn snapshot(names: &[String]) -> HashMap<u32, f64> {
    let mut out = HashMap::new();
    if names.is_empty() {
        return out;
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    let tps = ticks_per_second();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // `comm` first: reading `stat` of an unrelated process can block while that process
        // is stuck exiting (e.g. a FUSE client whose server died), so touch only ours.
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else {
            continue;
        };
        if !names.iter().any(|n| n == comm.trim_end()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some((_, ticks)) = parse_stat(&stat) {
            out.insert(pid, ticks as f64 / tps);
        }
    }
    out
}

/// CPU seconds spent between two snapshots (processes that started in between count whole).
pub fn spent(before: &HashMap<u32, f64>, after: &HashMap<u32, f64>) -> f64 {
    after
        .iter()
        .map(|(pid, t)| t - before.get(pid).copied().unwrap_or(0.0))
        .filter(|d| *d > 0.0)
        // Not sum(): the sum of nothing is -0.0, which reports read as "-0.0 s".
        .fold(0.0, |total, d| total + d)
}

/// User + system seconds of `who` per getrusage(2).
fn rusage_s(who: libc::c_int) -> f64 {
    // SAFETY: rusage is plain integers, for which all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: usage is a valid rusage to write into. getrusage fails only for an unknown `who`.
    if unsafe { libc::getrusage(who, &mut usage) } != 0 {
        return 0.0;
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// CPU seconds the calling thread has spent so far.
pub fn thread_s() -> f64 {
    rusage_s(libc::RUSAGE_THREAD)
}

/// CPU seconds of this process's children that have been waited for so far (the tools a
/// benchmark runs: std::process waits for them).
pub fn children_s() -> f64 {
    rusage_s(libc::RUSAGE_CHILDREN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_spaces_and_parentheses() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 5 0 0";
        assert_eq!(parse_stat(stat), Some(("a (b) c", 300)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn charges_this_process_for_its_own_work() {
        let me = parse_stat(&std::fs::read_to_string("/proc/self/stat").unwrap())
            .unwrap()
            .0
            .to_string();
        let names = vec![me];
        let before = snapshot(&names);
        // Burn 0.2 s of this process's CPU, however busy the machine is.
        let cpu_now = || {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: ts is a valid timespec to write into.
            unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
            ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
        };
        let start = cpu_now();
        let mut x = 0u64;
        while cpu_now() - start < 0.2 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = snapshot(&names);
        assert!(spent(&before, &after) >= 0.15, "{before:?} → {after:?}");
    }

    #[test]
    fn charges_the_tools_run_to_their_parent_once_waited_for() {
        let before = children_s();
        // A shell loop burns CPU in the child only.
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(status.success());
        assert!(children_s() > before, "{before} → {}", children_s());
    }

    #[test]
    fn a_thread_is_charged_for_its_own_work_only() {
        let busy = std::thread::spawn(|| {
            let start = thread_s();
            let mut x = 0u64;
            while thread_s() - start < 0.05 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        });
        busy.join().unwrap();
        // A thread that did nothing has spent next to nothing, however busy the process was.
        let idle = std::thread::spawn(thread_s).join().unwrap();
        assert!(idle < 0.05, "{idle}");
    }
}
