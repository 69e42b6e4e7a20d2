//! Launches on a CUDA device: the module loaded once per context, the function cached
//! (dynamic shared memory opted in), and the launch itself.

use super::*;

impl KernelDef {
    /// The loaded function for a variant on a GPU (loaded on first use).
    pub(super) fn cuda_function(
        &self,
        dev: &CudaDevice,
        variant: &'static Variant,
        portable: bool,
    ) -> Result<CudaFunction, LaunchError> {
        // `Variant`s are word-aligned statics: the low bit is free for the form.
        let key = variant as *const Variant as usize | usize::from(portable);
        let mut functions = dev.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = functions.get(&key) {
            return Ok(f.clone());
        }
        let (major, minor) = dev.compute_capability();
        let mut target = variant.target_for(major, minor);
        if target == Target::Sm90a && (!sm90a_enabled() || portable) {
            target = Target::Sm90;
        }
        let describe = variant.describe(self.const_names, self.has_stage_axis());
        let ptx = match register_override(self.name, &describe) {
            Err(message) => {
                return Err(LaunchError::Config {
                    kernel: self.name.into(),
                    message,
                })
            }
            Ok(Some(limit)) => {
                // Never above what one program an SM can hold (as the code generator caps).
                let most = crate::back::ptx::register_ceiling(variant.num_warps * 32);
                std::borrow::Cow::Owned(with_register_limit(variant.ptx(target), limit.min(most)))
            }
            Ok(None) => std::borrow::Cow::Borrowed(variant.ptx(target)),
        };
        if let Some(why) = variant.needs_newer_gpu(major) {
            return Err(LaunchError::Config {
                kernel: self.name.into(),
                message: format!("variant [{describe}] {why}"),
            });
        }
        if ptx.is_empty() || ptx.contains('\0') {
            return Err(LaunchError::Config {
                kernel: self.name.into(),
                message: format!("variant [{describe}] has no usable {} PTX", target.name()),
            });
        }
        if variant.entry.is_empty() || variant.entry.contains('\0') {
            return Err(LaunchError::Config {
                kernel: self.name.into(),
                message: format!(
                    "variant [{describe}] has an invalid entry name {:?}",
                    variant.entry
                ),
            });
        }
        let driver_err = |what: String| {
            let kernel = self.name.to_string();
            move |source| LaunchError::Driver {
                kernel,
                what,
                source,
            }
        };
        let module = dev
            .context()
            .load_module(CudaPtx::from_src(ptx.into_owned()))
            .map_err(driver_err(format!(
                "loading the {} PTX of [{describe}]",
                target.name()
            )))?;
        let f = module
            .load_function(variant.entry)
            .map_err(driver_err(format!(
                "finding entry `{}` of [{describe}]",
                variant.entry
            )))?;
        let dynamic = variant.dynamic_shared_bytes();
        if dynamic > 0 {
            // Above 48 KiB the function must opt in to its dynamic shared memory.
            use cudarc::driver::sys;
            // SAFETY: a valid function handle and a documented attribute.
            unsafe {
                sys::cuFuncSetAttribute(
                    f.cu_function(),
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    dynamic as i32,
                )
            }
            .result()
            .map_err(driver_err(format!(
                "allowing {dynamic} bytes of dynamic shared memory for [{describe}] (more than this device allows per program?)"
            )))?;
        }
        if variant.cluster.iter().product::<u32>() > 8 {
            // Clusters above 8 programs are "non-portable": the function must opt in.
            use cudarc::driver::sys;
            // SAFETY: a valid function handle and a documented attribute.
            unsafe {
                sys::cuFuncSetAttribute(
                    f.cu_function(),
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                    1,
                )
            }
            .result()
            .map_err(driver_err(format!(
                "allowing clusters of {:?} for [{describe}]",
                variant.cluster
            )))?;
        }
        functions.insert(key, f.clone());
        Ok(f)
    }

    /// `ask(function, variant)` of the loaded variant for `consts` and `num_warps`
    /// (`what`: the question, for errors), or `None` on the interpreter.
    pub(super) fn ask_driver(
        &self,
        dev: &Device,
        consts: &[i64],
        num_warps: Option<u32>,
        what: &str,
        ask: impl FnOnce(&CudaFunction, &Variant) -> Result<u32, cudarc::driver::DriverError>,
    ) -> Result<Option<u32>, LaunchError> {
        let variant = self.variant(consts, num_warps)?;
        let Some(cuda) = dev.as_cuda() else {
            return Ok(None);
        };
        let f = self.cuda_function(cuda, variant, false)?;
        ask(&f, variant)
            .map(Some)
            .map_err(|source| LaunchError::Driver {
                kernel: self.name.to_string(),
                what: format!("asking {what} of a variant"),
                source,
            })
    }

    /// Queues the kernel on the device's stream.
    pub(super) fn run_cuda(
        &self,
        dev: &CudaDevice,
        variant: &'static Variant,
        grid: [u32; 3],
        serialized: bool,
        args: &mut [KernelArg<'_>],
    ) -> Result<(), LaunchError> {
        // Tensor maps for the sm_90a PTX's copy-engine loads; where the arguments do not
        // suit the copy engine, the sm_90 PTX (pointer loads) runs instead.
        let (major, minor) = dev.compute_capability();
        if let Some(message) = variant
            .tma_maps
            .iter()
            .find_map(|m| tma::misfit(m, self.params, args))
        {
            return Err(LaunchError::Config {
                kernel: self.name.into(),
                message,
            });
        }
        let mut maps: Vec<tma::TensorMap> = Vec::new();
        let mut portable = false;
        if !variant.tma_maps.is_empty()
            && variant.target_for(major, minor) == Target::Sm90a
            && sm90a_enabled()
        {
            for m in variant.tma_maps {
                match tma::encode(m, self.params, args) {
                    Ok(t) => maps.push(t),
                    Err(tma::NoMap::Unsupported) => {
                        portable = true;
                        maps.clear();
                        break;
                    }
                    Err(tma::NoMap::Error(message)) => {
                        return Err(LaunchError::Config {
                            kernel: self.name.into(),
                            message,
                        })
                    }
                }
            }
        }
        let f = self.cuda_function(dev, variant, portable)?;
        // Every argument is at most 8 bytes: device pointers and 32/64-bit scalars.
        let mut slots = [[0u8; 8]; MAX_PARAMS];
        let n = args.len();
        for (slot, arg) in slots.iter_mut().zip(args.iter()) {
            match &arg.0 {
                ArgRepr::Read(b) => {
                    slot.copy_from_slice(&b.device_addr().unwrap_or(0).to_ne_bytes())
                }
                ArgRepr::ReadAs(b) => {
                    slot.copy_from_slice(&b.device_addr().unwrap_or(0).to_ne_bytes())
                }
                ArgRepr::Write(b) => {
                    slot.copy_from_slice(&b.device_addr().unwrap_or(0).to_ne_bytes())
                }
                ArgRepr::Scalar(s) => match *s {
                    Scalar::I32(v) => slot[..4].copy_from_slice(&v.to_ne_bytes()),
                    Scalar::U32(v) => slot[..4].copy_from_slice(&v.to_ne_bytes()),
                    Scalar::F32(v) => slot[..4].copy_from_slice(&v.to_ne_bytes()),
                    Scalar::I64(v) => slot.copy_from_slice(&v.to_ne_bytes()),
                },
            }
        }
        let mut params: Vec<*mut c_void> = slots[..n]
            .iter_mut()
            .map(|slot| slot.as_mut_ptr().cast())
            .collect();
        // The maps follow the kernel's parameters, by value.
        params.extend(
            maps.iter_mut()
                .map(|m| (m as *mut tma::TensorMap).cast::<c_void>()),
        );
        let n = params.len();
        let driver_err = |what: &str| {
            let kernel = self.name.to_string();
            let what = what.to_string();
            move |source| LaunchError::Driver {
                kernel,
                what,
                source,
            }
        };
        dev.context()
            .bind_to_thread()
            .map_err(driver_err("binding the context"))?;
        let block = 32 * variant.num_warps;
        let pdl = dev.programmatic_launch() && !serialized && !variant.ptx_sm90.is_empty();
        let clustered = variant.cluster != [1, 1, 1];
        if pdl || clustered {
            use cudarc::driver::sys;
            let mut attrs: Vec<sys::CUlaunchAttribute> = Vec::with_capacity(2);
            if pdl {
                // The sm_90 PTX waits for the previous kernel (`griddepcontrol.wait`)
                // before any global access, so the launch may overlap the previous
                // kernel's tail.
                let mut attr = sys::CUlaunchAttribute {
                    id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                    pad: [0; 4],
                    // SAFETY: an all-zero value is valid for this plain-data union.
                    value: unsafe { std::mem::zeroed() },
                };
                attr.value.programmaticStreamSerializationAllowed = 1;
                attrs.push(attr);
            }
            if clustered {
                let mut attr = sys::CUlaunchAttribute {
                    id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                    pad: [0; 4],
                    // SAFETY: as above.
                    value: unsafe { std::mem::zeroed() },
                };
                attr.value.clusterDim.x = variant.cluster[0];
                attr.value.clusterDim.y = variant.cluster[1];
                attr.value.clusterDim.z = variant.cluster[2];
                attrs.push(attr);
            }
            let config = sys::CUlaunchConfig {
                gridDimX: grid[0],
                gridDimY: grid[1],
                gridDimZ: grid[2],
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: variant.dynamic_shared_bytes(),
                hStream: dev.stream().cu_stream(),
                attrs: attrs.as_mut_ptr(),
                numAttrs: attrs.len() as u32,
            };
            // SAFETY: as below; `config` and `attrs` outlive the call.
            return unsafe {
                sys::cuLaunchKernelEx(
                    &config,
                    f.cu_function(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            }
            .result()
            .map_err(driver_err(match (pdl, clustered) {
                (true, true) => "launching (clusters, programmatic dependent launch)",
                (true, false) => "launching (programmatic dependent launch)",
                _ => "launching (clusters)",
            }));
        }
        // SAFETY: the arguments were checked against the signature the PTX was generated
        // from (count, pointer vs scalar, dtype, device); each slot holds the parameter's
        // value in its native size and outlives the call, which copies them.
        unsafe {
            cudarc::driver::result::launch_kernel(
                f.cu_function(),
                (grid[0], grid[1], grid[2]),
                (block, 1, 1),
                variant.dynamic_shared_bytes(),
                dev.stream().cu_stream(),
                &mut params[..n],
            )
        }
        .map_err(driver_err("launching"))
    }
}

/// The register limit `TILEFUSE_MAX_REGISTERS` sets for a variant, if any: a tuning
/// knob that sweeps `max_registers` without a rebuild (docs/language.md, "Register
/// limits at run time"). The value is `;`-separated rules, `kernel=N` or
/// `kernel[NAME=v,..]=N`, the bracketed pairs matched against the variant's constants and
/// `num_warps`; the first matching rule applies and replaces the attribute's limit.
fn register_override(kernel: &str, describe: &str) -> Result<Option<u32>, String> {
    static RULES: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let rules = RULES.get_or_init(|| std::env::var("TILEFUSE_MAX_REGISTERS").unwrap_or_default());
    register_rule(rules, kernel, describe)
        .map_err(|why| format!("TILEFUSE_MAX_REGISTERS={rules:?}: {why}"))
}

/// The first rule of `rules` (see [`register_override`]) that selects `kernel` with this
/// variant description (`NAME=v, .., num_warps=w`).
pub(super) fn register_rule(
    rules: &str,
    kernel: &str,
    describe: &str,
) -> Result<Option<u32>, String> {
    let have: Vec<&str> = describe.split(", ").collect();
    for rule in rules.split(';').map(str::trim).filter(|r| !r.is_empty()) {
        let (target, limit) = rule
            .rsplit_once('=')
            .ok_or_else(|| format!("rule `{rule}` is not `kernel=N` or `kernel[NAME=v,..]=N`"))?;
        let limit: u32 = limit
            .trim()
            .parse()
            .ok()
            .filter(|n| (16..=255).contains(n))
            .ok_or_else(|| format!("rule `{rule}`: the limit must be from 16 to 255"))?;
        let (name, pairs) = match target.split_once('[') {
            None => (target.trim(), ""),
            Some((name, rest)) => (
                name.trim(),
                rest.strip_suffix(']')
                    .ok_or_else(|| format!("rule `{rule}`: `[` without a closing `]`"))?,
            ),
        };
        let mut selects = name == kernel;
        for pair in pairs.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| format!("rule `{rule}`: `{pair}` is not `NAME=v`"))?;
            let want = format!("{}={}", k.trim(), v.trim());
            selects &= have.contains(&want.as_str());
        }
        if selects {
            return Ok(Some(limit));
        }
    }
    Ok(None)
}

/// `ptx` with its `.maxnreg` directives set to `limit`.
pub(super) fn with_register_limit(ptx: &str, limit: u32) -> String {
    let mut out = String::with_capacity(ptx.len());
    for line in ptx.split_inclusive('\n') {
        if line.starts_with(".maxnreg ") {
            let _ = writeln!(out, ".maxnreg {limit}");
        } else {
            out.push_str(line);
        }
    }
    out
}

/// Whether sm_90a modules may be used (`TILEFUSE_SM90A=0` turns them off, so that the
/// portable `mma.sync` variants can be measured against `wgmma` on one device).
fn sm90a_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("TILEFUSE_SM90A").map_or(true, |v| v != "0"))
}
