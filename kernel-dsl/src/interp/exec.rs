//! Statement and expression execution for one program at a time.

use super::more_ops;
use super::ops::{self, Data, OpResult};
use super::{Arg, InterpError, Scalar};
use crate::ir::{
    AtomicOp, Block, DType, Def, Expr, FlagOp, Kernel, Literal, ParamKind, Stmt, ValueId,
};

/// The launch arguments, seen as memory.
struct Mem<'k, 'b, 'a> {
    kernel: &'k Kernel,
    args: &'b mut [Arg<'a>],
}

impl Mem<'_, '_, '_> {
    fn name(&self, param: usize) -> &str {
        self.kernel
            .params
            .get(param)
            .map_or("?", |p| p.name.as_str())
    }

    fn bytes(&self, param: usize) -> OpResult<&[u8]> {
        match self.args.get(param) {
            Some(Arg::Read(b)) => Ok(b),
            Some(Arg::Write(b)) => Ok(b),
            _ => Err(format!("parameter `{}` is not a buffer", self.name(param))),
        }
    }

    fn bytes_mut(&mut self, param: usize) -> OpResult<&mut [u8]> {
        let name = self.name(param).to_string();
        match self.args.get_mut(param) {
            Some(Arg::Write(b)) => Ok(b),
            Some(Arg::Read(_)) => Err(format!("write through read-only buffer parameter `{name}`")),
            _ => Err(format!("parameter `{name}` is not a buffer")),
        }
    }

    /// The byte range of element `off` of `param`, or the out-of-bounds error.
    fn range(
        &self,
        what: &str,
        param: usize,
        off: i64,
        len: usize,
        size: usize,
    ) -> OpResult<usize> {
        let n = len / size;
        if off < 0 || off as u64 >= n as u64 {
            return Err(format!(
                "{what} `{}` at element index {off} is out of bounds (the buffer has {n} elements)",
                self.name(param)
            ));
        }
        Ok(off as usize * size)
    }

    /// Reads the unmasked lanes with `dec`; masked-off lanes take `other(lane)`.
    fn gather<T>(
        &self,
        ptrs: &[(usize, i64)],
        mask: Option<&[bool]>,
        size: usize,
        dec: impl Fn(&[u8]) -> T,
        other: impl Fn(usize) -> T,
    ) -> OpResult<Vec<T>> {
        let mut out = Vec::with_capacity(ptrs.len());
        // Lanes of one load nearly always share a buffer; look it up once per change.
        let mut cur: Option<(usize, &[u8])> = None;
        for (lane, &(param, off)) in ptrs.iter().enumerate() {
            if mask.is_some_and(|m| !m[lane]) {
                out.push(other(lane));
                continue;
            }
            let buf = match cur {
                Some((p, b)) if p == param => b,
                _ => {
                    let b = self.bytes(param)?;
                    cur = Some((param, b));
                    b
                }
            };
            let at = self.range("load from", param, off, buf.len(), size)?;
            out.push(dec(&buf[at..at + size]));
        }
        Ok(out)
    }

    /// Writes the unmasked lanes. Two lanes writing different values to one address is
    /// an error: on the GPU which one lands is unspecified.
    fn scatter<T: Copy>(
        &mut self,
        ptrs: &[(usize, i64)],
        vals: &[T],
        mask: Option<&[bool]>,
        size: usize,
        enc: impl Fn(T, &mut [u8]),
    ) -> OpResult<()> {
        self.check_duplicates(ptrs, vals, mask, size, &enc)?;
        for (lane, &(param, off)) in ptrs.iter().enumerate() {
            if mask.is_some_and(|m| !m[lane]) {
                continue;
            }
            let len = self.bytes_mut(param)?.len();
            let at = self.range("store to", param, off, len, size)?;
            enc(vals[lane], &mut self.bytes_mut(param)?[at..at + size]);
        }
        Ok(())
    }

    /// Fails when two unmasked lanes store different bytes to one element.
    fn check_duplicates<T: Copy>(
        &self,
        ptrs: &[(usize, i64)],
        vals: &[T],
        mask: Option<&[bool]>,
        size: usize,
        enc: &impl Fn(T, &mut [u8]),
    ) -> OpResult<()> {
        let live = |lane: &usize| mask.is_none_or(|m| m[*lane]);
        // Strictly increasing addresses (the common case) cannot repeat: skip the sort.
        let mut prev = None;
        let increasing = (0..ptrs.len()).filter(live).all(|lane| {
            let ok = prev < Some(ptrs[lane]);
            prev = Some(ptrs[lane]);
            ok
        });
        if increasing {
            return Ok(());
        }
        let mut lanes: Vec<usize> = (0..ptrs.len()).filter(live).collect();
        // Stable: equal addresses keep row-major lane order, so errors name the first pair.
        lanes.sort_by_key(|&lane| ptrs[lane]);
        let bytes = |lane: usize| {
            let mut b = [0u8; 8];
            enc(vals[lane], &mut b[..size]);
            b
        };
        for w in lanes.windows(2) {
            let (a, b) = (w[0], w[1]);
            if ptrs[a] == ptrs[b] && bytes(a) != bytes(b) {
                let (param, off) = ptrs[a];
                return Err(format!(
                    "store to `{}` at element index {off}: lanes {a} and {b} (row-major) write \
                     different values to the same address; which one lands is unspecified",
                    self.name(param)
                ));
            }
        }
        Ok(())
    }

    /// Read-modify-write of each unmasked lane in row-major order; returns the old values.
    fn rmw<T: Copy>(
        &mut self,
        ptrs: &[(usize, i64)],
        vals: &[T],
        mask: Option<&[bool]>,
        codec: Codec<T>,
        f: impl Fn(T, T) -> T,
    ) -> OpResult<Vec<T>> {
        let mut old = Vec::with_capacity(ptrs.len());
        for (lane, &(param, off)) in ptrs.iter().enumerate() {
            if mask.is_some_and(|m| !m[lane]) {
                old.push(codec.zero);
                continue;
            }
            let size = codec.size;
            let len = self.bytes_mut(param)?.len();
            let at = self.range("atomic on", param, off, len, size)?;
            let cell = &mut self.bytes_mut(param)?[at..at + size];
            let prev = (codec.dec)(cell);
            (codec.enc)(f(prev, vals[lane]), cell);
            old.push(prev);
        }
        Ok(old)
    }
}

/// How one element of a dtype sits in memory.
struct Codec<T> {
    size: usize,
    zero: T,
    dec: fn(&[u8]) -> T,
    enc: fn(T, &mut [u8]),
}

fn le<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(b);
    a
}

/// Decodes one float element of `d` to f32.
fn dec_f(d: DType) -> fn(&[u8]) -> f32 {
    match d {
        DType::F16 => |b| ops::half_to_f32(DType::F16, u16::from_le_bytes(le(b))),
        DType::BF16 => |b| ops::half_to_f32(DType::BF16, u16::from_le_bytes(le(b))),
        _ => |b| f32::from_le_bytes(le(b)),
    }
}

fn enc_f(d: DType) -> fn(f32, &mut [u8]) {
    match d {
        DType::F16 => |x, b| b.copy_from_slice(&ops::f32_to_half(DType::F16, x).to_le_bytes()),
        DType::BF16 => |x, b| b.copy_from_slice(&ops::f32_to_half(DType::BF16, x).to_le_bytes()),
        _ => |x, b| b.copy_from_slice(&x.to_le_bytes()),
    }
}

fn dec_i(d: DType) -> fn(&[u8]) -> i64 {
    match d {
        DType::U8 => |b| b[0] as i64,
        DType::I32 => |b| i32::from_le_bytes(le(b)) as i64,
        DType::U32 => |b| u32::from_le_bytes(le(b)) as i64,
        _ => |b| i64::from_le_bytes(le(b)),
    }
}

fn enc_i(d: DType) -> fn(i64, &mut [u8]) {
    match d {
        DType::U8 => |x, b| b[0] = x as u8,
        DType::I32 | DType::U32 => |x, b| b.copy_from_slice(&(x as u32).to_le_bytes()),
        _ => |x, b| b.copy_from_slice(&x.to_le_bytes()),
    }
}

/// Executes the programs of one launch.
pub(crate) struct Exec<'k, 'b, 'a> {
    kernel: &'k Kernel,
    mem: Mem<'k, 'b, 'a>,
    grid: [u32; 3],
    pid: [u32; 3],
    env: Vec<Option<Data>>,
    /// The statement being run, for errors.
    loc: Option<crate::ir::Loc>,
}

fn get(env: &[Option<Data>], v: ValueId) -> OpResult<&Data> {
    env.get(v.index())
        .and_then(Option::as_ref)
        .ok_or_else(|| format!("{v} is used before it is defined"))
}

fn scalar_i(d: &Data, what: &str) -> OpResult<i64> {
    match d {
        Data::I(v) if v.len() == 1 => Ok(v[0]),
        _ => Err(format!("{what} must be an integer scalar")),
    }
}

fn mask_of<'d>(
    env: &'d [Option<Data>],
    mask: Option<ValueId>,
    n: usize,
) -> OpResult<Option<std::borrow::Cow<'d, [bool]>>> {
    use std::borrow::Cow;
    let Some(m) = mask else { return Ok(None) };
    match get(env, m)? {
        Data::B(b) if b.len() == n => Ok(Some(Cow::Borrowed(b))),
        Data::B(b) if b.len() == 1 => Ok(Some(Cow::Owned(vec![b[0]; n]))),
        d => Err(format!(
            "mask {m} is a {} tile of {} elements for {n} pointers",
            d.kind(),
            d.len()
        )),
    }
}

impl<'k, 'b, 'a> Exec<'k, 'b, 'a> {
    pub(crate) fn new(kernel: &'k Kernel, grid: [u32; 3], args: &'b mut [Arg<'a>]) -> Self {
        Exec {
            kernel,
            mem: Mem { kernel, args },
            grid,
            pid: [0; 3],
            env: vec![None; kernel.values.len()],
            loc: None,
        }
    }

    fn err(&self, message: String) -> InterpError {
        InterpError {
            kernel: self.kernel.name.clone(),
            message: format!(
                "program ({}, {}, {}): {message}",
                self.pid[0], self.pid[1], self.pid[2]
            ),
            loc: self.loc,
        }
    }

    /// Runs one program.
    pub(crate) fn program(&mut self, pid: [u32; 3]) -> Result<(), InterpError> {
        self.pid = pid;
        self.env.iter_mut().for_each(|e| *e = None);
        let k = self.kernel;
        self.block(&k.body).map_err(|m| self.err(m))
    }

    /// Runs the programs of one cluster (`pids` in cluster-rank order) statement by
    /// statement, each in its own environment: a `cluster_gather` (always a top-level
    /// `let`) stacks the operand of every program, in rank order, for all of them.
    /// Any interleaving of whole top-level statements is a schedule the GPU may run.
    pub(crate) fn cluster(&mut self, pids: &[[u32; 3]]) -> Result<(), InterpError> {
        let k = self.kernel;
        let mut envs = vec![vec![None; k.values.len()]; pids.len()];
        for stmt in &k.body.stmts {
            if let Stmt::Let(v) = stmt {
                if let Def::Expr(Expr::ClusterGather { value }) = &k.value(*v).def {
                    let mut parts = Vec::with_capacity(envs.len());
                    for (env, pid) in envs.iter().zip(pids) {
                        self.pid = *pid;
                        let d = get(env, *value).map_err(|m| self.err(format!("{v}: {m}")))?;
                        parts.push(d.clone());
                    }
                    let stacked = ops::concat(parts).map_err(|m| self.err(format!("{v}: {m}")))?;
                    for env in &mut envs {
                        env[v.index()] = Some(stacked.clone());
                    }
                    continue;
                }
            }
            for (env, pid) in envs.iter_mut().zip(pids) {
                self.pid = *pid;
                std::mem::swap(&mut self.env, env);
                let r = self.stmt(stmt);
                std::mem::swap(&mut self.env, env);
                r.map_err(|m| self.err(m))?;
            }
        }
        Ok(())
    }

    fn block(&mut self, block: &'k Block) -> OpResult<()> {
        for stmt in &block.stmts {
            self.stmt(stmt)?;
        }
        Ok(())
    }

    fn set(&mut self, v: ValueId, d: Data) -> OpResult<()> {
        let slot = self
            .env
            .get_mut(v.index())
            .ok_or_else(|| format!("{v} is not in the value arena"))?;
        *slot = Some(d);
        Ok(())
    }

    fn stmt(&mut self, stmt: &'k Stmt) -> OpResult<()> {
        // The statement an error is reported at (inner statements override it).
        self.loc = match stmt {
            Stmt::Let(v) => self.kernel.values.get(v.index()).map(|value| value.loc),
            Stmt::Store { loc, .. }
            | Stmt::Prefetch { loc, .. }
            | Stmt::PrefetchRange { loc, .. }
            | Stmt::Flag { loc, .. }
            | Stmt::For { loc, .. }
            | Stmt::While { loc, .. }
            | Stmt::If { loc, .. }
            | Stmt::WaitPriorKernels { loc }
            | Stmt::LaunchDependents { loc } => Some(*loc),
        };
        match stmt {
            Stmt::Let(v) => {
                let value = self
                    .kernel
                    .values
                    .get(v.index())
                    .ok_or_else(|| format!("{v} is not in the value arena"))?;
                let Def::Expr(e) = &value.def else {
                    return Err(format!("`let` of {v}, which is not an expression"));
                };
                let d = self.expr(*v, e)?;
                let n = self.kernel.ty(*v).numel();
                if d.len() != n {
                    return Err(format!(
                        "{v}: computed {} elements for type {}",
                        d.len(),
                        self.kernel.ty(*v)
                    ));
                }
                self.set(*v, d)
            }
            Stmt::Store {
                ptr, value, mask, ..
            } => self.store(*ptr, *value, *mask),
            Stmt::Prefetch { ptr, mask, .. } => self.prefetch(*ptr, *mask),
            Stmt::PrefetchRange { ptr, count, .. } => self.prefetch_range(*ptr, *count),
            Stmt::Flag {
                op: FlagOp::Signal,
                ptr,
                value,
                ..
            } => self.store(*ptr, *value, None),
            Stmt::Flag {
                op: FlagOp::WaitAtLeast,
                ptr,
                value,
                ..
            } => self.wait_flag(*ptr, *value),
            // Launches run one after another here: prior kernels are long finished.
            Stmt::WaitPriorKernels { .. } | Stmt::LaunchDependents { .. } => Ok(()),
            Stmt::For {
                index,
                start,
                end,
                step,
                carried,
                body,
                ..
            } => {
                let s = scalar_i(get(&self.env, *start)?, "a loop's start")?;
                let e = scalar_i(get(&self.env, *end)?, "a loop's end")?;
                let st = scalar_i(get(&self.env, *step)?, "a loop's step")?;
                if st <= 0 {
                    return Err(format!("loop step {st} is not positive"));
                }
                for c in carried {
                    let init = get(&self.env, c.init)?.clone();
                    self.set(c.param, init)?;
                }
                let mut i = s;
                while i < e {
                    self.set(*index, Data::I(vec![i]))?;
                    self.block(body)?;
                    // Read every `next` before writing any parameter: a `next` may be
                    // another carried parameter (swaps).
                    let nexts = carried
                        .iter()
                        .map(|c| get(&self.env, c.next).cloned())
                        .collect::<OpResult<Vec<_>>>()?;
                    for (c, n) in carried.iter().zip(nexts) {
                        self.set(c.param, n)?;
                    }
                    i = match i.checked_add(st) {
                        Some(n) => n,
                        None => break,
                    };
                }
                for c in carried {
                    let last = get(&self.env, c.param)?.clone();
                    self.set(c.result, last)?;
                }
                Ok(())
            }
            Stmt::While {
                cond_body,
                cond,
                carried,
                body,
                ..
            } => {
                for c in carried {
                    let init = get(&self.env, c.init)?.clone();
                    self.set(c.param, init)?;
                }
                loop {
                    self.block(cond_body)?;
                    let go = match get(&self.env, *cond)? {
                        Data::B(b) if b.len() == 1 => b[0],
                        _ => return Err(format!("`while` condition {cond} is not a scalar bool")),
                    };
                    if !go {
                        break;
                    }
                    self.block(body)?;
                    let nexts = carried
                        .iter()
                        .map(|c| get(&self.env, c.next).cloned())
                        .collect::<OpResult<Vec<_>>>()?;
                    for (c, n) in carried.iter().zip(nexts) {
                        self.set(c.param, n)?;
                    }
                }
                for c in carried {
                    let last = get(&self.env, c.param)?.clone();
                    self.set(c.result, last)?;
                }
                Ok(())
            }
            Stmt::If {
                cond,
                then_body,
                else_body,
                merges,
                ..
            } => {
                let c = match get(&self.env, *cond)? {
                    Data::B(b) if b.len() == 1 => b[0],
                    _ => return Err(format!("`if` condition {cond} is not a scalar bool")),
                };
                let body = if c { then_body } else { else_body };
                self.block(body)?;
                for m in merges {
                    let src = if c { m.then_value } else { m.else_value };
                    let d = get(&self.env, src)?.clone();
                    self.set(m.result, d)?;
                }
                Ok(())
            }
        }
    }

    fn pointee(&self, ptr: ValueId) -> OpResult<DType> {
        self.kernel
            .ty(ptr)
            .pointee()
            .ok_or_else(|| format!("{ptr} is not a pointer"))
    }

    fn dtype(&self, v: ValueId) -> OpResult<DType> {
        self.kernel
            .ty(v)
            .dtype()
            .ok_or_else(|| format!("{v} is a pointer, not a value"))
    }

    /// A cache hint: nothing to do here but check, as a load would, that every unmasked
    /// address lies inside its buffer.
    fn prefetch(&mut self, ptr: ValueId, mask: Option<ValueId>) -> OpResult<()> {
        let d = self.pointee(ptr)?;
        let env = &self.env;
        let Data::P(ptrs) = get(env, ptr)? else {
            return Err(format!("prefetch through {ptr}, which holds no pointers"));
        };
        let mask = mask_of(env, mask, ptrs.len())?;
        self.mem
            .gather(ptrs, mask.as_deref(), d.size_bytes(), |_| (), |_| ())?;
        Ok(())
    }

    /// A cache hint: checks that the range's first and last elements lie inside the
    /// pointer's buffer.
    fn prefetch_range(&mut self, ptr: ValueId, count: ValueId) -> OpResult<()> {
        let d = self.pointee(ptr)?;
        let env = &self.env;
        let Data::P(p) = get(env, ptr)? else {
            return Err(format!("prefetch through {ptr}, which holds no pointers"));
        };
        let Data::I(n) = get(env, count)? else {
            return Err(format!("prefetch count {count} is not an integer"));
        };
        let n = n.first().copied().unwrap_or(0);
        if n > 0 {
            let ends = [p[0], (p[0].0, p[0].1 + n - 1)];
            self.mem
                .gather(&ends, None, d.size_bytes(), |_| (), |_| ())?;
        }
        Ok(())
    }

    /// `wait_flag_at_least`: programs and launches run one after another here, so no
    /// other program can raise the flag while this one waits. A flag already at the
    /// value passes; one below it is an error (on the GPU the program would wait for a
    /// signal that, in this order, comes later or never).
    fn wait_flag(&mut self, ptr: ValueId, value: ValueId) -> OpResult<()> {
        let env = &self.env;
        let Data::P(p) = get(env, ptr)? else {
            return Err(format!("flag wait through {ptr}, which holds no pointers"));
        };
        let Data::I(want) = get(env, value)? else {
            return Err(format!("flag wait for {value}, which is not an integer"));
        };
        let want = want.first().copied().unwrap_or(0) as i32;
        let got = self.mem.gather(p, None, 4, dec_i(DType::I32), |_| 0)?;
        let flag = got.first().copied().unwrap_or(0) as i32;
        if flag.wrapping_sub(want) < 0 {
            return Err(format!(
                "`wait_flag_at_least` waits for the flag to reach {want}, but it holds {flag}: \
                 the interpreter runs programs and launches one after another, so nothing can \
                 raise it while this program waits (signal it from an earlier launch)"
            ));
        }
        Ok(())
    }

    fn store(&mut self, ptr: ValueId, value: ValueId, mask: Option<ValueId>) -> OpResult<()> {
        let d = self.pointee(ptr)?;
        let env = &self.env;
        let Data::P(ptrs) = get(env, ptr)? else {
            return Err(format!("store through {ptr}, which holds no pointers"));
        };
        let n = ptrs.len();
        let mask = mask_of(env, mask, n)?;
        let mask = mask.as_deref();
        let vals = get(env, value)?;
        if vals.len() != n {
            return Err(format!(
                "store of {} values through {n} pointers",
                vals.len()
            ));
        }
        let size = d.size_bytes();
        match vals {
            Data::F(v) if d.is_float() => self.mem.scatter(ptrs, v, mask, size, enc_f(d)),
            Data::I(v) if d.is_int() => self.mem.scatter(ptrs, v, mask, size, enc_i(d)),
            Data::B(v) if d == DType::Bool => {
                self.mem.scatter(ptrs, v, mask, size, |x, b| b[0] = x as u8)
            }
            other => Err(format!("store of {} values to a {d} buffer", other.kind())),
        }
    }

    fn expr(&mut self, v: ValueId, e: &Expr) -> OpResult<Data> {
        let k = self.kernel;
        let env = &self.env;
        let ty = k.ty(v);
        Ok(match e {
            Expr::ClusterGather { .. } => {
                return Err("`cluster_gather` outside the top level of the body".into())
            }
            Expr::Param(i) => {
                let p = k
                    .params
                    .get(*i)
                    .ok_or_else(|| format!("no parameter {i}"))?;
                match (p.kind, self.mem.args.get(*i)) {
                    (ParamKind::Ptr(_), _) => Data::P(vec![(*i, 0)]),
                    (_, Some(Arg::Scalar(s))) => match *s {
                        Scalar::I32(x) => Data::I(vec![x as i64]),
                        Scalar::U32(x) => Data::I(vec![x as i64]),
                        Scalar::I64(x) => Data::I(vec![x]),
                        Scalar::F32(x) => Data::F(vec![x]),
                    },
                    _ => return Err(format!("parameter `{}` has no scalar argument", p.name)),
                }
            }
            Expr::Literal(lit) => {
                let d = self.dtype(v)?;
                let one = match *lit {
                    Literal::Int(x, _) => match d {
                        DType::Bool => Data::B(vec![x != 0]),
                        d if d.is_float() => Data::F(vec![ops::int_to_float(d, x)]),
                        d => Data::I(vec![ops::wrap_i(d, x)]),
                    },
                    // Straight from the written f64: one rounding (or truncation).
                    Literal::Float(x, _) => match d {
                        DType::Bool => Data::B(vec![x != 0.0]),
                        d if d.is_float() => Data::F(vec![ops::f64_to_float(d, x)]),
                        DType::U8 => Data::I(vec![x as u8 as i64]),
                        DType::I32 => Data::I(vec![x as i32 as i64]),
                        DType::U32 => Data::I(vec![x as u32 as i64]),
                        _ => Data::I(vec![x as i64]),
                    },
                    Literal::Bool(b) => ops::cast(&Data::B(vec![b]), DType::Bool, d)?,
                };
                one.splat(ty.numel())?
            }
            Expr::GlobalTimer => Data::I(vec![global_timer_ns()]),
            // The interpreter runs every program on one processor.
            Expr::SmId => Data::I(vec![0]),
            Expr::ProgramId(a) | Expr::NumPrograms(a) => {
                let a = *a as usize;
                if a > 2 {
                    return Err(format!("axis {a} (the grid has axes 0, 1, 2)"));
                }
                let x = if matches!(e, Expr::ProgramId(_)) {
                    self.pid[a]
                } else {
                    self.grid[a]
                };
                Data::I(vec![x as i32 as i64])
            }
            Expr::Arange { start, end } => {
                Data::I((*start..*end).map(|x| ops::wrap_i(DType::I32, x)).collect())
            }
            Expr::Splat { value, shape } => get(env, *value)?.splat(shape.iter().product())?,
            Expr::Broadcast { value, shape } => {
                let from = &k.ty(*value).shape;
                let src = get(env, *value)?;
                if src.len() != from.iter().product::<usize>() {
                    return Err(format!(
                        "{value} has {} elements for shape {from:?}",
                        src.len()
                    ));
                }
                if from == shape {
                    src.clone()
                } else {
                    src.gather(&ops::broadcast_index(from, shape)?)
                }
            }
            Expr::ExpandDims { value, axis } => {
                if *axis > k.ty(*value).shape.len() {
                    return Err(format!(
                        "expand_dims at axis {axis} of a rank-{} tile",
                        k.ty(*value).shape.len()
                    ));
                }
                get(env, *value)?.clone()
            }
            Expr::Unary { op, arg } => ops::unary(*op, self.dtype(*arg)?, get(env, *arg)?)?,
            Expr::Binary { op, lhs, rhs } => {
                let d = self.dtype(*lhs)?;
                if self.dtype(*rhs)? != d {
                    return Err(format!("`{op:?}` of {d} and {}", self.dtype(*rhs)?));
                }
                ops::binary(*op, d, get(env, *lhs)?, get(env, *rhs)?)?
            }
            Expr::Compare { op, lhs, rhs } => ops::compare(*op, get(env, *lhs)?, get(env, *rhs)?)?,
            Expr::Select { cond, then, other } => {
                let t = get(env, *then)?;
                let o = get(env, *other)?;
                let n = ty.numel();
                let c = mask_of(env, Some(*cond), n)?.unwrap_or_default();
                fn sel<T: Copy>(c: &[bool], t: &[T], o: &[T]) -> Vec<T> {
                    c.iter()
                        .zip(t.iter().zip(o))
                        .map(|(&c, (&t, &o))| if c { t } else { o })
                        .collect()
                }
                if t.len() != n || o.len() != n {
                    return Err(format!(
                        "select of {} and {} elements into {n}",
                        t.len(),
                        o.len()
                    ));
                }
                match (t, o) {
                    (Data::F(t), Data::F(o)) => Data::F(sel(&c, t, o)),
                    (Data::I(t), Data::I(o)) => Data::I(sel(&c, t, o)),
                    (Data::B(t), Data::B(o)) => Data::B(sel(&c, t, o)),
                    (Data::P(t), Data::P(o)) => Data::P(sel(&c, t, o)),
                    _ => return Err(format!("select of {} and {}", t.kind(), o.kind())),
                }
            }
            Expr::Dot4 { a, b, acc } => {
                let signed = |v: ValueId| -> OpResult<bool> { Ok(self.dtype(v)? == DType::I32) };
                ops::dot4(
                    (get(env, *a)?, signed(*a)?),
                    (get(env, *b)?, signed(*b)?),
                    get(env, *acc)?,
                )?
            }
            Expr::BytePerm { a, b, sel } => {
                let signed = self.dtype(*a)? == DType::I32;
                ops::byte_perm(get(env, *a)?, get(env, *b)?, get(env, *sel)?, signed)?
            }
            Expr::Cast { value, to } => {
                let from = self.dtype(*value)?;
                ops::cast(get(env, *value)?, from, *to)?
            }
            Expr::Bitcast { value, to } => {
                let from = self.dtype(*value)?;
                ops::bitcast(get(env, *value)?, from, *to)?
            }
            Expr::AddPtr { ptr, offset } => {
                let (Data::P(p), Data::I(o)) = (get(env, *ptr)?, get(env, *offset)?) else {
                    return Err("add_ptr needs a pointer and an integer offset".into());
                };
                let n = p.len().max(o.len());
                let ok = |l: usize| l == n || l == 1;
                if !ok(p.len()) || !ok(o.len()) {
                    return Err(format!(
                        "add_ptr of {} pointers and {} offsets",
                        p.len(),
                        o.len()
                    ));
                }
                Data::P(
                    (0..n)
                        .map(|i| {
                            let (param, base) = p[if p.len() == 1 { 0 } else { i }];
                            (
                                param,
                                base.wrapping_add(o[if o.len() == 1 { 0 } else { i }]),
                            )
                        })
                        .collect(),
                )
            }
            Expr::Load { ptr, mask, other } => {
                let d = self.pointee(*ptr)?;
                let Data::P(ptrs) = get(env, *ptr)? else {
                    return Err(format!("load through {ptr}, which holds no pointers"));
                };
                let n = ptrs.len();
                let mask = mask_of(env, *mask, n)?;
                let mask = mask.as_deref();
                let other = match other {
                    Some(o) => {
                        let od = get(env, *o)?;
                        if od.len() != n && od.len() != 1 {
                            return Err(format!(
                                "`other` has {} elements for {n} pointers",
                                od.len()
                            ));
                        }
                        od.clone()
                    }
                    None => Data::zeros(d, 1),
                };
                let pick = |l: usize, len: usize| if len == 1 { 0 } else { l };
                let size = d.size_bytes();
                match (d, &other) {
                    (d, Data::F(o)) if d.is_float() => {
                        Data::F(
                            self.mem
                                .gather(ptrs, mask, size, dec_f(d), |l| o[pick(l, o.len())])?,
                        )
                    }
                    (d, Data::I(o)) if d.is_int() => {
                        Data::I(
                            self.mem
                                .gather(ptrs, mask, size, dec_i(d), |l| o[pick(l, o.len())])?,
                        )
                    }
                    (DType::Bool, Data::B(o)) => Data::B(self.mem.gather(
                        ptrs,
                        mask,
                        size,
                        |b| b[0] != 0,
                        |l| o[pick(l, o.len())],
                    )?),
                    (d, o) => return Err(format!("load of {d} with a {} `other`", o.kind())),
                }
            }
            Expr::Scan { op, value, axis } => {
                let d = self.dtype(*value)?;
                more_ops::scan(*op, d, get(env, *value)?, &k.ty(*value).shape, *axis)?
            }
            Expr::Permute { value, dims } => {
                let idx = more_ops::permute_index(&k.ty(*value).shape, dims)?;
                get(env, *value)?.gather(&idx)
            }
            Expr::Reshape { value, .. } => get(env, *value)?.clone(),
            Expr::Histogram { value, bins, mask } => {
                let x = get(env, *value)?;
                let m = mask_of(env, *mask, x.len())?;
                more_ops::histogram(x, *bins, m.as_deref())?
            }
            Expr::Rand { op, seed, offset } => {
                more_ops::rand(*op, get(env, *seed)?, get(env, *offset)?)?
            }
            Expr::Reduce { op, value, axis } => {
                let d = self.dtype(*value)?;
                ops::reduce(*op, d, get(env, *value)?, &k.ty(*value).shape, *axis)?
            }
            Expr::Dot { a, b, acc } => {
                let (sa, sb) = (&k.ty(*a).shape, &k.ty(*b).shape);
                let (m, kk, n) = match (sa.as_slice(), sb.as_slice()) {
                    (&[m, k1], &[k2, n]) if k1 == k2 => (m, k1, n),
                    _ => return Err(format!("dot of shapes {sa:?} and {sb:?}")),
                };
                let av = ops::to_f32(get(env, *a)?)?;
                let bv = ops::to_f32(get(env, *b)?)?;
                if av.len() != m * kk || bv.len() != kk * n {
                    return Err("dot operands do not match their shapes".into());
                }
                let mut out = match acc {
                    Some(c) => ops::to_f32(get(env, *c)?)?.into_owned(),
                    None => vec![0.0; m * n],
                };
                if out.len() != m * n {
                    return Err(format!("dot accumulator has {} elements", out.len()));
                }
                ops::matmul(&av, &bv, &mut out, m, kk, n);
                let rd = self.dtype(v)?;
                if !rd.is_float() {
                    return Err(format!("dot result of dtype {rd}"));
                }
                ops::round_vec(rd, &mut out);
                Data::F(out)
            }
            Expr::Atomic {
                op,
                ptr,
                value,
                mask,
            } => {
                let d = self.pointee(*ptr)?;
                let Data::P(ptrs) = get(env, *ptr)? else {
                    return Err(format!("atomic through {ptr}, which holds no pointers"));
                };
                let n = ptrs.len();
                let mask = mask_of(env, *mask, n)?;
                let mask = mask.as_deref();
                let vals = get(env, *value)?;
                if vals.len() != n {
                    return Err(format!("atomic of {} values on {n} pointers", vals.len()));
                }
                let size = d.size_bytes();
                match (op, vals) {
                    (AtomicOp::Add, Data::F(x)) if d.is_float() => Data::F(self.mem.rmw(
                        ptrs,
                        x,
                        mask,
                        Codec {
                            size,
                            zero: 0.0,
                            dec: dec_f(d),
                            enc: enc_f(d),
                        },
                        |p, q| ops::round_f(d, p + q),
                    )?),
                    (AtomicOp::Max, Data::F(x)) if d.is_float() => Data::F(self.mem.rmw(
                        ptrs,
                        x,
                        mask,
                        Codec {
                            size,
                            zero: 0.0,
                            dec: dec_f(d),
                            enc: enc_f(d),
                        },
                        f32::max,
                    )?),
                    (AtomicOp::Add, Data::I(x)) if d.is_int() => Data::I(self.mem.rmw(
                        ptrs,
                        x,
                        mask,
                        Codec {
                            size,
                            zero: 0,
                            dec: dec_i(d),
                            enc: enc_i(d),
                        },
                        |p, q| ops::wrap_i(d, p.wrapping_add(q)),
                    )?),
                    (AtomicOp::Max, Data::I(x)) if d.is_int() => Data::I(self.mem.rmw(
                        ptrs,
                        x,
                        mask,
                        Codec {
                            size,
                            zero: 0,
                            dec: dec_i(d),
                            enc: enc_i(d),
                        },
                        i64::max,
                    )?),
                    (op, x) => {
                        return Err(format!("atomic `{op:?}` of {} values on {d}", x.kind()))
                    }
                }
            }
        })
    }
}

/// Checks the arguments against the parameters (count, kinds, buffer lengths).
pub(crate) fn check_args(kernel: &Kernel, args: &[Arg<'_>]) -> Result<(), String> {
    if let Some(i) = kernel.values.iter().position(|v| v.ty.is_none()) {
        return Err(format!(
            "{} has no type: the interpreter runs typed kernels only",
            ValueId(i as u32)
        ));
    }
    if args.len() != kernel.params.len() {
        return Err(format!(
            "{} arguments for {} parameters",
            args.len(),
            kernel.params.len()
        ));
    }
    for (p, a) in kernel.params.iter().zip(args) {
        match (p.kind, a) {
            (ParamKind::Ptr(d), Arg::Read(_) | Arg::Write(_)) => {
                let len = match a {
                    Arg::Read(b) => b.len(),
                    Arg::Write(b) => b.len(),
                    Arg::Scalar(_) => 0,
                };
                if len % d.size_bytes() != 0 {
                    return Err(format!(
                        "buffer `{}` has {} bytes, not a multiple of the {}-byte {d}",
                        p.name,
                        len,
                        d.size_bytes()
                    ));
                }
            }
            (ParamKind::Scalar(d) | ParamKind::ScalarMultipleOf(d, _), Arg::Scalar(s)) => {
                let ok = matches!(
                    (d, s),
                    (DType::I32, Scalar::I32(_))
                        | (DType::U32, Scalar::U32(_))
                        | (DType::I64, Scalar::I64(_))
                        | (DType::F32, Scalar::F32(_))
                );
                if !ok {
                    return Err(format!("scalar `{}` is {d}, but got {s:?}", p.name));
                }
            }
            (ParamKind::Ptr(d), Arg::Scalar(_)) => {
                return Err(format!(
                    "parameter `{}` is a Ptr<{d}>, but got a scalar",
                    p.name
                ))
            }
            (_, _) => {
                return Err(format!(
                    "parameter `{}` is a scalar, but got a buffer",
                    p.name
                ))
            }
        }
        if let (ParamKind::ScalarMultipleOf(_, m), Arg::Scalar(s)) = (p.kind, a) {
            let x = match *s {
                Scalar::I32(x) => x as i64,
                Scalar::U32(x) => x as i64,
                Scalar::I64(x) => x,
                Scalar::F32(_) => 0,
            };
            if m != 0 && x % m as i64 != 0 {
                return Err(format!(
                    "scalar `{}` = {x} is not a multiple of {m}",
                    p.name
                ));
            }
        }
    }
    Ok(())
}

/// `global_timer()` on the interpreter: nanoseconds since the first call in this
/// process (monotonic, shared by every program and launch).
fn global_timer_ns() -> i64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    i64::try_from(epoch.elapsed().as_nanos()).unwrap_or(i64::MAX)
}
