//! Handle tables: every stream, event, module, function, graph and BLAS descriptor is an opaque
//! value that is never reused, so a handle used after its destroy call is recognised as such.

use crate::error::{Error, Kind, Result};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

/// Handles count up from here: far from null and from the special stream values (1, 2).
const FIRST: u64 = 0x4b33_0000_0000;
static NEXT: AtomicU64 = AtomicU64::new(FIRST);

/// Objects of one kind by handle, with the handles already destroyed.
pub struct Table<T> {
    what: &'static str,
    destroy_call: &'static str,
    live: HashMap<u64, T>,
    dead: HashSet<u64>,
}

impl<T> Table<T> {
    /// `what` names the kind in messages (`stream`), `destroy_call` the call that ends one.
    pub fn new(what: &'static str, destroy_call: &'static str) -> Self {
        Table { what, destroy_call, live: HashMap::new(), dead: HashSet::new() }
    }

    pub fn insert(&mut self, v: T) -> u64 {
        let h = NEXT.fetch_add(16, Ordering::Relaxed);
        self.live.insert(h, v);
        h
    }

    fn missing(&self, h: u64) -> Error {
        if self.dead.contains(&h) {
            Error::new(Kind::InvalidHandle, format!("{} {h:#x} used after {}", self.what, self.destroy_call))
        } else {
            Error::new(Kind::InvalidHandle, format!("{h:#x} is not a {} of this device", self.what))
        }
    }

    pub fn get(&self, h: u64) -> Result<&T> {
        self.live.get(&h).ok_or_else(|| self.missing(h))
    }

    pub fn get_mut(&mut self, h: u64) -> Result<&mut T> {
        if !self.live.contains_key(&h) {
            return Err(self.missing(h));
        }
        self.live.get_mut(&h).ok_or_else(|| Error::new(Kind::InvalidHandle, "vanished"))
    }

    pub fn remove(&mut self, h: u64) -> Result<T> {
        match self.live.remove(&h) {
            Some(v) => {
                self.dead.insert(h);
                Ok(v)
            }
            None => Err(self.missing(h)),
        }
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = (&u64, &mut T)> {
        self.live.iter_mut()
    }

    pub fn values(&self) -> impl Iterator<Item = (&u64, &T)> {
        self.live.iter()
    }
}
