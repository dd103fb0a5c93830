//! Sets of lesson slots, as the search index keeps them: a sorted list while sparse, a bitmap
//! once the list would take more room than one bit per slot.
//!
//! Slots are numbered in the order lessons are first indexed and a lesson is indexed once, so
//! additions come in increasing slot order: a list stays sorted by pushing, and adding the
//! slot being indexed again (a word or pair of characters seen twice in one lesson) is a
//! comparison with the last element.

/// One set of slots.
#[derive(Clone, Debug, Default)]
pub(crate) enum Postings {
    /// Sorted, without repeats.
    #[default]
    Empty,
    List(Vec<u32>),
    /// Bit `s` of word `s / 64` is slot `s`.
    Bits(Vec<u64>),
}

impl Postings {
    /// Adds `slot`, which is at least every slot added before; `slots` is how many slots
    /// exist (what a bitmap costs).
    pub(crate) fn add(&mut self, slot: u32, slots: usize) {
        match self {
            Postings::Empty => *self = Postings::List(vec![slot]),
            Postings::List(list) => {
                if list.last() == Some(&slot) {
                    return;
                }
                list.push(slot);
                // 32 bits a list entry, one bit a slot in a bitmap.
                if list.len() * 32 > slots.max(64) {
                    let mut bits = vec![0u64; slots.div_ceil(64).max(1)];
                    for &s in list.iter() {
                        set(&mut bits, s);
                    }
                    *self = Postings::Bits(bits);
                }
            }
            Postings::Bits(bits) => set(bits, slot),
        }
    }

    /// ORs the set into `out` (one bit a slot, long enough for every slot).
    pub(crate) fn or_into(&self, out: &mut [u64]) {
        match self {
            Postings::Empty => {}
            Postings::List(list) => {
                for &s in list {
                    set_in(out, s);
                }
            }
            Postings::Bits(bits) => {
                for (o, b) in out.iter_mut().zip(bits) {
                    *o |= *b;
                }
            }
        }
    }

    /// Bytes the set holds on the heap.
    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            Postings::Empty => 0,
            Postings::List(list) => list.capacity() * 4,
            Postings::Bits(bits) => bits.capacity() * 8,
        }
    }
}

/// Sets bit `slot` of `bits`, growing it if needed.
fn set(bits: &mut Vec<u64>, slot: u32) {
    let word = slot as usize / 64;
    if word >= bits.len() {
        bits.resize(word + 1, 0);
    }
    bits[word] |= 1 << (slot % 64);
}

/// Sets bit `slot` of a bitmap long enough for it (a query's scratch).
fn set_in(bits: &mut [u64], slot: u32) {
    if let Some(w) = bits.get_mut(slot as usize / 64) {
        *w |= 1 << (slot % 64);
    }
}

/// Whether bit `slot` is set.
#[cfg(test)]
fn has(bits: &[u64], slot: u32) -> bool {
    bits.get(slot as usize / 64)
        .is_some_and(|w| w & (1 << (slot % 64)) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots_of(p: &Postings, n: usize) -> Vec<u32> {
        let mut bits = vec![0u64; n.div_ceil(64)];
        p.or_into(&mut bits);
        (0..n as u32).filter(|&s| has(&bits, s)).collect()
    }

    #[test]
    fn a_list_turns_into_a_bitmap_when_dense_and_keeps_its_members() {
        let mut p = Postings::default();
        let n = 10_000;
        let mut want = Vec::new();
        for s in (0..n as u32).step_by(7) {
            p.add(s, s as usize + 1);
            p.add(s, s as usize + 1);
            want.push(s);
        }
        assert!(matches!(p, Postings::Bits(_)), "every 7th slot is dense");
        assert_eq!(slots_of(&p, n), want);
        let mut sparse = Postings::default();
        for s in [3u32, 900, 9_000] {
            sparse.add(s, n);
        }
        assert!(matches!(sparse, Postings::List(_)));
        assert_eq!(slots_of(&sparse, n), [3, 900, 9_000]);
        assert!(sparse.heap_bytes() >= 12);
    }

    #[test]
    fn scratch_bits_ignore_slots_past_their_end() {
        let mut bits = vec![0u64; 1];
        set_in(&mut bits, 63);
        set_in(&mut bits, 64);
        assert!(has(&bits, 63));
        assert!(!has(&bits, 64));
    }
}
