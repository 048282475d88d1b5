//! Small statistics: median and range of repeated runs, percentiles of
//! samples and histograms, and a least-squares slope.

use hdrhistogram::Histogram;

use crate::document::Percentiles;

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
    fn slopes() {
        assert_eq!(least_squares_slope(&[(1.0, 1.0)]), None);
        assert_eq!(least_squares_slope(&[(1.0, 1.0), (1.0, 2.0)]), None);
        let flat = least_squares_slope(&[(0.0, 7.0), (1.0, 7.0), (2.0, 7.0)]).unwrap();
        assert_eq!(flat, 0.0);
    }
}
