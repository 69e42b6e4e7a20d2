//! The tile IR: one specialized kernel (every compile-time constant bound to a value).
//!
//! The IR is an arena of [`Value`]s plus a tree of [`Stmt`]s, in the style of naga:
//! every value is defined exactly once, by an expression evaluated at a [`Stmt::Let`], or
//! by a structured statement (a loop's index, a loop-carried value, a loop or branch result).
//! Loops and branches are structured (`scf`-like): mutable variables of the surface
//! language become loop-carried values ([`Carried`]) and branch results ([`Merge`]).
//!
//! Two forms share these definitions: the untyped form that [`crate::front`] builds
//! (every `ty` is `None`), and the typed form that [`crate::valid::infer()`] produces, where
//! every value has a type, every shape is a compile-time constant, and implicit
//! broadcasts, splats and literal types have been made explicit. Consumers (the
//! interpreter and the backends) only ever see typed kernels, through [`Kernel::ty`].

#[cfg(test)]
pub(crate) mod builder;
mod dtype;

pub use dtype::{DType, Elem, Type};

use std::fmt;

/// Index of a value in [`Kernel::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    /// The arena index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// A location in the kernel's source: an index into the front end's span table.
///
/// The IR stays `Send + Sync` and free of `proc_macro2` spans; the front end keeps the
/// table that maps a `Loc` back to a span for compile errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Loc(pub u32);

/// One specialization of a kernel: a value for every compile-time constant, the number
/// of warps per program and the pipelining depth. IR construction (`front::lower`)
/// takes one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Specialization {
    /// `(name, value)` for every const generic, in declaration order.
    pub consts: Vec<(String, i64)>,
    /// Warps per program.
    pub num_warps: u32,
    /// Software-pipelining depth of `dot` operand loads (one of the attribute's
    /// `num_stages` values); `None` for the first value the attribute lists.
    pub num_stages: Option<u32>,
}

/// A specialized kernel.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// The kernel's name (the Rust function's name).
    pub name: String,
    /// Run-time parameters, in launch order.
    pub params: Vec<Param>,
    /// The compile-time constants this kernel was specialized with, in declaration order.
    pub consts: Vec<(String, i64)>,
    /// Warps per program.
    pub num_warps: u32,
    /// Shared-memory buffers a loop's `dot` operand loads are pipelined through
    /// (`num_stages` in the attribute): loads run `num_stages - 1` iterations ahead as
    /// `cp.async` copies; 1 turns pipelining off.
    pub num_stages: u32,
    /// Programs per thread-block cluster along x, y and z (`[1, 1, 1]`: no clusters).
    /// The grid must be a multiple of it; [`Expr::ClusterGather`] exchanges tiles
    /// between the programs of one cluster.
    pub cluster: [u32; 3],
    /// At most this many registers a thread (`max_registers(..)` in the attribute;
    /// `None`: what one program per SM may use).
    pub max_registers: Option<u32>,
    /// The value arena.
    pub values: Vec<Value>,
    /// The kernel body.
    pub body: Block,
    /// Loads through tensor descriptors (`make_tensor_descriptor` / `desc.load`): each
    /// is an ordinary masked [`Expr::Load`] in the body, listed here with its view and
    /// block origin so that a backend may copy it with the tensor-memory engine instead.
    pub view_loads: Vec<ViewLoad>,
}

/// Where one of a [`MatrixView`]'s sizes comes from: a scalar integer parameter (its
/// index) or a compile-time constant. The host reads it off the launch's arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ViewDim {
    /// The value of parameter `i`.
    Param(u32),
    /// A constant.
    Const(i64),
}

/// A matrix in global memory as a tensor descriptor sees it: elements of `dtype` from
/// pointer parameter `ptr`, `rows x cols`; row-major (the columns contiguous, `stride`
/// elements from one row to the next) or column-major (the rows contiguous, `stride`
/// from one column to the next).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatrixView {
    /// The pointer parameter's index.
    pub ptr: u32,
    /// The element type.
    pub dtype: DType,
    /// Rows.
    pub rows: ViewDim,
    /// Columns.
    pub cols: ViewDim,
    /// Elements from one row (column-major: column) to the next.
    pub stride: ViewDim,
    /// The rows, not the columns, are contiguous.
    pub col_major: bool,
}

impl MatrixView {
    /// Elements from one row to the next and from one column to the next, given the
    /// value of [`MatrixView::stride`].
    pub fn axis_strides(&self, stride: i64) -> (i64, i64) {
        if self.col_major {
            (1, stride)
        } else {
            (stride, 1)
        }
    }
}

/// One dimension of a [`TmaMap`]'s box: `size` steps of `step` rows (or columns)
/// of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct TmaDim {
    /// Along the rows (`true`) or the columns.
    pub rows: bool,
    /// Rows (columns) from one index of this dimension to the next.
    pub step: u32,
    /// The box's extent along it.
    pub size: u32,
}

/// A tensor map for the copy engine (`cp.async.bulk.tensor`): a matrix seen as a tensor
/// of `rank` dimensions (fastest first; the first is the contiguous axis, step 1), copied in
/// boxes of `dims[i].size` along each, stored in that order in shared memory with the
/// swizzle whose span is `swizzle_bytes` (128, 64 or 32: a box row's bytes). Along each
/// of rows and columns, the dimension of the largest step spans the matrix (extent
/// `total / step`, rounded down) and the others their box. The host encodes it
/// (`cuTensorMapEncodeTiled`) from the launch's arguments and passes it as a 128-byte
/// parameter after the kernel's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TmaMap {
    /// The matrix.
    pub view: MatrixView,
    /// Dimensions in use.
    pub rank: u32,
    /// The dimensions, fastest first.
    pub dims: [TmaDim; 5],
    /// The swizzle span in bytes.
    pub swizzle_bytes: u32,
}

impl TmaMap {
    /// Whether dimension `i` is the one of largest step along its axis (it spans the
    /// matrix; the box origin's coordinate goes there).
    pub fn spans(&self, i: usize) -> bool {
        let d = self.dims[i];
        self.dims[..self.rank as usize]
            .iter()
            .all(|o| o.rows != d.rows || o.step <= d.step)
    }
}

/// A block load through a tensor descriptor: `load`, the value of a masked
/// [`Expr::Load`] of the `[rows, cols]` block of `view` whose first element is at
/// (`origin[0]`, `origin[1]`), zero outside the view.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ViewLoad {
    /// The load's value.
    pub load: ValueId,
    /// The matrix it reads.
    pub view: MatrixView,
    /// The block's first row and first column (scalars).
    pub origin: [ValueId; 2],
}

impl Kernel {
    /// The definition of a value.
    pub fn value(&self, id: ValueId) -> &Value {
        &self.values[id.index()]
    }

    /// The type of a value in a typed kernel.
    ///
    /// # Panics
    /// On an untyped kernel (one that has not been through [`crate::valid::infer()`]);
    /// consumers only receive typed kernels.
    pub fn ty(&self, id: ValueId) -> &Type {
        self.values[id.index()]
            .ty
            .as_ref()
            .expect("typed kernel: every value has a type after inference")
    }

    /// Programs per cluster (1 without clusters).
    pub fn cluster_size(&self) -> u32 {
        self.cluster.iter().product()
    }

    /// Whether the kernel exchanges tiles between the programs of a cluster.
    pub fn gathers(&self) -> bool {
        let mut found = false;
        self.body.visit(&mut |stmt| {
            if let Stmt::Let(v) = stmt {
                found |= matches!(self.value(*v).def, Def::Expr(Expr::ClusterGather { .. }));
            }
        });
        found
    }

    /// Whether the kernel has a `dot` (for which an sm_90a module may be worth making).
    pub fn has_dot(&self) -> bool {
        self.values
            .iter()
            .any(|v| matches!(v.def, Def::Expr(Expr::Dot { .. })))
    }

    /// Threads per program (`32 * num_warps`).
    pub fn threads_per_program(&self) -> u32 {
        32 * self.num_warps
    }

    /// Parameters that the kernel writes (stores or atomics through them).
    pub fn written_params(&self) -> Vec<usize> {
        let mut written = Vec::new();
        self.body.visit(&mut |stmt| {
            let ptr = match stmt {
                Stmt::Store { ptr, .. } => Some(*ptr),
                Stmt::Flag {
                    op: FlagOp::Signal,
                    ptr,
                    ..
                } => Some(*ptr),
                Stmt::Let(v) => match &self.value(*v).def {
                    Def::Expr(Expr::Atomic { ptr, .. }) => Some(*ptr),
                    _ => None,
                },
                _ => None,
            };
            if let Some(p) = ptr {
                written.extend(self.root_params(p).unwrap_or_default());
            }
        });
        written.sort_unstable();
        written.dedup();
        written
    }

    /// Whether the kernel waits on a flag (`wait_flag_at_least`): its loads after the
    /// wait may read memory another program or GPU wrote during the kernel's lifetime.
    pub fn waits_on_flags(&self) -> bool {
        let mut waits = false;
        self.body.visit(&mut |s| {
            waits |= matches!(
                s,
                Stmt::Flag {
                    op: FlagOp::WaitAtLeast,
                    ..
                }
            )
        });
        waits
    }

    /// Pointer parameters loaded before the kernel's `wait_for_prior_kernels()`. Loading
    /// a buffer before the wait declares that no kernel launched before this one writes
    /// it (weights, say), so every load from it may take the non-coherent path. Empty
    /// when the kernel has no explicit wait (it then waits at entry).
    pub fn params_loaded_before_wait(&self) -> Vec<usize> {
        let mut before = true;
        let mut seen_wait = false;
        let mut loaded = Vec::new();
        self.body.visit(&mut |stmt| match stmt {
            Stmt::WaitPriorKernels { .. } => {
                before = false;
                seen_wait = true;
            }
            Stmt::Let(v) if before => {
                if let Def::Expr(Expr::Load { ptr, .. }) = &self.value(*v).def {
                    loaded.extend(self.root_params(*ptr).unwrap_or_default());
                }
            }
            _ => {}
        });
        if !seen_wait {
            loaded.clear();
        }
        loaded.sort_unstable();
        loaded.dedup();
        loaded
    }

    /// Every pointer parameter a pointer value may derive from (through `AddPtr`,
    /// broadcasts, splats, permutations and reshapes, both sides of a `select`, both sides of an `if`, and a
    /// loop-carried value's entry and end-of-body values), in ascending order; `None`
    /// when some path leads elsewhere (a pointer loaded from memory, say).
    pub fn root_params(&self, v: ValueId) -> Option<Vec<usize>> {
        // Values a carried or merged value may also take, besides the one its `Def`
        // names: the end of the loop body, the `else` side.
        let mut other: Vec<(ValueId, ValueId)> = Vec::new();
        self.body.visit(&mut |stmt| match stmt {
            Stmt::For { carried, .. } | Stmt::While { carried, .. } => {
                for c in carried {
                    other.push((c.param, c.next));
                    other.push((c.result, c.next));
                }
            }
            Stmt::If { merges, .. } => {
                for m in merges {
                    other.push((m.result, m.else_value));
                }
            }
            _ => {}
        });
        let mut roots = Vec::new();
        let mut seen = vec![false; self.values.len()];
        let mut todo = vec![v];
        while let Some(v) = todo.pop() {
            if std::mem::replace(&mut seen[v.index()], true) {
                continue;
            }
            todo.extend(other.iter().filter(|(of, _)| *of == v).map(|(_, alt)| *alt));
            match &self.value(v).def {
                Def::Expr(Expr::Param(i)) => roots.push(*i),
                Def::Expr(Expr::AddPtr { ptr, .. })
                | Def::Expr(Expr::Splat { value: ptr, .. })
                | Def::Expr(Expr::Broadcast { value: ptr, .. })
                | Def::Expr(Expr::ExpandDims { value: ptr, .. })
                | Def::Expr(Expr::Permute { value: ptr, .. })
                | Def::Expr(Expr::Reshape { value: ptr, .. }) => todo.push(*ptr),
                Def::Expr(Expr::Select { then, other, .. }) => {
                    todo.push(*then);
                    todo.push(*other);
                }
                Def::Carried { init } | Def::LoopResult { init } => todo.push(*init),
                Def::BranchResult { then_value } => todo.push(*then_value),
                _ => return None,
            }
        }
        roots.sort_unstable();
        roots.dedup();
        Some(roots)
    }
}

/// A run-time kernel parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// The name, as written.
    pub name: String,
    /// Pointer or scalar.
    pub kind: ParamKind,
    /// Where it was declared.
    pub loc: Loc,
}

/// What a run-time parameter is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// `Ptr<T>`: a device pointer to elements of `T`, 16-byte aligned (checked at launch).
    Ptr(DType),
    /// A scalar passed by value (`i32`, `u32`, `i64`, `f32`).
    Scalar(DType),
    /// A scalar integer the caller promises is a multiple of `divisor`
    /// (`#[multiple_of(16)] k: i32`); checked at launch, used for vectorization.
    ScalarMultipleOf(DType, u32),
}

impl ParamKind {
    /// The IR type of the parameter's value.
    pub fn ty(self) -> Type {
        match self {
            ParamKind::Ptr(d) => Type::scalar(Elem::Ptr(d)),
            ParamKind::Scalar(d) | ParamKind::ScalarMultipleOf(d, _) => Type::scalar(Elem::Val(d)),
        }
    }
}

/// One value in the arena.
#[derive(Clone, Debug)]
pub struct Value {
    /// How the value is defined.
    pub def: Def,
    /// Its type; `None` only in the untyped form built by the front end.
    pub ty: Option<Type>,
    /// Where in the source it comes from.
    pub loc: Loc,
}

/// How a value is defined.
#[derive(Clone, Debug, PartialEq)]
pub enum Def {
    /// Computed by an expression at the [`Stmt::Let`] that names it.
    Expr(Expr),
    /// The index of a [`Stmt::For`] (a scalar of the bounds' type).
    LoopIndex,
    /// A loop-carried value as seen inside the loop body; `init` is its value on entry.
    Carried {
        /// The value before the first iteration.
        init: ValueId,
    },
    /// A loop-carried value after the loop; `init` is its value on entry.
    LoopResult {
        /// The value before the first iteration (the result when the loop runs zero times).
        init: ValueId,
    },
    /// The value of a [`Merge`] after an `if`.
    BranchResult {
        /// The value when the condition holds.
        then_value: ValueId,
    },
}

/// A literal as written; the inference pass gives it a dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Literal {
    /// An integer literal (or a compile-time constant); typed `i32` unless suffixed
    /// or too large, then `i64`.
    Int(i64, Option<DType>),
    /// A float literal; typed `f32` unless suffixed.
    Float(f64, Option<DType>),
    /// `true` / `false`.
    Bool(bool),
}

/// Unary elementwise operations.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    /// Logical not for `bool`, bitwise not for integers.
    Not,
    Exp,
    Exp2,
    Log,
    Log2,
    Sqrt,
    Rsqrt,
    Sin,
    Cos,
    Abs,
    Sigmoid,
    Tanh,
    Floor,
    Ceil,
}

/// Binary elementwise operations (both operands of one type after inference).
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// Float division, or integer division truncating toward zero.
    Div,
    /// Remainder with the sign of the dividend (Rust's `%`).
    Rem,
    And,
    Or,
    Xor,
    Shl,
    /// Arithmetic for signed, logical for unsigned.
    Shr,
    Max,
    Min,
}

/// Comparisons; the result is `bool` of the operands' shape.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// Reductions along one axis.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    /// Index (`i32`) of the first maximum along the axis.
    Argmax,
    /// Index (`i32`) of the first minimum along the axis.
    Argmin,
}

/// Inclusive scans along one axis (Triton's `tl.cumsum` / `tl.cumprod`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScanOp {
    /// Running sum.
    Sum,
    /// Running product.
    Prod,
}

/// Philox-based random numbers (Triton's `tl.rand`, `tl.randn`, `tl.randint`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RandOp {
    /// `f32` uniform in `[0, 1)`.
    Uniform,
    /// `f32` standard normal (Box-Muller of the first two Philox words).
    Normal,
    /// `u32`: the first Philox word.
    Int,
}

/// Atomic read-modify-write operations on global memory.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    Add,
    Max,
}

/// Expressions. Operands are earlier values. In typed kernels, elementwise operands
/// have identical shapes (broadcasts are explicit) and identical dtypes (casts are
/// explicit), except where noted.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// Run-time parameter `i` (a scalar pointer or scalar).
    Param(usize),
    /// A literal scalar.
    Literal(Literal),
    /// `program_id(axis)`: `i32`.
    ProgramId(u32),
    /// `num_programs(axis)`: `i32`.
    NumPrograms(u32),
    /// `global_timer()`: `i64` nanoseconds of a clock shared by every program of every
    /// launch (the GPU's `%globaltimer`; the interpreter's monotonic clock), for
    /// timelines of when programs start, wait and end.
    GlobalTimer,
    /// `sm_id()`: the `i32` index of the multiprocessor running the program (the GPU's
    /// `%smid`; 0 on the interpreter), to see which programs share an SM in a timeline.
    SmId,
    /// `arange(start, end)`: the `i32` tile `[start, start+1, .., end-1]`.
    Arange {
        /// First element.
        start: i64,
        /// One past the last element.
        end: i64,
    },
    /// A tile of `shape` with every element equal to the scalar `value`
    /// (`zeros`, `full`, and the implicit splat of a scalar operand).
    Splat {
        /// A scalar.
        value: ValueId,
        /// The tile shape.
        shape: Vec<usize>,
    },
    /// Broadcast a tile to `shape`: same rank, each axis equal or 1 in the input.
    Broadcast {
        /// The tile.
        value: ValueId,
        /// The result shape.
        shape: Vec<usize>,
    },
    /// Insert an axis of length 1 at `axis` (Triton's `x[:, None]` / `x[None, :]`).
    ExpandDims {
        /// The tile.
        value: ValueId,
        /// Position of the new axis in the result.
        axis: usize,
    },
    /// Elementwise unary operation (float ops need a float operand).
    Unary {
        /// The operation.
        op: UnaryOp,
        /// The operand.
        arg: ValueId,
    },
    /// Elementwise binary operation. Shifts take an integer right operand of the same type.
    Binary {
        /// The operation.
        op: BinaryOp,
        /// Left operand.
        lhs: ValueId,
        /// Right operand.
        rhs: ValueId,
    },
    /// Elementwise comparison; result dtype `bool`.
    Compare {
        /// The comparison.
        op: CmpOp,
        /// Left operand.
        lhs: ValueId,
        /// Right operand.
        rhs: ValueId,
    },
    /// `select(cond, then, other)` (Triton's `where`): elementwise choice.
    Select {
        /// A `bool` tile or scalar.
        cond: ValueId,
        /// Chosen where `cond` holds.
        then: ValueId,
        /// Chosen elsewhere.
        other: ValueId,
    },
    /// `dot4(a, b, acc)`: each 32-bit element of `a` and `b` holds four bytes (signed
    /// for `i32`, unsigned for `u32`); the result is `acc + Σ a_byte[j] * b_byte[j]`
    /// over the four byte pairs, in `i32` (wrapping), elementwise with broadcasting
    /// (PTX `dp4a`).
    Dot4 {
        /// Four bytes an element (`i32` or `u32`).
        a: ValueId,
        /// Four bytes an element (`i32` or `u32`).
        b: ValueId,
        /// The `i32` accumulator.
        acc: ValueId,
    },
    /// `byte_perm(a, b, sel)` (CUDA's `__byte_perm`, PTX `prmt`): byte `n` of each
    /// result is byte `(sel >> 4n) & 7` of the eight bytes of `b:a` (`a`'s bytes 0-3,
    /// `b`'s 4-7); `a`, `b` and the result share one 32-bit integer dtype,
    /// elementwise with broadcasting. Sixteen-entry byte tables are two of them.
    BytePerm {
        /// Bytes 0 to 3.
        a: ValueId,
        /// Bytes 4 to 7.
        b: ValueId,
        /// Four 3-bit byte indices, in bits 0-2, 4-6, 8-10 and 12-14.
        sel: ValueId,
    },
    /// Convert to `to` (`x as T`): floats round to nearest even; float to int truncates
    /// toward zero and saturates; int to int wraps; to `bool` tests `!= 0`.
    Cast {
        /// The value.
        value: ValueId,
        /// Target dtype.
        to: DType,
    },
    /// Reinterpret the bits as `to`, a dtype of the same width (`x.bitcast::<T>()`,
    /// Triton's `x.to(T, bitcast=True)`): `i32`/`u32`/`f32` among themselves, `f16`
    /// and `bf16` between each other.
    Bitcast {
        /// The value.
        value: ValueId,
        /// Target dtype.
        to: DType,
    },
    /// Pointer arithmetic: `ptr + offset` in elements; `ptr` and `offset` have one shape.
    AddPtr {
        /// Pointer (tile or scalar).
        ptr: ValueId,
        /// Integer offset of the same shape.
        offset: ValueId,
    },
    /// Load through a pointer tile or scalar pointer. Masked-off lanes read nothing and
    /// yield `other` (zero when absent).
    Load {
        /// The pointers.
        ptr: ValueId,
        /// A `bool` of the pointers' shape, if any.
        mask: Option<ValueId>,
        /// The value of masked-off lanes, of the loaded shape and dtype, if any.
        other: Option<ValueId>,
    },
    /// Reduce `value` along `axis`; the result drops that axis (a rank-1 tile reduces
    /// to a scalar).
    Reduce {
        /// The reduction.
        op: ReduceOp,
        /// The tile.
        value: ValueId,
        /// The axis.
        axis: usize,
    },
    /// Matrix product of `[M, K]` and `[K, N]` tiles, accumulated in `f32` into `acc`
    /// (`[M, N]`, `f32`) when present.
    Dot {
        /// Left operand `[M, K]`.
        a: ValueId,
        /// Right operand `[K, N]`.
        b: ValueId,
        /// Accumulator `[M, N]` f32, if any.
        acc: Option<ValueId>,
    },
    /// Atomic read-modify-write; yields the old values (masked-off lanes yield zero).
    Atomic {
        /// The operation.
        op: AtomicOp,
        /// The pointers.
        ptr: ValueId,
        /// The operand, of the pointers' shape and pointee dtype.
        value: ValueId,
        /// A `bool` of the pointers' shape, if any.
        mask: Option<ValueId>,
    },
    /// Inclusive scan of `value` along `axis`; same shape and dtype.
    Scan {
        /// The combining operation.
        op: ScanOp,
        /// The tile.
        value: ValueId,
        /// The axis.
        axis: usize,
    },
    /// Permutes the axes: result axis `t` is `value`'s axis `dims[t]` (`trans`, `permute`).
    Permute {
        /// The tile.
        value: ValueId,
        /// A permutation of `0..rank`.
        dims: Vec<usize>,
    },
    /// The same elements in row-major order, in another shape of equal size.
    Reshape {
        /// The tile.
        value: ValueId,
        /// The result shape.
        shape: Vec<usize>,
    },
    /// Counts of each integer in `[0, bins)` among the elements of a 1-D integer tile
    /// (where `mask` holds); an `i32` tile of shape `[bins]`. Other values are ignored.
    Histogram {
        /// The 1-D integer tile.
        value: ValueId,
        /// The number of bins (a power of two).
        bins: usize,
        /// A `bool` of the value's shape, if any.
        mask: Option<ValueId>,
    },
    /// Philox4x32-10 random numbers, elementwise over `offset` (an `i32`/`u32` tile or
    /// scalar) under the 64-bit key `seed` (a scalar integer).
    Rand {
        /// What to draw.
        op: RandOp,
        /// The key.
        seed: ValueId,
        /// The counter of each element.
        offset: ValueId,
    },
    /// `cluster_gather(value)`: every program of the cluster contributes its `value`;
    /// each gets all of them stacked along a new leading axis, row `r` from the program
    /// of cluster rank `r` (`x` fastest within the cluster, then `y`, then `z`). Only at
    /// the top level of the body, where every program reaches it.
    ClusterGather {
        /// The tile (or scalar) each program contributes.
        value: ValueId,
    },
}

/// The operands of an `Expr` behind a reference (`&Expr` or `&mut Expr`), as a `Vec` of
/// references of the same kind, in order.
macro_rules! operand_refs {
    ($expr:expr) => {
        match $expr {
            Expr::Param(_)
            | Expr::Literal(_)
            | Expr::ProgramId(_)
            | Expr::NumPrograms(_)
            | Expr::GlobalTimer
            | Expr::SmId
            | Expr::Arange { .. } => vec![],
            Expr::Splat { value, .. }
            | Expr::Broadcast { value, .. }
            | Expr::ExpandDims { value, .. }
            | Expr::Cast { value, .. }
            | Expr::Bitcast { value, .. }
            | Expr::Reduce { value, .. }
            | Expr::Scan { value, .. }
            | Expr::Permute { value, .. }
            | Expr::Reshape { value, .. }
            | Expr::ClusterGather { value } => vec![value],
            Expr::Histogram { value, mask, .. } => {
                let mut v = vec![value];
                v.extend(mask);
                v
            }
            Expr::Rand { seed, offset, .. } => vec![seed, offset],
            Expr::Unary { arg, .. } => vec![arg],
            Expr::Binary { lhs, rhs, .. } | Expr::Compare { lhs, rhs, .. } => vec![lhs, rhs],
            Expr::Select { cond, then, other } => vec![cond, then, other],
            Expr::Dot4 { a, b, acc } => vec![a, b, acc],
            Expr::BytePerm { a, b, sel } => vec![a, b, sel],
            Expr::AddPtr { ptr, offset } => vec![ptr, offset],
            Expr::Load { ptr, mask, other } => {
                let mut v = vec![ptr];
                v.extend(mask);
                v.extend(other);
                v
            }
            Expr::Dot { a, b, acc } => {
                let mut v = vec![a, b];
                v.extend(acc);
                v
            }
            Expr::Atomic {
                ptr, value, mask, ..
            } => {
                let mut v = vec![ptr, value];
                v.extend(mask);
                v
            }
        }
    };
}

impl Expr {
    /// The operands of this expression, in order.
    pub fn operands(&self) -> Vec<ValueId> {
        operand_refs!(self).into_iter().copied().collect()
    }

    /// The operands of this expression, in the order of [`Expr::operands`], to rewrite
    /// them in place (renumbering an arena).
    pub fn operands_mut(&mut self) -> Vec<&mut ValueId> {
        operand_refs!(self)
    }

    /// Whether evaluating the expression has an effect beyond its value.
    pub fn has_side_effects(&self) -> bool {
        matches!(self, Expr::Atomic { .. } | Expr::ClusterGather { .. })
    }
}

/// A sequence of statements.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Block {
    /// The statements, in order.
    pub stmts: Vec<Stmt>,
}

impl Block {
    /// Calls `f` on every value a statement of the block names, at any depth: the values
    /// it defines (a `let`, a loop index, loop-carried and merged values) and those it
    /// uses (not the operands inside the arena's definitions), to rewrite them in place.
    pub fn for_each_value_mut(&mut self, f: &mut impl FnMut(&mut ValueId)) {
        for stmt in &mut self.stmts {
            match stmt {
                Stmt::Let(v) => f(v),
                Stmt::Store {
                    ptr, value, mask, ..
                } => {
                    f(ptr);
                    f(value);
                    mask.iter_mut().for_each(&mut *f);
                }
                Stmt::Prefetch { ptr, mask, .. } => {
                    f(ptr);
                    mask.iter_mut().for_each(&mut *f);
                }
                Stmt::PrefetchRange {
                    ptr, count: value, ..
                }
                | Stmt::Flag { ptr, value, .. } => {
                    f(ptr);
                    f(value);
                }
                Stmt::WaitPriorKernels { .. } | Stmt::LaunchDependents { .. } => {}
                Stmt::For {
                    index,
                    start,
                    end,
                    step,
                    carried,
                    body,
                    ..
                } => {
                    for v in [index, start, end, step] {
                        f(v);
                    }
                    carried_values_mut(carried, f);
                    body.for_each_value_mut(f);
                }
                Stmt::While {
                    cond_body,
                    cond,
                    carried,
                    body,
                    ..
                } => {
                    f(cond);
                    carried_values_mut(carried, f);
                    cond_body.for_each_value_mut(f);
                    body.for_each_value_mut(f);
                }
                Stmt::If {
                    cond,
                    then_body,
                    else_body,
                    merges,
                    ..
                } => {
                    f(cond);
                    for m in merges.iter_mut() {
                        for v in [&mut m.then_value, &mut m.else_value, &mut m.result] {
                            f(v);
                        }
                    }
                    then_body.for_each_value_mut(f);
                    else_body.for_each_value_mut(f);
                }
            }
        }
    }

    /// Calls `f` on every statement, depth first, in program order.
    pub fn visit(&self, f: &mut impl FnMut(&Stmt)) {
        for stmt in &self.stmts {
            f(stmt);
            match stmt {
                Stmt::For { body, .. } => body.visit(f),
                Stmt::While {
                    cond_body, body, ..
                } => {
                    cond_body.visit(f);
                    body.visit(f);
                }
                Stmt::If {
                    then_body,
                    else_body,
                    ..
                } => {
                    then_body.visit(f);
                    else_body.visit(f);
                }
                _ => {}
            }
        }
    }
}

fn carried_values_mut(carried: &mut [Carried], f: &mut impl FnMut(&mut ValueId)) {
    for c in carried {
        for v in [&mut c.param, &mut c.init, &mut c.next, &mut c.result] {
            f(v);
        }
    }
}

/// A loop-carried value of a [`Stmt::For`] or [`Stmt::While`].
#[derive(Clone, Debug, PartialEq)]
pub struct Carried {
    /// The value inside the body (defined as [`Def::Carried`]).
    pub param: ValueId,
    /// The value entering the first iteration.
    pub init: ValueId,
    /// The value at the end of the body, carried into the next iteration.
    pub next: ValueId,
    /// The value after the loop (defined as [`Def::LoopResult`]).
    pub result: ValueId,
}

/// The two sides of a flag handshake ([`Stmt::Flag`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagOp {
    /// `signal_flag(ptr, value)`: once every thread of the program has made its earlier
    /// memory accesses, one thread stores `value` at `ptr` with release semantics at
    /// system scope (visible to other GPUs and the host).
    Signal,
    /// `wait_flag_at_least(ptr, value)`: the program waits until the flag, read with
    /// acquire semantics at system scope, is at least `value` (compared modulo 2^32:
    /// `flag - value`, wrapping, as `i32` is not negative); what the signaler wrote
    /// before its signal is visible to every thread afterwards.
    WaitAtLeast,
}

/// A value merged at the end of a [`Stmt::If`].
#[derive(Clone, Debug, PartialEq)]
pub struct Merge {
    /// The value at the end of the `then` block.
    pub then_value: ValueId,
    /// The value at the end of the `else` block.
    pub else_value: ValueId,
    /// The value after the `if` (defined as [`Def::BranchResult`]).
    pub result: ValueId,
}

/// Statements.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// Evaluate the expression that defines this value.
    Let(ValueId),
    /// Store `value` through `ptr` where `mask` holds.
    Store {
        /// The pointers (tile or scalar).
        ptr: ValueId,
        /// The values, of the pointers' shape and pointee dtype.
        value: ValueId,
        /// A `bool` of the pointers' shape, if any.
        mask: Option<ValueId>,
        /// The statement's location.
        loc: Loc,
    },
    /// `for index in (start..end).step_by(step)`, with scalar run-time bounds of one
    /// integer type and a positive step.
    For {
        /// The loop index ([`Def::LoopIndex`]).
        index: ValueId,
        /// First index.
        start: ValueId,
        /// Exclusive end.
        end: ValueId,
        /// Step (must be positive at run time).
        step: ValueId,
        /// Loop-carried values.
        carried: Vec<Carried>,
        /// The loop body.
        body: Block,
        /// `.unroll(2)` on the range: the body is emitted twice per trip through the
        /// loop, the second copy reading the first copy's carried values where they were
        /// computed (a hint; the interpreter ignores it).
        unroll: bool,
        /// `.stages(n)` on the range (Triton's `tl.range(.., num_stages=n)`): the body's
        /// loads are copied into shared memory `n - 1` iterations ahead (a hint; the
        /// interpreter ignores it). 0 without the hint.
        stages: u32,
        /// The statement's location.
        loc: Loc,
    },
    /// `while cond { .. }`: runs `cond_body`, then `body` while `cond` (a scalar `bool`
    /// computed by `cond_body`) holds. Both see the loop-carried parameters.
    While {
        /// Statements computing the condition, run before every iteration.
        cond_body: Block,
        /// The condition (a scalar `bool` defined in `cond_body` or before the loop).
        cond: ValueId,
        /// Loop-carried values.
        carried: Vec<Carried>,
        /// The loop body.
        body: Block,
        /// The statement's location.
        loc: Loc,
    },
    /// `prefetch(ptrs, mask)`: asks the GPU's L2 cache to fetch the lines of these
    /// addresses (where `mask` holds); no value, no effect on any result.
    Prefetch {
        /// The pointers (tile or scalar).
        ptr: ValueId,
        /// A `bool` of the pointers' shape, if any.
        mask: Option<ValueId>,
        /// The statement's location.
        loc: Loc,
    },
    /// `prefetch_range(ptr, count)`: asks L2 for the `count` elements from the scalar
    /// pointer `ptr` (one bulk request on sm_90); no value, no effect on any result.
    PrefetchRange {
        /// The first element (a scalar pointer).
        ptr: ValueId,
        /// Elements to fetch (a scalar `i32`; nothing when not positive).
        count: ValueId,
        /// The statement's location.
        loc: Loc,
    },
    /// `wait_for_prior_kernels()`: memory written by the kernels launched before this
    /// one on the stream is visible after this point (Hopper's programmatic dependent
    /// launch); a no-op elsewhere. Only at the top level of the kernel body.
    WaitPriorKernels {
        /// The statement's location.
        loc: Loc,
    },
    /// `launch_dependents()`: the next kernel of the stream may be scheduled once every
    /// program has passed this point (Hopper's programmatic dependent launch; without the
    /// statement, at entry); a no-op elsewhere. Only at the top level of the kernel body.
    LaunchDependents {
        /// The statement's location.
        loc: Loc,
    },
    /// `signal_flag(ptr, value)` or `wait_flag_at_least(ptr, value)`: synchronization
    /// with programs of other launches, possibly on other GPUs, through an `i32` flag
    /// word (see [`FlagOp`]). Only at the top level of the kernel body.
    Flag {
        /// Which side of the handshake.
        op: FlagOp,
        /// The flag (a scalar `i32` pointer).
        ptr: ValueId,
        /// The value written, or the value waited for (a scalar `i32`).
        value: ValueId,
        /// The statement's location.
        loc: Loc,
    },
    /// `if cond { .. } else { .. }` on a scalar `bool`.
    If {
        /// A scalar `bool`.
        cond: ValueId,
        /// Runs when `cond` holds.
        then_body: Block,
        /// Runs otherwise.
        else_body: Block,
        /// Values merged after the branch.
        merges: Vec<Merge>,
        /// The statement's location.
        loc: Loc,
    },
}
