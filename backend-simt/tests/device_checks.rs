//! Checked launches on the emulator: where a violation recorded by a kernel is reported (the
//! synchronising call of its stream, or any download), that it is reported once, that the first
//! one wins, and that `DeviceChecks::Off` runs the same kernels without a record. In an
//! AddressSanitizer build, also that ASan sees what the checks prevent (so the bad-input suite
//! passing under ASan means something).

use k3_backend_simt::{simt_backend, SimtBackend};
use k3_kernels::{DeviceChecks, Runtime};
use kernel_api::ops::{EmbeddingGather, EmbeddingGatherArgs, EmbeddingGatherParams, MlaCacheWrite, MlaCacheWriteArgs, MlaCacheWriteBatch, MlaCacheWriteParams};
use kernel_api::ops::kv_cache::{KvCacheFormat, KvDims};
use kernel_api::{Backend, BackendExt, DType, DeviceTensor, HostTensor};
use std::process::Command;

const P: EmbeddingGatherParams = EmbeddingGatherParams { vocab: 8, d: 4, m: 3 };

fn table(b: &SimtBackend) -> DeviceTensor<SimtBackend> {
    let v: Vec<f32> = (0..32).map(|i| i as f32).collect();
    b.upload_tensor(&HostTensor::from_f32(DType::F32, &[8, 4], &v).unwrap()).unwrap()
}

/// Enqueues a gather of `device_ids` (planned with valid ids) on `stream`; returns the output.
fn gather(b: &SimtBackend, device_ids: &[i32], stream: &<SimtBackend as Backend>::Stream) -> DeviceTensor<SimtBackend> {
    let plan = EmbeddingGather::plan(b, &P, &[0, 1, 2]).unwrap();
    let t = table(b);
    let ids = b.upload_tensor(&HostTensor::from_i32(&[3], device_ids).unwrap()).unwrap();
    let mut out = b.zeros(DType::F32, &[3, 4]).unwrap();
    let args = EmbeddingGatherArgs { table: t.as_ref(), ids: ids.as_ref(), out: out.as_mut() };
    EmbeddingGather::run(b, &plan, args, None, stream).expect("run only enqueues: the ids are not read on the host");
    out
}

#[test]
fn a_violation_is_reported_by_its_streams_sync_once() {
    let b = simt_backend(32).unwrap();
    let s = b.runtime().create_stream().unwrap();
    gather(&b, &[0, 9, 2], &s);
    b.synchronize(b.default_stream()).expect("another stream's sync does not report it");
    let e = b.synchronize(&s).expect_err("the stream's sync reports it");
    assert_eq!(e.field(), Some("ids"), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("entry 1 is 9, outside [0, 8)") && msg.contains("embedding_gather"), "{msg}");
    b.synchronize(&s).expect("reported once, then cleared");
}

#[test]
fn download_reports_a_violation_of_any_stream() {
    let b = simt_backend(64).unwrap();
    let s = b.runtime().create_stream().unwrap();
    let out = gather(&b, &[-3, 0, 1], &s);
    assert_eq!(b.download_tensor(&out).unwrap_err().field(), Some("ids"));
    // The rows of valid ids were gathered; the bad row is NaN, never a read outside the table.
    let got = b.download_tensor(&out).expect("cleared").to_f32();
    assert!(got[..4].iter().all(|x| x.is_nan()), "{got:?}");
    assert_eq!(got[4..], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
}

#[test]
fn the_first_violation_wins() {
    let b = simt_backend(32).unwrap();
    gather(&b, &[0, 1, 100], b.default_stream());
    // A second op with a bad slot on the same stream before the sync.
    let p = MlaCacheWriteParams { dims: KvDims { latent: 8, rope: 0 }, num_pages: 1, page_size: 2, format: KvCacheFormat::Bf16, kv_scale: 1.0 };
    let plan = MlaCacheWrite::plan(&b, &p, &MlaCacheWriteBatch { slot_mapping: vec![0] }).unwrap();
    let kv = b.upload_tensor(&HostTensor::from_f32(DType::F32, &[1, 8], &[1.0; 8]).unwrap()).unwrap();
    let slots = b.upload_tensor(&HostTensor::from_i64(&[1], &[7]).unwrap()).unwrap();
    let mut cache = b.zeros(DType::U8, &[1, 2, 16]).unwrap();
    let args = MlaCacheWriteArgs { kv: kv.as_ref(), slot_mapping: slots.as_ref(), cache: cache.as_mut() };
    MlaCacheWrite::run(&b, &plan, args, None, b.default_stream()).unwrap();
    assert_eq!(b.synchronize(b.default_stream()).unwrap_err().field(), Some("ids"));
    b.synchronize(b.default_stream()).expect("the later violation was dropped with the record");
    assert_eq!(b.download_tensor(&cache).unwrap().bytes, vec![0u8; 32], "the bad slot was skipped");
}

#[test]
fn checks_off_runs_the_same_kernels_without_a_record() {
    let on = simt_backend(32).unwrap();
    let off = simt_backend(32).unwrap();
    off.set_device_checks(DeviceChecks::Off);
    assert_eq!((on.device_checks(), off.device_checks()), (DeviceChecks::On, DeviceChecks::Off));
    let a = on.download_tensor(&gather(&on, &[7, 0, 3], on.default_stream())).unwrap();
    let b = off.download_tensor(&gather(&off, &[7, 0, 3], off.default_stream())).unwrap();
    assert_eq!(a.bytes, b.bytes);
    off.synchronize(off.default_stream()).unwrap();
    // On again: later launches are checked.
    off.set_device_checks(DeviceChecks::On);
    gather(&off, &[0, 8, 0], off.default_stream());
    assert_eq!(off.synchronize(off.default_stream()).unwrap_err().field(), Some("ids"));
}

const CHILD_ENV: &str = "K3_DEVICE_CHECKS_ASAN_CHILD";

/// A cache write whose device slot is one past a 1-page cache (the plan saw slot 0).
fn cache_write_past_the_end(b: &SimtBackend) -> kernel_api::Result<()> {
    let p = MlaCacheWriteParams { dims: KvDims { latent: 8, rope: 0 }, num_pages: 1, page_size: 2, format: KvCacheFormat::Bf16, kv_scale: 1.0 };
    let plan = MlaCacheWrite::plan(b, &p, &MlaCacheWriteBatch { slot_mapping: vec![0] }).unwrap();
    let kv = b.upload_tensor(&HostTensor::from_f32(DType::F32, &[1, 8], &[1.0; 8]).unwrap()).unwrap();
    let slots = b.upload_tensor(&HostTensor::from_i32(&[1], &[2]).unwrap()).unwrap();
    let mut cache = b.zeros(DType::U8, &[1, 2, 16]).unwrap();
    let args = MlaCacheWriteArgs { kv: kv.as_ref(), slot_mapping: slots.as_ref(), cache: cache.as_mut() };
    MlaCacheWrite::run(b, &plan, args, None, b.default_stream())?;
    b.synchronize(b.default_stream())
}

#[test]
fn asan_catches_the_write_the_checks_prevent() {
    let b = simt_backend(32).unwrap();
    if std::env::var(CHILD_ENV).is_ok() {
        b.set_device_checks(DeviceChecks::Off);
        let _ = cache_write_past_the_end(&b);
        panic!("AddressSanitizer did not stop the unchecked write past the cache");
    }
    // Checked: the write is skipped and reported.
    assert_eq!(cache_write_past_the_end(&b).unwrap_err().field(), Some("slot_mapping"));
    if !k3_backend_simt::asan_enabled() {
        println!(
            "skipped: the unchecked part needs an AddressSanitizer build \
             (K3_SIMT_ASAN=1 CARGO_TARGET_DIR=target/asan cargo test -p k3-backend-simt --test device_checks)"
        );
        return;
    }
    let exe = std::env::current_exe().expect("test executable");
    let child = Command::new(exe)
        .args(["asan_catches_the_write_the_checks_prevent", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("ASAN_OPTIONS", "detect_leaks=0")
        .output()
        .expect("spawn the child test");
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(!child.status.success(), "the child should have been stopped by ASan:\n{stderr}");
    assert!(stderr.contains("ERROR: AddressSanitizer: heap-buffer-overflow"), "{stderr}");
    assert!(stderr.contains("mla_cache_write.cu"), "the report should point into the cache-write kernel:\n{stderr}");
}
