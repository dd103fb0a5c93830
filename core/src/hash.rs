//! Hash maps for tables looked up on every message (connections, services).
//!
//! Why not `BTreeMap` there: a notification looks up its sender and its destination several
//! times, and on `axhost-load` 64→64 the ordered maps' comparisons (`memcmp` on 36-byte service
//! ids, pointer chasing through nodes) were 12% of the host. Why not `std`'s default hasher: it
//! is seeded from OS randomness, and the core takes no randomness it was not given.
//!
//! [`IdHasher`] is fixed (no seed), so a map built by the same operations has the same layout on
//! every run. These maps are never iterated on the way to an output; where an order is shown to
//! a client (the catalog) the entries are sorted first, so the determinism of outputs does not
//! depend on the hasher at all.
//!
//! Flooding: keys are chosen by the host (driver-assigned connection ids, service ids drawn from
//! the seeded generator), never by peers. A peer can only *look up* a key it made up, which
//! costs one probe like any miss.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` with [`IdHasher`].
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// A multiply-rotate hasher over 8-byte words (the `FxHash` construction): fast for short keys,
/// with good high bits (hashbrown takes its control tag from the top 7).
#[derive(Default, Clone, Copy)]
pub struct IdHasher {
    hash: u64,
}

/// An odd constant with well-spread bits (2^64 / golden ratio).
const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl IdHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl Hasher for IdHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            // The tail's length goes in its free top byte, so "ab" and "ab\0" differ.
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// A `HashMap` keyed by `u64` ids with [`IdHasher`], for drivers that keep per-connection
/// tables of their own (the mio driver's sockets).
pub type U64Map<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// A `HashMap` for keys peers choose (words of lesson text): hashed with SipHash-1-3 whose
/// state first absorbs a 128-bit secret derived from the host's seed, so a peer cannot aim keys
/// at one bucket the way it could with the fixed [`IdHasher`]. The seed is secret in
/// production (drawn from the OS by the binary) and fixed in tests and the simulator, which
/// keeps runs reproducible; these maps are never iterated on the way to an output.
pub(crate) type SecretMap<K, V> = HashMap<K, V, SecretState>;

/// The [`SecretMap`] hasher factory: the secret the hash state starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SecretState {
    k0: u64,
    k1: u64,
}

impl SecretState {
    /// A secret derived from `seed` for one `purpose`, so maps of different purposes do not
    /// share it.
    pub(crate) fn derive(seed: u64, purpose: &str) -> SecretState {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(seed.to_le_bytes());
        h.update(purpose.as_bytes());
        let d = h.finalize();
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&d[i..i + 8]);
            u64::from_le_bytes(w)
        };
        SecretState {
            k0: word(0),
            k1: word(8),
        }
    }
}

impl std::hash::BuildHasher for SecretState {
    type Hasher = std::hash::DefaultHasher;

    fn build_hasher(&self) -> Self::Hasher {
        let mut h = std::hash::DefaultHasher::new();
        h.write_u64(self.k0);
        h.write_u64(self.k1);
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash<T: Hash>(t: &T) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(t)
    }

    #[test]
    fn fixed_across_runs_and_sensitive_to_every_byte() {
        // A fixed value: no seed anywhere.
        assert_eq!(hash(&7u64), hash(&7u64));
        let id = "svc_00112233445566778899aabbccddeeff";
        let base = hash(&id);
        for i in 0..id.len() {
            let mut b = id.as_bytes().to_vec();
            b[i] ^= 1;
            let other = String::from_utf8(b).expect("ascii");
            assert_ne!(hash(&other.as_str()), base, "byte {i} ignored");
        }
        // Length is part of a str's hash (`Hash for str` adds a terminator byte).
        assert_ne!(hash(&"ab"), hash(&"ab\0"));
    }

    #[test]
    fn secret_hashes_depend_on_the_seed_and_the_purpose() {
        let a = SecretState::derive(1, "words");
        assert_eq!(
            a.hash_one("parser"),
            SecretState::derive(1, "words").hash_one("parser")
        );
        assert_ne!(
            a.hash_one("parser"),
            SecretState::derive(2, "words").hash_one("parser")
        );
        assert_ne!(
            a.hash_one("parser"),
            SecretState::derive(1, "grams").hash_one("parser")
        );
    }

    #[test]
    fn sequential_ids_spread_over_the_control_tags() {
        let tags: std::collections::BTreeSet<u64> = (1..=128u64).map(|n| hash(&n) >> 57).collect();
        assert!(
            tags.len() > 64,
            "only {} distinct top-7-bit tags",
            tags.len()
        );
    }
}
