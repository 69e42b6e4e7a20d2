//! Test-only helpers: a small builder of typed kernels, byte conversions and a seeded PRNG.

use crate::ir::{
    AtomicOp, BinaryOp, Block, Carried, CmpOp, DType, Def, Elem, Expr, Kernel, Literal, Loc, Merge,
    Param, ParamKind, ReduceOp, Stmt, Type, UnaryOp, Value, ValueId,
};

/// Builds a typed kernel statement by statement, inferring result types the simple way.
pub struct Kb {
    k: Kernel,
    blocks: Vec<Vec<Stmt>>,
}

impl Kb {
    pub fn new(name: &str) -> Kb {
        Kb {
            k: Kernel {
                name: name.into(),
                params: vec![],
                consts: vec![],
                num_warps: 4,
                num_stages: 1,
                cluster: [1, 1, 1],
                values: vec![],
                body: Block::default(),
            },
            blocks: vec![vec![]],
        }
    }

    pub fn finish(mut self) -> Kernel {
        assert_eq!(self.blocks.len(), 1);
        self.k.body = Block {
            stmts: self.blocks.pop().unwrap(),
        };
        self.k
    }

    pub fn ty(&self, v: ValueId) -> Type {
        self.k.ty(v).clone()
    }

    fn value(&mut self, def: Def, ty: Type) -> ValueId {
        self.k.values.push(Value {
            def,
            ty: Some(ty),
            loc: Loc::default(),
        });
        ValueId(self.k.values.len() as u32 - 1)
    }

    fn push(&mut self, s: Stmt) {
        self.blocks.last_mut().unwrap().push(s);
    }

    /// A `let` of `e` with type `ty`.
    pub fn let_(&mut self, e: Expr, ty: Type) -> ValueId {
        let v = self.value(Def::Expr(e), ty);
        self.push(Stmt::Let(v));
        v
    }

    fn param(&mut self, name: &str, kind: ParamKind) -> ValueId {
        self.k.params.push(Param {
            name: name.into(),
            kind,
            loc: Loc::default(),
        });
        let i = self.k.params.len() - 1;
        self.let_(Expr::Param(i), kind.ty())
    }

    pub fn ptr(&mut self, name: &str, d: DType) -> ValueId {
        self.param(name, ParamKind::Ptr(d))
    }

    pub fn scalar(&mut self, name: &str, d: DType) -> ValueId {
        self.param(name, ParamKind::Scalar(d))
    }

    pub fn lit(&mut self, l: Literal, d: DType) -> ValueId {
        self.let_(Expr::Literal(l), Type::val(d, vec![]))
    }

    pub fn int(&mut self, x: i64, d: DType) -> ValueId {
        self.lit(Literal::Int(x, None), d)
    }

    pub fn i32(&mut self, x: i64) -> ValueId {
        self.int(x, DType::I32)
    }

    pub fn f32(&mut self, x: f64) -> ValueId {
        self.lit(Literal::Float(x, None), DType::F32)
    }

    pub fn pid(&mut self, axis: u32) -> ValueId {
        self.let_(Expr::ProgramId(axis), Type::val(DType::I32, vec![]))
    }

    pub fn arange(&mut self, start: i64, end: i64) -> ValueId {
        self.let_(
            Expr::Arange { start, end },
            Type::val(DType::I32, vec![(end - start) as usize]),
        )
    }

    pub fn splat(&mut self, value: ValueId, shape: &[usize]) -> ValueId {
        let elem = self.ty(value).elem;
        self.let_(
            Expr::Splat {
                value,
                shape: shape.to_vec(),
            },
            Type::tile(elem, shape.to_vec()),
        )
    }

    pub fn broadcast(&mut self, value: ValueId, shape: &[usize]) -> ValueId {
        let elem = self.ty(value).elem;
        self.let_(
            Expr::Broadcast {
                value,
                shape: shape.to_vec(),
            },
            Type::tile(elem, shape.to_vec()),
        )
    }

    pub fn expand(&mut self, value: ValueId, axis: usize) -> ValueId {
        let mut t = self.ty(value);
        t.shape.insert(axis, 1);
        self.let_(Expr::ExpandDims { value, axis }, t)
    }

    pub fn un(&mut self, op: UnaryOp, arg: ValueId) -> ValueId {
        let t = self.ty(arg);
        self.let_(Expr::Unary { op, arg }, t)
    }

    /// Binary op; a scalar operand is splat to the other's shape first.
    pub fn bin(&mut self, op: BinaryOp, lhs: ValueId, rhs: ValueId) -> ValueId {
        let (lhs, rhs) = self.unify(lhs, rhs);
        let t = self.ty(lhs);
        self.let_(Expr::Binary { op, lhs, rhs }, t)
    }

    fn unify(&mut self, a: ValueId, b: ValueId) -> (ValueId, ValueId) {
        let (ta, tb) = (self.ty(a), self.ty(b));
        if ta.shape == tb.shape {
            (a, b)
        } else if ta.is_scalar() {
            (self.splat(a, &tb.shape), b)
        } else {
            (a, self.splat(b, &ta.shape))
        }
    }

    pub fn cmp(&mut self, op: CmpOp, lhs: ValueId, rhs: ValueId) -> ValueId {
        let (lhs, rhs) = self.unify(lhs, rhs);
        let shape = self.ty(lhs).shape;
        self.let_(
            Expr::Compare { op, lhs, rhs },
            Type::val(DType::Bool, shape),
        )
    }

    pub fn select(&mut self, cond: ValueId, then: ValueId, other: ValueId) -> ValueId {
        let t = self.ty(then);
        self.let_(Expr::Select { cond, then, other }, t)
    }

    pub fn cast(&mut self, value: ValueId, to: DType) -> ValueId {
        let shape = self.ty(value).shape;
        self.let_(Expr::Cast { value, to }, Type::val(to, shape))
    }

    /// `ptr + offset`; a scalar pointer is splat to the offset's shape.
    pub fn add_ptr(&mut self, ptr: ValueId, offset: ValueId) -> ValueId {
        let (ptr, offset) = self.unify(ptr, offset);
        let t = Type::tile(self.ty(ptr).elem, self.ty(offset).shape);
        self.let_(Expr::AddPtr { ptr, offset }, t)
    }

    pub fn load(&mut self, ptr: ValueId, mask: Option<ValueId>, other: Option<ValueId>) -> ValueId {
        let t = self.ty(ptr);
        let d = t.pointee().unwrap();
        self.let_(Expr::Load { ptr, mask, other }, Type::val(d, t.shape))
    }

    pub fn store(&mut self, ptr: ValueId, value: ValueId, mask: Option<ValueId>) {
        self.push(Stmt::Store {
            ptr,
            value,
            mask,
            loc: Loc::default(),
        });
    }

    pub fn reduce(&mut self, op: ReduceOp, value: ValueId, axis: usize) -> ValueId {
        let mut t = self.ty(value);
        t.shape.remove(axis);
        if op == ReduceOp::Argmax {
            t.elem = Elem::Val(DType::I32);
        }
        self.let_(Expr::Reduce { op, value, axis }, t)
    }

    pub fn dot(&mut self, a: ValueId, b: ValueId, acc: Option<ValueId>) -> ValueId {
        let (m, n) = (self.ty(a).shape[0], self.ty(b).shape[1]);
        self.let_(Expr::Dot { a, b, acc }, Type::val(DType::F32, vec![m, n]))
    }

    pub fn atomic(
        &mut self,
        op: AtomicOp,
        ptr: ValueId,
        value: ValueId,
        mask: Option<ValueId>,
    ) -> ValueId {
        let t = self.ty(value);
        self.let_(
            Expr::Atomic {
                op,
                ptr,
                value,
                mask,
            },
            t,
        )
    }

    /// `for i in (start..end).step_by(step)` carrying `inits`; `body` gets the index and
    /// the carried values and returns the next values. Returns the loop results.
    pub fn for_(
        &mut self,
        start: ValueId,
        end: ValueId,
        step: ValueId,
        inits: &[ValueId],
        body: impl FnOnce(&mut Kb, ValueId, &[ValueId]) -> Vec<ValueId>,
    ) -> Vec<ValueId> {
        let index = self.value(Def::LoopIndex, self.ty(start));
        let params: Vec<ValueId> = inits
            .iter()
            .map(|&init| self.value(Def::Carried { init }, self.ty(init)))
            .collect();
        self.blocks.push(vec![]);
        let nexts = body(self, index, &params);
        let stmts = self.blocks.pop().unwrap();
        let carried = inits
            .iter()
            .zip(&params)
            .zip(&nexts)
            .map(|((&init, &param), &next)| Carried {
                param,
                init,
                next,
                result: self.value(Def::LoopResult { init }, self.ty(init)),
            })
            .collect::<Vec<_>>();
        let results = carried.iter().map(|c| c.result).collect();
        self.push(Stmt::For {
            index,
            start,
            end,
            step,
            carried,
            body: Block { stmts },
            loc: Loc::default(),
        });
        results
    }

    /// `if cond { then } else { other }`; each branch returns the values to merge.
    pub fn if_(
        &mut self,
        cond: ValueId,
        then: impl FnOnce(&mut Kb) -> Vec<ValueId>,
        other: impl FnOnce(&mut Kb) -> Vec<ValueId>,
    ) -> Vec<ValueId> {
        self.blocks.push(vec![]);
        let tv = then(self);
        let then_body = Block {
            stmts: self.blocks.pop().unwrap(),
        };
        self.blocks.push(vec![]);
        let ev = other(self);
        let else_body = Block {
            stmts: self.blocks.pop().unwrap(),
        };
        let merges: Vec<Merge> = tv
            .iter()
            .zip(&ev)
            .map(|(&then_value, &else_value)| Merge {
                then_value,
                else_value,
                result: self.value(Def::BranchResult { then_value }, self.ty(then_value)),
            })
            .collect();
        let results = merges.iter().map(|m| m.result).collect();
        self.push(Stmt::If {
            cond,
            then_body,
            else_body,
            merges,
            loc: Loc::default(),
        });
        results
    }
}

/// splitmix64: a tiny seeded generator for test inputs.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn bytes_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
