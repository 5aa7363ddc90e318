//! The conformance suite on the ROCm backend: every op's GPU kernel against the oracles, when a
//! HIP device answers (a real one, or the emulator-backed stand-in selected with
//! `eval "$(bash scripts/standin-env.sh rocm gfx942)"`); otherwise every test prints
//! `skipped: <reason>`.

kernel_api::conformance_suite!(k3_backend_rocm::rocm_backend(0));
