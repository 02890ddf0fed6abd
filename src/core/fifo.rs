//! The queue of replies a connection is owed: a `Vec` read from a moving front.
//!
//! # Invariants
//!
//! - The live entries are `buf[head..]`, oldest first; `head <= buf.len()`.
//! - The queue empties at the end of almost every round (every command answered), and
//!   emptying resets it to the start of the buffer, so in steady state pushing, peeking
//!   and popping are a store, a compare and an increment: no wrap-around arithmetic as
//!   in a ring buffer.
//! - A connection that never fully catches up (always a reply or two behind, as when
//!   calls return at a majority) would walk `head` through an ever-growing buffer: a push
//!   into a full buffer whose dead prefix is at least half of it drops the prefix instead
//!   of growing. The buffer thus holds at most twice its live entries, each entry is moved
//!   O(1) times on average, and a steady state, however far behind, stops allocating once
//!   its high-water mark is reached.

/// A FIFO of `Copy` entries.
#[derive(Clone, Debug)]
pub(crate) struct Fifo<T: Copy> {
    buf: Vec<T>,
    head: usize,
}

impl<T: Copy> Fifo<T> {
    /// An empty queue with room for `n` entries before it allocates again.
    pub fn with_capacity(n: usize) -> Fifo<T> {
        Fifo {
            buf: Vec::with_capacity(n),
            head: 0,
        }
    }

    /// Number of live entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.buf.len() - self.head
    }

    /// The oldest entry.
    #[inline(always)]
    pub fn front(&self) -> Option<&T> {
        self.buf.get(self.head)
    }

    /// Appends an entry.
    #[inline(always)]
    pub fn push_back(&mut self, item: T) {
        // Compacting moves the live entries: only worth it when the dead prefix is at
        // least half the buffer, so each entry is moved O(1) times on average; otherwise
        // grow (once, to the high-water mark).
        if self.buf.len() == self.buf.capacity() && self.head * 2 >= self.buf.len() {
            self.compact();
        }
        self.buf.push(item);
    }

    /// Drops the oldest entry (no-op when empty).
    #[inline(always)]
    pub fn pop_front(&mut self) {
        self.head += 1;
        if self.head >= self.buf.len() {
            self.clear();
        }
    }

    #[cold]
    fn compact(&mut self) {
        self.buf.drain(..self.head);
        self.head = 0;
    }

    /// Drops every entry; keeps the memory.
    #[inline]
    pub fn clear(&mut self) {
        self.buf.clear();
        self.head = 0;
    }

    /// The live entries, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.buf[self.head..].iter()
    }

    /// The live entries, oldest first, for in-place updates.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.buf[self.head..].iter_mut()
    }

    /// Entries the buffer can hold without growing.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    #[test]
    fn behaves_like_a_deque_under_random_use() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut fifo = Fifo::with_capacity(0);
        let mut model = VecDeque::new();
        for i in 0..200_000u32 {
            match rng.u8(..10) {
                // Pushes slightly outnumber pops: the queue walks through long stretches
                // where it never empties, which exercises compaction.
                0..=4 => {
                    fifo.push_back(i);
                    model.push_back(i);
                }
                5..=8 => {
                    fifo.pop_front();
                    model.pop_front();
                }
                _ if rng.u8(..50) == 0 => {
                    fifo.clear();
                    model.clear();
                }
                _ => {}
            }
            assert_eq!(fifo.front(), model.front());
            assert_eq!(fifo.len(), model.len());
        }
        let rest: Vec<u32> = fifo.iter_mut().map(|x| *x).collect();
        assert_eq!(rest, model.iter().copied().collect::<Vec<_>>());
    }

    #[test]
    fn a_queue_that_never_empties_stays_small() {
        let mut fifo = Fifo::with_capacity(0);
        fifo.push_back(0u64);
        for i in 1..1_000_000u64 {
            fifo.push_back(i);
            fifo.pop_front();
            assert_eq!(fifo.len(), 1);
        }
        assert!(fifo.capacity() <= 8, "{}", fifo.capacity());
    }

    #[test]
    fn a_steady_backlog_stops_growing_at_its_high_water_mark() {
        let mut fifo = Fifo::with_capacity(0);
        for i in 0..5u64 {
            fifo.push_back(i);
        }
        let mut grown = Vec::new();
        for i in 5..100_000u64 {
            fifo.push_back(i);
            fifo.pop_front();
            grown.push(fifo.capacity());
        }
        assert_eq!(fifo.len(), 5);
        // Any growth happens right at the start; then never again.
        let last = *grown.last().unwrap();
        assert!(grown[100..].iter().all(|&c| c == last), "{last}");
        assert!(last <= 16, "{last}");
    }
}
