//! `k3-hip-decls [--write | --check]`: regenerates backend-rocm's HIP declarations from the HIP
//! headers found on this machine (`--write`), or checks the checked-in copy against them
//! (`--check`, the default; what CI runs through this crate's test).

use std::process::ExitCode;

fn main() -> ExitCode {
    let write = match std::env::args().nth(1).as_deref() {
        None | Some("--check") => false,
        Some("--write") => true,
        Some(other) => {
            eprintln!("unknown argument {other}; usage: k3-hip-decls [--write | --check]");
            return ExitCode::from(2);
        }
    };
    let run = || -> Result<String, String> {
        let include = k3_hip_decls::find_include_dir()?;
        let fresh = k3_hip_decls::generate(&include)?;
        let path = k3_hip_decls::checked_in_path();
        if write {
            std::fs::write(&path, &fresh).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            return Ok(format!("wrote {} from the headers in {}", path.display(), include.display()));
        }
        let checked_in = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        k3_hip_decls::compare(&fresh, &checked_in)?;
        Ok(format!("{} agrees with the headers in {}", path.display(), include.display()))
    };
    match run() {
        Ok(msg) => {
            println!("{msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("k3-hip-decls: {e}");
            ExitCode::FAILURE
        }
    }
}
