//! Helpers for tests, benches and examples that may or may not have a GPU.

use std::path::{Path, PathBuf};

use super::device::Device;

/// The environment variable that turns "no GPU" from a skip into a failure.
pub const REQUIRE_GPU_ENV: &str = "TILEFUSE_REQUIRE_GPU";

/// Whether `TILEFUSE_REQUIRE_GPU=1` is set.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| v == "1")
}

/// A CUDA device for a GPU-only test, or `None` to skip it.
///
/// Without a usable GPU this prints `skipped: no CUDA device` and returns `None`, unless
/// `TILEFUSE_REQUIRE_GPU=1` is set: then it panics, so a GPU run can never pass by
/// skipping.
pub fn gpu_or_skip(test_name: &str) -> Option<Device> {
    // `Device::cuda` probes the driver library first, so this never panics.
    let err = match Device::cuda(0) {
        Ok(d) => return Some(d),
        Err(e) => e.to_string(),
    };
    no_gpu(test_name, &err, gpu_required())
}

/// Serializes the tests of one process that use a GPU: [`Device::cuda`] hands every
/// caller the same stream, so one test's work would land in another's graph capture or
/// behind its waits. Hold the guard for as long as the test uses the device.
pub fn gpu_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a test does without a GPU: skip, or fail when a GPU is required.
fn no_gpu(test_name: &str, err: &str, required: bool) -> Option<Device> {
    if required {
        panic!("{test_name}: {REQUIRE_GPU_ENV}=1 but no CUDA device is usable: {err}");
    }
    println!("{test_name}: skipped: no CUDA device ({err})");
    None
}

/// Finds a file of the repository (for example `tests/fixtures/x.bin`) without baking
/// absolute paths into the binary.
///
/// Tries, in order, the crate directory named by `CARGO_MANIFEST_DIR` at run time (set
/// by `cargo test`/`cargo run`) and its parents, the working directory and its parents,
/// and the executable's directory and its parents. The error lists what was tried.
pub fn fixture_path(relative: impl AsRef<Path>) -> Result<PathBuf, String> {
    let relative = relative.as_ref();
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from) {
        if dir.is_dir() {
            roots.extend(dir.ancestors().map(Path::to_path_buf));
        }
    }
    if let Ok(dir) = std::env::current_dir() {
        roots.extend(dir.ancestors().map(Path::to_path_buf));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        roots.extend(dir.ancestors().map(Path::to_path_buf));
    }
    let mut tried = Vec::new();
    for root in roots {
        let candidate = root.join(relative);
        if candidate.exists() {
            return Ok(candidate);
        }
        if !tried.contains(&candidate) {
            tried.push(candidate);
        }
    }
    let tried: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "fixture `{}` not found; tried: {}",
        relative.display(),
        tried.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::cuda_available;

    #[test]
    fn skip_or_device() {
        let d = gpu_or_skip("skip_or_device");
        assert_eq!(d.is_some(), cuda_available());
    }

    #[test]
    fn skips_unless_required() {
        assert!(no_gpu("t", "no CUDA driver found (libcuda.so.1)", false).is_none());
    }

    #[test]
    #[should_panic(
        expected = "t: TILEFUSE_REQUIRE_GPU=1 but no CUDA device is usable: no CUDA device"
    )]
    fn required_gpu_fails_instead_of_skipping() {
        no_gpu("t", "no CUDA device", true);
    }

    #[test]
    fn finds_fixtures() {
        let p = fixture_path("kernel-dsl/Cargo.toml").unwrap();
        assert!(p.ends_with("kernel-dsl/Cargo.toml"));
        let err = fixture_path("no/such/file.bin").unwrap_err();
        assert!(
            err.contains("no/such/file.bin") && err.contains("tried"),
            "{err}"
        );
    }
}
