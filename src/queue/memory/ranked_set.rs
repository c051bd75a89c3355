//! An ordered set that answers "how many keys are smaller than this one" in
//! O(log n): the memory store's line, where 100 000 waiters polling for their
//! place is normal.
//!
//! A treap (a binary search tree whose nodes also form a heap on random
//! priorities, which keeps it balanced in expectation) stored in a `Vec`
//! arena, each node carrying the size of its subtree. Insert, remove, rank and
//! pop-first are O(log n) expected; recursion depth is the tree's height.
//! Hand-written because the standard `BTreeSet` has no rank and the structure
//! is small; the tests below check it against a naive model.

use std::cmp::Ordering;

type Link = Option<usize>;

struct Node<K> {
    key: K,
    priority: u64,
    size: usize,
    left: Link,
    right: Link,
}

/// A set of keys in order, with ranks.
pub(super) struct RankedSet<K> {
    nodes: Vec<Node<K>>,
    /// Arena slots of removed nodes, reused before the arena grows.
    free: Vec<usize>,
    root: Link,
    /// State of the splitmix64 sequence that draws node priorities.
    seed: u64,
}

impl<K: Ord + Copy> RankedSet<K> {
    pub(super) fn new() -> RankedSet<K> {
        RankedSet {
            nodes: Vec::new(),
            free: Vec::new(),
            root: None,
            seed: rand::random(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.size(self.root)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.root.is_none()
    }

    /// The number of keys smaller than `key` (its rank, when it is present).
    pub(super) fn count_below(&self, key: &K) -> usize {
        let mut smaller = 0;
        let mut at = self.root;
        while let Some(i) = at {
            let node = &self.nodes[i];
            match key.cmp(&node.key) {
                Ordering::Less => at = node.left,
                Ordering::Greater => {
                    smaller += self.size(node.left) + 1;
                    at = node.right;
                }
                Ordering::Equal => return smaller + self.size(node.left),
            }
        }
        smaller
    }

    pub(super) fn contains(&self, key: &K) -> bool {
        let mut at = self.root;
        while let Some(i) = at {
            let node = &self.nodes[i];
            match key.cmp(&node.key) {
                Ordering::Less => at = node.left,
                Ordering::Greater => at = node.right,
                Ordering::Equal => return true,
            }
        }
        false
    }

    /// The smallest key.
    pub(super) fn first(&self) -> Option<&K> {
        let mut at = self.root?;
        while let Some(left) = self.nodes[at].left {
            at = left;
        }
        Some(&self.nodes[at].key)
    }

    /// The key at `rank` (0-based: the smallest is 0).
    pub(super) fn nth(&self, rank: usize) -> Option<&K> {
        let mut at = self.root;
        let mut rank = rank;
        while let Some(i) = at {
            let node = &self.nodes[i];
            let left = self.size(node.left);
            match rank.cmp(&left) {
                Ordering::Less => at = node.left,
                Ordering::Equal => return Some(&node.key),
                Ordering::Greater => {
                    rank -= left + 1;
                    at = node.right;
                }
            }
        }
        None
    }

    /// Adds `key`; false if it was already there.
    pub(super) fn insert(&mut self, key: K) -> bool {
        if self.contains(&key) {
            return false;
        }
        let node = self.alloc(key);
        self.root = self.insert_at(self.root, node);
        true
    }

    /// Removes `key`; false if it was not there.
    pub(super) fn remove(&mut self, key: &K) -> bool {
        let (root, removed) = self.remove_at(self.root, key);
        self.root = root;
        removed
    }

    /// Removes and returns the smallest key.
    pub(super) fn pop_first(&mut self) -> Option<K> {
        let key = *self.first()?;
        self.remove(&key);
        Some(key)
    }

    fn size(&self, link: Link) -> usize {
        link.map_or(0, |i| self.nodes[i].size)
    }

    fn update(&mut self, i: usize) {
        let size = 1 + self.size(self.nodes[i].left) + self.size(self.nodes[i].right);
        self.nodes[i].size = size;
    }

    fn next_priority(&mut self) -> u64 {
        self.seed = self.seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn alloc(&mut self, key: K) -> usize {
        let node = Node {
            key,
            priority: self.next_priority(),
            size: 1,
            left: None,
            right: None,
        };
        match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    /// Inserts the detached node `n` (whose key is not in `t`) into subtree `t`.
    fn insert_at(&mut self, t: Link, n: usize) -> Link {
        let Some(ti) = t else { return Some(n) };
        let key = self.nodes[n].key;
        if self.nodes[n].priority > self.nodes[ti].priority {
            let (left, right) = self.split(t, &key);
            self.nodes[n].left = left;
            self.nodes[n].right = right;
            self.update(n);
            return Some(n);
        }
        if key < self.nodes[ti].key {
            let left = self.insert_at(self.nodes[ti].left, n);
            self.nodes[ti].left = left;
        } else {
            let right = self.insert_at(self.nodes[ti].right, n);
            self.nodes[ti].right = right;
        }
        self.update(ti);
        t
    }

    /// Splits subtree `t` into keys smaller than `key` and the rest.
    fn split(&mut self, t: Link, key: &K) -> (Link, Link) {
        let Some(ti) = t else { return (None, None) };
        if self.nodes[ti].key < *key {
            let (left, right) = self.split(self.nodes[ti].right, key);
            self.nodes[ti].right = left;
            self.update(ti);
            (t, right)
        } else {
            let (left, right) = self.split(self.nodes[ti].left, key);
            self.nodes[ti].left = right;
            self.update(ti);
            (left, t)
        }
    }

    /// Joins two subtrees where every key of `a` is smaller than every key of `b`.
    fn merge(&mut self, a: Link, b: Link) -> Link {
        match (a, b) {
            (None, other) | (other, None) => other,
            (Some(ai), Some(bi)) => {
                if self.nodes[ai].priority > self.nodes[bi].priority {
                    let right = self.merge(self.nodes[ai].right, b);
                    self.nodes[ai].right = right;
                    self.update(ai);
                    a
                } else {
                    let left = self.merge(a, self.nodes[bi].left);
                    self.nodes[bi].left = left;
                    self.update(bi);
                    b
                }
            }
        }
    }

    fn remove_at(&mut self, t: Link, key: &K) -> (Link, bool) {
        let Some(ti) = t else { return (None, false) };
        let removed = match key.cmp(&self.nodes[ti].key) {
            Ordering::Equal => {
                let joined = self.merge(self.nodes[ti].left, self.nodes[ti].right);
                self.free.push(ti);
                return (joined, true);
            }
            Ordering::Less => {
                let (left, removed) = self.remove_at(self.nodes[ti].left, key);
                self.nodes[ti].left = left;
                removed
            }
            Ordering::Greater => {
                let (right, removed) = self.remove_at(self.nodes[ti].right, key);
                self.nodes[ti].right = right;
                removed
            }
        };
        if removed {
            self.nodes[ti].size -= 1;
        }
        (t, removed)
    }
}

impl<K: Ord + Copy> Default for RankedSet<K> {
    fn default() -> Self {
        RankedSet::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    impl<K: Ord + Copy + std::fmt::Debug> RankedSet<K> {
        /// Keys in order, after checking the search-tree order, the heap order
        /// on priorities and every subtree size.
        fn checked_keys(&self) -> Vec<K> {
            let mut keys = Vec::new();
            let size = self.check(self.root, None, &mut keys);
            assert_eq!(size, keys.len());
            keys
        }

        fn check(&self, t: Link, parent_priority: Option<u64>, keys: &mut Vec<K>) -> usize {
            let Some(i) = t else { return 0 };
            let node = &self.nodes[i];
            if let Some(p) = parent_priority {
                assert!(node.priority <= p, "heap order broken");
            }
            let left = self.check(node.left, Some(node.priority), keys);
            if let Some(last) = keys.last() {
                assert!(*last < node.key, "search order broken");
            }
            keys.push(node.key);
            let right = self.check(node.right, Some(node.priority), keys);
            assert_eq!(node.size, left + right + 1, "subtree size wrong");
            node.size
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u16),
        Remove(u16),
        PopFirst,
        Rank(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        // A small key space so inserts collide and removes hit.
        prop_oneof![
            4 => (0u16..200).prop_map(Op::Insert),
            2 => (0u16..200).prop_map(Op::Remove),
            1 => Just(Op::PopFirst),
            2 => (0u16..200).prop_map(Op::Rank),
        ]
    }

    proptest! {
        #[test]
        fn behaves_like_a_sorted_set(ops in proptest::collection::vec(op(), 0..400)) {
            let mut set = RankedSet::new();
            let mut model = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Insert(k) => prop_assert_eq!(set.insert(k), model.insert(k)),
                    Op::Remove(k) => prop_assert_eq!(set.remove(&k), model.remove(&k)),
                    Op::PopFirst => prop_assert_eq!(set.pop_first(), model.pop_first()),
                    Op::Rank(k) => {
                        prop_assert_eq!(set.contains(&k), model.contains(&k));
                        prop_assert_eq!(set.count_below(&k), model.range(..k).count());
                        prop_assert_eq!(set.nth(usize::from(k) % 64), model.iter().nth(usize::from(k) % 64));
                    }
                }
                prop_assert_eq!(set.len(), model.len());
                prop_assert_eq!(set.first(), model.first());
            }
            let keys = set.checked_keys();
            prop_assert_eq!(keys, model.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn nth_walks_the_keys_in_order() {
        let mut set = RankedSet::new();
        for k in [50u32, 10, 40, 20, 30] {
            set.insert(k);
        }
        let walked: Vec<u32> = (0..6).filter_map(|r| set.nth(r).copied()).collect();
        assert_eq!(walked, vec![10, 20, 30, 40, 50]);
        set.remove(&30);
        assert_eq!(set.nth(2), Some(&40));
        assert_eq!(set.nth(4), None);
    }

    #[test]
    fn ranks_follow_key_order_not_insertion_order() {
        let mut set = RankedSet::new();
        for k in [50u32, 10, 40, 20, 30] {
            assert!(set.insert(k));
        }
        assert!(!set.insert(30));
        let ranks: Vec<_> = [10, 20, 30, 40, 50]
            .iter()
            .map(|k| set.count_below(k))
            .collect();
        assert_eq!(ranks, vec![0, 1, 2, 3, 4]);
        assert!(!set.contains(&35));
        assert_eq!(set.count_below(&35), 3);
        assert!(set.remove(&20));
        assert!(!set.remove(&20));
        assert_eq!(set.count_below(&50), 3);
        assert_eq!(set.pop_first(), Some(10));
        assert_eq!(set.count_below(&50), 2);
    }

    #[test]
    fn stays_shallow_for_a_long_line_joined_in_order() {
        // Join scores arrive in increasing order: the worst case for a plain
        // search tree, which a treap keeps balanced.
        let mut set = RankedSet::new();
        for k in 0..100_000u64 {
            set.insert(k);
        }
        fn height<K>(set: &RankedSet<K>, t: Link) -> usize {
            t.map_or(0, |i| {
                1 + height(set, set.nodes[i].left).max(height(set, set.nodes[i].right))
            })
        }
        assert!(height(&set, set.root) < 100);
        assert_eq!(set.count_below(&99_999), 99_999);
        for k in 0..50_000u64 {
            assert_eq!(set.pop_first(), Some(k));
        }
        assert_eq!(set.count_below(&99_999), 49_999);
        assert!(set.nodes.len() <= 100_000, "freed slots are reused");
    }
}
