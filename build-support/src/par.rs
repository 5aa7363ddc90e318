//! A small scoped thread pool: `f` over a slice on at most `jobs` threads, the calling thread
//! being one of them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// `f` applied to every item, results in item order. An entry is `None` only if the item was
/// never processed (cannot happen unless a worker panicked, which the scope then re-raises);
/// callers turn it into their own error rather than trusting that.
pub fn map<T: Sync, R: Send>(items: &[T], jobs: usize, name: &str, f: impl Fn(&T) -> R + Sync) -> Vec<Option<R>> {
    let next = AtomicUsize::new(0);
    let slots: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(item) = items.get(i) else { break };
        let r = f(item);
        let mut guard = match slots.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some(slot) = guard.get_mut(i) {
            *slot = Some(r);
        }
    };
    std::thread::scope(|s| {
        for _ in 1..jobs.max(1).min(items.len()) {
            // If the OS refuses a thread, the remaining ones (and this one) do the work.
            let _ = std::thread::Builder::new().name(name.into()).spawn_scoped(s, work);
        }
        work();
    });
    match slots.into_inner() {
        Ok(v) => v,
        Err(p) => p.into_inner(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn results_keep_item_order() {
        let items: Vec<u32> = (0..37).collect();
        let out = super::map(&items, 4, "t", |x| x * 2);
        assert_eq!(out, items.iter().map(|x| Some(x * 2)).collect::<Vec<_>>());
        assert!(super::map(&[] as &[u32], 4, "t", |x| *x).is_empty());
    }
}
