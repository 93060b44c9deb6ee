//! A keyed bijection on `[0, n)` that needs O(1) memory: a balanced Feistel
//! network over the smallest even number of bits covering `n`, with cycle
//! walking to stay inside `[0, n)`.
//!
//! Because the domain is at most 4n, cycle walking takes fewer than four
//! rounds of the network on average, so `apply` costs a few dozen
//! nanoseconds whatever `n` is — no shuffle index is ever materialized.

/// Feistel rounds. Four make a pseudo-random permutation from a
/// pseudo-random round function (Luby–Rackoff); six leave margin for the
/// statistical tests samplers are judged by.
const ROUNDS: usize = 6;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyedPermutation {
    n: u64,
    half_bits: u32,
    keys: [u64; ROUNDS],
}

/// SplitMix64's finalizer: a fast 64-bit mixer with full avalanche.
pub(crate) fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl KeyedPermutation {
    /// The permutation of `[0, n)` for `key` (`n >= 1`).
    pub fn new(n: u64, key: u64) -> Self {
        assert!(n >= 1, "a permutation needs a non-empty domain");
        let bits = 64 - (n - 1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let mut keys = [0u64; ROUNDS];
        let mut state = key;
        for k in &mut keys {
            state = mix64(state);
            *k = state;
        }
        Self { n, half_bits, keys }
    }

    pub fn len(&self) -> u64 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn round_trip(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for key in &self.keys {
            let f = mix64(right ^ key) & mask;
            (left, right) = (right, left ^ f);
        }
        (left << self.half_bits) | right
    }

    /// Where `index` goes: a value in `[0, n)`, distinct for distinct
    /// indices.
    pub fn apply(&self, index: u64) -> u64 {
        assert!(index < self.n, "index {index} outside [0, {})", self.n);
        let mut x = index;
        loop {
            x = self.round_trip(x);
            if x < self.n {
                return x;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_bijection(n: u64, key: u64) {
        let perm = KeyedPermutation::new(n, key);
        let mut seen = vec![0u64; (n as usize).div_ceil(64)];
        for i in 0..n {
            let v = perm.apply(i);
            assert!(v < n, "{v} outside [0, {n})");
            let (word, bit) = ((v / 64) as usize, v % 64);
            assert_eq!(seen[word] & (1 << bit), 0, "n = {n}: {v} hit twice");
            seen[word] |= 1 << bit;
        }
    }

    /// Every value exactly once, for the sizes the sampler must handle:
    /// tiny, around powers of two, and a prime near 10^7.
    #[test]
    fn is_a_permutation() {
        for n in [1, 2, 3, 1000, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 9_999_991] {
            assert_bijection(n, 0xdead_beef ^ n);
        }
    }

    /// No key leaves a sizeable domain in order.
    #[test]
    fn never_the_identity() {
        for key in 0..200 {
            let perm = KeyedPermutation::new(10_000, key);
            let fixed = (0..10_000).filter(|&i| perm.apply(i) == i).count();
            assert!(fixed < 20, "key {key} fixes {fixed} of 10000 points");
        }
    }
}
