//! The least-recently-used order of blocks that are kept but nobody references: an intrusive
//! doubly linked list over block ids, so moving a block in or out allocates nothing.

use super::blocks::{zeroed, NIL};

pub(super) struct LruList {
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    len: usize,
}

impl LruList {
    /// An empty list over block ids `0..n`.
    pub(super) fn new(n: usize) -> Option<LruList> {
        Some(LruList {
            prev: zeroed(n, NIL)?,
            next: zeroed(n, NIL)?,
            head: NIL,
            tail: NIL,
            len: 0,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The first block (taken first), if any.
    pub(super) fn front(&self) -> Option<u32> {
        (self.head != NIL).then_some(self.head)
    }

    pub(super) fn contains(&self, b: u32) -> bool {
        self.head == b || self.prev[b as usize] != NIL
    }

    /// Appends `b` (not in the list): taken last.
    pub(super) fn push_back(&mut self, b: u32) {
        self.prev[b as usize] = self.tail;
        self.next[b as usize] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.len += 1;
    }

    /// Prepends `b` (not in the list): taken first.
    pub(super) fn push_front(&mut self, b: u32) {
        self.prev[b as usize] = NIL;
        self.next[b as usize] = self.head;
        if self.head == NIL {
            self.tail = b;
        } else {
            self.prev[self.head as usize] = b;
        }
        self.head = b;
        self.len += 1;
    }

    /// Takes `b` (in the list) out.
    pub(super) fn remove(&mut self, b: u32) {
        let (prev, next) = (self.prev[b as usize], self.next[b as usize]);
        if prev == NIL {
            self.head = next;
        } else {
            self.next[prev as usize] = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.prev[next as usize] = prev;
        }
        self.prev[b as usize] = NIL;
        self.next[b as usize] = NIL;
        self.len -= 1;
    }

    /// Takes the first block out, if any.
    pub(super) fn pop_front(&mut self) -> Option<u32> {
        let b = self.front()?;
        self.remove(b);
        Some(b)
    }
}
