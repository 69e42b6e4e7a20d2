//! A test-only builder of typed IR (the front end is developed separately).

use crate::ir::*;

/// Builds a typed kernel statement by statement.
pub struct B {
    k: Kernel,
    stack: Vec<Block>,
}

impl B {
    pub fn new(name: &str, num_warps: u32) -> B {
        B {
            k: Kernel {
                name: name.into(),
                params: vec![],
                consts: vec![],
                num_warps,
                num_stages: 1,
                cluster: [1, 1, 1],
                values: vec![],
                body: Block::default(),
            },
            stack: vec![Block::default()],
        }
    }

    fn def(&mut self, def: Def, ty: Type) -> ValueId {
        self.k.values.push(Value {
            def,
            ty: Some(ty),
            loc: Loc(self.k.values.len() as u32),
        });
        ValueId(self.k.values.len() as u32 - 1)
    }

    pub fn ty(&self, v: ValueId) -> Type {
        self.k.ty(v).clone()
    }

    pub fn e(&mut self, e: Expr, ty: Type) -> ValueId {
        let v = self.def(Def::Expr(e), ty);
        self.stack.last_mut().unwrap().stmts.push(Stmt::Let(v));
        v
    }

    pub fn param(&mut self, name: &str, kind: ParamKind) -> ValueId {
        self.k.params.push(Param {
            name: name.into(),
            kind,
            loc: Loc(0),
        });
        let i = self.k.params.len() - 1;
        self.e(Expr::Param(i), kind.ty())
    }

    pub fn ptr(&mut self, name: &str, d: DType) -> ValueId {
        self.param(name, ParamKind::Ptr(d))
    }

    pub fn i32(&mut self, c: i64) -> ValueId {
        self.e(
            Expr::Literal(Literal::Int(c, None)),
            Type::val(DType::I32, vec![]),
        )
    }

    pub fn lit(&mut self, lit: Literal, d: DType) -> ValueId {
        self.e(Expr::Literal(lit), Type::val(d, vec![]))
    }

    pub fn f32(&mut self, x: f64) -> ValueId {
        self.lit(Literal::Float(x, None), DType::F32)
    }

    pub fn pid(&mut self, a: u32) -> ValueId {
        self.e(Expr::ProgramId(a), Type::val(DType::I32, vec![]))
    }

    pub fn arange(&mut self, n: i64) -> ValueId {
        self.e(
            Expr::Arange { start: 0, end: n },
            Type::val(DType::I32, vec![n as usize]),
        )
    }

    pub fn splat(&mut self, v: ValueId, shape: &[usize]) -> ValueId {
        let elem = self.ty(v).elem;
        self.e(
            Expr::Splat {
                value: v,
                shape: shape.to_vec(),
            },
            Type::tile(elem, shape.to_vec()),
        )
    }

    pub fn bcast(&mut self, v: ValueId, shape: &[usize]) -> ValueId {
        let elem = self.ty(v).elem;
        self.e(
            Expr::Broadcast {
                value: v,
                shape: shape.to_vec(),
            },
            Type::tile(elem, shape.to_vec()),
        )
    }

    pub fn expand(&mut self, v: ValueId, axis: usize) -> ValueId {
        let mut t = self.ty(v);
        t.shape.insert(axis, 1);
        self.e(Expr::ExpandDims { value: v, axis }, t)
    }

    /// Splats a scalar to the shape of `like` when needed.
    pub fn like(&mut self, v: ValueId, like: ValueId) -> ValueId {
        let shape = self.ty(like).shape;
        if self.ty(v).shape == shape {
            v
        } else {
            self.splat(v, &shape)
        }
    }

    pub fn bin(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
        let b = self.like(b, a);
        let t = self.ty(a);
        self.e(Expr::Binary { op, lhs: a, rhs: b }, t)
    }

    pub fn cmp(&mut self, op: CmpOp, a: ValueId, b: ValueId) -> ValueId {
        let b = self.like(b, a);
        let t = Type::val(DType::Bool, self.ty(a).shape);
        self.e(Expr::Compare { op, lhs: a, rhs: b }, t)
    }

    pub fn un(&mut self, op: UnaryOp, a: ValueId) -> ValueId {
        let t = self.ty(a);
        self.e(Expr::Unary { op, arg: a }, t)
    }

    pub fn cast(&mut self, v: ValueId, to: DType) -> ValueId {
        let t = Type::val(to, self.ty(v).shape);
        self.e(Expr::Cast { value: v, to }, t)
    }

    pub fn select(&mut self, c: ValueId, a: ValueId, b: ValueId) -> ValueId {
        let t = self.ty(a);
        self.e(
            Expr::Select {
                cond: c,
                then: a,
                other: b,
            },
            t,
        )
    }

    pub fn addptr(&mut self, p: ValueId, off: ValueId) -> ValueId {
        let shape = self.ty(off).shape;
        let p = if self.ty(p).shape == shape {
            p
        } else {
            self.splat(p, &shape)
        };
        let t = self.ty(p);
        self.e(
            Expr::AddPtr {
                ptr: p,
                offset: off,
            },
            t,
        )
    }

    pub fn load(&mut self, p: ValueId, mask: Option<ValueId>, other: Option<ValueId>) -> ValueId {
        let t = self.ty(p);
        let t = Type::val(t.pointee().unwrap(), t.shape);
        self.e(
            Expr::Load {
                ptr: p,
                mask,
                other,
            },
            t,
        )
    }

    pub fn store(&mut self, p: ValueId, v: ValueId, mask: Option<ValueId>) {
        self.stack.last_mut().unwrap().stmts.push(Stmt::Store {
            ptr: p,
            value: v,
            mask,
            loc: Loc(0),
        });
    }

    pub fn reduce(&mut self, op: ReduceOp, v: ValueId, axis: usize) -> ValueId {
        let mut t = self.ty(v);
        t.shape.remove(axis);
        if op == ReduceOp::Argmax {
            t.elem = Elem::Val(DType::I32);
        }
        self.e(Expr::Reduce { op, value: v, axis }, t)
    }

    pub fn atomic(
        &mut self,
        op: AtomicOp,
        p: ValueId,
        v: ValueId,
        mask: Option<ValueId>,
    ) -> ValueId {
        let t = self.ty(v);
        self.e(
            Expr::Atomic {
                op,
                ptr: p,
                value: v,
                mask,
            },
            t,
        )
    }

    pub fn dot(&mut self, a: ValueId, b: ValueId, acc: Option<ValueId>) -> ValueId {
        let t = Type::val(DType::F32, vec![self.ty(a).shape[0], self.ty(b).shape[1]]);
        self.e(Expr::Dot { a, b, acc }, t)
    }

    /// `for i in (start..end).step_by(step)` carrying `inits`; `body` returns the nexts.
    pub fn for_(
        &mut self,
        start: ValueId,
        end: ValueId,
        step: ValueId,
        inits: &[ValueId],
        body: impl FnOnce(&mut B, ValueId, &[ValueId]) -> Vec<ValueId>,
    ) -> Vec<ValueId> {
        let it = self.ty(start);
        let index = self.def(Def::LoopIndex, it);
        let params: Vec<ValueId> = inits
            .iter()
            .map(|&i| {
                let t = self.ty(i);
                self.def(Def::Carried { init: i }, t)
            })
            .collect();
        self.stack.push(Block::default());
        let nexts = body(self, index, &params);
        let blk = self.stack.pop().unwrap();
        let mut carried = Vec::new();
        let mut results = Vec::new();
        for ((&init, &param), &next) in inits.iter().zip(&params).zip(&nexts) {
            let t = self.ty(init);
            let result = self.def(Def::LoopResult { init }, t);
            results.push(result);
            carried.push(Carried {
                param,
                init,
                next,
                result,
            });
        }
        self.stack.last_mut().unwrap().stmts.push(Stmt::For {
            index,
            start,
            end,
            step,
            carried,
            body: blk,
            loc: Loc(0),
        });
        results
    }

    /// `if cond { .. } else { .. }` merging the values each branch returns.
    pub fn if_(
        &mut self,
        cond: ValueId,
        then: impl FnOnce(&mut B) -> Vec<ValueId>,
        els: impl FnOnce(&mut B) -> Vec<ValueId>,
    ) -> Vec<ValueId> {
        self.stack.push(Block::default());
        let tv = then(self);
        let tb = self.stack.pop().unwrap();
        self.stack.push(Block::default());
        let ev = els(self);
        let eb = self.stack.pop().unwrap();
        let mut merges = Vec::new();
        let mut out = Vec::new();
        for (&t, &e) in tv.iter().zip(&ev) {
            let ty = self.ty(t);
            let result = self.def(Def::BranchResult { then_value: t }, ty);
            out.push(result);
            merges.push(Merge {
                then_value: t,
                else_value: e,
                result,
            });
        }
        self.stack.last_mut().unwrap().stmts.push(Stmt::If {
            cond,
            then_body: tb,
            else_body: eb,
            merges,
            loc: Loc(0),
        });
        out
    }

    pub fn finish(mut self) -> Kernel {
        self.k.body = self.stack.pop().unwrap();
        self.k
    }
}
