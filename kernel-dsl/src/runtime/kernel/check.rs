//! Argument checks before a launch: count, dtypes, devices, alignment, `multiple_of`,
//! each error naming the kernel and the parameter.

use super::*;

impl KernelDef {
    /// The parameter names, comma-separated.
    pub(super) fn param_names(&self) -> String {
        self.params
            .iter()
            .map(|p| p.name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub(super) fn arg_error(&self, param: &ParamDef, message: String) -> LaunchError {
        LaunchError::Arg {
            kernel: self.name.into(),
            param: param.name.into(),
            message,
        }
    }

    /// Checks grid, argument count, devices, dtypes, read/write and scalar constraints.
    pub(super) fn check(
        &self,
        dev: &Device,
        cfg: &LaunchConfig,
        variant_cluster: [u32; 3],
        args: &[KernelArg<'_>],
    ) -> Result<(), LaunchError> {
        for (axis, (&n, &max)) in ["x", "y", "z"].iter().zip(cfg.grid.iter().zip(&MAX_GRID)) {
            if n == 0 || n > max {
                return Err(LaunchError::Config {
                    kernel: self.name.into(),
                    message: format!(
                        "grid {:?}: the {axis} extent must be between 1 and {max}, got {n}",
                        cfg.grid
                    ),
                });
            }
        }
        if let Some(axis) = (0..3).find(|&a| cfg.grid[a] % variant_cluster[a] != 0) {
            return Err(LaunchError::Config {
                kernel: self.name.into(),
                message: format!(
                    "grid {:?} is not a multiple of the kernel's cluster {:?} along {}",
                    cfg.grid,
                    variant_cluster,
                    ["x", "y", "z"][axis]
                ),
            });
        }
        if args.len() != self.params.len() {
            return Err(LaunchError::ArgCount {
                kernel: self.name.into(),
                expected: self.params.len(),
                params: self.param_names(),
                got: args.len(),
            });
        }
        if self.params.len() > MAX_PARAMS {
            return Err(LaunchError::Config {
                kernel: self.name.into(),
                message: format!(
                    "{} parameters; at most {MAX_PARAMS} are supported",
                    self.params.len()
                ),
            });
        }
        for (param, arg) in self.params.iter().zip(args) {
            self.check_arg(dev, param, arg)?;
        }
        Ok(())
    }

    pub(super) fn check_arg(
        &self,
        dev: &Device,
        param: &ParamDef,
        arg: &KernelArg<'_>,
    ) -> Result<(), LaunchError> {
        match (param.kind, arg.0.buffer()) {
            (ParamKind::Ptr(want), Some((buf, is_write))) => {
                if buf.dtype() != want {
                    return Err(self.arg_error(
                        param,
                        format!(
                            "expected a buffer of {want}, got a buffer of {}",
                            buf.dtype()
                        ),
                    ));
                }
                if param.written && !is_write {
                    return Err(self.arg_error(
                        param,
                        "the kernel writes this buffer; pass it as `&mut Buffer` (KernelArg::write)".into(),
                    ));
                }
                if !dev.reaches(buf.device()) {
                    return Err(self.arg_error(
                        param,
                        format!(
                            "the buffer lives on {} but the launch is on {} (a peer GPU's buffer needs Device::enable_peer_access first)",
                            buf.device(),
                            dev
                        ),
                    ));
                }
                if let Some(addr) = buf.device_addr() {
                    if addr % 16 != 0 && buf.len() != 0 {
                        return Err(self.arg_error(
                            param,
                            format!("device address {addr:#x} is not 16-byte aligned"),
                        ));
                    }
                }
                Ok(())
            }
            (ParamKind::Ptr(want), None) => Err(self.arg_error(
                param,
                format!("expected a buffer of {want}, got the scalar {arg:?}"),
            )),
            (ParamKind::Scalar(want) | ParamKind::ScalarMultipleOf(want, _), Some((buf, _))) => {
                Err(self.arg_error(
                    param,
                    format!(
                        "expected a scalar of {want}, got a buffer of {}",
                        buf.dtype()
                    ),
                ))
            }
            (ParamKind::Scalar(want) | ParamKind::ScalarMultipleOf(want, _), None) => {
                let ArgRepr::Scalar(s) = &arg.0 else {
                    return Ok(());
                };
                if scalar_dtype(*s) != want {
                    return Err(self.arg_error(
                        param,
                        format!("expected a scalar of {want}, got {}", scalar_text(*s)),
                    ));
                }
                if let ParamKind::ScalarMultipleOf(_, d) = param.kind {
                    let v: i64 = match *s {
                        Scalar::I32(v) => v.into(),
                        Scalar::U32(v) => v.into(),
                        Scalar::I64(v) => v,
                        Scalar::F32(_) => 0,
                    };
                    if d == 0 || v % i64::from(d) != 0 {
                        return Err(self.arg_error(
                            param,
                            format!("the kernel requires a multiple of {d}, got {v}"),
                        ));
                    }
                }
                Ok(())
            }
        }
    }
}
