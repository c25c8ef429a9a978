//! DAOS's ranged rank-list strings (`"[0-3,5]"`, gurt's `d_rank_range_list_str`).

/// Formats ranks as DAOS does: sorted, deduplicated, runs collapsed, in brackets.
pub fn format_ranks(ranks: &[u32]) -> String {
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    format!("[{}]", parts.join(","))
}

/// Most ranks one string may name. A DAOS system has far fewer; the bound keeps a request
/// naming `0-4000000000` from costing 16 GB and minutes to expand (found by the
/// `mgmt_request` fuzz target).
pub const MAX_RANKS: usize = 1 << 16;

/// Parses a ranged rank string, with or without brackets. Empty input is no ranks; more
/// than [`MAX_RANKS`] ranks is not a rank list.
pub fn parse_ranks(s: &str) -> Option<Vec<u32>> {
    let inner = s
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim();
    if inner.is_empty() {
        return Some(Vec::new());
    }
    let mut out = Vec::new();
    for part in inner.split(',') {
        let (first, last): (u32, u32) = match part.trim().split_once('-') {
            Some((a, b)) => (a.trim().parse().ok()?, b.trim().parse().ok()?),
            None => {
                let rank = part.trim().parse().ok()?;
                (rank, rank)
            }
        };
        // Checked before expanding: `out` never holds more than MAX_RANKS.
        if first > last || (last - first) as usize >= MAX_RANKS - out.len() {
            return None;
        }
        out.extend(first..=last);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_runs() {
        assert_eq!(format_ranks(&[5, 0, 1, 2, 3]), "[0-3,5]");
        assert_eq!(format_ranks(&[]), "[]");
        assert_eq!(format_ranks(&[7]), "[7]");
    }

    #[test]
    fn parses_what_it_formats() {
        for ranks in [vec![0, 1, 2, 3, 5], vec![], vec![2, 4, 6, 7]] {
            assert_eq!(parse_ranks(&format_ranks(&ranks)), Some(ranks));
        }
        assert_eq!(parse_ranks("3-1"), None);
        assert_eq!(parse_ranks("[x]"), None);
    }

    #[test]
    fn a_list_naming_more_than_max_ranks_is_refused_without_expanding_it() {
        let last = MAX_RANKS as u32 - 1;
        assert_eq!(
            parse_ranks(&format!("0-{last}")).map(|r| r.len()),
            Some(MAX_RANKS)
        );
        assert_eq!(parse_ranks(&format!("0-{}", last + 1)), None);
        assert_eq!(parse_ranks("000-4000000000"), None);
        assert_eq!(parse_ranks(&format!("0-{last},{}", last + 1)), None);
    }
}
