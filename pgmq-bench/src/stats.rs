//! Small statistics: median and range of repeated runs, percentiles of
//! samples and histograms, and a least-squares slope.

use hdrhistogram::Histogram;

use serde::{Deserialize, Serialize};

/// A latency distribution, milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Percentiles {
    /// How many values.
    pub samples: u64,
    /// Smallest.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// The median and 99th percentile of one interval's values.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct IntervalPercentiles {
    /// How many values.
    pub samples: u64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// Median, minimum and maximum of `values` (NaN-free); `None` when empty.
///
/// The median of an even count is the mean of the two middle values.
///
/// ```
/// let s = pgmq_bench::stats::median_min_max(&[3.0, 1.0, 2.0, 10.0]).unwrap();
/// assert_eq!(s, (2.5, 1.0, 10.0));
/// ```
pub fn median_min_max(values: &[f64]) -> Option<(f64, f64, f64)> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some((median, v[0], v[n - 1]))
}

/// The nearest-rank percentile `p` (0..=100) of sorted `values`.
fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// p50/p95/p99/max (and min, mean) of raw samples, nearest-rank.
///
/// ```
/// let p = pgmq_bench::stats::percentiles_of(&(1..=100).map(f64::from).collect::<Vec<_>>()).unwrap();
/// assert_eq!((p.p50, p.p95, p.p99, p.max), (50.0, 95.0, 99.0, 100.0));
/// ```
pub fn percentiles_of(values: &[f64]) -> Option<Percentiles> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    Some(Percentiles {
        samples: v.len() as u64,
        min: v[0],
        mean: v.iter().sum::<f64>() / v.len() as f64,
        p50: nearest_rank(&v, 50.0),
        p95: nearest_rank(&v, 95.0),
        p99: nearest_rank(&v, 99.0),
        max: v[v.len() - 1],
    })
}

/// Percentiles of a microsecond histogram, reported in milliseconds.
pub fn percentiles_us_to_ms(h: &Histogram<u64>) -> Percentiles {
    let ms = |us: u64| us as f64 / 1000.0;
    if h.is_empty() {
        return Percentiles::default();
    }
    Percentiles {
        samples: h.len(),
        min: ms(h.min()),
        mean: h.mean() / 1000.0,
        p50: ms(h.value_at_quantile(0.50)),
        p95: ms(h.value_at_quantile(0.95)),
        p99: ms(h.value_at_quantile(0.99)),
        max: ms(h.max()),
    }
}

/// A histogram of microseconds up to one day, two significant digits (as
/// the worker's own).
pub fn us_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 86_400_000_000, 2).expect("static histogram bounds are valid")
}

/// The median and 99th percentile of `h` (microseconds) in milliseconds;
/// None when it is empty.
///
/// ```
/// let mut h = pgmq_bench::stats::us_histogram();
/// for v in 1..=100u64 { h.record(v * 1000).unwrap(); }
/// let p = pgmq_bench::stats::interval_percentiles_ms(&h).unwrap();
/// assert_eq!(p.samples, 100);
/// assert!((p.p50 - 50.0).abs() < 0.5 && (p.p99 - 99.0).abs() < 1.0);
/// assert!(pgmq_bench::stats::interval_percentiles_ms(&pgmq_bench::stats::us_histogram()).is_none());
/// ```
pub fn interval_percentiles_ms(h: &Histogram<u64>) -> Option<IntervalPercentiles> {
    (!h.is_empty()).then(|| IntervalPercentiles {
        samples: h.len(),
        p50: h.value_at_quantile(0.50) as f64 / 1000.0,
        p99: h.value_at_quantile(0.99) as f64 / 1000.0,
    })
}

/// `now - before` of two snapshots of one cumulative histogram: the values
/// recorded in between (empty if `before` is not an earlier state of `now`).
pub fn histogram_delta(now: &Histogram<u64>, before: &Histogram<u64>) -> Histogram<u64> {
    let mut d = now.clone();
    if d.subtract(before).is_err() {
        d.reset();
    }
    d
}

/// Ordinary least-squares slope of `y` over `x` and its standard error
/// (from the residuals, as if they were independent); `None` with fewer than
/// three points or fewer than two distinct `x`.
///
/// ```
/// let (s, se) = pgmq_bench::stats::least_squares_fit(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]).unwrap();
/// assert!((s - 2.0).abs() < 1e-12 && se.abs() < 1e-12);
/// ```
pub fn least_squares_fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    if points.len() < 3 {
        return None;
    }
    let n = points.len() as f64;
    let slope = least_squares_slope(points)?;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let rss: f64 = points
        .iter()
        .map(|p| {
            let r = p.1 - (my + slope * (p.0 - mx));
            r * r
        })
        .sum();
    Some((slope, (rss / (n - 2.0) / sxx).sqrt()))
}

/// Ordinary least-squares slope of `y` over `x`; `None` with fewer than two
/// distinct `x`.
///
/// ```
/// let s = pgmq_bench::stats::least_squares_slope(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]).unwrap();
/// assert!((s - 2.0).abs() < 1e-12);
/// ```
pub fn least_squares_slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    Some(sxy / sxx)
}

/// The result of a two-sided Mann-Whitney U test (Wilcoxon rank-sum).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct MannWhitney {
    /// U of the first sample: pairs (a, b) with a > b, ties counting one half.
    pub u: f64,
    /// Two-sided p-value.
    pub p_value: f64,
    /// Whether `p_value` is exact (no ties, n1 * n2 at most 400) or from the
    /// normal approximation with tie and continuity corrections.
    pub exact: bool,
}

/// Two-sided Mann-Whitney U test of `a` against `b`; `None` when either is empty.
///
/// Exact (the permutation distribution of U, counted by dynamic programming)
/// when there are no ties and the samples are small; otherwise the normal
/// approximation with tie correction and continuity correction.
///
/// ```
/// let t = pgmq_bench::stats::mann_whitney(&[10.0, 11.0, 12.0, 13.0, 14.0], &[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
/// assert_eq!(t.u, 25.0);
/// assert!(t.exact && (t.p_value - 2.0 / 252.0).abs() < 1e-12);
/// ```
pub fn mann_whitney(a: &[f64], b: &[f64]) -> Option<MannWhitney> {
    let (n1, n2) = (a.len(), b.len());
    if n1 == 0 || n2 == 0 {
        return None;
    }
    let mut u: f64 = 0.0;
    let mut ties = false;
    for x in a {
        for y in b {
            if x > y {
                u += 1.0;
            } else if x == y {
                u += 0.5;
                ties = true;
            }
        }
    }
    let m = (n1 * n2) as f64;
    if !ties && n1 * n2 <= 400 {
        // counts[k][u]: arrangements of k items of `a` among the first items
        // with statistic u; built item by item (the classic recurrence).
        let dist = u_distribution(n1, n2);
        let total: f64 = dist.iter().sum();
        let lo = u.min(m - u) as usize;
        let tail: f64 = dist[..=lo].iter().sum::<f64>() / total;
        return Some(MannWhitney {
            u,
            p_value: (2.0 * tail).min(1.0),
            exact: true,
        });
    }
    // Normal approximation with tie correction.
    let mut all: Vec<f64> = a.iter().chain(b.iter()).copied().collect();
    all.sort_by(f64::total_cmp);
    let n = (n1 + n2) as f64;
    let mut tie_term = 0.0;
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j + 1 < all.len() && all[j + 1] == all[i] {
            j += 1;
        }
        let t = (j - i + 1) as f64;
        tie_term += t * t * t - t;
        i = j + 1;
    }
    let mean = m / 2.0;
    let var = m / 12.0 * ((n + 1.0) - tie_term / (n * (n - 1.0)));
    if var <= 0.0 {
        return Some(MannWhitney {
            u,
            p_value: 1.0,
            exact: false,
        });
    }
    let z = ((u - mean).abs() - 0.5).max(0.0) / var.sqrt();
    Some(MannWhitney {
        u,
        p_value: (2.0 * normal_upper_tail(z)).min(1.0),
        exact: false,
    })
}

/// The number of arrangements giving each U = 0..=n1*n2, with no ties.
fn u_distribution(n1: usize, n2: usize) -> Vec<f64> {
    // f[i][j][u]: arrangements of i items of one sample and j of the other.
    // Recurrence: f(i, j, u) = f(i-1, j, u-j) + f(i, j-1, u).
    let max = n1 * n2;
    let mut prev: Vec<Vec<f64>> = vec![vec![0.0; max + 1]; n2 + 1];
    for row in prev.iter_mut() {
        row[0] = 1.0; // i = 0: one arrangement, U = 0
    }
    for _i in 1..=n1 {
        let mut cur: Vec<Vec<f64>> = vec![vec![0.0; max + 1]; n2 + 1];
        cur[0][0] = 1.0;
        for j in 1..=n2 {
            for u in 0..=max {
                let mut v = cur[j - 1][u];
                if u >= j {
                    v += prev[j][u - j];
                }
                cur[j][u] = v;
            }
        }
        prev = cur;
    }
    prev.swap_remove(n2)
}

/// P(Z > z) for a standard normal Z (Abramowitz and Stegun 7.1.26, error below 1.5e-7).
fn normal_upper_tail(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erfc = poly * (-x * x).exp();
    0.5 * erfc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median_min_max(&[]), None);
        assert_eq!(median_min_max(&[5.0]), Some((5.0, 5.0, 5.0)));
        assert_eq!(median_min_max(&[5.0, 1.0, 3.0]), Some((3.0, 1.0, 5.0)));
    }

    #[test]
    fn percentiles_small_sets() {
        let p = percentiles_of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(p.p50, 2.0);
        assert_eq!(p.p99, 4.0);
        assert_eq!(p.min, 1.0);
        assert_eq!(p.samples, 4);
        assert!(percentiles_of(&[]).is_none());
    }

    #[test]
    fn histogram_in_ms() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for us in 1..=1000u64 {
            h.record(us).unwrap();
        }
        let p = percentiles_us_to_ms(&h);
        assert_eq!(p.samples, 1000);
        assert!((p.p50 - 0.5).abs() < 0.001, "{}", p.p50);
        assert!((p.max - 1.0).abs() < 0.001);
    }

    #[test]
    fn mann_whitney_exact_and_approximate() {
        // n1 = n2 = 3, complete separation: p = 2 / C(6, 3) = 0.1.
        let t = mann_whitney(&[4.0, 5.0, 6.0], &[1.0, 2.0, 3.0]).unwrap();
        assert!((t.p_value - 0.1).abs() < 1e-12, "{t:?}");
        // One overlap at 5 + 5: U = 24 (or 1), p = 2 * 2 / 252.
        let t = mann_whitney(&[10.0, 11.0, 12.0, 13.0, 2.5], &[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        assert_eq!(t.u, 22.0);
        let same = mann_whitney(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]).unwrap();
        assert!(!same.exact && same.p_value > 0.9, "{same:?}");
        assert!((normal_upper_tail(1.959_964) - 0.025).abs() < 1e-6);
        // Large and separated: the approximation agrees.
        let a: Vec<f64> = (0..30).map(|i| 100.0 + f64::from(i)).collect();
        let b: Vec<f64> = (0..30).map(f64::from).collect();
        assert!(mann_whitney(&a, &b).unwrap().p_value < 1e-6);
        assert!(mann_whitney(&[], &b).is_none());
    }

    #[test]
    fn slopes() {
        assert_eq!(least_squares_slope(&[(1.0, 1.0)]), None);
        assert_eq!(least_squares_slope(&[(1.0, 1.0), (1.0, 2.0)]), None);
        let flat = least_squares_slope(&[(0.0, 7.0), (1.0, 7.0), (2.0, 7.0)]).unwrap();
        assert_eq!(flat, 0.0);
    }
}
