//! Running NVIDIA's `ptxas` on generated PTX, offline: finding the binary and reading its
//! resource report (registers, shared memory, spills, stack frame).
//!
//! Nothing here is needed to run kernels (the driver JIT-compiles PTX); tests and
//! `tilefuse inspect` use it to check that PTX assembles and stays in registers.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{PtxKernel, Target};

/// Where CI installs `ptxas` (relative to the repository root), see `.ci/run`.
pub const TOOLS_PATH: &str = ".tools/nvcc/nvidia/cuda_nvcc/bin/ptxas";

/// How to get `ptxas` when it is not found.
pub const HOW_TO_GET: &str =
    "install it with `python3 -m pip install --no-deps --target .tools/nvcc \
nvidia-cuda-nvcc-cu12==12.9.86` (what `.ci/run` does) or from a CUDA toolkit, then put it on \
PATH or set TILEFUSE_PTXAS=/path/to/ptxas";

/// Why no `ptxas` could be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotFound {
    /// `TILEFUSE_PTXAS` names a file that does not exist.
    BadEnv(PathBuf),
    /// Not in `TILEFUSE_PTXAS`, `.tools/` or `PATH`.
    Missing,
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotFound::BadEnv(p) => write!(
                f,
                "TILEFUSE_PTXAS={} does not exist; {HOW_TO_GET}",
                p.display()
            ),
            NotFound::Missing => write!(
                f,
                "ptxas not found (TILEFUSE_PTXAS unset, no {TOOLS_PATH} above the current \
                 directory, none on PATH); {HOW_TO_GET}"
            ),
        }
    }
}

impl std::error::Error for NotFound {}

/// Finds `ptxas`: `TILEFUSE_PTXAS`, else [`TOOLS_PATH`] in the current directory or one of
/// its ancestors, else `ptxas` on `PATH`.
pub fn find() -> Result<PathBuf, NotFound> {
    if let Some(p) = std::env::var_os("TILEFUSE_PTXAS").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(NotFound::BadEnv(p))
        };
    }
    if let Ok(mut dir) = std::env::current_dir() {
        loop {
            let c = dir.join(TOOLS_PATH);
            if c.is_file() {
                return Ok(c);
            }
            if !dir.pop() {
                break;
            }
        }
    }
    let exe = format!("ptxas{}", std::env::consts::EXE_SUFFIX);
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(&exe))
        .find(|c| c.is_file())
        .ok_or(NotFound::Missing)
}

/// What `ptxas -v` reports for one entry on one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The architecture assembled for.
    pub target: Target,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory, bytes.
    pub shared_bytes: u32,
    /// Bytes stored to local memory because registers ran out.
    pub spill_stores: u32,
    /// Bytes loaded back from local memory.
    pub spill_loads: u32,
    /// Per-thread stack frame, bytes.
    pub stack_frame: u32,
    /// The full `ptxas` output.
    pub log: String,
}

impl Report {
    /// No spills and no stack frame: everything stays in registers.
    pub fn is_clean(&self) -> bool {
        self.spill_stores == 0 && self.spill_loads == 0 && self.stack_frame == 0
    }

    /// Reads the numbers out of `ptxas -v` output.
    ///
    /// Returns `None` when a line the report always has (stack frame and spills, used
    /// registers) is missing.
    pub fn parse(target: Target, log: &str) -> Option<Report> {
        // `N <unit>` pairs: the number is the token just before the unit.
        let before = |line: &str, unit: &str| -> Option<u32> {
            let at = line.find(unit)?;
            line[..at]
                .split([' ', ',', ':'])
                .rev()
                .find(|t| !t.is_empty())?
                .parse()
                .ok()
        };
        let props = log.lines().find(|l| l.contains("bytes stack frame"))?;
        let used = log
            .lines()
            .find(|l| l.contains("Used ") && l.contains(" registers"))?;
        Some(Report {
            target,
            registers: before(used, " registers")?,
            shared_bytes: before(used, " bytes smem").unwrap_or(0),
            spill_stores: before(props, " bytes spill stores")?,
            spill_loads: before(props, " bytes spill loads")?,
            stack_frame: before(props, " bytes stack frame")?,
            log: log.to_string(),
        })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} registers, {} bytes shared, {} bytes spill stores, {} bytes spill loads, \
             {} bytes stack frame",
            self.target.name(),
            self.registers,
            self.shared_bytes,
            self.spill_stores,
            self.spill_loads,
            self.stack_frame
        )
    }
}

/// Assembling failed: `ptxas` could not run, rejected the PTX, or printed no report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AssembleError {
    /// The entry that was assembled.
    pub entry: String,
    /// The architecture.
    pub target: Target,
    /// What went wrong, with `ptxas`' output.
    pub message: String,
}

impl fmt::Display for AssembleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ptxas ({}) on `{}`: {}",
            self.target.name(),
            self.entry,
            self.message
        )
    }
}

impl std::error::Error for AssembleError {}

/// Assembles `kernel` (compiled for `target`) with the `ptxas` at `ptxas`, verbosely, and
/// returns its resource report. Safe to call from several threads at once.
pub fn assemble(ptxas: &Path, kernel: &PtxKernel, target: Target) -> Result<Report, AssembleError> {
    assemble_text(ptxas, &kernel.ptx, &kernel.entry, target)
}

/// [`assemble`] for PTX text with the `.entry` named `entry` (hand-written PTX included).
pub fn assemble_text(
    ptxas: &Path,
    ptx: &str,
    entry: &str,
    target: Target,
) -> Result<Report, AssembleError> {
    let fail = |message: String| AssembleError {
        entry: entry.to_string(),
        target,
        message,
    };
    // One directory per call: parallel callers must not share file names.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tilefuse-ptxas-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
    let src = dir.join(format!("{entry}.ptx"));
    let result = std::fs::write(&src, ptx)
        .map_err(|e| fail(format!("{}: {e}", src.display())))
        .and_then(|()| {
            Command::new(ptxas)
                .arg(format!("-arch={}", target.name()))
                .arg("-v")
                .arg(&src)
                .arg("-o")
                .arg(dir.join("out.cubin"))
                .output()
                .map_err(|e| fail(format!("cannot run {}: {e}", ptxas.display())))
        });
    let _ = std::fs::remove_dir_all(&dir);
    let out = result?;
    let log =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(fail(format!("rejected the PTX ({}):\n{log}", out.status)));
    }
    Report::parse(target, &log).ok_or_else(|| fail(format!("no resource report in:\n{log}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_verbose_report() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'softmax' for 'sm_90'\n\
ptxas info    : Function properties for softmax\n    \
8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 40 registers, 64 bytes smem, 380 bytes cmem[0]\n";
        let r = Report::parse(Target::Sm90, log).unwrap();
        assert_eq!(
            (
                r.registers,
                r.shared_bytes,
                r.spill_stores,
                r.spill_loads,
                r.stack_frame
            ),
            (40, 64, 4, 12, 8)
        );
        assert!(!r.is_clean());
        let clean = log
            .replace("8 bytes stack", "0 bytes stack")
            .replace("4 bytes spill", "0 bytes spill")
            .replace("12 bytes spill", "0 bytes spill")
            .replace("64 bytes smem, ", "");
        let r = Report::parse(Target::Sm90, &clean).unwrap();
        assert_eq!(r.shared_bytes, 0);
        assert!(r.is_clean());
        assert!(Report::parse(Target::Sm80, "ptxas info: nothing").is_none());
    }
}
