//! How results and errors reach the user: aligned plain-text tables and
//! fields for people, JSON for scripts (`--json`), and errors with a hint on
//! what to do next.

use dpufs_daos::DaosError;
use serde::Serialize;

/// Where a command's result goes: JSON or text.
#[derive(Debug, Clone, Copy)]
pub struct Out {
    pub json: bool,
}

impl Out {
    /// Prints `value` as JSON with `--json`, else calls `human` to print it.
    pub fn show<T: Serialize + ?Sized>(
        &self,
        value: &T,
        human: impl FnOnce(&T),
    ) -> anyhow::Result<()> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(value)?);
        } else {
            human(value);
        }
        Ok(())
    }
}

/// A plain-text table: columns padded to their widest cell, a dashed rule
/// under the header, nothing else (so `awk`/`cut` still work on it).
#[derive(Debug, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with the given column titles.
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// A header-less two-column table of `name: value` fields.
    pub fn fields<S: Into<String>>(fields: impl IntoIterator<Item = (&'static str, S)>) -> Table {
        let mut t = Table::default();
        for (name, value) in fields {
            t.row([format!("{name}:"), value.into()]);
        }
        t
    }

    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// The table as text, one line per row; the last column is not padded.
    pub fn render(&self) -> String {
        let lines = std::iter::once(&self.header)
            .filter(|h| !h.is_empty())
            .chain(&self.rows);
        let mut widths: Vec<usize> = Vec::new();
        for line in lines.clone() {
            for (i, cell) in line.iter().enumerate() {
                let w = cell.chars().count();
                match widths.get_mut(i) {
                    Some(max) => *max = (*max).max(w),
                    None => widths.push(w),
                }
            }
        }
        let render_line = |cells: &[String]| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            padded.join("  ").trim_end().to_string() + "\n"
        };
        let mut out = String::new();
        if !self.header.is_empty() {
            out += &render_line(&self.header);
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            out += &render_line(&rule);
        }
        for row in &self.rows {
            out += &render_line(row);
        }
        out
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// Bytes in binary units with one decimal: `512 B`, `1.0 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    // Compared with what one decimal rounds to, so 1 GiB - 1 reads `1.0 GiB`.
    while value >= 1023.95 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A rank list in DAOS's ranged form, `[0-3,5]`.
pub fn ranks(ranks: &[u32]) -> String {
    dpufs_proto::daos::ranks::format_ranks(ranks)
}

/// Seconds since the epoch as UTC `YYYY-MM-DD HH:MM:SSZ` (0 reads `-`).
pub fn utc_time(unix: u64) -> String {
    if unix == 0 {
        return "-".into();
    }
    let (days, secs) = (unix / 86_400, unix % 86_400);
    // Days to civil date (Howard Hinnant's algorithm), for dates after 1970.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Prints a failed command's error and, for DAOS errors, what to do about it.
pub fn print_error(err: &anyhow::Error, endpoint: &str) {
    eprintln!("error: {err:#}");
    let daos = err.chain().find_map(|e| e.downcast_ref::<DaosError>());
    if let Some(hint) = daos.and_then(|e| hint(e, endpoint)) {
        eprintln!("hint: {hint}");
    }
}

/// The next step for the common kinds of DAOS error. Faults carry DAOS's own
/// resolution in their text already, so they get none here.
fn hint(err: &DaosError, endpoint: &str) -> Option<String> {
    Some(match err {
        DaosError::NotFound { .. } => {
            "check the name or UUID: `dpufs pool list` lists pools, `dpufs cont list POOL` containers".into()
        }
        DaosError::Unreachable { .. } => format!(
            "is `dpufs up` (or a dpufs-engine / DAOS server) running? dpufs used --endpoint {endpoint}"
        ),
        DaosError::Incompatible { .. } => format!(
            "dpufs speaks DAOS {}: point it at servers of one of those releases",
            dpufs_daos::Wire::supported()
        ),
        DaosError::Invalid { .. } => {
            "correct the value the error names; `--help` shows the accepted forms".into()
        }
        DaosError::Exists { .. } => "choose another label, or use the existing one".into(),
        DaosError::NoSpace { .. } => {
            "ask for less (--size), or destroy what is no longer needed (`dpufs pool list`)".into()
        }
        DaosError::PermissionDenied { .. } => {
            "read-only and create-only properties cannot be changed; otherwise check the ACL (get-acl)"
                .into()
        }
        DaosError::Config(_) => "--endpoint takes HOST:PORT or unix:/PATH".into(),
        DaosError::Timeout(_, inner) => return hint(inner, endpoint),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let mut t = Table::new(&["Rank", "State"]);
        t.row(["0", "Joined"]);
        t.row(["10", "Stopped"]);
        assert_eq!(
            t.render(),
            "Rank  State\n----  -------\n0     Joined\n10    Stopped\n"
        );
        let f = Table::fields([("UUID", "u"), ("Leader", "0")]);
        assert_eq!(f.render(), "UUID:    u\nLeader:  0\n");
    }

    #[test]
    fn sizes_in_binary_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(1 << 30), "1.0 GiB");
        assert_eq!(bytes((1 << 30) - 1), "1.0 GiB");
        assert_eq!(bytes(1000 << 20), "1000.0 MiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
        assert_eq!(bytes(u64::MAX), "16.0 EiB");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_time(0), "-");
        assert_eq!(utc_time(86_399), "1970-01-01 23:59:59Z");
        assert_eq!(utc_time(951_782_400), "2000-02-29 00:00:00Z");
        assert_eq!(utc_time(1_735_689_600), "2025-01-01 00:00:00Z");
    }

    #[test]
    fn hints_for_common_errors() {
        let not_found = DaosError::NotFound {
            message: "x".into(),
            der: None,
        };
        assert!(hint(&not_found, "e").unwrap().contains("dpufs pool list"));
        let unreachable = DaosError::Unreachable {
            endpoints: "e".into(),
            cause: "refused".into(),
        };
        let timeout = DaosError::Timeout(std::time::Duration::from_secs(1), Box::new(unreachable));
        assert!(
            hint(&timeout, "127.0.0.1:9")
                .unwrap()
                .contains("127.0.0.1:9")
        );
        let fault = DaosError::Fault {
            code: 609,
            domain: "pool".into(),
            description: "d".into(),
            resolution: "r".into(),
        };
        assert_eq!(hint(&fault, "e"), None);
    }
}
