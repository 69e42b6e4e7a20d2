use super::*;

#[test]
fn deflated_ptx_reads_as_its_text_and_bad_bytes_as_empty() {
    let text = ".version 8.0\n.target sm_80\n// a kernel\n".repeat(200);
    let deflated: &'static [u8] = Vec::leak(deflate_ptx(&text));
    assert!(deflated.len() * 10 < text.len(), "repetitive text deflates");
    static CACHE: OnceLock<String> = OnceLock::new();
    let ptx = Ptx::deflated(deflated, &CACHE);
    assert!(!ptx.is_empty());
    assert_eq!(ptx.as_str(), text);
    // Inflated once, then served from the cache.
    assert!(std::ptr::eq(ptx.as_str(), ptx.as_str()));
    assert_eq!(ptx, Ptx::text(Box::leak(text.into_boxed_str())));
    assert!(format!("{ptx:?}").contains("deflated"));

    static BAD: OnceLock<String> = OnceLock::new();
    let bad = Ptx::deflated(b"not deflate data", &BAD);
    assert_eq!(bad.as_str(), "", "launching reports a missing module");
    assert_eq!(inflate_ptx(b"not deflate data"), None);
    assert!(Ptx::text("").is_empty());
}

static ADD: KernelDef = KernelDef {
    name: "add",
    source: "fn add<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {}",
    const_names: &["BLOCK"],
    params: &[
        ParamDef {
            name: "x",
            kind: ParamKind::Ptr(DType::F32),
            written: false,
        },
        ParamDef {
            name: "out",
            kind: ParamKind::Ptr(DType::F32),
            written: true,
        },
        ParamDef {
            name: "n",
            kind: ParamKind::ScalarMultipleOf(DType::I32, 16),
            written: false,
        },
    ],
    variants: &[
        Variant {
            consts: &[256],
            num_warps: 4,
            num_stages: 2,
            ptx_sm80: Ptx::text("// sm80"),
            ptx_sm90: Ptx::text(""),
            ptx_sm90a: Ptx::text(""),
            entry: "add",
            shared_bytes: 0,
            cluster: [1, 1, 1],
            assumes_divisible: 0,
            divisible_form: None,
            tma_maps: &[],
        },
        Variant {
            consts: &[256],
            num_warps: 8,
            num_stages: 2,
            ptx_sm80: Ptx::text("// sm80 w8"),
            ptx_sm90: Ptx::text("// sm90 w8"),
            ptx_sm90a: Ptx::text(""),
            entry: "add",
            shared_bytes: 0,
            cluster: [1, 1, 1],
            assumes_divisible: 0,
            divisible_form: None,
            tma_maps: &[],
        },
        Variant {
            consts: &[1024],
            num_warps: 4,
            num_stages: 2,
            ptx_sm80: Ptx::text("// sm80 1024"),
            ptx_sm90: Ptx::text(""),
            ptx_sm90a: Ptx::text(""),
            entry: "add",
            shared_bytes: 0,
            cluster: [1, 1, 1],
            assumes_divisible: 0,
            divisible_form: None,
            tma_maps: &[],
        },
    ],
};

fn launch(cfg: impl Into<LaunchConfig>, consts: &[i64], args: &mut [KernelArg<'_>]) -> String {
    ADD.launch_dyn(&Device::Cpu, cfg, consts, args)
        .unwrap_err()
        .to_string()
}

#[test]
fn launch_config_conversions() {
    assert_eq!(LaunchConfig::from(7).grid, [7, 1, 1]);
    assert_eq!(LaunchConfig::from((7, 2)).grid, [7, 2, 1]);
    assert_eq!(LaunchConfig::from((7, 2, 3)).grid, [7, 2, 3]);
    assert_eq!(LaunchConfig::from([1, 2, 3]).grid, [1, 2, 3]);
    assert_eq!(LaunchConfig::from(7).num_warps, None);
    assert!(!LaunchConfig::from(7).serialized);
    let s = LaunchConfig::from(7).num_warps(2).serialized();
    assert!(s.serialized && s.num_warps == Some(2) && s.grid == [7, 1, 1]);
    let c = LaunchConfig::from((4, 5)).num_warps(8);
    assert_eq!(
        c,
        LaunchConfig {
            grid: [4, 5, 1],
            num_warps: Some(8),
            num_stages: None,
            serialized: false,
        }
    );
}

#[test]
fn variant_selection() {
    assert_eq!(ADD.variant(&[256], None).unwrap().num_warps, 4);
    assert_eq!(
        ADD.variant(&[256], Some(8)).unwrap().ptx_sm80.as_str(),
        "// sm80 w8"
    );
    assert_eq!(
        ADD.ptx(&[1024], None, Target::Sm80).unwrap(),
        "// sm80 1024"
    );
    assert_eq!(
        ADD.ptx(&[256], Some(8), Target::Sm90).unwrap(),
        "// sm90 w8"
    );
    let err = ADD.variant(&[512], Some(4)).unwrap_err().to_string();
    assert_eq!(
        err,
        "kernel `add`: no compiled variant for BLOCK=512, num_warps=4; compiled variants: \
         [BLOCK=256, num_warps=4], [BLOCK=256, num_warps=8], [BLOCK=1024, num_warps=4]"
    );
    let err = ADD.variant(&[1024], Some(8)).unwrap_err().to_string();
    assert!(err.contains("BLOCK=1024, num_warps=8"), "{err}");
    let err = ADD.variant(&[512], None).unwrap_err().to_string();
    assert!(err.contains("BLOCK=512, any num_warps"), "{err}");
    let err = ADD.variant(&[], None).unwrap_err().to_string();
    assert!(
        err.contains("expected 1 compile-time constant(s) (BLOCK), got 0"),
        "{err}"
    );
}

#[test]
fn argument_errors_name_kernel_and_param() {
    let d = Device::Cpu;
    let x = d.upload(&[1.0f32; 32]).unwrap();
    let xi = d.upload(&[1i32; 32]).unwrap();
    let mut out = d.zeros::<f32>(32).unwrap();
    let out2 = d.zeros::<f32>(32).unwrap();

    let err = launch(1, &[256], &mut [(&x).into(), (&mut out).into()]);
    assert_eq!(err, "kernel `add` takes 3 arguments (x, out, n), got 2");

    let err = launch(
        1,
        &[256],
        &mut [(&xi).into(), (&mut out).into(), 32i32.into()],
    );
    assert_eq!(
        err,
        "kernel `add`, parameter `x`: expected a buffer of f32, got a buffer of i32"
    );

    let err = launch(1, &[256], &mut [(&x).into(), (&out2).into(), 32i32.into()]);
    assert!(
        err.starts_with("kernel `add`, parameter `out`: the kernel writes this buffer"),
        "{err}"
    );

    let err = launch(
        1,
        &[256],
        &mut [(&x).into(), (&mut out).into(), 32u32.into()],
    );
    assert_eq!(
        err,
        "kernel `add`, parameter `n`: expected a scalar of i32, got 32u32"
    );

    let err = launch(
        1,
        &[256],
        &mut [(&x).into(), (&mut out).into(), 33i32.into()],
    );
    assert_eq!(
        err,
        "kernel `add`, parameter `n`: the kernel requires a multiple of 16, got 33"
    );

    let err = launch(
        1,
        &[256],
        &mut [1.5f32.into(), (&mut out).into(), 32i32.into()],
    );
    assert_eq!(
        err,
        "kernel `add`, parameter `x`: expected a buffer of f32, got the scalar 1.5f32"
    );

    let err = launch(
        1,
        &[256],
        &mut [(&x).into(), (&mut out).into(), (&x).into()],
    );
    assert_eq!(
        err,
        "kernel `add`, parameter `n`: expected a scalar of i32, got a buffer of f32"
    );

    let err = launch(
        (1, 0),
        &[256],
        &mut [(&x).into(), (&mut out).into(), 32i32.into()],
    );
    assert!(
        err.contains("invalid launch configuration") && err.contains("y extent"),
        "{err}"
    );
    let err = launch(
        (1, 1, 70000),
        &[256],
        &mut [(&x).into(), (&mut out).into(), 32i32.into()],
    );
    assert!(
        err.contains("z extent must be between 1 and 65535, got 70000"),
        "{err}"
    );

    let cfg = LaunchConfig::from(1).num_warps(2);
    let err = launch(
        cfg,
        &[256],
        &mut [(&x).into(), (&mut out).into(), 32i32.into()],
    );
    assert!(
        err.contains("no compiled variant for BLOCK=256, num_warps=2"),
        "{err}"
    );
}

#[test]
fn buffers_from_another_device_are_rejected() {
    let _turn = crate::runtime::testing::gpu_turn();
    let Some(gpu) =
        crate::runtime::testing::gpu_or_skip("buffers_from_another_device_are_rejected")
    else {
        return;
    };
    let x = gpu.upload(&[1.0f32; 32]).unwrap();
    let mut out = Device::Cpu.zeros::<f32>(32).unwrap();
    let err = launch(
        1,
        &[256],
        &mut [(&x).into(), (&mut out).into(), 32i32.into()],
    );
    assert!(
        err.contains("parameter `x`: the buffer lives on cuda:0 but the launch is on cpu"),
        "{err}"
    );
}

#[test]
fn cpu_launch_reaches_the_compiler() {
    let d = Device::Cpu;
    let x = d.upload(&[1.0f32; 32]).unwrap();
    let mut out = d.zeros::<f32>(32).unwrap();
    // A read-only parameter also accepts `&mut`.
    let mut x2 = d.upload(&[1.0f32; 32]).unwrap();
    let r = ADD.launch_dyn(
        &d,
        1,
        &[256],
        &mut [(&mut x2).into(), (&mut out).into(), 32i32.into()],
    );
    let r2 = ADD.launch_dyn(
        &d,
        1,
        &[256],
        &mut [
            (&x).into(),
            (&mut out).into(),
            KernelArg::scalar(Scalar::I32(32)),
        ],
    );
    match (r, r2) {
        // Until the front end and interpreter land, the stub errors must surface as
        // launch errors naming the kernel; afterwards the launch succeeds or fails in
        // the interpreter, never with an argument error.
        (Err(e), _) | (_, Err(e)) => {
            assert!(
                matches!(e, LaunchError::Compile { .. } | LaunchError::Interp(_)),
                "{e}"
            );
            assert!(e.to_string().contains("kernel `add`"), "{e}");
        }
        (Ok(()), Ok(())) => {}
    }
}

#[test]
fn debug_of_args() {
    let d = Device::Cpu;
    let x = d.upload(&[1u8; 3]).unwrap();
    let mut y = d.upload(&[half::f16::ONE; 2]).unwrap();
    assert_eq!(format!("{:?}", KernelArg::from(&x)), "&Buffer<u8>[3]");
    assert_eq!(
        format!("{:?}", KernelArg::from(&mut y)),
        "&mut Buffer<f16>[2]"
    );
    assert_eq!(format!("{:?}", KernelArg::from(-3i64)), "-3i64");
}

#[test]
fn sm90a_modules_run_on_compute_capability_9_0_only() {
    let v = |sm90: &'static str, sm90a: &'static str| Variant {
        consts: &[],
        num_warps: 4,
        num_stages: 2,
        ptx_sm80: Ptx::text("// sm80"),
        ptx_sm90: Ptx::text(sm90),
        ptx_sm90a: Ptx::text(sm90a),
        entry: "k",
        shared_bytes: 0,
        cluster: [1, 1, 1],
        assumes_divisible: 0,
        divisible_form: None,
        tma_maps: &[],
    };
    let both = v("// sm90", "// sm90a");
    assert_eq!(both.target_for(9, 0), Target::Sm90a);
    // Arch-specific PTX does not run on later architectures, nor on earlier ones.
    assert_eq!(both.target_for(10, 0), Target::Sm90);
    assert_eq!(both.target_for(12, 0), Target::Sm90);
    assert_eq!(both.target_for(8, 9), Target::Sm80);
    assert_eq!(both.ptx(Target::Sm90a), "// sm90a");
    // Without an sm_90a module, 9.0 takes the portable sm_90 one.
    assert_eq!(v("// sm90", "").target_for(9, 0), Target::Sm90);
    assert_eq!(v("", "").target_for(9, 0), Target::Sm80);
}

/// A variant whose divisible form assumes parameter 2 (`k`) a multiple of 16.
static ROWS_DIVISIBLE: Variant = Variant {
    consts: &[64],
    num_warps: 4,
    num_stages: 2,
    ptx_sm80: Ptx::text("// k % 16 == 0"),
    ptx_sm90: Ptx::text(""),
    ptx_sm90a: Ptx::text(""),
    entry: "rows",
    shared_bytes: 0,
    cluster: [1, 1, 1],
    assumes_divisible: 1 << 2,
    divisible_form: None,
    tma_maps: &[],
};

static ROWS: Variant = Variant {
    consts: &[64],
    num_warps: 4,
    num_stages: 2,
    ptx_sm80: Ptx::text("// any k"),
    ptx_sm90: Ptx::text(""),
    ptx_sm90a: Ptx::text(""),
    entry: "rows",
    shared_bytes: 0,
    cluster: [1, 1, 1],
    assumes_divisible: 0,
    divisible_form: Some(&ROWS_DIVISIBLE),
    tma_maps: &[],
};

#[test]
fn the_divisible_form_is_taken_exactly_when_its_arguments_divide() {
    let x = Device::Cpu.upload(&[0f32; 4]).unwrap();
    let pick = |k: i32, pos: i32| {
        let args = [
            KernelArg::read(&x),
            KernelArg::from(pos),
            KernelArg::from(k),
        ];
        ROWS.for_args(&args).ptx_sm80.as_str()
    };
    // Only the assumed parameter counts: `pos` (parameter 1) may be anything.
    assert_eq!(pick(1024, 3), "// k % 16 == 0");
    assert_eq!(pick(0, 7), "// k % 16 == 0");
    assert_eq!(pick(-32, 1), "// k % 16 == 0");
    for k in [1, 8, 24, 1000, -8] {
        assert_eq!(pick(k, 0), "// any k", "k = {k}");
    }
    // A form without a divisible form launches as itself.
    let args = [KernelArg::read(&x), KernelArg::from(0), KernelArg::from(5)];
    assert_eq!(
        ROWS_DIVISIBLE.for_args(&args).ptx_sm80.as_str(),
        "// k % 16 == 0"
    );
}

/// Variants with no sm_80 module (clustered, or more shared memory than sm_80 gives a
/// program) say why on an older GPU and run on Hopper.
#[test]
fn hopper_only_variants_name_what_they_need() {
    let base = Variant {
        consts: &[128],
        num_warps: 8,
        num_stages: 4,
        ptx_sm80: Ptx::text(""),
        ptx_sm90: Ptx::text("// sm90"),
        ptx_sm90a: Ptx::text(""),
        entry: "k",
        shared_bytes: 192 * 1024,
        cluster: [1, 1, 1],
        assumes_divisible: 0,
        divisible_form: None,
        tma_maps: &[],
    };
    let why = base.needs_newer_gpu(8).expect("over sm_80's shared memory");
    assert!(why.contains("196608 bytes") && why.contains("8.x"), "{why}");
    assert_eq!(base.needs_newer_gpu(9), None);
    assert_eq!(base.needs_newer_gpu(10), None);
    let fits = Variant {
        shared_bytes: 163 * 1024,
        ..base
    };
    assert_eq!(fits.needs_newer_gpu(8), None);
    let clustered = Variant {
        shared_bytes: 0,
        cluster: [2, 1, 1],
        ..base
    };
    let why = clustered.needs_newer_gpu(8).expect("clusters");
    assert!(why.contains("clusters of [2, 1, 1]"), "{why}");
}

#[test]
fn a_byte_buffer_read_as_words_reaches_the_kernel_as_its_bytes() {
    // Four bytes a word, little-endian: the kernel sees the same memory as `u32`s, and a
    // signature check counts the words.
    let src = "fn words<const B: usize>(w: Ptr<u32>, out: Ptr<u32>, n: i32) {
        let i = arange(0, B);
        store(out + i, load(w + i, i < n) >> 8, i < n);
    }";
    let d = crate::testing::def_with(src, &[("B", 4)], 1, false);
    let dev = Device::cpu();
    let bytes: Vec<u8> = (1..=16).collect();
    let b = dev.upload(&bytes).unwrap();
    let mut out = dev.alloc_filled(4, u32::MAX).unwrap();
    let mut args = [
        KernelArg::read_as::<u32, u8>(&b).unwrap(),
        KernelArg::write(&mut out),
        KernelArg::from(4i32),
    ];
    d.launch_dyn(&dev, [1, 1, 1], &[4], &mut args).unwrap();
    let want: Vec<u32> = bytes
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()) >> 8)
        .collect();
    assert_eq!(out.to_vec().unwrap(), want);
    // As bytes, the same buffer is the wrong element type for `w`.
    let mut args = [
        KernelArg::read(&b),
        KernelArg::write(&mut out),
        KernelArg::from(4i32),
    ];
    let e = d.launch_dyn(&dev, [1, 1, 1], &[4], &mut args).unwrap_err();
    assert!(e.to_string().contains('w'), "{e}");
    let odd = dev.upload(&[1u8, 2, 3, 4, 5]).unwrap();
    let e = KernelArg::read_as::<u32, u8>(&odd).unwrap_err();
    assert!(
        e.to_string()
            .contains("5 u8 (5 bytes) cannot be read as u32"),
        "{e}"
    );
}

#[test]
fn register_rules_select_variants_by_kernel_and_constants() {
    use super::cuda::register_rule;
    let d = "BLOCK_N=16, BLOCK_K=1024, num_warps=4";
    assert_eq!(register_rule("", "gemv", d), Ok(None));
    assert_eq!(register_rule("gemv=80", "gemv", d), Ok(Some(80)));
    assert_eq!(register_rule("other=80", "gemv", d), Ok(None));
    // Pairs must all match; the first matching rule wins.
    let rules = "gemv[BLOCK_N=16, num_warps=8]=72; gemv[BLOCK_K=1024]=96; gemv=64";
    assert_eq!(register_rule(rules, "gemv", d), Ok(Some(96)));
    let d8 = "BLOCK_N=16, BLOCK_K=512, num_warps=8";
    assert_eq!(register_rule(rules, "gemv", d8), Ok(Some(72)));
    // A pair's value is matched whole: BLOCK_N=1 is not BLOCK_N=16.
    assert_eq!(register_rule("gemv[BLOCK_N=1]=72", "gemv", d), Ok(None));
    for (bad, says) in [
        ("gemv", "is not `kernel=N`"),
        ("gemv=8", "from 16 to 255"),
        ("gemv=eighty", "from 16 to 255"),
        ("gemv[BLOCK_N=16=80", "closing `]`"),
        ("gemv[BLOCK_N]=80", "`BLOCK_N` is not `NAME=v`"),
    ] {
        let e = register_rule(bad, "gemv", d).unwrap_err();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn a_register_limit_rewrites_every_maxnreg_line_only() {
    use super::cuda::with_register_limit;
    let ptx =
        ".entry k(\n)\n.maxntid 128, 1, 1\n.maxnreg 248\n{\n\tmov.u32 %r1, 1; // .maxnreg 9\n}\n";
    let out = with_register_limit(ptx, 80);
    assert_eq!(out, ptx.replace(".maxnreg 248\n", ".maxnreg 80\n"));
}

#[test]
fn occupancy_questions_have_no_answer_on_the_interpreter_and_name_bad_variants() {
    let cpu = Device::Cpu;
    assert_eq!(ADD.programs_per_sm(&cpu, &[256], Some(8)).unwrap(), None);
    assert_eq!(ADD.registers_per_thread(&cpu, &[1024], None).unwrap(), None);
    let e = ADD
        .programs_per_sm(&cpu, &[512], None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("BLOCK=512"), "{e}");
    let e = ADD
        .registers_per_thread(&cpu, &[1024], Some(8))
        .unwrap_err()
        .to_string();
    assert!(e.contains("num_warps=8"), "{e}");
}
