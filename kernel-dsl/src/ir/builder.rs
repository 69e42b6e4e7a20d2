//! A builder of typed kernels for tests: the interpreter's tests, the PTX backend's tests
//! and the tests that run one kernel on every device (`crate::testing`) all write their
//! hand-made IR with it, so a kernel is written once whichever backend runs it.
//!
//! Result types are inferred the simple way (a scalar operand of a binary op, compare or
//! pointer offset is splat to the other operand's shape); nothing is validated, so a test
//! can also build IR that the front end would refuse.

use super::{
    AtomicOp, BinaryOp, Block, Carried, CmpOp, DType, Def, Elem, Expr, Kernel, Literal, Loc, Merge,
    Param, ParamKind, ReduceOp, Stmt, Type, UnaryOp, Value, ValueId,
};

/// Builds a typed kernel statement by statement.
pub struct Builder {
    k: Kernel,
    /// The blocks under construction: the body, then one per open loop or branch.
    blocks: Vec<Vec<Stmt>>,
    /// The next `for_` is unrolled by two ([`Builder::unroll_next_loop`]).
    unroll_next: bool,
}

impl Builder {
    /// An empty kernel named `name` run by `num_warps` warps per program.
    pub fn new(name: &str, num_warps: u32) -> Builder {
        Builder {
            k: Kernel {
                name: name.into(),
                params: vec![],
                consts: vec![],
                num_warps,
                num_stages: 1,
                cluster: [1, 1, 1],
                max_registers: None,
                values: vec![],
                body: Block::default(),
                view_loads: vec![],
            },
            blocks: vec![vec![]],
            unroll_next: false,
        }
    }

    /// Marks the next [`Builder::for_`] as `.unroll(2)`.
    pub fn unroll_next_loop(&mut self) {
        self.unroll_next = true;
    }

    /// The kernel built so far, with every loop and branch closed.
    pub fn finish(mut self) -> Kernel {
        assert_eq!(self.blocks.len(), 1, "a loop or branch is still open");
        self.k.body = Block {
            stmts: self.blocks.pop().unwrap(),
        };
        self.k
    }

    /// The type of `v`.
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

    /// A parameter of any kind, read where it is declared.
    pub fn param(&mut self, name: &str, kind: ParamKind) -> ValueId {
        self.k.params.push(Param {
            name: name.into(),
            kind,
            loc: Loc::default(),
        });
        let i = self.k.params.len() - 1;
        self.let_(Expr::Param(i), kind.ty())
    }

    /// A pointer parameter to elements of `d`.
    pub fn ptr(&mut self, name: &str, d: DType) -> ValueId {
        self.param(name, ParamKind::Ptr(d))
    }

    /// A scalar parameter of `d`.
    pub fn scalar(&mut self, name: &str, d: DType) -> ValueId {
        self.param(name, ParamKind::Scalar(d))
    }

    /// A scalar literal of dtype `d`.
    pub fn lit(&mut self, l: Literal, d: DType) -> ValueId {
        self.let_(Expr::Literal(l), Type::val(d, vec![]))
    }

    /// An integer literal of dtype `d`.
    pub fn int(&mut self, x: i64, d: DType) -> ValueId {
        self.lit(Literal::Int(x, None), d)
    }

    /// An `i32` literal.
    pub fn i32(&mut self, x: i64) -> ValueId {
        self.int(x, DType::I32)
    }

    /// An `f32` literal.
    pub fn f32(&mut self, x: f64) -> ValueId {
        self.lit(Literal::Float(x, None), DType::F32)
    }

    /// `program_id(axis)`.
    pub fn pid(&mut self, axis: u32) -> ValueId {
        self.let_(Expr::ProgramId(axis), Type::val(DType::I32, vec![]))
    }

    /// `arange(start, end)`.
    pub fn arange(&mut self, start: i64, end: i64) -> ValueId {
        self.let_(
            Expr::Arange { start, end },
            Type::val(DType::I32, vec![(end - start) as usize]),
        )
    }

    /// A scalar repeated over `shape`.
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

    /// A tile broadcast along its size-1 dimensions to `shape`.
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

    /// A size-1 dimension inserted at `axis`.
    pub fn expand(&mut self, value: ValueId, axis: usize) -> ValueId {
        let mut t = self.ty(value);
        t.shape.insert(axis, 1);
        self.let_(Expr::ExpandDims { value, axis }, t)
    }

    /// A unary op.
    pub fn un(&mut self, op: UnaryOp, arg: ValueId) -> ValueId {
        let t = self.ty(arg);
        self.let_(Expr::Unary { op, arg }, t)
    }

    /// A binary op; a scalar operand is splat to the other's shape first.
    pub fn bin(&mut self, op: BinaryOp, lhs: ValueId, rhs: ValueId) -> ValueId {
        let (lhs, rhs) = self.unify(lhs, rhs);
        let t = self.ty(lhs);
        self.let_(Expr::Binary { op, lhs, rhs }, t)
    }

    /// Splats whichever of `a` and `b` is a scalar to the other's shape.
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

    /// A comparison; a scalar operand is splat to the other's shape first.
    pub fn cmp(&mut self, op: CmpOp, lhs: ValueId, rhs: ValueId) -> ValueId {
        let (lhs, rhs) = self.unify(lhs, rhs);
        let shape = self.ty(lhs).shape;
        self.let_(
            Expr::Compare { op, lhs, rhs },
            Type::val(DType::Bool, shape),
        )
    }

    /// `select(cond, then, other)`.
    pub fn select(&mut self, cond: ValueId, then: ValueId, other: ValueId) -> ValueId {
        let t = self.ty(then);
        self.let_(Expr::Select { cond, then, other }, t)
    }

    /// A conversion to `to`.
    pub fn cast(&mut self, value: ValueId, to: DType) -> ValueId {
        let shape = self.ty(value).shape;
        self.let_(Expr::Cast { value, to }, Type::val(to, shape))
    }

    /// `ptr + offset`; a scalar pointer or offset is splat to the other's shape.
    pub fn add_ptr(&mut self, ptr: ValueId, offset: ValueId) -> ValueId {
        let (ptr, offset) = self.unify(ptr, offset);
        let t = Type::tile(self.ty(ptr).elem, self.ty(offset).shape);
        self.let_(Expr::AddPtr { ptr, offset }, t)
    }

    /// `load(ptr, mask, other)`.
    pub fn load(&mut self, ptr: ValueId, mask: Option<ValueId>, other: Option<ValueId>) -> ValueId {
        let t = self.ty(ptr);
        let d = t.pointee().unwrap();
        self.let_(Expr::Load { ptr, mask, other }, Type::val(d, t.shape))
    }

    /// `store(ptr, value, mask)`.
    pub fn store(&mut self, ptr: ValueId, value: ValueId, mask: Option<ValueId>) {
        self.push(Stmt::Store {
            ptr,
            value,
            mask,
            loc: Loc::default(),
        });
    }

    /// A reduction of `value` along `axis` (an `i32` index for `argmax`).
    pub fn reduce(&mut self, op: ReduceOp, value: ValueId, axis: usize) -> ValueId {
        let mut t = self.ty(value);
        t.shape.remove(axis);
        if op == ReduceOp::Argmax {
            t.elem = Elem::Val(DType::I32);
        }
        self.let_(Expr::Reduce { op, value, axis }, t)
    }

    /// `dot(a, b)` (plus `acc`), accumulated in `f32`.
    pub fn dot(&mut self, a: ValueId, b: ValueId, acc: Option<ValueId>) -> ValueId {
        let (m, n) = (self.ty(a).shape[0], self.ty(b).shape[1]);
        self.let_(Expr::Dot { a, b, acc }, Type::val(DType::F32, vec![m, n]))
    }

    /// An atomic read-modify-write; its value is the old contents.
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
        body: impl FnOnce(&mut Builder, ValueId, &[ValueId]) -> Vec<ValueId>,
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
            unroll: self.unroll_next,
            stages: 0,
            loc: Loc::default(),
        });
        self.unroll_next = false;
        results
    }

    /// `if cond { then } else { other }`; each branch returns the values to merge.
    pub fn if_(
        &mut self,
        cond: ValueId,
        then: impl FnOnce(&mut Builder) -> Vec<ValueId>,
        other: impl FnOnce(&mut Builder) -> Vec<ValueId>,
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
