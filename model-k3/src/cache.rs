//! The hybrid inference cache: a paged latent pool shared by the MLA layers (one page table per
//! sequence, one pool tensor per layer), a KDA slot pool (recurrent state and conv state per KDA
//! layer, slot 0 reserved as the null slot), and the allocators that hand out and take back
//! pages and slots.

use kernel_api::{Error, Result};

/// Free-list allocator of page ids `0..capacity`.
#[derive(Clone, Debug)]
pub struct PageAllocator {
    capacity: usize,
    free: Vec<u32>,
}

impl PageAllocator {
    pub fn new(capacity: usize) -> Self {
        // Hand out low ids first (pop from the back of a descending list).
        PageAllocator { capacity, free: (0..capacity as u32).rev().collect() }
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    pub fn free_count(&self) -> usize {
        self.free.len()
    }
    /// `n` pages, all or nothing.
    pub fn alloc(&mut self, n: usize) -> Result<Vec<u32>> {
        if n > self.free.len() {
            return Err(Error::invalid("kv_pages", format!("{n} pages requested, {} free of {}", self.free.len(), self.capacity)));
        }
        Ok((0..n).filter_map(|_| self.free.pop()).collect())
    }
    pub fn release(&mut self, pages: &[u32]) {
        self.free.extend(pages.iter().rev());
    }
}

/// Allocator of KDA state slots `1..capacity` (slot 0 is the null slot and never handed out).
#[derive(Clone, Debug)]
pub struct SlotAllocator {
    capacity: usize,
    free: Vec<u32>,
}

impl SlotAllocator {
    /// `capacity` includes the null slot, so `capacity - 1` sequences fit.
    pub fn new(capacity: usize) -> Self {
        SlotAllocator { capacity, free: (1..capacity as u32).rev().collect() }
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    pub fn free_count(&self) -> usize {
        self.free.len()
    }
    pub fn alloc(&mut self) -> Result<u32> {
        self.free.pop().ok_or_else(|| Error::invalid("kda_slots", format!("all {} slots are in use", self.capacity - 1)))
    }
    pub fn release(&mut self, slot: u32) {
        if slot != 0 {
            self.free.push(slot);
        }
    }
}

/// One live sequence's share of the cache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SequenceState {
    /// Every token fed so far (prompt and generated), in order.
    pub tokens: Vec<u32>,
    /// Pages of the MLA latent cache, in logical order.
    pub pages: Vec<u32>,
    /// KDA slot (>= 1).
    pub slot: u32,
}

impl SequenceState {
    /// How many of `prompt`'s tokens are already in the cache if `prompt` extends what was fed
    /// (the only reuse a KDA state allows without checkpoints); `None` if it does not extend it
    /// or adds nothing new.
    pub fn reusable_prefix(&self, prompt: &[u32]) -> Option<usize> {
        (prompt.len() > self.tokens.len() && prompt.starts_with(&self.tokens)).then_some(self.tokens.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_slots_are_reused() {
        let mut p = PageAllocator::new(4);
        let a = p.alloc(3).unwrap();
        assert_eq!(a, vec![0, 1, 2]);
        assert!(p.alloc(2).is_err(), "all-or-nothing");
        assert_eq!(p.free_count(), 1);
        p.release(&a);
        assert_eq!(p.free_count(), 4);
        let mut s = SlotAllocator::new(3);
        let x = s.alloc().unwrap();
        let y = s.alloc().unwrap();
        assert_eq!((x, y), (1, 2));
        assert!(s.alloc().is_err());
        s.release(x);
        assert_eq!(s.alloc().unwrap(), 1);
        s.release(0); // the null slot is never freed into the pool
        assert_eq!(s.free_count(), 0);
    }

    #[test]
    fn prefix_reuse_only_on_exact_extension() {
        let s = SequenceState { tokens: vec![1, 2, 3], pages: vec![], slot: 1 };
        assert_eq!(s.reusable_prefix(&[1, 2, 3, 4]), Some(3));
        assert_eq!(s.reusable_prefix(&[1, 2, 3]), None);
        assert_eq!(s.reusable_prefix(&[1, 2, 4, 5]), None);
    }
}
