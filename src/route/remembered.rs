//! Keys an instance remembers for a while, in memory and bounded: the
//! places a route has seen end, and the invite tokens it has seen used up.
//! They outlive the store's own records of them (its tombstones are kept
//! `abandon_after`, and a wiped store keeps nothing), so that what was given
//! up is not restored after a store loss (DESIGN §8.3).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// Keys with the unix second until which each is remembered, at most `CAP`
/// of them. Beyond `CAP` the key remembered first is forgotten first (the
/// one closest to its end anyway, as every key of a set is kept alike).
#[derive(Debug)]
pub(super) struct Remembered<K, const CAP: usize> {
    until: HashMap<K, u64>,
    /// Keys in the order they were first remembered, with their time.
    order: VecDeque<(u64, K)>,
    /// When expired keys were last dropped (unix seconds).
    pruned_s: u64,
    /// Keys forgotten at the cap before their time.
    pub(super) forgotten_early: u64,
}

impl<K, const CAP: usize> Default for Remembered<K, CAP> {
    fn default() -> Self {
        Remembered {
            until: HashMap::new(),
            order: VecDeque::new(),
            pruned_s: 0,
            forgotten_early: 0,
        }
    }
}

impl<K: Hash + Eq + Copy, const CAP: usize> Remembered<K, CAP> {
    /// Remembers `key` at `now_s` until `until_s`. A key still remembered
    /// keeps its time: the store says again what it said (its reads of
    /// ended places overlap), and the first word counts. A key whose time is
    /// over but not yet dropped (it waits behind one remembered longer) is
    /// remembered anew.
    pub(super) fn remember(&mut self, key: K, now_s: u64, until_s: u64) {
        // At most once a second, so remembering many stays cheap.
        if self.pruned_s != now_s {
            self.pruned_s = now_s;
            self.forget_expired(now_s);
        }
        match self.until.entry(key) {
            Entry::Occupied(mut over) if *over.get() < now_s => {
                over.insert(until_s);
            }
            Entry::Occupied(_) => return,
            Entry::Vacant(vacant) => {
                vacant.insert(until_s);
            }
        }
        self.order.push_back((until_s, key));
        while self.order.len() > CAP {
            if let Some((at, oldest)) = self.order.pop_front() {
                self.forget(at, &oldest);
                self.forgotten_early += 1;
            }
        }
    }

    /// Whether `key` is remembered at `now_s`.
    pub(super) fn contains(&self, key: &K, now_s: u64) -> bool {
        self.until.get(key).is_some_and(|&until| until >= now_s)
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.until.len()
    }

    /// Drops the keys remembered first whose time is over; a key behind one
    /// still remembered waits for it (the cap bounds them all).
    fn forget_expired(&mut self, now_s: u64) {
        while let Some(&(until, key)) = self.order.front() {
            if until >= now_s {
                break;
            }
            self.order.pop_front();
            self.forget(until, &key);
        }
    }

    fn forget(&mut self, until_s: u64, key: &K) {
        if self.until.get(key) == Some(&until_s) {
            self.until.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_remembered_until_its_time() {
        let mut set = Remembered::<u8, 10>::default();
        set.remember(1, 100, 130);
        set.remember(1, 101, 200);
        assert!(set.contains(&1, 130));
        assert!(!set.contains(&1, 131), "the first time counts");
        assert!(!set.contains(&2, 100));
        set.remember(2, 131, 140);
        assert_eq!(set.len(), 1, "the expired key was dropped");
    }

    #[test]
    fn a_key_over_but_not_yet_dropped_is_remembered_anew() {
        let mut set = Remembered::<u8, 10>::default();
        set.remember(1, 100, 1_000);
        set.remember(2, 100, 110);
        // Key 2's time is over, but it waits behind key 1 to be dropped.
        set.remember(2, 120, 200);
        assert!(set.contains(&2, 150));
    }

    #[test]
    fn the_cap_forgets_the_oldest_first() {
        let mut set = Remembered::<u32, 3>::default();
        for key in 0..5 {
            set.remember(key, 100, 1_000);
        }
        assert_eq!(set.len(), 3);
        assert!(!set.contains(&0, 100) && !set.contains(&1, 100));
        assert!((2..5).all(|key| set.contains(&key, 100)));
        assert_eq!(set.forgotten_early, 2);
    }
}
