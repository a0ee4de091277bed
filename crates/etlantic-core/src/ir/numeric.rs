//! Numeric semantics every backend shares, where DTCS leaves a choice to the engine.

/// Beyond this magnitude a float has no fractional digits left to round.
const NO_FRACTION: f64 = 4_503_599_627_370_496.0; // 2^52

/// DTCS `round(x, digits)`, as ETLantic-py (Python's `round`) computes it: the exact
/// value of `x` to `digits` decimal places (a negative `digits` rounds to tens,
/// hundreds, …), **ties to even** — `round(2.5) = 2`, `round(-2.5) = -2`,
/// `round(2.25, 1) = 2.2`, `round(0.125, 2) = 0.12`, and `round(2.675, 2) = 2.67`
/// because the double nearest 2.675 lies below it. The DTCS specification is silent on
/// ties (the `dtcs` crate's reference runtime rounds them away from zero); ETLantic-py's
/// corpus fixes them to even, and every backend follows it.
///
/// Away from a tie, `x · 10^digits` rounded and scaled back is the answer (its error is
/// far below the distance to the tie); near one, Rust's formatting, which rounds the
/// exact binary value with ties to even as Python does, decides. NaN and infinities are
/// returned unchanged.
pub fn round_half_even(x: f64, digits: i64) -> f64 {
    if !x.is_finite() {
        return x;
    }
    let d = digits.clamp(-400, 400) as i32;
    if d >= 0 {
        let factor = 10f64.powi(d);
        let y = x * factor;
        if !y.is_finite() || y.abs() >= NO_FRACTION {
            return x;
        }
        if !near_tie(y) && d <= 22 {
            return y.round() / factor;
        }
        return format!("{:.*}", d as usize, x).parse().unwrap_or(x);
    }
    let factor = 10f64.powi(-d);
    if !factor.is_finite() {
        return 0.0 * x.signum();
    }
    let y = x / factor;
    if near_tie(y) && x.fract() == 0.0 && x.abs() < 9.0e18 && -d <= 18 {
        // An integer: decide the tie exactly in integer arithmetic.
        let (i, unit) = (x as i64, 10i64.pow((-d) as u32));
        let (q, r) = (i / unit, i % unit);
        let q = match (2 * r.abs()).cmp(&unit) {
            std::cmp::Ordering::Less => q,
            std::cmp::Ordering::Greater => q + r.signum(),
            std::cmp::Ordering::Equal if q % 2 == 0 => q,
            std::cmp::Ordering::Equal => q + r.signum(),
        };
        return (q * unit) as f64;
    }
    y.round_ties_even() * factor
}

/// Whether `y` is within rounding error of a half.
fn near_tie(y: f64) -> bool {
    let frac = (y - y.trunc()).abs();
    (frac - 0.5).abs() <= 1e-9 * y.abs().max(1.0)
}

#[cfg(test)]
mod tests {
    use super::round_half_even as r;

    #[test]
    fn ties_go_to_even_as_in_etlantic_py() {
        // The corpus' cases.
        assert_eq!(r(2.5, 0), 2.0);
        assert_eq!(r(-2.5, 0), -2.0);
        assert_eq!(r(3.5, 0), 4.0);
        assert_eq!(r(2.25, 1), 2.2);
        assert_eq!(r(3.6, 0), 4.0);
        // Python: round(0.125, 2) == 0.12, round(2.675, 2) == 2.67 (2.675 is below the
        // tie in binary), round(1250, -2) == 1200, round(1350, -2) == 1400.
        assert_eq!(r(0.125, 2), 0.12);
        assert_eq!(r(2.675, 2), 2.67);
        assert_eq!(r(1250.0, -2), 1200.0);
        assert_eq!(r(1350.0, -2), 1400.0);
        assert_eq!(r(-1250.0, -2), -1200.0);
        assert_eq!(r(1251.0, -2), 1300.0);
        assert_eq!(r(0.375, 2), 0.38);
        assert_eq!(r(1.005, 2), 1.0);
        assert_eq!(r(-1.5, 0), -2.0);
        assert_eq!(r(0.5, 0), 0.0);
        // Nothing left to round, or nothing to round to.
        assert_eq!(r(1e300, 5), 1e300);
        assert_eq!(r(0.1, 400), 0.1);
        assert_eq!(r(123.0, -400), 0.0);
        assert!(r(f64::NAN, 0).is_nan());
        assert_eq!(r(f64::INFINITY, 2), f64::INFINITY);
    }
}
