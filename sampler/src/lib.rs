//! Deterministic sampling without a shuffle index: sample `g` of the global
//! sequence is `perm_e(g mod m)` in epoch `e = g / m`, where `perm_e` is a
//! [`KeyedPermutation`] keyed by (seed, epoch). Memory is O(1) in the
//! dataset size, the order does not depend on how many ranks read it, and a
//! [`SamplerState`] of 92 bytes resumes it exactly.

mod permutation;
pub mod state;

use std::ops::Range;

pub use permutation::KeyedPermutation;
pub use state::{SamplerKind, SamplerState, StateError};

use permutation::mix64;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SamplerError {
    #[error("a window of {window} tokens does not fit {tokens} tokens")]
    WindowTooLong { window: u64, tokens: u64 },
    #[error("{per_epoch} samples per epoch exceed the {domain} distinct samples")]
    TooManySamples { per_epoch: u64, domain: u64 },
    #[error("samples per epoch must be at least 1")]
    NoSamples,
    #[error("global batch {global_batch} does not split over {world} ranks")]
    Uneven { global_batch: u64, world: u32 },
    #[error("rank {rank} is outside a world of {world}")]
    Rank { rank: u32, world: u32 },
}

/// The key of epoch `epoch`'s permutation.
fn epoch_key(seed: u64, epoch: u64) -> u64 {
    mix64(seed ^ mix64(epoch.wrapping_add(0x5eed_0f5a_3b1e)))
}

/// Picks `per_epoch` distinct indices of `[0, domain)` per epoch, in a
/// different keyed order each epoch.
#[derive(Clone, Debug)]
pub struct IndexSampler {
    domain: u64,
    per_epoch: u64,
    seed: u64,
    cached: Option<(u64, KeyedPermutation)>,
}

impl IndexSampler {
    pub fn new(domain: u64, per_epoch: u64, seed: u64) -> Result<Self, SamplerError> {
        if per_epoch == 0 || domain == 0 {
            return Err(SamplerError::NoSamples);
        }
        if per_epoch > domain {
            return Err(SamplerError::TooManySamples { per_epoch, domain });
        }
        Ok(Self { domain, per_epoch, seed, cached: None })
    }

    pub fn domain(&self) -> u64 {
        self.domain
    }

    pub fn per_epoch(&self) -> u64 {
        self.per_epoch
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The index of global sample `global`.
    pub fn index(&mut self, global: u64) -> u64 {
        let epoch = global / self.per_epoch;
        let within = global % self.per_epoch;
        if self.cached.as_ref().is_none_or(|(e, _)| *e != epoch) {
            self.cached = Some((epoch, KeyedPermutation::new(self.domain, epoch_key(self.seed, epoch))));
        }
        let (_, perm) = self.cached.as_ref().expect("permutation cached above");
        perm.apply(within)
    }
}

/// Windows of `window` consecutive tokens out of `tokens`: the domain is the
/// `tokens - window + 1` possible starts.
pub fn window_domain(tokens: u64, window: u64) -> Result<u64, SamplerError> {
    if window == 0 || window > tokens {
        return Err(SamplerError::WindowTooLong { window, tokens });
    }
    Ok(tokens - window + 1)
}

/// Global sample indices of `rank`'s part of global batch `step`: each rank
/// takes a contiguous slice, so the global order is the same at any world
/// size and a job can resume on a different number of ranks.
pub fn rank_slice(step: u64, global_batch: u64, rank: u32, world: u32) -> Result<Range<u64>, SamplerError> {
    if world == 0 || rank >= world {
        return Err(SamplerError::Rank { rank, world });
    }
    if global_batch == 0 || !global_batch.is_multiple_of(u64::from(world)) {
        return Err(SamplerError::Uneven { global_batch, world });
    }
    let per_rank = global_batch / u64::from(world);
    let start = step * global_batch + u64::from(rank) * per_rank;
    Ok(start..start + per_rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within an epoch no index repeats; every epoch is a new order.
    #[test]
    fn epochs_are_distinct_orders() {
        let mut sampler = IndexSampler::new(5000, 5000, 1).expect("sampler");
        let first: Vec<u64> = (0..5000).map(|g| sampler.index(g)).collect();
        let second: Vec<u64> = (5000..10_000).map(|g| sampler.index(g)).collect();
        let mut sorted = first.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..5000).collect::<Vec<_>>());
        assert_ne!(first, second);
    }

    /// Start positions are uniform: chi-square over 100 buckets stays well
    /// inside what a uniform draw gives (99 degrees of freedom; 1e-4 tail at
    /// about 156).
    #[test]
    fn starts_are_uniform() {
        let tokens = 10_000_000u64;
        let domain = window_domain(tokens, 1024).expect("domain");
        let mut sampler = IndexSampler::new(domain, 200_000, 7).expect("sampler");
        let mut buckets = [0u64; 100];
        for g in 0..200_000 {
            buckets[(sampler.index(g) * 100 / domain) as usize] += 1;
        }
        let expected = 200_000.0 / 100.0;
        let chi2: f64 = buckets.iter().map(|&b| (b as f64 - expected).powi(2) / expected).sum();
        assert!(chi2 < 156.0, "chi-square {chi2}");
    }

    /// Successive epochs are uncorrelated: Spearman's rank correlation of
    /// the positions of the same samples is near zero.
    #[test]
    fn successive_epochs_are_uncorrelated() {
        let n = 20_000u64;
        let mut sampler = IndexSampler::new(n, n, 3).expect("sampler");
        let mut rank_in = |epoch: u64| {
            let mut rank = vec![0f64; n as usize];
            for i in 0..n {
                rank[sampler.index(epoch * n + i) as usize] = i as f64;
            }
            rank
        };
        let (a, b) = (rank_in(0), rank_in(1));
        let mean = (n as f64 - 1.0) / 2.0;
        let cov: f64 = a.iter().zip(&b).map(|(x, y)| (x - mean) * (y - mean)).sum();
        let var: f64 = a.iter().map(|x| (x - mean).powi(2)).sum();
        let rho = cov / var;
        assert!(rho.abs() < 0.03, "rank correlation {rho}");
    }

    /// Ranks tile each global batch without overlap, in order.
    #[test]
    fn rank_slices_tile_the_global_batch() {
        let slices: Vec<_> = (0..4).map(|r| rank_slice(3, 32, r, 4).expect("slice")).collect();
        assert_eq!(slices, [96..104, 104..112, 112..120, 120..128]);
        assert!(rank_slice(0, 30, 0, 4).is_err());
        assert!(rank_slice(0, 32, 4, 4).is_err());
    }
}
