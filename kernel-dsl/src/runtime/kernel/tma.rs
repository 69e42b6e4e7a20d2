//! Tensor maps for the copy engine: what the host encodes, at launch, for a variant whose
//! sm_90a PTX moves descriptor loads with `cp.async.bulk.tensor` ([`Variant::tma_maps`]).

use super::*;
use crate::ir::{TmaMap, ViewDim};
use cudarc::driver::sys;

/// `CUtensorMap`: 128 opaque bytes, 64-byte aligned, passed to the kernel by value.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct TensorMap(pub [u64; 16]);

/// Why a map could not be encoded.
pub(super) enum NoMap {
    /// The copy engine cannot take these arguments (alignment, sizes): the launch runs
    /// the sm_90 PTX, whose loads take any.
    Unsupported,
    /// The matrix the descriptor names does not fit in its buffer: an error in the
    /// arguments, whichever PTX runs.
    Error(String),
}

/// The value of size `d` among the launch's arguments.
fn dim(d: ViewDim, params: &[ParamDef], args: &[KernelArg<'_>]) -> Result<i64, NoMap> {
    match d {
        ViewDim::Const(c) => Ok(c),
        ViewDim::Param(i) => match args.get(i as usize).map(|a| &a.0) {
            Some(ArgRepr::Scalar(Scalar::I32(v))) => Ok(i64::from(*v)),
            Some(ArgRepr::Scalar(Scalar::U32(v))) => Ok(i64::from(*v)),
            Some(ArgRepr::Scalar(Scalar::I64(v))) => Ok(*v),
            _ => Err(NoMap::Error(format!(
                "a tensor descriptor's size `{}` is not an integer argument",
                params.get(i as usize).map_or("?", |p| p.name)
            ))),
        },
    }
}

/// The matrix `map` names in these arguments, checked against its buffer: the buffer,
/// rows, columns and row stride. `Unsupported` for an empty matrix.
fn view<'b>(
    map: &TmaMap,
    params: &[ParamDef],
    args: &'b [KernelArg<'_>],
) -> Result<(&'b dyn ErasedBuffer, i64, i64, i64), NoMap> {
    let v = &map.view;
    let name = params.get(v.ptr as usize).map_or("?", |p| p.name);
    let Some((buf, _)) = args.get(v.ptr as usize).and_then(|a| a.0.buffer()) else {
        return Err(NoMap::Error(format!(
            "the base `{name}` of a tensor descriptor is not a buffer argument"
        )));
    };
    let (rows, cols) = (dim(v.rows, params, args)?, dim(v.cols, params, args)?);
    let stride = dim(v.stride, params, args)?;
    if rows <= 0 || cols <= 0 {
        // An empty matrix: no block reads anything; the loads' path needs no map.
        return Err(NoMap::Unsupported);
    }
    // Lines are rows (row-major) or columns (column-major).
    let (lines, line) = if v.col_major {
        (cols, rows)
    } else {
        (rows, cols)
    };
    let what = if v.col_major { "column" } else { "row" };
    if lines > 1 && stride < line {
        return Err(NoMap::Error(format!(
            "the tensor descriptor over `{name}` has {what}s of {line} elements but a {what} stride of {stride}"
        )));
    }
    let needed = (lines - 1) * stride + line;
    if needed > buf.len() as i64 {
        return Err(NoMap::Error(format!(
            "the tensor descriptor over `{name}` spans {rows} x {cols} elements with a {what} stride of {stride} ({needed} elements), but the buffer holds {}",
            buf.len()
        )));
    }
    Ok((buf, rows, cols, stride))
}

/// Why these arguments are wrong for `map`'s matrix (it does not fit its buffer, a size
/// is not an integer), if they are; checked on every launch of a variant with maps,
/// whichever PTX runs.
pub(super) fn misfit(map: &TmaMap, params: &[ParamDef], args: &[KernelArg<'_>]) -> Option<String> {
    match view(map, params, args) {
        Err(NoMap::Error(e)) => Some(e),
        _ => None,
    }
}

/// Encodes `map` for these arguments.
pub(super) fn encode(
    map: &TmaMap,
    params: &[ParamDef],
    args: &[KernelArg<'_>],
) -> Result<TensorMap, NoMap> {
    let v = &map.view;
    let (buf, rows, cols, stride) = view(map, params, args)?;
    let esz = v.dtype.size_bytes() as i64;
    let addr = buf.device_addr().ok_or(NoMap::Unsupported)?;
    // The copy engine's rules: a 16-byte aligned base and row stride, sizes below 2^32
    // and strides below 2^40 bytes.
    if addr % 16 != 0
        || (stride * esz) % 16 != 0
        || stride * esz >= 1 << 40
        || rows >= 1 << 32
        || cols >= 1 << 32
    {
        return Err(NoMap::Unsupported);
    }
    use sys::CUtensorMapDataType as T;
    let dtype = match v.dtype {
        crate::ir::DType::BF16 => T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        crate::ir::DType::F16 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        crate::ir::DType::F32 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        crate::ir::DType::I32 => T::CU_TENSOR_MAP_DATA_TYPE_INT32,
        crate::ir::DType::U32 => T::CU_TENSOR_MAP_DATA_TYPE_UINT32,
        crate::ir::DType::I64 => T::CU_TENSOR_MAP_DATA_TYPE_INT64,
        crate::ir::DType::U8 => T::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        _ => return Err(NoMap::Unsupported),
    };
    use sys::CUtensorMapSwizzle as S;
    let swizzle = match map.swizzle_bytes {
        128 => S::CU_TENSOR_MAP_SWIZZLE_128B,
        64 => S::CU_TENSOR_MAP_SWIZZLE_64B,
        32 => S::CU_TENSOR_MAP_SWIZZLE_32B,
        _ => S::CU_TENSOR_MAP_SWIZZLE_NONE,
    };
    let rank = map.rank as usize;
    let mut dims = [0u64; 5];
    let mut strides = [0u64; 4];
    let mut boxes = [0u32; 5];
    for (i, d) in map.dims[..rank].iter().enumerate() {
        let total = if d.rows { rows } else { cols };
        dims[i] = if map.spans(i) {
            (total / i64::from(d.step)) as u64
        } else {
            u64::from(d.size)
        };
        if dims[i] == 0 {
            return Err(NoMap::Unsupported);
        }
        boxes[i] = d.size;
        let (row_step, col_step) = v.axis_strides(stride);
        let axis_step = if d.rows { row_step } else { col_step };
        let step_bytes = i64::from(d.step) * esz * axis_step;
        if i == 0 {
            // The first dim is the contiguous one.
            if axis_step != 1 || d.step != 1 {
                return Err(NoMap::Unsupported);
            }
        } else {
            if step_bytes % 16 != 0 || step_bytes >= 1 << 40 {
                return Err(NoMap::Unsupported);
            }
            strides[i - 1] = step_bytes as u64;
        }
    }
    let element_strides = [1u32; 5];
    let mut out = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every pointer is to a live array of the length the rank (2) implies, and
    // `out` is a properly aligned `CUtensorMap` the call fills.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            out.as_mut_ptr(),
            dtype,
            rank as u32,
            addr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(NoMap::Unsupported);
    }
    // SAFETY: the call succeeded, so `out` is initialized.
    let out = unsafe { out.assume_init() };
    Ok(TensorMap(out.opaque))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, MatrixView, ParamKind, TmaDim};
    use crate::runtime::Device;

    fn map() -> TmaMap {
        let d = TmaDim {
            rows: false,
            step: 1,
            size: 64,
        };
        TmaMap {
            view: MatrixView {
                ptr: 0,
                dtype: DType::F32,
                rows: ViewDim::Param(1),
                cols: ViewDim::Param(2),
                stride: ViewDim::Param(2),
                col_major: false,
            },
            rank: 2,
            dims: [
                d,
                TmaDim {
                    rows: true,
                    size: 8,
                    ..d
                },
                d,
                d,
                d,
            ],
            swizzle_bytes: 128,
        }
    }

    const PARAMS: [ParamDef; 3] = [
        ParamDef {
            name: "a",
            kind: ParamKind::Ptr(DType::F32),
            written: false,
        },
        ParamDef {
            name: "m",
            kind: ParamKind::Scalar(DType::I32),
            written: false,
        },
        ParamDef {
            name: "k",
            kind: ParamKind::Scalar(DType::I32),
            written: false,
        },
    ];

    /// A matrix larger than its buffer is an error naming the parameter and the sizes;
    /// one that fits, or is empty, is not.
    #[test]
    fn a_matrix_past_its_buffer_is_named() {
        let dev = Device::cpu();
        let buf = dev.upload(&vec![1.0f32; 100]).unwrap();
        let args = |m: i32, k: i32| {
            [
                KernelArg::read(&buf),
                KernelArg::from(m),
                KernelArg::from(k),
            ]
        };
        let e = misfit(&map(), &PARAMS, &args(11, 10)).expect("110 elements in 100");
        assert!(
            e.contains("`a`") && e.contains("11 x 10") && e.contains("holds 100"),
            "{e}"
        );
        assert_eq!(misfit(&map(), &PARAMS, &args(10, 10)), None);
        assert_eq!(misfit(&map(), &PARAMS, &args(0, 10)), None);
    }
}
