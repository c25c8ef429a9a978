//! Latency percentiles of a test's samples.

use std::time::Duration;

/// The 99th percentile (nearest rank) of `sorted`, ascending; zero for no samples.
pub fn p99(sorted: &[Duration]) -> Duration {
    let rank = (sorted.len() * 99).div_ceil(100);
    sorted
        .get(rank.saturating_sub(1))
        .copied()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_99th_percentile_is_the_nearest_rank() {
        let ms = |n: u64| Duration::from_millis(n);
        let hundred: Vec<_> = (1..=100).map(ms).collect();
        assert_eq!(p99(&hundred), ms(99));
        let ten: Vec<_> = (1..=10).map(ms).collect();
        assert_eq!(p99(&ten), ms(10));
        assert_eq!(p99(&[]), Duration::ZERO);
    }
}
