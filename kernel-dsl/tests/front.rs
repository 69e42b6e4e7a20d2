//! Front end and inference: kernels from source text to typed IR, and the errors users see.

use tilefuse_dsl::ir::{DType, Def, Elem, Expr, Stmt, Type};
use tilefuse_dsl::{compile_source, Specialization};

fn spec(consts: &[(&str, i64)], num_warps: u32) -> Specialization {
    Specialization {
        consts: consts.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
        num_warps,
        num_stages: None,
    }
}

const ADD: &str = r#"
#[kernel(BLOCK = [64, 256])]
fn add<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let a = load(x + offs, mask, 0.0);
    let b = load(y + offs, mask);
    store(out + offs, a + b, mask);
}
"#;

#[test]
fn vector_add_types() {
    let k = compile_source(ADD, &spec(&[("BLOCK", 64)], 4)).unwrap();
    assert_eq!(k.name, "add");
    assert_eq!(k.params.len(), 4);
    assert_eq!(k.written_params(), vec![2]);
    let mut saw_store = false;
    k.body.visit(&mut |s| {
        if let Stmt::Store {
            ptr, value, mask, ..
        } = s
        {
            saw_store = true;
            assert_eq!(*k.ty(*ptr), Type::tile(Elem::Ptr(DType::F32), vec![64]));
            assert_eq!(*k.ty(*value), Type::val(DType::F32, vec![64]));
            assert_eq!(*k.ty(mask.unwrap()), Type::val(DType::Bool, vec![64]));
        }
    });
    assert!(saw_store);
    // The other specialization gets its own shapes.
    let k = compile_source(ADD, &spec(&[("BLOCK", 256)], 8)).unwrap();
    assert_eq!(k.num_warps, 8);
    assert!(k
        .values
        .iter()
        .any(|v| v.ty.as_ref().is_some_and(|t| t.shape == vec![256])));
}

#[test]
fn loops_carry_and_branches_merge() {
    let src = r#"
#[kernel(BLOCK_N = [4], BLOCK_K = [128])]
fn gemv<const BLOCK_N: usize, const BLOCK_K: usize>(w: Ptr<bf16>, x: Ptr<bf16>, y: Ptr<f32>, n: i32, k: i32) {
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let cols = arange(0, BLOCK_K);
    let mut acc = zeros::<f32>([BLOCK_N, BLOCK_K]);
    for k0 in (0..k).step_by(BLOCK_K) {
        let c = k0 + cols;
        let m = (rows.expand_dims(1) < n) & (c.expand_dims(0) < k);
        let wt = load(w + rows.expand_dims(1) * k + c.expand_dims(0), m, 0.0);
        let xt = load(x + c, c < k, 0.0);
        acc += wt as f32 * (xt as f32).expand_dims(0);
    }
    let mut total = acc.sum(1);
    if n > 100 {
        total = total * 2.0;
    }
    store(y + rows, total, rows < n);
}
"#;
    let k = compile_source(src, &spec(&[("BLOCK_N", 4), ("BLOCK_K", 128)], 4)).unwrap();
    let mut fors = 0;
    let mut ifs = 0;
    k.body.visit(&mut |s| match s {
        Stmt::For { carried, index, .. } => {
            fors += 1;
            assert_eq!(carried.len(), 1);
            assert_eq!(*k.ty(carried[0].param), Type::val(DType::F32, vec![4, 128]));
            assert_eq!(*k.ty(*index), Type::val(DType::I32, vec![]));
        }
        Stmt::If { merges, .. } => {
            ifs += 1;
            assert_eq!(merges.len(), 1);
            assert_eq!(*k.ty(merges[0].result), Type::val(DType::F32, vec![4]));
        }
        _ => {}
    });
    assert_eq!((fors, ifs), (1, 1));
}

#[test]
fn an_if_on_constants_compiles_only_the_taken_branch() {
    // The dead branch would not compile for this specialization (a tile of 3 is not a
    // power of two; a [B] + [2B] shape mismatch), and no run-time branch is emitted.
    let src = r#"
#[kernel(B = [8, 16], MODE = [1, 2])]
fn k<const B: usize, const MODE: usize>(x: Ptr<f32>, y: Ptr<f32>, n: i32) {
    let offs = arange(0, B);
    let mut v = load(x + offs);
    for i in (0..n).step_by(1) {
        if MODE == 1 {
            v = v + 1.0;
        } else if B == 8 {
            v = v * 2.0;
        } else {
            v = v + load(x + arange(0, 2 * B)).sum(0);
        }
    }
    if MODE == 3 {
        v = v + load(x + arange(0, 3));
    }
    store(y + offs, v);
}
"#;
    for (b, mode) in [(8, 1), (8, 2), (16, 1), (16, 2)] {
        let k = compile_source(src, &spec(&[("B", b), ("MODE", mode)], 4)).unwrap();
        let mut ifs = 0;
        let mut carried = 0;
        k.body.visit(&mut |s| match s {
            Stmt::If { .. } => ifs += 1,
            Stmt::For { carried: c, .. } => carried += c.len(),
            _ => {}
        });
        assert_eq!(
            ifs, 0,
            "B={b} MODE={mode}: a constant condition left a branch"
        );
        assert_eq!(carried, 1, "B={b} MODE={mode}: `v` is carried by the loop");
    }
    // A condition on run-time values still branches.
    let e = error_of(
        "#[kernel(B = [8])] fn k<const B: usize>(x: Ptr<f32>, n: i32) { if n > 0 { store(x + arange(0, 3), 1.0); } }",
        &[("B", 8)],
    );
    assert!(e.contains("power of two"), "{e}");
}

#[test]
fn skip_leaves_combinations_out_of_the_product() {
    let src = r#"
#[kernel(A = [1, 2], B = [8, 16], num_warps = [4, 8], skip(A = 2, B = 16, num_warps = 4), skip(B = 8, num_warps = 8))]
fn k<const A: usize, const B: usize>(x: Ptr<f32>) {
    store(x + arange(0, B), 1.0);
}
"#;
    let found = tilefuse_dsl::front::find_kernels(src).unwrap();
    let specs: Vec<(i64, i64, u32)> = found[0]
        .ast
        .specializations()
        .iter()
        .map(|s| (s.consts[0].1, s.consts[1].1, s.num_warps))
        .collect();
    assert_eq!(
        specs,
        [(1, 8, 4), (1, 16, 4), (1, 16, 8), (2, 8, 4), (2, 16, 8)],
        "8 combinations less (2, 16, w4) and (*, 8, w8)"
    );

    let error = |attr: &str| {
        let src =
            format!("#[kernel({attr})] fn k<const B: usize>(x: Ptr<f32>) {{ store(x, 1.0); }}");
        tilefuse_dsl::front::find_kernels(&src).unwrap_err().message
    };
    let e = error("B = [8, 16], skip(C = 8)");
    assert!(e.contains("`C`") && e.contains("neither"), "{e}");
    let e = error("B = [8, 16], skip(B = 32)");
    assert!(
        e.contains("B = 32") && e.contains("not among the listed values"),
        "{e}"
    );
    let e = error("B = [8, 16], skip(B = 8, B = 16)");
    assert!(e.contains("twice"), "{e}");
    let e = error("B = [8, 16], skip(B = 8), skip(B = 16)");
    assert!(e.contains("leaves no combination"), "{e}");
    let e = error("B = [8], skip()");
    assert!(e.contains("names no values"), "{e}");
    let e = error("B = [8, 16], skip(B = [])");
    assert!(e.contains("lists no values"), "{e}");
    let e = error("B = [8, 16], skip(B = [8, 32])");
    assert!(e.contains("B = 32"), "{e}");
    let e = error("B = [8, 16], skip(B = [8, 16])");
    assert!(e.contains("leaves no combination"), "{e}");

    // A list skips each of its values: the product of single-valued skips.
    let src = r#"
#[kernel(A = [1, 2, 4], B = [8, 16, 32], skip(A = [2, 4], B = [16, 32]))]
fn k<const A: usize, const B: usize>(x: Ptr<f32>) {
    store(x + arange(0, B), 1.0);
}
"#;
    let found = tilefuse_dsl::front::find_kernels(src).unwrap();
    let specs: Vec<(i64, i64)> = found[0]
        .ast
        .specializations()
        .iter()
        .map(|s| (s.consts[0].1, s.consts[1].1))
        .collect();
    assert_eq!(specs, [(1, 8), (1, 16), (1, 32), (2, 8), (4, 8)]);
}

#[test]
fn num_stages_is_a_variant_axis() {
    // Stages vary fastest, after `num_warps`; `skip` names them like `num_warps`.
    let src = r#"
#[kernel(B = [8, 16], num_warps = [4, 8], num_stages = [3, 4, 5], skip(B = 16, num_stages = 5), skip(num_warps = 8, num_stages = [3, 4]))]
fn k<const B: usize>(x: Ptr<f32>) {
    store(x + arange(0, B), 1.0);
}
"#;
    let found = tilefuse_dsl::front::find_kernels(src).unwrap();
    let specs: Vec<(i64, u32, Option<u32>)> = found[0]
        .ast
        .specializations()
        .iter()
        .map(|s| (s.consts[0].1, s.num_warps, s.num_stages))
        .collect();
    assert_eq!(
        specs,
        [
            (8, 4, Some(3)),
            (8, 4, Some(4)),
            (8, 4, Some(5)),
            (8, 8, Some(5)),
            (16, 4, Some(3)),
            (16, 4, Some(4)),
        ]
    );

    // The lowered kernel carries the specialization's depth; `None` is the first listed.
    let k = compile_source(src, &spec(&[("B", 8)], 4)).unwrap();
    assert_eq!(k.num_stages, 3);
    let staged = Specialization {
        num_stages: Some(5),
        ..spec(&[("B", 8)], 4)
    };
    assert_eq!(compile_source(src, &staged).unwrap().num_stages, 5);
    // No `num_stages`: the default depth alone.
    let found = tilefuse_dsl::front::find_kernels(
        "#[kernel(B = [8])] fn k<const B: usize>(x: Ptr<f32>) { store(x, 1.0); }",
    )
    .unwrap();
    assert_eq!(
        found[0].ast.num_stages,
        [tilefuse_dsl::front::DEFAULT_NUM_STAGES]
    );

    let error = |attr: &str| {
        let src =
            format!("#[kernel({attr})] fn k<const B: usize>(x: Ptr<f32>) {{ store(x, 1.0); }}");
        tilefuse_dsl::front::find_kernels(&src).unwrap_err().message
    };
    let e = error("B = [8], num_stages = [3, 9]");
    assert!(e.contains("from 1 to 8, got 9"), "{e}");
    let e = error("B = [8], num_stages = [3, 3]");
    assert!(e.contains("num_stages = 3 is listed twice"), "{e}");
    let e = error("B = [8], num_stages = [3], num_stages = [4]");
    assert!(e.contains("listed twice"), "{e}");
    let e = error("B = [8], num_stages = [3, 4], skip(num_stages = 5)");
    assert!(
        e.contains("num_stages = 5") && e.contains("not among the listed values"),
        "{e}"
    );
    let e = error("B = [8], num_stages = [3, 4], skip(num_stages = [3, 4])");
    assert!(e.contains("leaves no combination"), "{e}");
}

#[test]
fn weak_literals_take_the_other_operands_type() {
    let src = r#"
#[kernel(B = [8])]
fn k<const B: usize>(x: Ptr<bf16>, y: Ptr<i64>) {
    let v = load(x + arange(0, B)) * 2;
    store(x + arange(0, B), v);
    store(y + arange(0, B), load(y + arange(0, B)) + 1);
}
"#;
    let k = compile_source(src, &spec(&[("B", 8)], 1)).unwrap();
    let lits: Vec<_> = k
        .values
        .iter()
        .filter_map(|v| match &v.def {
            Def::Expr(Expr::Literal(_)) => v.ty.clone(),
            _ => None,
        })
        .collect();
    assert!(lits.contains(&Type::val(DType::BF16, vec![])));
    assert!(lits.contains(&Type::val(DType::I64, vec![])));
}

/// Runs ptxas on `p` for `target` when this machine has it (CI installs it).
fn assemble_if_ptxas(
    p: &tilefuse_dsl::back::ptx::PtxKernel,
    target: tilefuse_dsl::back::ptx::Target,
) {
    if let Ok(ptxas) = tilefuse_dsl::back::ptx::ptxas::find() {
        tilefuse_dsl::back::ptx::ptxas::assemble(&ptxas, p, target)
            .unwrap_or_else(|e| panic!("{target:?}: {e}"));
    }
}

fn error_of(src: &str, consts: &[(&str, i64)]) -> String {
    compile_source(src, &spec(consts, 4)).unwrap_err().message
}

#[test]
fn shape_mismatch_is_reported_with_a_location() {
    let e = error_of(
        "#[kernel] fn k(x: Ptr<f32>) {\n let a = arange(0, 128) + arange(0, 64);\n}",
        &[],
    );
    assert!(e.contains("shape mismatch"), "{e}");
    assert!(e.contains("[128]") && e.contains("[64]"), "{e}");
    assert!(e.starts_with("line 2"), "{e}");
}

#[test]
fn mixed_dtypes_need_a_cast() {
    let e = error_of(
        "#[kernel] fn k(x: Ptr<f32>, y: Ptr<bf16>) { let a = load(x) + load(y); }",
        &[],
    );
    assert!(
        e.contains("mismatched types") && e.contains("f32") && e.contains("bf16"),
        "{e}"
    );
    let e = error_of(
        "#[kernel] fn k(x: Ptr<f32>, n: i32) { let a = load(x) * n; }",
        &[],
    );
    assert!(e.contains("mismatched types"), "{e}");
}

#[test]
fn unknown_op_runtime_shape_and_non_power_of_two() {
    let e = error_of(
        "#[kernel] fn k(x: Ptr<f32>) { let a = frobnicate(x); }",
        &[],
    );
    assert!(e.contains("unknown op `frobnicate`"), "{e}");
    let e = error_of(
        "#[kernel] fn k(x: Ptr<f32>, n: i32) { let a = zeros::<f32>([n]); }",
        &[],
    );
    assert!(e.contains("compile-time constant"), "{e}");
    let e = error_of(
        "#[kernel(B = [48])] fn k<const B: usize>(x: Ptr<f32>) { let a = arange(0, B); }",
        &[("B", 48)],
    );
    assert!(e.contains("power of two") && e.contains("48"), "{e}");
}

#[test]
fn constants_need_listed_values() {
    let e = error_of(
        "#[kernel] fn k<const B: usize>(x: Ptr<f32>) {}",
        &[("B", 4)],
    );
    assert!(e.contains("constant `B` has no listed values"), "{e}");
}

#[test]
fn stores_check_the_pointee_type() {
    let e = error_of(
        "#[kernel] fn k(x: Ptr<bf16>, y: Ptr<f32>) { store(x, load(y)); }",
        &[],
    );
    assert!(e.contains("convert with `as bf16`"), "{e}");
}

#[test]
fn float_literals_never_become_integers() {
    let e = error_of(
        "#[kernel] fn k(x: Ptr<i32>) { store(x, load(x) + 1.5); }",
        &[],
    );
    assert!(e.contains("float literal"), "{e}");
}

#[test]
fn immutable_assignment_and_unknown_names() {
    let e = error_of("#[kernel] fn k(x: Ptr<i32>) { let a = 1; a = 2; }", &[]);
    assert!(e.contains("immutable"), "{e}");
    let e = error_of("#[kernel] fn k(x: Ptr<i32>) { store(x, y); }", &[]);
    assert!(e.contains("unknown name `y`"), "{e}");
}

#[test]
fn a_pointer_from_several_parameters_takes_the_most_careful_cache_path() {
    // `p` may point into `a` or `b` (an `if`), `q` into `c` or `d` (a loop): stores
    // through them write all four, so loads of `b` and `d` go through L2 (`.cg`); a load
    // through `r`, which may read `w` (unwritten, loaded before the wait: `.nc`) or `e`
    // (ordinary after the wait), takes the ordinary path.
    let src = "#[kernel(B = [128])] fn k<const B: usize>(w: Ptr<f32>, a: Ptr<f32>, b: Ptr<f32>, c: Ptr<f32>, d: Ptr<f32>, e: Ptr<f32>, n: i32) {
        let offs = arange(0, B);
        let wv = load(w + offs);
        wait_for_prior_kernels();
        let mut p = a;
        if n > 0 {
            p = b;
        }
        store(p + offs, wv);
        let mut q = c;
        for i in (0..n).step_by(1) {
            q = d;
        }
        store(q + offs, wv);
        let mut r = w;
        if n > 5 {
            r = e;
        }
        store(a + offs, load(b + offs) + load(d + offs) + load(r + offs));
    }";
    let k = compile_source(src, &spec(&[("B", 128)], 4)).unwrap();
    assert_eq!(k.written_params(), vec![1, 2, 3, 4]);
    let p90 = tilefuse_dsl::back::ptx::compile(&k, tilefuse_dsl::back::ptx::Target::Sm90).unwrap();
    let loads: Vec<&str> = p90
        .ptx
        .lines()
        .filter_map(|l| l.split_whitespace().find(|op| op.starts_with("ld.global")))
        .collect();
    assert_eq!(loads.len(), 4, "{loads:?}");
    assert!(loads[0].contains(".nc"), "w before the wait: {loads:?}");
    assert!(
        loads[1].contains(".cg"),
        "b is written through p: {loads:?}"
    );
    assert!(
        loads[2].contains(".cg"),
        "d is written through q: {loads:?}"
    );
    assert!(
        !loads[3].contains(".nc") && !loads[3].contains(".cg"),
        "w or e: the ordinary path: {loads:?}"
    );
}

#[test]
fn launch_dependents_only_at_top_level_and_moves_the_sm90_trigger() {
    let e = error_of(
        "#[kernel] fn k(x: Ptr<f32>, n: i32) { for i in 0..n { launch_dependents(); } }",
        &[],
    );
    assert!(e.contains("top level"), "{e}");
    let e = error_of("#[kernel] fn k(x: Ptr<f32>) { launch_dependents(x); }", &[]);
    assert!(e.contains("no arguments"), "{e}");

    use tilefuse_dsl::back::ptx::{compile, Target};
    let body = |trigger: &str| {
        format!(
            "#[kernel(B = [128])] fn k<const B: usize>(w: Ptr<f32>, x: Ptr<f32>) {{
                let offs = arange(0, B);
                let wv = load(w + offs);
                wait_for_prior_kernels();
                {trigger}
                store(x + offs, load(x + offs) + wv);
            }}"
        )
    };
    let trigger_and_wait = |src: &str| {
        let k = compile_source(src, &spec(&[("B", 128)], 4)).unwrap();
        let p = compile(&k, Target::Sm90).unwrap();
        assert_eq!(p.ptx.matches("griddepcontrol.launch_dependents").count(), 1);
        let trigger = p.ptx.find("griddepcontrol.launch_dependents").unwrap();
        let wait = p.ptx.find("griddepcontrol.wait").unwrap();
        let first_load = p.ptx.find("ld.global").unwrap();
        let p80 = compile(&k, Target::Sm80).unwrap();
        assert!(!p80.ptx.contains("griddepcontrol"), "{}", p80.ptx);
        (trigger, wait, first_load)
    };
    // By default the trigger is at entry, before the weight load and the wait.
    let (trigger, wait, first_load) = trigger_and_wait(&body(""));
    assert!(trigger < first_load && first_load < wait);
    // Placed after the wait, it follows the wait.
    let (trigger, wait, _) = trigger_and_wait(&body("launch_dependents();"));
    assert!(wait < trigger);
    // The interpreter runs the kernel the same with or without it.
    let k = compile_source(&body("launch_dependents();"), &spec(&[("B", 128)], 4)).unwrap();
    let w: Vec<f32> = (0..128).map(|i| i as f32 * 0.5 - 3.0).collect();
    let mut x: Vec<f32> = (0..128).map(|i| 1.0 + i as f32).collect();
    let want: Vec<f32> = x.iter().zip(&w).map(|(a, b)| a + b).collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_ne_bytes()).collect::<Vec<u8>>();
    let wb = bytes(&w);
    let mut xb = bytes(&x);
    tilefuse_dsl::interp::run(
        &k,
        [1, 1, 1],
        &mut [
            tilefuse_dsl::interp::Arg::Read(&wb),
            tilefuse_dsl::interp::Arg::Write(&mut xb),
        ],
    )
    .unwrap();
    x = xb
        .chunks(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(x, want);
}

#[test]
fn wait_for_prior_kernels_only_at_top_level_and_placed_in_sm90_ptx() {
    let e = error_of(
        "#[kernel] fn k(x: Ptr<f32>, n: i32) { if n > 0 { wait_for_prior_kernels(); } }",
        &[],
    );
    assert!(e.contains("top level"), "{e}");
    let e = error_of(
        "#[kernel] fn k(x: Ptr<f32>) { wait_for_prior_kernels(1); }",
        &[],
    );
    assert!(e.contains("no arguments"), "{e}");

    let src = "#[kernel(B = [128])] fn k<const B: usize>(w: Ptr<f32>, a: Ptr<f32>, x: Ptr<f32>) {
        let offs = arange(0, B);
        let wv = load(w + offs);
        wait_for_prior_kernels();
        store(x + offs, load(x + offs) + wv + load(w + B + offs) * load(a + offs));
    }";
    let k = compile_source(src, &spec(&[("B", 128)], 4)).unwrap();
    let p90 = tilefuse_dsl::back::ptx::compile(&k, tilefuse_dsl::back::ptx::Target::Sm90).unwrap();
    let wait = p90.ptx.find("griddepcontrol.wait").expect("a wait");
    // The wait is pinned after the loads above it (ptxas would otherwise hoist a lone
    // wait above them): a branch on a parameter, with a wait on either side.
    assert_eq!(
        p90.ptx.matches("griddepcontrol.wait").count(),
        2,
        "{}",
        p90.ptx
    );
    let w_load = p90.ptx.find("ld.global.nc").expect("the weight load");
    assert!(w_load < wait, "the weight load comes before the wait");
    let branch = p90.ptx.find("@%tfw_p bra").expect("the pinning branch");
    let param = p90
        .ptx
        .find("ld.param.b64 %tfw_d, [p0]")
        .expect("its predicate's input");
    assert!(
        w_load < param && param < branch && branch < wait,
        "{}",
        p90.ptx
    );
    assert!(p90.ptx.contains("griddepcontrol.launch_dependents"));
    // Cache paths on sm_90: `w`, loaded before the wait, is declared unwritten by prior
    // kernels and stays non-coherent (both loads); `a` and `x` may have been written by
    // the kernel just before, so their loads are ordinary ones.
    let qualifiers = |ptx: &str| -> Vec<String> {
        ptx.lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|op| op.starts_with("ld.global"))
            .map(str::to_string)
            .collect()
    };
    let q90 = qualifiers(&p90.ptx);
    assert_eq!(
        q90.iter().filter(|q| q.contains(".nc")).count(),
        2,
        "{q90:?}"
    );
    assert_eq!(
        q90.iter().filter(|q| !q.contains(".nc")).count(),
        2,
        "{q90:?}"
    );
    let p80 = tilefuse_dsl::back::ptx::compile(&k, tilefuse_dsl::back::ptx::Target::Sm80).unwrap();
    assert!(
        !p80.ptx.contains("griddepcontrol"),
        "sm_80 has no programmatic launch"
    );
    // Without programmatic launch every buffer the kernel never writes is non-coherent.
    let q80 = qualifiers(&p80.ptx);
    assert_eq!(
        q80.iter().filter(|q| q.contains(".nc")).count(),
        3,
        "{q80:?}"
    );
    assert_eq!(q80.len(), 4, "{q80:?}");
    // A buffer the kernel writes is read through L2 on both targets.
    for q in [&q80, &q90] {
        assert_eq!(q.iter().filter(|q| q.contains(".cg")).count(), 1, "{q:?}");
    }

    // Without an explicit wait, sm_90 code waits at entry, before any access.
    let k = compile_source(ADD, &spec(&[("BLOCK", 64)], 4)).unwrap();
    let p90 = tilefuse_dsl::back::ptx::compile(&k, tilefuse_dsl::back::ptx::Target::Sm90).unwrap();
    let wait = p90.ptx.find("griddepcontrol.wait").expect("a wait");
    assert!(wait < p90.ptx.find("ld.global").unwrap());
}

#[test]
fn cluster_gather_stacks_along_a_new_leading_axis() {
    let src = r#"
#[kernel(C = [2, 4], cluster(y = C))]
fn k<const C: usize>(x: Ptr<f32>) {
    let v = load(x + arange(0, 64));
    let all = cluster_gather(v);
    let ms = cluster_gather(v.max(0));
}
"#;
    for c in [2, 4] {
        let k = compile_source(src, &spec(&[("C", c)], 4)).unwrap();
        assert_eq!(k.cluster, [1, c as u32, 1]);
        assert!(k.gathers());
        let mut shapes = Vec::new();
        k.body.visit(&mut |s| {
            if let Stmt::Let(v) = s {
                if let Def::Expr(Expr::ClusterGather { .. }) = k.value(*v).def {
                    shapes.push(k.ty(*v).clone());
                }
            }
        });
        assert_eq!(
            shapes,
            vec![
                Type::val(DType::F32, vec![c as usize, 64]),
                Type::val(DType::F32, vec![c as usize]),
            ]
        );
    }
}

#[test]
fn cluster_mistakes_are_errors() {
    let no_cluster = error_of(
        "#[kernel] fn k(x: Ptr<f32>) { let a = cluster_gather(load(x)); }",
        &[],
    );
    assert!(no_cluster.contains("add `cluster(y = N)`"), "{no_cluster}");
    let nested = error_of(
        "#[kernel(cluster(y = 2))] fn k(x: Ptr<f32>, n: i32) {\n if n > 0 { let a = cluster_gather(load(x)); }\n}",
        &[],
    );
    assert!(
        nested.contains("top level") && nested.starts_with("line 2"),
        "{nested}"
    );
    let in_loop = error_of(
        "#[kernel(cluster(x = 2))] fn k(x: Ptr<f32>, n: i32) { for i in 0..n { let a = cluster_gather(load(x + i)); } }",
        &[],
    );
    assert!(in_loop.contains("top level"), "{in_loop}");
    let big = error_of(
        "#[kernel(C = [32], cluster(y = C))] fn k<const C: usize>(x: Ptr<f32>) { }",
        &[("C", 32)],
    );
    assert!(big.contains("between 1 and 16, got 32"), "{big}");
    let total = error_of(
        "#[kernel(cluster(x = 4, y = 8))] fn k(x: Ptr<f32>) { }",
        &[],
    );
    assert!(total.contains("at most 16 programs"), "{total}");
    let unknown = error_of("#[kernel(cluster(y = SPLITS))] fn k(x: Ptr<f32>) { }", &[]);
    assert!(
        unknown.contains("`SPLITS` is not a const generic"),
        "{unknown}"
    );
    let axis = error_of("#[kernel(cluster(w = 2))] fn k(x: Ptr<f32>) { }", &[]);
    assert!(axis.contains("axes are x, y and z"), "{axis}");
    let ptrs = error_of(
        "#[kernel(cluster(y = 2))] fn k(x: Ptr<f32>) { let p = cluster_gather(x); }",
        &[],
    );
    assert!(ptrs.contains("not pointers"), "{ptrs}");
}

#[test]
fn prefetch_is_a_statement_on_pointers_and_becomes_an_l2_prefetch() {
    let e = error_of("#[kernel] fn k(x: Ptr<f32>) { prefetch(load(x)); }", &[]);
    assert!(e.contains("`prefetch` needs pointers"), "{e}");
    let e = error_of("#[kernel] fn k(x: Ptr<f32>) { prefetch(); }", &[]);
    assert!(e.contains("`prefetch` takes 1 to 2 arguments"), "{e}");
    let e = error_of(
        "#[kernel(B = [64])] fn k<const B: usize>(x: Ptr<f32>) { prefetch(x + arange(0, B), arange(0, 32) < 4); }",
        &[("B", 64)],
    );
    assert!(e.contains("64") && e.contains("32"), "{e}");

    // One line a thread: 512 bf16 (1 KiB) over 4 warps, 4 elements a thread in one
    // 8-byte group, masked.
    let src = "#[kernel(B = [512])] fn k<const B: usize>(w: Ptr<bf16>, n: i32) {
        let offs = arange(0, B);
        prefetch(w + offs, offs < n);
    }";
    let k = compile_source(src, &spec(&[("B", 512)], 4)).unwrap();
    let mut saw = 0;
    k.body.visit(&mut |s| {
        if let Stmt::Prefetch { ptr, mask, .. } = s {
            saw += 1;
            assert_eq!(*k.ty(*ptr), Type::tile(Elem::Ptr(DType::BF16), vec![512]));
            assert_eq!(*k.ty(mask.unwrap()), Type::val(DType::Bool, vec![512]));
        }
    });
    assert_eq!(saw, 1);
    for target in [
        tilefuse_dsl::back::ptx::Target::Sm80,
        tilefuse_dsl::back::ptx::Target::Sm90,
    ] {
        let p = tilefuse_dsl::back::ptx::compile(&k, target).unwrap();
        let lines: Vec<&str> = p
            .ptx
            .lines()
            .filter(|l| l.contains("prefetch.global.L2"))
            .collect();
        assert_eq!(lines.len(), 1, "{}", p.ptx);
        assert!(
            lines[0].trim_start().starts_with("@%p"),
            "masked: {}",
            lines[0]
        );
        assert!(
            !p.ptx.contains("ld.global"),
            "a prefetch loads nothing: {}",
            p.ptx
        );
        assemble_if_ptxas(&p, target);
    }
}

#[test]
fn prefetch_range_is_one_bulk_request_on_sm90_and_nothing_on_sm80() {
    let e = error_of(
        "#[kernel(B = [64])] fn k<const B: usize>(x: Ptr<f32>) { prefetch_range(x + arange(0, B), 4); }",
        &[("B", 64)],
    );
    assert!(e.contains("`prefetch_range` needs a single pointer"), "{e}");
    let e = error_of("#[kernel] fn k(x: Ptr<f32>) { prefetch_range(x); }", &[]);
    assert!(e.contains("`prefetch_range` takes 2 arguments"), "{e}");
    let e = error_of(
        "#[kernel] fn k(x: Ptr<f32>) { prefetch_range(x, 1.5); }",
        &[],
    );
    assert!(e.contains("i32"), "{e}");

    let src =
        "#[kernel] fn k(w: Ptr<bf16>, n: i32) { prefetch_range(w + program_id(0) * 4096, n); }";
    let k = compile_source(src, &spec(&[], 4)).unwrap();
    let p90 = tilefuse_dsl::back::ptx::compile(&k, tilefuse_dsl::back::ptx::Target::Sm90).unwrap();
    assert!(p90.ptx.contains(".version 8.0"), "{}", p90.ptx);
    let bulk: Vec<&str> = p90
        .ptx
        .lines()
        .filter(|l| l.contains("cp.async.bulk.prefetch.L2.global"))
        .collect();
    assert_eq!(bulk.len(), 1, "{}", p90.ptx);
    assert!(
        bulk[0].trim_start().starts_with("@%p"),
        "one thread, n > 0: {}",
        bulk[0]
    );
    let p80 = tilefuse_dsl::back::ptx::compile(&k, tilefuse_dsl::back::ptx::Target::Sm80).unwrap();
    assert!(p80.ptx.contains(".version 7.8") && !p80.ptx.contains("prefetch"));
    assemble_if_ptxas(&p90, tilefuse_dsl::back::ptx::Target::Sm90);
    assemble_if_ptxas(&p80, tilefuse_dsl::back::ptx::Target::Sm80);
}

/// A one-shot exchange between two GPUs: count up, signal the peer, wait for its
/// signal, read its data (the engine's `peer_residual_add` in small).
const FLAG_EXCHANGE: &str = r#"
#[kernel(B = [256])]
fn exchange<const B: usize>(count: Ptr<i32>, outbox: Ptr<i32>, inbox: Ptr<i32>, mine: Ptr<f32>, theirs: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let epoch = load(count + program_id(0)) + 1;
    store(count + program_id(0), epoch);
    signal_flag(outbox + program_id(0), epoch);
    wait_flag_at_least(inbox + program_id(0), epoch);
    let offs = program_id(0) * B + arange(0, B);
    let ok = offs < n;
    store(out + offs, load(mine + offs, ok, 0.0) + load(theirs + offs, ok, 0.0), ok);
}
"#;

#[test]
fn flag_ops_check_their_operands_and_placement() {
    let k = |body: &str| {
        format!("#[kernel(B = [64])] fn k<const B: usize>(f: Ptr<i32>, x: Ptr<f32>, v: i32) {{ {body} }}")
    };
    let e = error_of(&k("signal_flag(f + arange(0, B), 1);"), &[("B", 64)]);
    assert!(
        e.contains("`signal_flag` needs a single pointer to an i32 flag"),
        "{e}"
    );
    let e = error_of(&k("wait_flag_at_least(x, 1);"), &[("B", 64)]);
    assert!(
        e.contains("`wait_flag_at_least` needs a single pointer to an i32 flag")
            && e.contains("Ptr<f32>"),
        "{e}"
    );
    let e = error_of(&k("signal_flag(f, 1.5);"), &[("B", 64)]);
    assert!(e.contains("i32"), "{e}");
    let e = error_of(&k("signal_flag(f, arange(0, B));"), &[("B", 64)]);
    assert!(e.contains("`signal_flag` takes an i32 scalar value"), "{e}");
    let e = error_of(&k("wait_flag_at_least(f);"), &[("B", 64)]);
    assert!(e.contains("`wait_flag_at_least` takes 2 arguments"), "{e}");
    let e = error_of(&k("if v > 0 { wait_flag_at_least(f, v); }"), &[("B", 64)]);
    assert!(
        e.contains("`wait_flag_at_least` must be at the top level"),
        "{e}"
    );
    let e = error_of(&k("for i in 0..v { signal_flag(f, i); }"), &[("B", 64)]);
    assert!(e.contains("`signal_flag` must be at the top level"), "{e}");
    let e = error_of(&k("let a = signal_flag(f, v);"), &[("B", 64)]);
    assert!(e.contains("`signal_flag` is a statement"), "{e}");
}

#[test]
fn flag_ops_are_release_and_acquire_at_system_scope_with_a_bounded_poll() {
    use tilefuse_dsl::back::ptx::{compile, Target};
    let k = compile_source(FLAG_EXCHANGE, &spec(&[("B", 256)], 4)).unwrap();
    // The signal writes `outbox`; nothing else is written but `count` and `out`.
    assert_eq!(k.written_params(), vec![0, 1, 5]);
    assert!(k.waits_on_flags());
    for target in [Target::Sm80, Target::Sm90] {
        let p = compile(&k, target).unwrap();
        let lines: Vec<&str> = p.ptx.lines().map(str::trim).collect();
        let find = |pat: &str| lines.iter().position(|l| l.contains(pat));
        let signal: Vec<&&str> = lines
            .iter()
            .filter(|l| l.contains("st.release.sys.global.b32"))
            .collect();
        assert_eq!(signal.len(), 1, "{}", p.ptx);
        assert!(
            signal[0].starts_with("@%p"),
            "one thread signals: {}",
            signal[0]
        );
        let poll = find("ld.acquire.sys.global.b32").expect("an acquiring poll");
        let release = find("st.release.sys").unwrap();
        // A barrier before the signal, the poll after it, then a trap past the time
        // limit and a barrier before the data is read.
        assert_eq!(lines[release - 1], "bar.sync 0;", "{}", p.ptx);
        assert!(poll > release, "{}", p.ptx);
        let trap = find("trap;").expect("a bounded poll traps");
        assert!(trap > poll, "{}", p.ptx);
        assert!(p.ptx.contains("%globaltimer"), "{}", p.ptx);
        assert!(
            p.ptx
                .contains(&format!("{}", tilefuse_dsl::back::ptx::FLAG_WAIT_LIMIT_NS)),
            "{}",
            p.ptx
        );
        let data = lines
            .iter()
            .position(|l| l.contains("ld.global") && l.contains(".f32"))
            .unwrap_or_else(|| panic!("data loads: {}", p.ptx));
        assert!(data > trap, "the data is read after the wait: {}", p.ptx);
        assert!(lines[trap + 2..data].contains(&"bar.sync 0;"), "{}", p.ptx);
        // What the peer wrote during the kernel never goes through the
        // non-coherent path, on sm_80 either.
        assert!(!p.ptx.contains("ld.global.nc"), "{target:?}: {}", p.ptx);
        assemble_if_ptxas(&p, target);
    }
}

#[test]
fn sm_id_is_an_i32_scalar_that_reads_the_processor_index() {
    let e = error_of("#[kernel] fn k(t: Ptr<i32>) { store(t, sm_id(0)); }", &[]);
    assert!(e.contains("sm_id"), "{e}");
    let src = "#[kernel] fn k(t: Ptr<i32>) { store(t + program_id(0), sm_id()); }";
    let k = compile_source(src, &spec(&[], 4)).unwrap();
    let ids: Vec<_> = k
        .values
        .iter()
        .filter(|v| matches!(v.def, Def::Expr(Expr::SmId)))
        .collect();
    assert_eq!(ids.len(), 1);
    assert_eq!(ids[0].ty.as_ref().unwrap(), &Type::val(DType::I32, vec![]));
    for target in [
        tilefuse_dsl::back::ptx::Target::Sm80,
        tilefuse_dsl::back::ptx::Target::Sm90,
    ] {
        let p = tilefuse_dsl::back::ptx::compile(&k, target).unwrap();
        assert_eq!(p.ptx.matches("%smid").count(), 1, "{}", p.ptx);
        assemble_if_ptxas(&p, target);
    }
}

#[test]
fn global_timer_is_an_i64_scalar_that_reads_the_gpu_clock() {
    let e = error_of(
        "#[kernel] fn k(t: Ptr<i64>) { store(t, global_timer(1)); }",
        &[],
    );
    assert!(e.contains("global_timer"), "{e}");
    let e = error_of(
        "#[kernel] fn k(t: Ptr<i32>) { store(t, global_timer()); }",
        &[],
    );
    assert!(
        e.contains("i64") || e.contains("i32"),
        "storing i64 into i32: {e}"
    );

    let src = "#[kernel] fn k(t: Ptr<i64>, x: Ptr<f32>) {
        let start = global_timer();
        store(x, load(x) * 2.0);
        store(t, start);
        store(t + 1, global_timer() - start);
    }";
    let k = compile_source(src, &spec(&[], 4)).unwrap();
    let timers: Vec<_> = k
        .values
        .iter()
        .filter(|v| matches!(v.def, Def::Expr(Expr::GlobalTimer)))
        .collect();
    assert_eq!(timers.len(), 2, "two reads, not one shared value");
    for v in timers {
        assert_eq!(v.ty.as_ref().unwrap(), &Type::val(DType::I64, vec![]));
    }
    for target in [
        tilefuse_dsl::back::ptx::Target::Sm80,
        tilefuse_dsl::back::ptx::Target::Sm90,
    ] {
        let p = tilefuse_dsl::back::ptx::compile(&k, target).unwrap();
        assert_eq!(p.ptx.matches("%globaltimer").count(), 2, "{}", p.ptx);
        if let Ok(ptxas) = tilefuse_dsl::back::ptx::ptxas::find() {
            tilefuse_dsl::back::ptx::ptxas::assemble(&ptxas, &p, target)
                .unwrap_or_else(|e| panic!("{e}\n{}", p.ptx));
        }
    }
}
