//! Launches on the CPU interpreter: each variant compiled once from the kernel's source
//! and cached.

use super::*;

impl KernelDef {
    /// Compiles (once per variant) and interprets the kernel.
    pub(super) fn run_cpu(
        &self,
        variant: &'static Variant,
        grid: [u32; 3],
        args: &mut [KernelArg<'_>],
    ) -> Result<(), LaunchError> {
        let kernel = self.interp_kernel(variant)?;
        let mut iargs = Vec::with_capacity(args.len());
        for (param, arg) in self.params.iter().zip(args.iter_mut()) {
            let missing = || LaunchError::Arg {
                kernel: self.name.into(),
                param: param.name.into(),
                message: "the buffer has no host memory".into(),
            };
            iargs.push(match &mut arg.0 {
                ArgRepr::Scalar(s) => interp::Arg::Scalar(*s),
                ArgRepr::Read(b) => interp::Arg::Read(b.host_bytes().ok_or_else(missing)?),
                ArgRepr::ReadAs(b) => interp::Arg::Read(b.host_bytes().ok_or_else(missing)?),
                ArgRepr::Write(b) => {
                    if param.written {
                        interp::Arg::Write(b.host_bytes_mut().ok_or_else(missing)?)
                    } else {
                        interp::Arg::Read(b.host_bytes().ok_or_else(missing)?)
                    }
                }
            });
        }
        interp::run(&kernel, grid, &mut iargs).map_err(|mut e| {
            // Name the statement in the user's source, not an IR value.
            if let Some(at) = e
                .loc
                .and_then(|loc| crate::source_snippet(self.source, &self.spec_of(variant), loc))
            {
                e.message = format!("{} (at `{at}`)", e.message);
            }
            e
        })?;
        Ok(())
    }

    /// The specialization a variant was compiled for.
    pub(super) fn spec_of(&self, variant: &Variant) -> Specialization {
        Specialization {
            consts: self
                .const_names
                .iter()
                .zip(variant.consts)
                .map(|(n, v)| (n.to_string(), *v))
                .collect(),
            num_warps: variant.num_warps,
            num_stages: Some(variant.num_stages),
        }
    }

    /// The typed IR of one variant for the interpreter, compiled from the source text on
    /// first use and cached for the life of the process.
    pub(super) fn interp_kernel(
        &self,
        variant: &'static Variant,
    ) -> Result<Arc<ir::Kernel>, LaunchError> {
        type Key = (&'static str, &'static str, &'static [i64], u32, u32);
        static CACHE: OnceLock<Mutex<HashMap<Key, Arc<ir::Kernel>>>> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        let key: Key = (
            self.name,
            self.source,
            variant.consts,
            variant.num_warps,
            variant.num_stages,
        );
        if let Some(k) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(k.clone());
        }
        let spec = self.spec_of(variant);
        // Compiled outside the lock: a slow compile does not block other kernels.
        let kernel =
            crate::compile_source(self.source, &spec).map_err(|e| LaunchError::Compile {
                kernel: self.name.into(),
                message: format!(
                    "[{}] {}",
                    variant.describe(self.const_names, self.has_stage_axis()),
                    e.message
                ),
            })?;
        if kernel.params.len() != self.params.len() {
            return Err(LaunchError::Compile {
                kernel: self.name.into(),
                message: format!(
                    "the compiled kernel has {} parameters but its description lists {}",
                    kernel.params.len(),
                    self.params.len()
                ),
            });
        }
        let kernel = Arc::new(kernel);
        cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_insert(kernel.clone());
        Ok(kernel)
    }
}
