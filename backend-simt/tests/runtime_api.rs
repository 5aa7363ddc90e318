//! The `Runtime` and `kernel_api::Backend` surfaces of the emulator: allocation, copies and
//! their range checks, memset, device-to-device copies, streams, events, module loading, and
//! the Backend's names, device description and upload/download.
mod common;

use common::*;
use k3_backend_simt::SimtRuntime;
use k3_kernels::{KernelArgs, LaunchConfig, ModuleImage, Runtime};
use kernel_api::{Backend, BackendExt, BackendKind, DType, HostTensor};

#[test]
fn memory_copies_and_range_checks() {
    let rt = SimtRuntime::new(32).unwrap();
    let s = rt.default_stream();
    let mut a = rt.alloc(16).unwrap();
    let mut out = [0u8; 16];
    rt.copy_d2h(&a, 0, &mut out, s).unwrap();
    assert_eq!(out, [0xFF; 16], "fresh allocations are poisoned");
    rt.memset(&mut a, 7, s).unwrap();
    rt.copy_h2d(&[1, 2, 3], &mut a, 13, s).unwrap();
    rt.copy_d2h(&a, 0, &mut out, s).unwrap();
    assert_eq!(&out[12..], &[7, 1, 2, 3]);
    assert_eq!(rt.copy_h2d(&[1, 2, 3], &mut a, 14, s).unwrap_err().field(), Some("dst_offset"));
    assert_eq!(rt.copy_d2h(&a, 1, &mut out, s).unwrap_err().field(), Some("src_offset"));
    let mut b = rt.alloc(8).unwrap();
    rt.copy_d2d(&a, 12, &mut b, 2, 4, s).unwrap();
    let mut ob = [0u8; 8];
    rt.copy_d2h(&b, 0, &mut ob, s).unwrap();
    assert_eq!(ob, [0xFF, 0xFF, 7, 1, 2, 3, 0xFF, 0xFF]);
    assert!(rt.copy_d2d(&a, 12, &mut b, 6, 4, s).is_err());
    assert_eq!(rt.device_ptr(&a).0 % 256, 0, "allocations are 256-byte aligned");
    assert_eq!(rt.buffer_len(&a), 16);
    let empty = rt.alloc(0).unwrap();
    assert_eq!(rt.buffer_len(&empty), 0);
    rt.free(empty).unwrap();
    rt.free(a).unwrap();
}

#[test]
fn streams_events_and_modules() {
    let rt = SimtRuntime::new(64).unwrap();
    let s1 = rt.create_stream().unwrap();
    let s2 = rt.create_stream().unwrap();
    assert_ne!(s1.id(), s2.id());
    let (e0, e1) = (rt.create_event().unwrap(), rt.create_event().unwrap());
    assert!(rt.elapsed_ms(&e0, &e1).is_err(), "unrecorded events have no elapsed time");
    rt.record_event(&e0, &s1).unwrap();
    let m = rt.load_module(&ModuleImage::host_linked("tests")).unwrap();
    let k = rt.kernel(&m, "empty_kernel").unwrap();
    // SAFETY: empty_kernel takes no parameters.
    unsafe { rt.launch(&k, &LaunchConfig::new(4, 64, 0), &[], &s1) }.unwrap();
    rt.record_event(&e1, &s1).unwrap();
    rt.synchronize_event(&e1).unwrap();
    let ms = rt.elapsed_ms(&e0, &e1).unwrap();
    assert!((0.0..10_000.0).contains(&ms), "{ms}");
    rt.synchronize_stream(&s2).unwrap();
    rt.synchronize().unwrap();
    let info = rt.device_info();
    assert_eq!((info.kind, info.warp_size, info.arch.as_str()), (BackendKind::Simt, 64, "simt64"));
    assert_eq!(info.shared_mem_per_block, rt.shared_limit());
}

#[test]
fn backend_round_trips_tensors_and_launches_on_its_buffers() {
    for warp in WARPS {
        let b = k3_backend_simt::simt_backend(warp).unwrap();
        assert_eq!(b.name(), if warp == 32 { "simt32" } else { "simt64" });
        assert_eq!(b.device_info().warp_size, warp);
        let t = HostTensor::from_f32(DType::F32, &[4, 32], &(0..128).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
        let d = b.upload_tensor(&t).unwrap();
        assert_eq!(b.download_tensor(&d).unwrap().to_f32(), t.to_f32());
        let z = b.zeros(DType::BF16, &[3]).unwrap();
        assert_eq!(b.download_tensor(&z).unwrap().to_f32(), vec![0.0; 3]);
        let mut wrong = vec![0u8; 3];
        assert!(b.download(&d.buf, &mut wrong).is_err());
        // Op launchers use the runtime on the Backend's own buffers.
        let out = b.alloc_zeroed(4 * 4).unwrap();
        let mut a = KernelArgs::new();
        a.push(d.buf.device_ptr()).push(out.device_ptr());
        // SAFETY: dynamic_shared_sum(const float*, float*) reads 4 blocks of 32 floats and
        // writes 4 floats; both buffers are that large.
        unsafe { b.runtime().launch_args("dynamic_shared_sum", &LaunchConfig::new(4, 32, 128), &mut a) }.unwrap();
        b.synchronize(b.default_stream()).unwrap();
        let mut bytes = vec![0u8; 16];
        b.download(&out, &mut bytes).unwrap();
        let sums: Vec<f32> = bytes.chunks(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect();
        let want: Vec<f32> = (0..4).map(|r| (0..32).map(|c| (r * 32 + c) as f32).sum()).collect();
        assert_eq!(sums, want);
    }
}

/// The dialect's 16-byte vector loads/stores: a vector body with a scalar tail, and raw copies.
#[test]
fn vector_loads_and_stores() {
    for warp in WARPS {
        let b = k3_backend_simt::simt_backend(warp).unwrap();
        let n = 4 * 37 + 3;
        let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
        let d = b.upload_tensor(&HostTensor::from_f32(DType::F32, &[n], &x).unwrap()).unwrap();
        let out = b.alloc_zeroed(4 * n).unwrap();
        let mut a = KernelArgs::new();
        a.push(d.buf.device_ptr()).push(out.device_ptr()).push(n as i32);
        // SAFETY: vec_scale2(const float*, float*, int) touches n floats of each buffer.
        unsafe { b.runtime().launch_args("vec_scale2", &LaunchConfig::new(2, 16, 0), &mut a) }.unwrap();
        let mut bytes = vec![0u8; 4 * n];
        b.download(&out, &mut bytes).unwrap();
        let got: Vec<f32> = bytes.chunks(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect();
        assert_eq!(got, x.iter().map(|v| 2.0 * v).collect::<Vec<_>>(), "warp {warp}");

        let src: Vec<u8> = (0..64u32).map(|i| (i * 7 + 3) as u8).collect();
        let s = b.upload(&src).unwrap();
        let dst = b.alloc_zeroed(64).unwrap();
        let mut a = KernelArgs::new();
        a.push(s.device_ptr()).push(dst.device_ptr()).push(4i32);
        // SAFETY: vec_copy16(src, dst, 4) copies 4 chunks of 16 bytes within 64-byte buffers.
        unsafe { b.runtime().launch_args("vec_copy16", &LaunchConfig::new(1, 32, 0), &mut a) }.unwrap();
        let mut back = vec![0u8; 64];
        b.download(&dst, &mut back).unwrap();
        assert_eq!(back, src);
    }
}

/// The typed 4- and 2-element stores (`k3::store_f32x4(base, dtype, i, x)`, one 16 / 8 / 4-byte
/// store; `k3::store_f32x2`, one 8 / 4 / 2-byte store) write the bytes `store_f32` writes, for every float output dtype: rounding ties,
/// subnormals, values past each format's range, signed zeros, infinities.
#[test]
fn typed_vector_store_matches_scalar_stores() {
    let mut x: Vec<f32> = vec![0.0, -0.0, 1.0, -1.5, f32::INFINITY, f32::NEG_INFINITY, 65520.0, 1.0e9, 448.0, 464.0, -57344.0, 1.0e-7];
    // bf16 ties (exact halfway between two bf16 values, even and odd), f16 / fp8 subnormals.
    x.extend([f32::from_bits(0x3f80_8000), f32::from_bits(0x3f81_8000), 6.0e-8, 2.0f32.powi(-9), 2.0f32.powi(-17), -3.0e-5]);
    x.extend((0..42).map(|i| (i as f32 - 20.0) * 0.37 + (i as f32).sin() * 1.0e-3));
    assert_eq!(x.len() % 4, 0);
    let quads = x.len() / 4;
    for warp in WARPS {
        let b = k3_backend_simt::simt_backend(warp).unwrap();
        let d = b.upload_tensor(&HostTensor::from_f32(DType::F32, &[x.len()], &x).unwrap()).unwrap();
        for dt in [DType::F32, DType::F16, DType::BF16, DType::F8E4M3Fn, DType::F8E4M3Fnuz, DType::F8E5M2] {
            let bytes = x.len() * dt.size_bytes();
            let outs = [0; 3].map(|_| b.alloc_zeroed(bytes).unwrap());
            let mut a = KernelArgs::new();
            a.push(d.buf.device_ptr());
            for o in &outs {
                a.push(o.device_ptr());
            }
            a.push(k3_kernels::dtype_code(dt)).push(quads as i32);
            // SAFETY: vec_store_typed(x, out4, out2, out1, dtype, quads) reads 4 * quads floats and
            // writes 4 * quads elements of dtype to each output, all within the buffers.
            unsafe { b.runtime().launch_args("vec_store_typed", &LaunchConfig::new(2, 8, 0), &mut a) }.unwrap();
            let [v4, v2, v1] = outs.map(|o| {
                let mut v = vec![0u8; bytes];
                b.download(&o, &mut v).unwrap();
                v
            });
            assert_eq!(v4, v1, "store_f32x4, warp {warp}, {dt:?}");
            assert_eq!(v2, v1, "store_f32x2, warp {warp}, {dt:?}");
            assert!(v1.iter().any(|&c| c != 0), "warp {warp}, {dt:?}: nothing stored");
        }
    }
}
