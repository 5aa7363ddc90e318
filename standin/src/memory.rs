//! Device memory: host pages from one address range reserved up front, handed out in order and
//! never reused, so every pointer into a freed allocation is recognised as such for the life of
//! the process (a freed range is returned to the OS and made inaccessible).
//!
//! The table answers the checks the stand-in makes: a copy's range lies in one live allocation, a
//! kernel's pointer parameter points into one (or is null), a free names the start of a live one.

use crate::error::{Error, Kind, Result};
use std::collections::BTreeMap;

/// Address space reserved for allocations (never backed until used).
const RESERVE: usize = 16 << 40;
/// Granularity of allocations: whole pages, so a freed range can be protected on its own.
const PAGE: usize = 4096;
/// Byte fresh allocations hold: NaN as f32/bf16, -1 as an integer (as in the SIMT emulator).
pub const POISON: u8 = 0xFF;

#[derive(Clone, Copy, Debug)]
struct Alloc {
    len: usize,
    /// Bytes of address space it took (len rounded up to pages, at least one page).
    span: usize,
    live: bool,
}

/// The allocation table of one device.
pub struct Memory {
    base: usize,
    next: usize,
    end: usize,
    allocs: BTreeMap<usize, Alloc>,
    live_bytes: u64,
    total: u64,
}

// SAFETY: the table only holds addresses; the pages are reached through them under the device's
// lock.
unsafe impl Send for Memory {}

impl Memory {
    /// Reserves the address range; `total` is the capacity reported as device memory.
    pub fn new(total: u64) -> Result<Self> {
        // SAFETY: an anonymous private PROT_NONE reservation; nothing is backed until mprotect.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RESERVE,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::new(Kind::OutOfMemory, "cannot reserve address space for device memory"));
        }
        let base = p as usize;
        Ok(Memory { base, next: base, end: base + RESERVE, allocs: BTreeMap::new(), live_bytes: 0, total })
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn free_bytes(&self) -> u64 {
        self.total.saturating_sub(self.live_bytes)
    }

    /// A new allocation of `len` bytes (at least one page of address space), filled with
    /// [`POISON`].
    pub fn alloc(&mut self, len: usize) -> Result<u64> {
        if len as u64 > self.free_bytes() {
            return Err(Error::new(
                Kind::OutOfMemory,
                format!("{len} bytes requested, {} of the device's {} bytes free", self.free_bytes(), self.total),
            ));
        }
        let span = len.max(1).div_ceil(PAGE) * PAGE;
        if self.end - self.next < span {
            return Err(Error::new(Kind::OutOfMemory, "the stand-in's never-reused address range is exhausted"));
        }
        let addr = self.next;
        // SAFETY: [addr, addr + span) lies in our reservation and is not in use.
        let rc = unsafe { libc::mprotect(addr as *mut libc::c_void, span, libc::PROT_READ | libc::PROT_WRITE) };
        if rc != 0 {
            return Err(Error::new(Kind::OutOfMemory, format!("cannot back {span} bytes of device memory")));
        }
        // SAFETY: just made readable and writable.
        unsafe { std::ptr::write_bytes(addr as *mut u8, POISON, span) };
        self.next += span;
        self.allocs.insert(addr, Alloc { len, span, live: true });
        self.live_bytes += len as u64;
        Ok(addr as u64)
    }

    /// Frees the allocation starting at `ptr`.
    pub fn free(&mut self, ptr: u64) -> Result<()> {
        let p = ptr as usize;
        match self.allocs.get_mut(&p) {
            Some(a) if a.live => {
                a.live = false;
                let (span, len) = (a.span, a.len);
                self.live_bytes -= len as u64;
                // SAFETY: the pages of a live allocation of ours; after this nothing may touch
                // them, and nothing can: the range is never handed out again.
                unsafe {
                    libc::madvise(p as *mut libc::c_void, span, libc::MADV_DONTNEED);
                    libc::mprotect(p as *mut libc::c_void, span, libc::PROT_NONE);
                }
                Ok(())
            }
            Some(a) => Err(Error::new(
                Kind::InvalidValue,
                format!("double free: the allocation at {ptr:#x} ({} bytes) was already freed", a.len),
            )),
            None => Err(Error::new(Kind::InvalidValue, format!("{ptr:#x} is not the start of an allocation: {}", self.describe(ptr)))),
        }
    }

    /// The allocation containing `ptr` (base, len, live), `ptr == base + len` included.
    fn find(&self, ptr: u64) -> Option<(usize, Alloc)> {
        let p = usize::try_from(ptr).ok()?;
        let (&base, &a) = self.allocs.range(..=p).next_back()?;
        (p - base <= a.len).then_some((base, a))
    }

    /// Whether `ptr` lies in an allocation of this device, live or freed.
    pub fn owns(&self, ptr: u64) -> bool {
        self.find(ptr).is_some()
    }

    /// Where `ptr` points, for messages.
    fn describe(&self, ptr: u64) -> String {
        match self.find(ptr) {
            Some((base, a)) if a.live => format!("{} bytes into the live allocation at {base:#x} of {} bytes", ptr as usize - base, a.len),
            Some((base, a)) => format!("into the freed allocation at {base:#x} of {} bytes (use after free)", a.len),
            None => "outside every allocation of this device".into(),
        }
    }

    /// `[ptr, ptr + len)` lies inside one live allocation.
    pub fn check_range(&self, ptr: u64, len: usize, what: &str) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        match self.find(ptr) {
            Some((base, a)) if a.live && (ptr as usize - base).checked_add(len).is_some_and(|e| e <= a.len) => Ok(()),
            Some((base, a)) if a.live => Err(Error::new(
                Kind::InvalidValue,
                format!(
                    "{what}: {len} bytes at {ptr:#x} run past the end of the allocation at {base:#x} of {} bytes",
                    a.len
                ),
            )),
            Some(_) => Err(Error::new(Kind::IllegalAddress, format!("{what}: {ptr:#x} points {}", self.describe(ptr)))),
            None => Err(Error::new(Kind::InvalidValue, format!("{what}: {ptr:#x} points {}", self.describe(ptr)))),
        }
    }

    /// A kernel's pointer parameter: null, or inside a live allocation (its one-past-the-end
    /// address included: an empty view at the end of a buffer).
    pub fn check_pointer(&self, ptr: u64, what: &str) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        match self.find(ptr) {
            Some((_, a)) if a.live => Ok(()),
            _ => Err(Error::new(Kind::IllegalAddress, format!("{what}: {ptr:#x} points {}", self.describe(ptr)))),
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: the whole reservation made in `new`.
        unsafe { libc::munmap(self.base as *mut libc::c_void, RESERVE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_frees_and_stale_pointers() {
        let mut m = Memory::new(1 << 30).unwrap();
        let a = m.alloc(100).unwrap();
        let b = m.alloc(0).unwrap();
        assert_eq!(a % 4096, 0);
        // SAFETY: inside the live allocation `a`.
        assert_eq!(unsafe { *(a as *const u8).add(99) }, POISON);
        m.check_range(a, 100, "x").unwrap();
        m.check_range(a + 50, 0, "x").unwrap();
        assert_eq!(m.check_range(a + 50, 51, "x").unwrap_err().kind, Kind::InvalidValue);
        m.check_pointer(a + 100, "p").unwrap();
        m.check_pointer(b, "p").unwrap();
        m.check_pointer(0, "p").unwrap();
        assert_eq!(m.check_pointer(a + 4096 * 50, "p").unwrap_err().kind, Kind::IllegalAddress);
        m.free(a).unwrap();
        let e = m.check_pointer(a + 8, "param 0").unwrap_err();
        assert!(e.msg.contains("freed") && e.msg.contains("param 0"), "{e}");
        assert!(m.check_range(a, 4, "src").unwrap_err().msg.contains("use after free"));
        assert!(m.free(a).unwrap_err().msg.contains("double free"));
        assert!(m.free(b + 1).is_err());
        let c = m.alloc(10).unwrap();
        assert!(c > b, "addresses are never reused");
        assert!(m.alloc(2 << 30).unwrap_err().kind == Kind::OutOfMemory);
    }
}
