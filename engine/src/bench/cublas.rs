//! The cuBLAS bf16 GEMV baseline the kernel measurements compare against.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::CudaStream;
use tilefuse_dsl::half::bf16;
use tilefuse_dsl::runtime::{Buffer, Device};

use super::workloads::{PerfError, Result};

/// A cuBLAS handle on the device's stream, for the bf16 GEMV baseline.
pub struct Cublas {
    blas: CudaBlas,
}

/// Runs `f`, turning a panic (cudarc panics when a library or symbol is missing) into an
/// error, without printing the panic message.
fn no_panic<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    match r {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(PerfError(format!("{what}: {msg}")))
        }
    }
}

impl Cublas {
    /// Loads cuBLAS and creates a handle on `dev`'s stream. Returns an error (never
    /// panics) without a GPU or without a loadable `libcublas.so` (cudarc looks for
    /// `libcublas.so`, `libcublas.so.12`, … on the loader's path).
    pub fn new(dev: &Device) -> Result<Cublas> {
        let s = stream(dev)?.clone();
        no_panic("loading cuBLAS", || {
            // SAFETY: loading the library runs its initializers; nothing else.
            unsafe { cudarc::cublas::sys::culib() };
            Ok(Cublas {
                blas: CudaBlas::new(s)?,
            })
        })
    }

    /// `y = W x` for a row-major bf16 `W` of shape `[n, k]`, bf16 in and out, f32
    /// compute (`cublasGemmEx` with m = n, n = 1).
    pub fn gemv_bf16(
        &self,
        w: &Buffer<bf16>,
        x: &Buffer<bf16>,
        y: &mut Buffer<bf16>,
        n: usize,
        k: usize,
    ) -> Result<()> {
        if w.len() < n * k || x.len() < k || y.len() < n {
            return Err(PerfError(format!(
                "cuBLAS GEMV {n}x{k}: buffers too small (w {}, x {}, y {})",
                w.len(),
                x.len(),
                y.len()
            )));
        }
        let (Some(ws), Some(xs)) = (w.cuda_slice(), x.cuda_slice()) else {
            return Err(PerfError("cuBLAS needs CUDA buffers".into()));
        };
        let ys = y
            .cuda_slice_mut()
            .ok_or_else(|| PerfError("cuBLAS needs CUDA buffers".into()))?;
        // Row-major [n, k] is column-major [k, n]; transposed it is the [n, k] operand.
        let cfg = GemmConfig {
            transa: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T,
            transb: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
            m: n as i32,
            n: 1,
            k: k as i32,
            alpha: bf16::ONE,
            lda: k as i32,
            ldb: k as i32,
            beta: bf16::ZERO,
            ldc: n as i32,
        };
        no_panic("cuBLAS GemmEx", || {
            // SAFETY: the sizes were checked against the buffers above.
            unsafe { self.blas.gemm(cfg, ws, xs, ys) }?;
            Ok(())
        })
    }
}

/// The stream of a CUDA device, or an error for the CPU.
fn stream(dev: &Device) -> Result<&Arc<CudaStream>> {
    dev.as_cuda()
        .map(|d| d.stream())
        .ok_or_else(|| PerfError(format!("cuBLAS needs a CUDA device, got {dev}")))
}
impl Cublas {
    /// `c = a b` for row-major bf16 `a [m, k]`, `b [k, n]` and `c [m, n]`, f32 compute
    /// (`cublasGemmEx`; row-major `c` is column-major `c^T = b^T a^T`).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bf16(
        &self,
        a: &Buffer<bf16>,
        b: &Buffer<bf16>,
        c: &mut Buffer<bf16>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        if a.len() < m * k || b.len() < k * n || c.len() < m * n {
            return Err(PerfError(format!(
                "cuBLAS GEMM {m}x{n}x{k}: buffers too small (a {}, b {}, c {})",
                a.len(),
                b.len(),
                c.len()
            )));
        }
        let (Some(asl), Some(bsl)) = (a.cuda_slice(), b.cuda_slice()) else {
            return Err(PerfError("cuBLAS needs CUDA buffers".into()));
        };
        let csl = c
            .cuda_slice_mut()
            .ok_or_else(|| PerfError("cuBLAS needs CUDA buffers".into()))?;
        let op = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N;
        let cfg = GemmConfig {
            transa: op,
            transb: op,
            m: n as i32,
            n: m as i32,
            k: k as i32,
            alpha: bf16::ONE,
            lda: n as i32,
            ldb: k as i32,
            beta: bf16::ZERO,
            ldc: n as i32,
        };
        no_panic("cuBLAS GemmEx", || {
            // SAFETY: the sizes were checked against the buffers above.
            unsafe { self.blas.gemm(cfg, bsl, asl, csl) }?;
            Ok(())
        })
    }
}
