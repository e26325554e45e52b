//! The statistics of the speed/quality picture: a proportion's Wilson score interval and the exact
//! McNemar test of two decoders answered question by question on the same questions.

/// The two-sided 95% normal quantile.
pub const Z95: f64 = 1.959_963_984_540_054;

/// The Wilson score interval of `right` successes out of `n` at normal quantile `z` (95%:
/// [`Z95`]): `(p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)`, clamped to [0, 1]. Unlike
/// the normal interval it stays inside [0, 1] and is not empty at 0 or n. `None` for `n == 0`.
pub fn wilson(right: usize, n: usize, z: f64) -> Option<(f64, f64)> {
    if n == 0 || right > n {
        return None;
    }
    let (k, n) = (right as f64, n as f64);
    let p = k / n;
    let z2 = z * z;
    let d = 1.0 + z2 / n;
    let center = (p + z2 / (2.0 * n)) / d;
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / d;
    Some(((center - half).max(0.0), (center + half).min(1.0)))
}

/// McNemar's test of two decoders on the same questions: `b` questions only the first got right,
/// `c` only the second. Under the null hypothesis each of the `b + c` discordant questions goes
/// either way with probability 1/2, so the exact two-sided p-value is
/// `min(1, 2 · P(X <= min(b, c)))` for `X ~ Binomial(b + c, 1/2)` (1 when there is no discordant
/// question). The terms are summed in log space, so any `b + c` is fine.
pub fn mcnemar_exact(b: usize, c: usize) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    let k = b.min(c);
    // ln C(n, i) - n ln 2, term by term: C(n, i) = C(n, i - 1) (n - i + 1) / i.
    let mut ln_term = -(n as f64) * std::f64::consts::LN_2;
    let mut tail = ln_term.exp();
    for i in 1..=k {
        ln_term += ((n - i + 1) as f64).ln() - (i as f64).ln();
        tail += ln_term.exp();
    }
    (2.0 * tail).min(1.0)
}

/// The discordant pairs of `a` against `reference`, question by question: `(b, c)` with `b` the
/// questions `reference` got right and `a` wrong, `c` those `a` got right and `reference` wrong.
/// `None` when the two did not answer the same number of questions.
pub fn discordant(reference: &[bool], a: &[bool]) -> Option<(usize, usize)> {
    if reference.len() != a.len() {
        return None;
    }
    let b = reference.iter().zip(a).filter(|&(&r, &x)| r && !x).count();
    let c = reference.iter().zip(a).filter(|&(&r, &x)| !r && x).count();
    Some((b, c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn wilson_matches_hand_computed_intervals() {
        // 117/120: p = 0.975, denominator 1 + 3.8415/120 = 1.032012, centre 0.960266, half-width
        // 1.96 * sqrt(0.975 * 0.025 / 120 + 3.8415 / 57600) / 1.032012 = 0.031196.
        let (lo, hi) = wilson(117, 120, Z95).unwrap();
        assert!(close(lo, 0.929_069_966_672_133_9), "{lo}");
        assert!(close(hi, 0.991_461_825_230_097_8), "{hi}");
        // At the edges the interval is one-sided, never empty: 0/10 -> [0, 0.2775].
        let (lo, hi) = wilson(0, 10, Z95).unwrap();
        assert_eq!(lo, 0.0);
        assert!(close(hi, 0.277_532_799_862_889_2), "{hi}");
        let (lo, hi) = wilson(10, 10, Z95).unwrap();
        assert!(close(lo, 0.722_467_200_137_110_7) && hi <= 1.0, "{lo} {hi}");
        // Symmetric around 1/2 at 5/10.
        let (lo, hi) = wilson(5, 10, Z95).unwrap();
        assert!(
            close(lo + hi, 1.0) && close(lo, 0.236_593_090_512_564),
            "{lo}"
        );
        assert_eq!(wilson(0, 0, Z95), None);
        assert_eq!(wilson(3, 2, Z95), None);
    }

    #[test]
    fn mcnemar_matches_hand_computed_p_values() {
        // b = 1, c = 7: n = 8, P(X <= 1) = (1 + 8) / 256, two-sided 18 / 256 = 0.0703125.
        assert!(close(mcnemar_exact(1, 7), 0.070_312_5));
        assert!(close(mcnemar_exact(7, 1), 0.070_312_5));
        // 0 / 5: 2 / 32.
        assert!(close(mcnemar_exact(0, 5), 0.0625));
        // No discordant question, or a tie: no evidence either way.
        assert_eq!(mcnemar_exact(0, 0), 1.0);
        assert_eq!(mcnemar_exact(3, 3), 1.0);
        // Larger n (exact binomial sums, computed independently).
        assert!((mcnemar_exact(10, 25) - 0.016_673_847_800_120_71).abs() < 1e-12);
        assert!((mcnemar_exact(300, 340) - 0.123_101_130_721_967_67).abs() < 1e-9);
        // Far past f64's 2^-1074: still a probability, not NaN.
        let p = mcnemar_exact(0, 3000);
        assert!((0.0..=1.0).contains(&p));
    }

    #[test]
    fn discordant_pairs_are_counted_question_by_question() {
        let reference = [true, true, false, false, true];
        let a = [true, false, true, false, false];
        assert_eq!(discordant(&reference, &a), Some((2, 1)));
        assert_eq!(discordant(&reference, &a[..4]), None);
    }
}
