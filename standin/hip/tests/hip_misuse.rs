//! Misuses the HIP stand-in turns into errors (each with its hipError_t and a message that
//! hipGetErrorString returns): launches beyond the personality's limits, a kernel missing from
//! the image, an image for another GPU, pointer parameters outside every allocation or into a
//! freed one, copies from freed memory, double frees, streams, events and modules used after
//! destroy, and `extra` launch arguments.

mod common;

use common::*;
use std::ffi::{c_int, c_void};

/// A live reduce setup: module, function and valid arguments.
fn setup() -> Option<(H, H, ReduceArgs)> {
    let h = hip();
    let m = h.reduce_module()?;
    let f = h.function(m, "block_reduce").expect("block_reduce");
    let a = ReduceArgs { x: h.upload(&[1f32; 256]), n: 256, sums: h.malloc(4), total: h.upload(&[0f32]), positives: h.upload(&[0i32]), max: h.upload(&[0i32]) };
    Some((m, f, a))
}

fn expect(code: c_int, want: c_int, needle: &str) {
    let h = hip();
    assert_eq!(code, want, "{}", h.text(code));
    let text = h.text(code);
    assert!(text.contains("k3 stand-in") && text.contains(needle), "{text}");
    // SAFETY: plain query.
    let last = unsafe { (h.hipGetLastError)() };
    assert_eq!(last, want, "hipGetLastError reports it");
}

#[test]
fn launches_beyond_the_personality_limits() {
    let Some((_, f, mut a)) = setup() else { return };
    let h = hip();
    let s = std::ptr::null_mut();
    expect(h.launch(f, 1, 2048, 0, s, &mut a.params()), 1, "block");
    expect(h.launch(f, 0, 256, 0, s, &mut a.params()), 1, "grid");
    // SAFETY: valid handles; the grid is what is wrong.
    let rc = unsafe { (h.hipModuleLaunchKernel)(f, 1, 70000, 1, 256, 1, 1, 0, s, a.params().as_mut_ptr(), std::ptr::null_mut()) };
    expect(rc, 1, "grid");
    let lds = 1 << 20;
    expect(h.launch(f, 1, 256, lds, s, &mut a.params()), 1, "dynamic shared memory");
    let mut extra = [std::ptr::null_mut::<c_void>(); 1];
    // SAFETY: as above, with a non-null `extra`.
    let rc = unsafe { (h.hipModuleLaunchKernel)(f, 1, 1, 1, 256, 1, 1, 0, s, a.params().as_mut_ptr(), extra.as_mut_ptr()) };
    expect(rc, 1, "extra");
    h.ok("a valid launch still works", h.launch(f, 1, 256, 0, s, &mut a.params()));
}

#[test]
fn kernel_missing_from_the_image_and_images_for_another_gpu() {
    let Some((m, _, _)) = setup() else { return };
    let h = hip();
    expect(h.function(m, "no_such_kernel").unwrap_err(), 500, "no kernel `no_such_kernel`");
    let arch = h.arch();
    let other = images::IMAGES.iter().find(|(_, t, _)| *t != arch);
    if let Some((_, t, img)) = other {
        let mut m2 = std::ptr::null_mut();
        // SAFETY: a complete code object, for the other arch.
        let rc = unsafe { (h.hipModuleLoadData)(&mut m2, img.as_ptr() as *const c_void) };
        expect(rc, 209, t);
    }
    let junk = b"not a code object\0";
    let mut m3 = std::ptr::null_mut();
    // SAFETY: NUL-terminated bytes.
    expect(unsafe { (h.hipModuleLoadData)(&mut m3, junk.as_ptr() as *const c_void) }, 200, "PTX");
    // SAFETY: m is live until the unload; using it afterwards is the misuse.
    unsafe { h.ok("unload", (h.hipModuleUnload)(m)) };
    expect(h.function(m, "block_reduce").unwrap_err(), 400, "after hipModuleUnload");
}

#[test]
fn pointer_parameters_outside_allocations_and_into_freed_ones() {
    let Some((_, f, mut a)) = setup() else { return };
    let h = hip();
    let s = std::ptr::null_mut();
    let good = a.sums;
    a.sums = 0x1234_5678usize as H;
    expect(h.launch(f, 1, 256, 0, s, &mut a.params()), 700, "outside every allocation");
    a.sums = (good as usize + (64 << 20)) as H;
    expect(h.launch(f, 1, 256, 0, s, &mut a.params()), 700, "parameter 2");
    let doomed = h.malloc(4);
    // SAFETY: freeing a live allocation; the launch below is the misuse.
    unsafe { h.ok("free", (h.hipFree)(doomed)) };
    a.sums = doomed;
    expect(h.launch(f, 1, 256, 0, s, &mut a.params()), 700, "freed allocation");
}

#[test]
fn freed_memory_and_double_free() {
    let h = hip();
    let p = h.upload(&[1u32; 16]);
    let q = h.malloc(64);
    let mut host = [0u32; 16];
    // SAFETY: p and q are live until the frees; everything after is the misuse under test.
    unsafe {
        h.ok("free", (h.hipFree)(p));
        let rc = (h.hipMemcpyAsync)(host.as_mut_ptr() as H, p, 64, DEVICE_TO_HOST, std::ptr::null_mut());
        expect(rc, 700, "use after free");
        expect((h.hipMemcpyAsync)(q, p, 64, DEVICE_TO_DEVICE, std::ptr::null_mut()), 700, "use after free");
        expect((h.hipMemsetAsync)(p, 0, 64, std::ptr::null_mut()), 700, "use after free");
        expect((h.hipFree)(p), 1, "double free");
        expect((h.hipFree)((q as usize + 8) as H), 1, "not the start of an allocation");
    }
}

#[test]
fn streams_events_and_graphs_after_destroy() {
    let h = hip();
    let s = h.stream();
    let e = h.event();
    let p = h.malloc(16);
    // SAFETY: handles live until their destroy calls; every call after is the misuse.
    unsafe {
        h.ok("destroy stream", (h.hipStreamDestroy)(s));
        expect((h.hipMemsetAsync)(p, 0, 16, s), 400, "stream");
        expect((h.hipStreamSynchronize)(s), 400, "after hipStreamDestroy");
        expect((h.hipEventRecord)(e, s), 400, "after hipStreamDestroy");
        expect((h.hipStreamDestroy)(s), 400, "after hipStreamDestroy");
        h.ok("destroy event", (h.hipEventDestroy)(e));
        expect((h.hipEventRecord)(e, std::ptr::null_mut()), 400, "after hipEventDestroy");
        expect((h.hipEventSynchronize)(e), 400, "after hipEventDestroy");
        expect((h.hipStreamBeginCapture)(std::ptr::null_mut(), 0), 900, "default");
    }
}
