//! Statements: `let`, stores, loops (`for`, `while`) with their carried values, `if`
//! with its merges, and the barrier-like statements.

use super::{Infer, R};
use crate::error::CompileError;
use crate::ir::{Block, Carried, DType, Def, Expr, Loc, Merge, Stmt, Type, ValueId};

impl Infer<'_> {
    pub(super) fn stmt(&mut self, s: &Stmt) -> R<()> {
        match s {
            Stmt::WaitPriorKernels { .. } | Stmt::LaunchDependents { .. } => {
                self.blocks.last_mut().expect("open block").push(s.clone());
                Ok(())
            }
            Stmt::Let(v) => {
                let new = self.expr(*v)?;
                self.map[v.index()] = Some(new);
                Ok(())
            }
            Stmt::PrefetchRange { ptr, count, loc } => {
                let (ptr, count) = self.prefetch_range(*ptr, *count, *loc)?;
                self.blocks
                    .last_mut()
                    .expect("open block")
                    .push(Stmt::PrefetchRange {
                        ptr,
                        count,
                        loc: *loc,
                    });
                Ok(())
            }
            Stmt::Flag {
                op,
                ptr,
                value,
                loc,
            } => {
                let (ptr, value) = self.flag(*op, *ptr, *value, *loc)?;
                self.blocks
                    .last_mut()
                    .expect("open block")
                    .push(Stmt::Flag {
                        op: *op,
                        ptr,
                        value,
                        loc: *loc,
                    });
                Ok(())
            }
            Stmt::Prefetch { ptr, mask, loc } => {
                let (ptr, mask) = self.prefetch(*ptr, *mask, *loc)?;
                self.blocks
                    .last_mut()
                    .expect("open block")
                    .push(Stmt::Prefetch {
                        ptr,
                        mask,
                        loc: *loc,
                    });
                Ok(())
            }
            Stmt::Store {
                ptr,
                value,
                mask,
                loc,
            } => {
                let (ptr, value, mask) = self.access(*ptr, *value, *mask, *loc, "store")?;
                self.blocks
                    .last_mut()
                    .expect("open block")
                    .push(Stmt::Store {
                        ptr,
                        value,
                        mask,
                        loc: *loc,
                    });
                Ok(())
            }
            Stmt::For {
                index,
                start,
                end,
                step,
                carried,
                body,
                unroll,
                stages,
                loc,
            } => self.for_stmt(
                *index,
                *start,
                *end,
                *step,
                carried,
                body,
                (*unroll, *stages),
                *loc,
            ),
            Stmt::While {
                cond_body,
                cond,
                carried,
                body,
                loc,
            } => self.while_stmt(cond_body, *cond, carried, body, *loc),
            Stmt::If {
                cond,
                then_body,
                else_body,
                merges,
                loc,
            } => self.if_stmt(*cond, then_body, else_body, merges, *loc),
        }
    }

    /// What in a loop body keeps the code generator from applying a loop hint
    /// (`.unroll(2)`, `.stages(n)`): an inner loop, a `dot` (described by `dot`) or a
    /// `cluster_gather`, the first met.
    fn hint_obstacle(&self, body: &Block, dot: &'static str) -> Option<&'static str> {
        let mut why = None;
        body.visit(&mut |s| match s {
            Stmt::For { .. } | Stmt::While { .. } => {
                why.get_or_insert("an inner loop");
            }
            Stmt::Let(v) => match &self.src.value(*v).def {
                Def::Expr(Expr::Dot { .. }) => {
                    why.get_or_insert(dot);
                }
                Def::Expr(Expr::ClusterGather { .. }) => {
                    why.get_or_insert("a `cluster_gather`");
                }
                _ => {}
            },
            _ => {}
        });
        why
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn for_stmt(
        &mut self,
        index: ValueId,
        start: ValueId,
        end: ValueId,
        step: ValueId,
        carried: &[Carried],
        body: &Block,
        (unroll, stages): (bool, u32),
        loc: Loc,
    ) -> R<()> {
        if stages > 0 {
            let why = if unroll {
                Some("`.unroll(2)` (a staged loop's loads are already ahead)")
            } else {
                self.hint_obstacle(
                    body,
                    "a `dot` (its operands are pipelined by the kernel's `num_stages`)",
                )
            };
            if let Some(why) = why {
                return Err(CompileError::new(
                    loc,
                    format!("`.stages(n)` needs a loop without {why}"),
                ));
            }
        }
        if unroll {
            let dot = "a `dot` (its loads are pipelined instead: `num_stages`)";
            if let Some(why) = self.hint_obstacle(body, dot) {
                return Err(CompileError::new(
                    loc,
                    format!("`.unroll(2)` needs a loop body without {why}"),
                ));
            }
        }
        let mut bounds = [self.get(start)?, self.get(end)?, self.get(step)?];
        let dtype = self.unify_scalar_ints(&mut bounds, loc, "loop bounds and step")?;
        let new_index = self.add(Def::LoopIndex, Type::val(dtype, vec![]), loc);
        self.map[index.index()] = Some(new_index);
        let params = self.open_carried(carried)?;
        self.blocks.push(Vec::new());
        let r = self.block(body);
        if let Err(e) = r {
            self.blocks.pop();
            return Err(e);
        }
        let out = self.close_carried(carried, params, loc)?;
        let body = Block {
            stmts: self.blocks.pop().unwrap_or_default(),
        };
        let [start, end, step] = bounds;
        self.blocks.last_mut().expect("open block").push(Stmt::For {
            index: new_index,
            start,
            end,
            step,
            carried: out,
            body,
            unroll,
            stages,
            loc,
        });
        Ok(())
    }

    /// Types the carried parameters from their initial values (as `for` does), then the
    /// condition (a scalar `bool`) and the body.
    pub(super) fn while_stmt(
        &mut self,
        cond_body: &Block,
        cond: ValueId,
        carried: &[Carried],
        body: &Block,
        loc: Loc,
    ) -> R<()> {
        let params = self.open_carried(carried)?;
        self.blocks.push(Vec::new());
        if let Err(e) = self.block(cond_body) {
            self.blocks.pop();
            return Err(e);
        }
        let new_cond = match self.get(cond) {
            Ok(c) => c,
            Err(e) => {
                self.blocks.pop();
                return Err(e);
            }
        };
        let cond_ty = self.ty(new_cond).clone();
        if !(cond_ty.is_scalar() && cond_ty.dtype() == Some(DType::Bool)) {
            self.blocks.pop();
            return Err(CompileError::new(
                self.src.value(cond).loc,
                format!("a `while` condition is a scalar bool, got {cond_ty}"),
            ));
        }
        let cond_block = Block {
            stmts: self.blocks.pop().unwrap_or_default(),
        };
        self.blocks.push(Vec::new());
        if let Err(e) = self.block(body) {
            self.blocks.pop();
            return Err(e);
        }
        let out = self.close_carried(carried, params, loc)?;
        let body = Block {
            stmts: self.blocks.pop().unwrap_or_default(),
        };
        self.blocks
            .last_mut()
            .expect("open block")
            .push(Stmt::While {
                cond_body: cond_block,
                cond: new_cond,
                carried: out,
                body,
                loc,
            });
        Ok(())
    }

    pub(super) fn if_stmt(
        &mut self,
        cond: ValueId,
        then_body: &Block,
        else_body: &Block,
        merges: &[Merge],
        loc: Loc,
    ) -> R<()> {
        let c = self.get(cond)?;
        let cty = self.ty(c).clone();
        if cty != Type::val(DType::Bool, vec![]) {
            return Err(CompileError::new(
                loc,
                format!(
                    "an `if` condition is a scalar bool, found {cty}: tiles need `select` or masks"
                ),
            ));
        }
        let mut then_b = self.nested(then_body)?;
        let mut else_b = self.nested(else_body)?;
        let mut out = Vec::new();
        for m in merges {
            let t = self.get(m.then_value)?;
            let e = self.get(m.else_value)?;
            // The merged type: a typed side wins over a weak literal.
            let (t, e) = match (self.weak.get(&t).copied(), self.weak.get(&e).copied()) {
                (Some(_), None) => {
                    let ty = self.ty(e).clone();
                    self.blocks.push(std::mem::take(&mut then_b.stmts));
                    let t = self.conform(t, &ty, loc, "a variable assigned in an `if`");
                    then_b.stmts = self.blocks.pop().unwrap_or_default();
                    (t?, e)
                }
                (_, Some(_)) => {
                    let ty = self.ty(t).clone();
                    self.blocks.push(std::mem::take(&mut else_b.stmts));
                    let e = self.conform(e, &ty, loc, "a variable assigned in an `if`");
                    else_b.stmts = self.blocks.pop().unwrap_or_default();
                    (t, e?)
                }
                _ => (t, e),
            };
            let (tt, et) = (self.ty(t).clone(), self.ty(e).clone());
            if tt != et {
                return Err(CompileError::new(
                    loc,
                    format!("a variable assigned in an `if` is {tt} in one branch and {et} in the other"),
                ));
            }
            let result = self.add(Def::BranchResult { then_value: t }, tt, loc);
            self.map[m.result.index()] = Some(result);
            out.push(Merge {
                then_value: t,
                else_value: e,
                result,
            });
        }
        self.blocks.last_mut().expect("open block").push(Stmt::If {
            cond: c,
            then_body: then_b,
            else_body: else_b,
            merges: out,
            loc,
        });
        Ok(())
    }

    /// A loop's carried values at its head (`for` and `while` alike): each parameter
    /// typed like its initial value (a weak literal takes its default type).
    fn open_carried(&mut self, carried: &[Carried]) -> R<Vec<(ValueId, ValueId)>> {
        let mut params = Vec::new();
        for c in carried {
            let mut init = self.get(c.init)?;
            if let Some(lit) = self.weak.get(&init).copied() {
                init = self.typed_literal(lit, None, self.out[init.index()].loc)?;
            }
            let ty = self.ty(init).clone();
            let p = self.add(Def::Carried { init }, ty, self.src.value(c.param).loc);
            self.map[c.param.index()] = Some(p);
            params.push((init, p));
        }
        Ok(params)
    }

    /// A loop's carried values after its body: each `next` conformed to its parameter's
    /// type, and the loop's result values defined.
    fn close_carried(
        &mut self,
        carried: &[Carried],
        params: Vec<(ValueId, ValueId)>,
        loc: Loc,
    ) -> R<Vec<Carried>> {
        let mut out = Vec::new();
        for (c, (init, p)) in carried.iter().zip(params) {
            let ty = self.ty(p).clone();
            let next = self.get(c.next)?;
            let next = self.conform(
                next,
                &ty,
                self.src.value(c.next).loc,
                "a loop-carried variable",
            )?;
            let result = self.add(Def::LoopResult { init }, ty, loc);
            self.map[c.result.index()] = Some(result);
            out.push(Carried {
                param: p,
                init,
                next,
                result,
            });
        }
        Ok(out)
    }
}
