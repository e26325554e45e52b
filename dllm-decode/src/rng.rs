//! The project's own small PRNG: xoshiro256** seeded through SplitMix64.
//!
//! Everything that must be reproducible across machines and crate versions (the task
//! suite, the held-out split, training data order, the decoders' Gumbel noise) draws from
//! this generator instead of `rand`, whose value streams are allowed to change between
//! releases. The algorithms are fixed by their published reference implementations
//! (<https://prng.di.unimi.it/>), and the derived helpers (`below`, `f64`, `shuffle`, ...)
//! are part of the project's stability contract: **for a given seed, every method returns the
//! same values in every version**. Tests pin known outputs; changing any of
//! them changes the suite and invalidates trained checkpoints, so don't.

/// One step of SplitMix64: advances `state` and returns the next output.
///
/// Used to expand a single `u64` seed into xoshiro's 256-bit state, as its authors
/// recommend, so that nearby seeds (0, 1, 2, ...) give unrelated streams.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xoshiro256** generator. Small, fast, statistically strong enough for data
/// generation and sampling noise; not cryptographic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator seeded from one `u64` (state expanded with SplitMix64).
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Self { s }
    }

    /// A generator for an independent sub-stream `stream` of `seed`, e.g. one per data-loader
    /// worker or per task, without the streams overlapping in practice.
    pub fn with_stream(seed: u64, stream: u64) -> Self {
        // Mix the stream id through SplitMix64 first so that (seed, stream) pairs such as
        // (1, 0) and (0, 1) do not collide.
        let mut sm = stream ^ 0x6A09_E667_F3BC_C909;
        let mixed = splitmix64(&mut sm);
        Self::new(seed ^ mixed)
    }

    /// Rebuilds a generator from a state returned by [`Rng::state`] (checkpoint resume).
    ///
    /// The all-zero state is a fixed point of xoshiro; it is replaced by the state of
    /// `Rng::new(0)` so a corrupted checkpoint cannot yield a constant stream.
    pub fn from_state(s: [u64; 4]) -> Self {
        if s == [0; 4] {
            return Self::new(0);
        }
        Self { s }
    }

    /// The full internal state, for checkpointing.
    pub fn state(&self) -> [u64; 4] {
        self.s
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Next 32 random bits (the high half of [`Rng::next_u64`], the better-mixed half).
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// A uniform integer in `0..n`, without modulo bias (Lemire's multiply-and-reject).
    ///
    /// # Panics
    /// If `n == 0`: the range is empty, which is a bug in the caller.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below(0): empty range");
        let mut m = (self.next_u64() as u128) * (n as u128);
        let mut low = m as u64;
        if low < n {
            // Reject the values that would make some outputs one count more likely.
            let threshold = n.wrapping_neg() % n;
            while low < threshold {
                m = (self.next_u64() as u128) * (n as u128);
                low = m as u64;
            }
        }
        (m >> 64) as u64
    }

    /// A uniform index in `0..n` (see [`Rng::below`]).
    ///
    /// # Panics
    /// If `n == 0`.
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// A uniform `f64` in `[0, 1)` with 53 bits of precision.
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform `f32` in `[0, 1)` with 24 bits of precision.
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// A uniform `f64` in the open interval `(0, 1)`: safe to take `ln` of, e.g. for Gumbel
    /// noise `-ln(-ln(u))`.
    pub fn f64_open(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
    }

    /// A standard Gumbel(0, 1) sample, `-ln(-ln(u))` with `u` in `(0, 1)`.
    pub fn gumbel(&mut self) -> f64 {
        -(-self.f64_open().ln()).ln()
    }

    /// A standard normal sample (Box–Muller; one of the pair is discarded so that the
    /// stream position does not depend on call history).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.f64_open();
        let u2 = self.f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// `true` with probability `p` (clamped to `[0, 1]`).
    pub fn bernoulli(&mut self, p: f64) -> bool {
        self.f64() < p
    }

    /// Shuffles `items` in place (Fisher–Yates, walking down from the end).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.index(i + 1);
            items.swap(i, j);
        }
    }

    /// A uniformly chosen element, or `None` if `items` is empty.
    pub fn choose<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            None
        } else {
            Some(&items[self.index(items.len())])
        }
    }

    /// `k` distinct indices from `0..n`, in random order (partial Fisher–Yates).
    /// Returns fewer than `k` if `n < k`.
    pub fn sample_indices(&mut self, n: usize, k: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..n).collect();
        let k = k.min(n);
        for i in 0..k {
            let j = i + self.index(n - i);
            all.swap(i, j);
        }
        all.truncate(k);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_reference() {
        // First outputs of the reference splitmix64.c seeded with 0.
        let mut s = 0u64;
        assert_eq!(splitmix64(&mut s), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(&mut s), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(splitmix64(&mut s), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn xoshiro256starstar_matches_reference() {
        // Reference xoshiro256starstar.c from state {1, 2, 3, 4}.
        let mut r = Rng::from_state([1, 2, 3, 4]);
        let expected = [
            11520u64,
            0,
            1509978240,
            1215971899390074240,
            1216172134540287360,
            607988272756665600,
            16172922978634559625,
            8476171486693032832,
            10595114339597558777,
            2904607092377533576,
        ];
        for e in expected {
            assert_eq!(r.next_u64(), e);
        }
    }

    #[test]
    fn seeded_outputs_are_pinned() {
        // Pins the seeding path and derived helpers: changing these changes the suite.
        let mut r = Rng::new(42);
        let got: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(got, PINNED_SEED42);
        let mut r = Rng::new(7);
        let below: Vec<u64> = (0..8).map(|_| r.below(10)).collect();
        assert_eq!(below, PINNED_BELOW10_SEED7);
        let mut v: Vec<u32> = (0..8).collect();
        Rng::new(3).shuffle(&mut v);
        assert_eq!(v, PINNED_SHUFFLE_SEED3);
    }

    // Computed with an independent Python transcription of the reference algorithms.
    const PINNED_SEED42: [u64; 3] = [
        1546998764402558742,
        6990951692964543102,
        12544586762248559009,
    ];
    const PINNED_BELOW10_SEED7: [u64; 8] = [7, 2, 8, 9, 9, 8, 0, 1];
    const PINNED_SHUFFLE_SEED3: [u32; 8] = [6, 0, 3, 7, 2, 1, 4, 5];

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut r = Rng::new(1);
        let mut counts = [0u32; 7];
        for _ in 0..70_000 {
            let x = r.below(7);
            counts[x as usize] += 1;
        }
        for c in counts {
            assert!((9_500..10_500).contains(&c), "counts {counts:?}");
        }
        // Edge cases: n = 1 always 0; n = u64::MAX exercises the rejection threshold.
        assert_eq!(r.below(1), 0);
        assert!(r.below(u64::MAX) < u64::MAX);
    }

    #[test]
    fn floats_are_in_unit_interval() {
        let mut r = Rng::new(5);
        let mut sum = 0.0;
        for _ in 0..10_000 {
            let a = r.f64();
            let b = r.f32();
            let c = r.f64_open();
            assert!((0.0..1.0).contains(&a));
            assert!((0.0..1.0).contains(&b));
            assert!(c > 0.0 && c < 1.0);
            assert!(r.gumbel().is_finite());
            sum += a;
        }
        let mean = sum / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut r = Rng::new(11);
        let n = 20_000;
        let xs: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "var {var}");
    }

    #[test]
    fn shuffle_is_a_permutation_and_choose_handles_empty() {
        let mut r = Rng::new(9);
        let mut v: Vec<u32> = (0..50).collect();
        r.shuffle(&mut v);
        assert_ne!(v, (0..50).collect::<Vec<_>>());
        let mut sorted = v.clone();
        sorted.sort();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        let empty: [u8; 0] = [];
        assert_eq!(r.choose(&empty), None);
        assert!(r.choose(&[1, 2, 3]).is_some());
        let idx = r.sample_indices(10, 4);
        assert_eq!(idx.len(), 4);
        let mut d = idx.clone();
        d.sort();
        d.dedup();
        assert_eq!(d.len(), 4);
        assert_eq!(r.sample_indices(2, 5).len(), 2);
    }

    #[test]
    fn streams_and_state_round_trip() {
        let a: Vec<u64> = {
            let mut r = Rng::with_stream(1, 0);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::with_stream(0, 1);
            (0..4).map(|_| r.next_u64()).collect()
        };
        assert_ne!(a, b);
        let mut r = Rng::new(3);
        r.next_u64();
        let mut resumed = Rng::from_state(r.state());
        assert_eq!(r.next_u64(), resumed.next_u64());
        assert_eq!(Rng::from_state([0; 4]), Rng::new(0));
    }
}
