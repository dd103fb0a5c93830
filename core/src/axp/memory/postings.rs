//! Sets of lesson slots, as the search index keeps them: a sorted list while sparse, a bitmap
//! once the list would take more room than one bit per slot.
//!
//! Text postings only grow, in slot order: slots are numbered in the order lessons are first
//! indexed and a lesson's text is indexed once, so [`Postings::push`] appends, and pushing the
//! slot being indexed again (a word seen twice in one lesson) is a comparison with the last
//! element. Evidence postings (which sessions a lesson cites) change in any order, rarely:
//! [`Postings::insert`] and [`Postings::remove`] keep them exact.

/// One set of slots.
#[derive(Clone, Debug, Default)]
pub(crate) struct Postings {
    set: Set,
    len: u32,
}

#[derive(Clone, Debug, Default)]
enum Set {
    #[default]
    Empty,
    /// Sorted, without repeats.
    List(Vec<u32>),
    /// Bit `s` of word `s / 64` is slot `s`.
    Bits(Vec<u64>),
}

impl Postings {
    /// How many slots the set holds.
    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    /// Adds `slot`, which is at least every slot added before; `slots` is how many slots
    /// exist (what a bitmap costs). Whether it was not in yet.
    pub(crate) fn push(&mut self, slot: u32, slots: usize) -> bool {
        match &mut self.set {
            Set::Empty => {
                self.set = Set::List(vec![slot]);
                self.len = 1;
            }
            Set::List(list) => {
                if list.last() == Some(&slot) {
                    return false;
                }
                list.push(slot);
                self.len += 1;
                self.densify(slots);
            }
            Set::Bits(bits) => {
                if !set(bits, slot) {
                    return false;
                }
                self.len += 1;
            }
        }
        true
    }

    /// The set of the slots set in `bits`.
    pub(crate) fn from_bits(bits: &[u64], slots: usize) -> Postings {
        let mut p = Postings::default();
        for s in ones(bits) {
            p.push(s, slots);
        }
        p
    }

    /// Adds `slot` wherever it falls.
    pub(crate) fn insert(&mut self, slot: u32, slots: usize) {
        match &mut self.set {
            Set::Empty => {
                self.set = Set::List(vec![slot]);
                self.len = 1;
            }
            Set::List(list) => {
                if let Err(at) = list.binary_search(&slot) {
                    list.insert(at, slot);
                    self.len += 1;
                    self.densify(slots);
                }
            }
            Set::Bits(bits) => {
                if set(bits, slot) {
                    self.len += 1;
                }
            }
        }
    }

    /// Takes `slot` out, if it is in.
    pub(crate) fn remove(&mut self, slot: u32) {
        match &mut self.set {
            Set::Empty => {}
            Set::List(list) => {
                if let Ok(at) = list.binary_search(&slot) {
                    list.remove(at);
                    self.len -= 1;
                }
            }
            Set::Bits(bits) => {
                let (word, bit) = (slot as usize / 64, 1u64 << (slot % 64));
                if let Some(w) = bits.get_mut(word).filter(|w| **w & bit != 0) {
                    *w &= !bit;
                    self.len -= 1;
                }
            }
        }
    }

    /// A list that would take more room than a bitmap of `slots` bits (32 bits an entry
    /// against one a slot) becomes one.
    fn densify(&mut self, slots: usize) {
        if let Set::List(list) = &self.set {
            if list.len() * 32 > slots.max(64) {
                let mut bits = vec![0u64; slots.div_ceil(64).max(1)];
                for &s in list {
                    set(&mut bits, s);
                }
                self.set = Set::Bits(bits);
            }
        }
    }

    /// ORs the set into `out` (one bit a slot, long enough for every slot).
    pub(crate) fn or_into(&self, out: &mut [u64]) {
        match &self.set {
            Set::Empty => {}
            Set::List(list) => {
                for &s in list {
                    if let Some(w) = out.get_mut(s as usize / 64) {
                        *w |= 1 << (s % 64);
                    }
                }
            }
            Set::Bits(bits) => {
                for (o, b) in out.iter_mut().zip(bits) {
                    *o |= *b;
                }
            }
        }
    }
}

/// Sets bit `slot`, growing `bits` if needed; whether it was clear.
fn set(bits: &mut Vec<u64>, slot: u32) -> bool {
    let word = slot as usize / 64;
    if word >= bits.len() {
        bits.resize(word + 1, 0);
    }
    let bit = 1u64 << (slot % 64);
    let was_clear = bits[word] & bit == 0;
    bits[word] |= bit;
    was_clear
}

/// Whether bit `slot` of `bits` is set.
pub(crate) fn has(bits: &[u64], slot: u32) -> bool {
    bits.get(slot as usize / 64)
        .is_some_and(|w| w & (1 << (slot % 64)) != 0)
}

/// The set bits of `bits`, as slots, in order.
pub(crate) fn ones(bits: &[u64]) -> impl Iterator<Item = u32> + '_ {
    bits.iter().enumerate().flat_map(|(i, &w)| {
        let mut w = w;
        std::iter::from_fn(move || {
            if w == 0 {
                return None;
            }
            let s = i as u32 * 64 + w.trailing_zeros();
            w &= w - 1;
            Some(s)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots_of(p: &Postings, n: usize) -> Vec<u32> {
        let mut bits = vec![0u64; n.div_ceil(64)];
        p.or_into(&mut bits);
        ones(&bits).collect()
    }

    #[test]
    fn a_list_turns_into_a_bitmap_when_dense_and_keeps_its_members() {
        let mut p = Postings::default();
        let n = 10_000;
        let mut want = Vec::new();
        for s in (0..n as u32).step_by(7) {
            p.push(s, s as usize + 1);
            p.push(s, s as usize + 1);
            want.push(s);
        }
        assert!(matches!(p.set, Set::Bits(_)), "every 7th slot is dense");
        assert_eq!(slots_of(&p, n), want);
        assert_eq!(p.len() as usize, want.len());
        let mut sparse = Postings::default();
        for s in [3u32, 900, 9_000] {
            sparse.push(s, n);
        }
        assert!(matches!(sparse.set, Set::List(_)));
        assert_eq!(slots_of(&sparse, n), [3, 900, 9_000]);
        let bits = [0b101u64, 1];
        assert_eq!(slots_of(&Postings::from_bits(&bits, 128), 128), [0, 2, 64]);
        let mut p = Postings::default();
        assert!(p.push(5, 10) && !p.push(5, 10) && p.push(6, 10));
    }

    #[test]
    fn inserts_and_removals_keep_the_set_exact_in_either_form() {
        for n in [100_000usize, 64] {
            let mut p = Postings::default();
            for s in [50u32, 7, 30, 7, 63] {
                p.insert(s, n);
            }
            assert_eq!(slots_of(&p, n.max(64)), [7, 30, 50, 63]);
            p.remove(30);
            p.remove(31);
            assert_eq!(slots_of(&p, n.max(64)), [7, 50, 63]);
            assert_eq!(p.len(), 3);
        }
    }

    #[test]
    fn ones_lists_set_bits_in_order() {
        let bits = [0b1010u64, 0, 1 << 63];
        assert_eq!(ones(&bits).collect::<Vec<_>>(), [1, 3, 191]);
        assert!(has(&bits, 191) && !has(&bits, 2) && !has(&bits, 500));
    }
}
