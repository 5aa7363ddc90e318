//! The CI check: a fresh bindgen run over the installed HIP headers must agree with the
//! declarations backend-rocm is built from. Without headers the test skips with the places it
//! looked, unless `K3_REQUIRE_HIP_HEADERS=1` (CI sets it after installing libamdhip64-dev).

#[test]
fn checked_in_declarations_match_a_fresh_bindgen_run() {
    let include = match k3_hip_decls::find_include_dir() {
        Ok(d) => d,
        Err(why) if std::env::var("K3_REQUIRE_HIP_HEADERS").as_deref() != Ok("1") => {
            println!("skipped: {why}");
            return;
        }
        Err(why) => panic!("K3_REQUIRE_HIP_HEADERS=1: {why}"),
    };
    let fresh = k3_hip_decls::generate(&include).unwrap_or_else(|e| panic!("{e}"));
    let path = k3_hip_decls::checked_in_path();
    let checked_in = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    if let Err(e) = k3_hip_decls::compare(&fresh, &checked_in) {
        panic!("{e}");
    }
    println!("{} agrees with {}", path.display(), include.display());
}
