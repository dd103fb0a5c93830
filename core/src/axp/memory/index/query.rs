//! Answering a search from the index, one bitmap word (64 slots) at a time:
//! 1. who may be listed: accepted lessons of the scope whose every evidence session the caller
//!    may read, from the slots citing each session (each session asked about once);
//! 2. scores: each token's lessons are added into per-slot counters held as bit-planes (plane
//!    `b` holds bit `b` of every slot's score), a ripple-carry addition per word, so a token
//!    that most lessons hold costs as little as a rare one;
//! 3. the ranking: the highest score `t` that at least `limit` lessons reach (a binary search,
//!    counting with a comparator over the planes); those above `t` are all listed, those at `t`
//!    by id.

use crate::axp::memory::index::LessonIndex;
use crate::axp::memory::postings::{has, ones};

/// Per-slot counters of a query's scores, as bit-planes.
struct Planes {
    /// Planes per word: enough bits for the highest possible score (the token count).
    width: usize,
    /// Word `w`'s planes, lowest bit first, at `w * width`.
    bits: Vec<u64>,
}

impl Planes {
    fn new(words: usize, tokens: usize) -> Planes {
        let width = (usize::BITS - tokens.leading_zeros()) as usize;
        Planes {
            width,
            bits: vec![0; words * width],
        }
    }

    fn row(&self, w: usize) -> &[u64] {
        &self.bits[w * self.width..(w + 1) * self.width]
    }

    /// Adds one to the score of each slot of word `w` set in `carry`.
    fn add(&mut self, w: usize, mut carry: u64) {
        for p in &mut self.bits[w * self.width..(w + 1) * self.width] {
            let next = *p & carry;
            *p ^= carry;
            carry = next;
            if carry == 0 {
                break;
            }
        }
    }

    /// The slots of word `w` scoring at least `t`.
    fn at_least(&self, w: usize, t: u32) -> u64 {
        if self.width < 32 && t >> self.width != 0 {
            return 0;
        }
        let (mut greater, mut equal) = (0u64, !0u64);
        for (b, &p) in self.row(w).iter().enumerate().rev() {
            if (t >> b) & 1 == 1 {
                equal &= p;
            } else {
                greater |= equal & p;
                equal &= !p;
            }
        }
        greater | equal
    }

    fn score(&self, slot: u32) -> u32 {
        let bit = slot % 64;
        self.row(slot as usize / 64)
            .iter()
            .enumerate()
            .map(|(b, p)| (((p >> bit) & 1) as u32) << b)
            .sum()
    }
}

fn count(bits: impl Iterator<Item = u64>) -> usize {
    bits.map(|w| w.count_ones() as usize).sum()
}

impl LessonIndex {
    /// The reference's `search`: lessons of `scope` that are accepted and whose every
    /// evidence session `can_read` allows (each session asked about once), scored by how many
    /// distinct query tokens their text holds; those scoring above zero (all of them for a
    /// query without tokens), best first, then by id. The ids of the first `limit`, and how
    /// many there are in all.
    pub(crate) fn search(
        &self,
        scope: &str,
        query: &str,
        limit: usize,
        can_read: &dyn Fn(&str) -> bool,
    ) -> (Vec<&str>, usize) {
        let Some(scope) = self.scopes.get(scope) else {
            return (Vec::new(), 0);
        };
        let words = self.slots.len().div_ceil(64);
        let mut eligible = vec![0u64; words];
        for (e, a) in eligible.iter_mut().zip(&self.accepted) {
            *e = *a;
        }
        if self.scopes.names.len() > 1 {
            let mut of_scope = vec![0u64; words];
            self.scope_slots[scope as usize].or_into(&mut of_scope);
            for (e, s) in eligible.iter_mut().zip(&of_scope) {
                *e &= *s;
            }
        }
        self.keep_visible(&mut eligible, can_read);
        let tokens = self.tokens(query);
        if tokens.is_empty() {
            let total = count(eligible.iter().copied());
            let first = self.first_by_id(ones(&eligible), limit);
            return (self.ids(&first), total);
        }
        let mut planes = Planes::new(words, tokens.len());
        let mut matched = vec![0u64; words];
        let mut these = vec![0u64; words];
        for t in &tokens {
            these.fill(0);
            self.token_lessons(t, &mut these);
            for (w, (x, e)) in these.iter().zip(&eligible).enumerate() {
                let x = x & e;
                if x != 0 {
                    matched[w] |= x;
                    planes.add(w, x);
                }
            }
        }
        let total = count(matched.iter().copied());
        let k = limit.min(total);
        if k == 0 {
            return (Vec::new(), total);
        }
        // The highest score that at least k lessons reach (every matched lesson reaches 1).
        let reaching = |t: u32| {
            count(
                matched
                    .iter()
                    .enumerate()
                    .map(|(w, m)| planes.at_least(w, t) & m),
            )
        };
        let (mut lo, mut hi) = (1u32, tokens.len() as u32);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if reaching(mid) >= k {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let mut above = Vec::new();
        let mut at = vec![0u64; words];
        for (w, m) in matched.iter().enumerate() {
            if *m == 0 {
                continue;
            }
            let (reach, beyond) = (planes.at_least(w, lo) & m, planes.at_least(w, lo + 1) & m);
            at[w] = reach & !beyond;
            let mut b = beyond;
            while b != 0 {
                let slot = w as u32 * 64 + b.trailing_zeros();
                above.push((planes.score(slot), slot));
                b &= b - 1;
            }
        }
        above.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| self.id_order(a.1, b.1)));
        let mut ranked: Vec<u32> = above.into_iter().map(|(_, slot)| slot).collect();
        let rest = self.first_by_id(ones(&at), k - ranked.len());
        ranked.extend(rest);
        (self.ids(&ranked), total)
    }

    fn ids(&self, slots: &[u32]) -> Vec<&str> {
        slots
            .iter()
            .map(|&s| self.slots[s as usize].id.as_str())
            .collect()
    }

    /// How slots `a` and `b` order by id.
    fn id_order(&self, a: u32, b: u32) -> std::cmp::Ordering {
        self.keys[a as usize]
            .cmp(&self.keys[b as usize])
            .then_with(|| self.slots[a as usize].id.cmp(&self.slots[b as usize].id))
    }

    /// The `n` slots of `slots` with the lowest ids, in id order.
    fn first_by_id(&self, slots: impl Iterator<Item = u32>, n: usize) -> Vec<u32> {
        let mut best: Vec<u32> = Vec::with_capacity(n + 1);
        if n == 0 {
            return best;
        }
        for s in slots {
            if best.len() == n {
                match best.last() {
                    Some(&last) if self.id_order(s, last).is_lt() => {
                        best.pop();
                    }
                    _ => continue,
                }
            }
            let at = best.partition_point(|&x| self.id_order(x, s).is_lt());
            best.insert(at, s);
        }
        best
    }

    /// Clears from `eligible` every slot citing a session `can_read` refuses. Works from
    /// whichever side is smaller: the slots of the sessions it refuses (cleared), or those of
    /// the sessions it allows (kept, each checked against all its sessions).
    fn keep_visible(&self, eligible: &mut [u64], can_read: &dyn Fn(&str) -> bool) {
        let (mut allowed, mut refused) = (0u64, 0u64);
        let readable: Vec<bool> = self
            .sessions
            .names
            .iter()
            .zip(&self.session_slots)
            .map(|(name, slots)| {
                let ok = can_read(name);
                *(if ok { &mut allowed } else { &mut refused }) += u64::from(slots.len());
                ok
            })
            .collect();
        if refused == 0 {
            return;
        }
        let words = eligible.len();
        if allowed < refused {
            let mut kept = vec![0u64; words];
            for (slots, _) in self
                .session_slots
                .iter()
                .zip(&readable)
                .filter(|(_, r)| **r)
            {
                slots.or_into(&mut kept);
            }
            self.unevidenced.or_into(&mut kept);
            for (w, (e, k)) in eligible.iter_mut().zip(&kept).enumerate() {
                let mut x = *e & k;
                let mut keep = x;
                while x != 0 {
                    let bit = x & x.wrapping_neg();
                    let slot = w as u32 * 64 + bit.trailing_zeros();
                    let sessions = &self.slots[slot as usize].sessions;
                    if !sessions.iter().all(|&s| readable[s as usize]) {
                        keep &= !bit;
                    }
                    x &= x - 1;
                }
                *e = keep;
            }
        } else {
            let mut hidden = vec![0u64; words];
            for (slots, _) in self
                .session_slots
                .iter()
                .zip(&readable)
                .filter(|(_, r)| !**r)
            {
                slots.or_into(&mut hidden);
            }
            for (e, h) in eligible.iter_mut().zip(&hidden) {
                *e &= !h;
            }
        }
        debug_assert!(ones(&*eligible).all(|s| has(&self.accepted, s)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planes_count_and_compare_every_slot() {
        let mut p = Planes::new(2, 5);
        assert_eq!(p.width, 3);
        // Slot 0 gets 5, slot 1 gets 2, slot 64 gets 1.
        for _ in 0..5 {
            p.add(0, 1);
        }
        p.add(0, 2);
        p.add(0, 2);
        p.add(1, 1);
        assert_eq!(
            (p.score(0), p.score(1), p.score(64), p.score(65)),
            (5, 2, 1, 0)
        );
        assert_eq!(p.at_least(0, 1), 0b11);
        assert_eq!(p.at_least(0, 2), 0b11);
        assert_eq!(p.at_least(0, 3), 0b01);
        assert_eq!(p.at_least(0, 5), 0b01);
        assert_eq!(p.at_least(0, 6), 0);
        assert_eq!(p.at_least(0, 8), 0, "beyond the planes");
        assert_eq!(p.at_least(1, 1), 1);
        assert_eq!(p.at_least(1, 0), !0, "everything reaches 0");
    }
}
