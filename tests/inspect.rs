//! `tilefuse inspect`: the summary of the examples' kernels, the sections the flags select,
//! and clear errors (never panics) for bad input.

use std::path::PathBuf;
use std::process::Command;

use tilefuse::cli::inspect::{run, InspectArgs, TargetArg};

fn args(file: &str) -> InspectArgs {
    InspectArgs {
        file: PathBuf::from(file),
        kernel: None,
        consts: Vec::new(),
        num_warps: None,
        num_stages: None,
        target: TargetArg::Sm80,
        ptx: false,
        layouts: false,
        ptxas: false,
        sm: None,
    }
}

const EXAMPLES: &str = "examples/common/mod.rs";

#[test]
fn summarizes_every_kernel_of_the_examples() {
    let out = run(&args(EXAMPLES)).unwrap();
    for k in ["vector_add", "softmax", "rmsnorm", "gemv"] {
        assert!(out.contains(&format!("kernel `{k}` ({EXAMPLES}:")), "{out}");
    }
    // First listed values by default.
    assert!(out.contains("BLOCK = 256, num_warps = 4"), "{out}");
    assert!(
        out.contains("BLOCK_N = 4, BLOCK_K = 256, num_warps = 4"),
        "{out}"
    );
    // gemv's accumulator is named by its `let`, with its layout in words.
    let acc = out
        .lines()
        .position(|l| l.contains(" acc (51:"))
        .expect(&out);
    let next = out.lines().nth(acc + 1).unwrap();
    assert!(
        next.contains("per thread [1, 8] x threads/warp [1, 32] x warps [4, 1]"),
        "{next}"
    );
    assert!(out.contains("load   w "), "{out}");
    assert!(out.contains("shared memory: 16 bytes"), "{out}");
    // Either ptxas' report for both targets, each with the programs an SM holds, or
    // how to get it.
    assert!(
        (out.contains("sm_80: ")
            && out.contains("sm_90: ")
            && out.contains(" programs an SM (bound by "))
            || out.contains("ptxas: not available"),
        "{out}"
    );
}

#[test]
fn shows_vector_widths_and_chosen_specialization() {
    let dir = std::env::temp_dir().join(format!("tilefuse-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("copy.rs");
    std::fs::write(
        &file,
        "#[kernel(BLOCK = [512, 1024], num_warps = [4, 8])]\n\
         fn copy<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, #[multiple_of(16)] n: i32) {\n\
         \x20   let offs = program_id(0) * BLOCK + arange(0, BLOCK);\n\
         \x20   let v = load(x + offs, offs < n, 0.0);\n\
         \x20   store(y + offs, v, offs < n);\n\
         }\n",
    )
    .unwrap();
    let mut a = args(file.to_str().unwrap());
    a.consts = vec![("BLOCK".into(), 1024)];
    a.num_warps = Some(8);
    let out = run(&a).unwrap();
    assert!(out.contains("BLOCK = 1024, num_warps = 8"), "{out}");
    assert!(!out.contains("not a listed"), "{out}");
    // 1024 elements over 256 threads: 4 per thread, one 16-byte vector each way.
    assert!(
        out.contains(
            "load   x        4 x f32: 1 instruction(s) of 4 element(s) (16 bytes, .v4) at v (4:13)"
        ),
        "{out}"
    );
    assert!(
        out.contains("store  y        4 x f32: 1 instruction(s) of 4 element(s)"),
        "{out}"
    );
    a.consts = vec![("BLOCK".into(), 64)];
    let out = run(&a).unwrap();
    assert!(out.contains("not a listed specialization"), "{out}");

    a.consts = vec![("BLOCK".into(), 1024)];
    a.ptx = true;
    a.target = TargetArg::Sm90;
    let out = run(&a).unwrap();
    assert!(out.starts_with("// kernel `copy`"), "{out}");
    assert!(
        out.contains(".target sm_90") && out.contains("st.global.v4.f32"),
        "{out}"
    );
    assert!(!out.contains("layouts ("), "only the PTX with --ptx");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn clustered_kernels_are_shown_for_sm_90() {
    let dir = std::env::temp_dir().join(format!("tilefuse-inspect-c{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("gather.rs");
    std::fs::write(
        &file,
        "#[kernel(cluster(x = 4))]\n\
         fn gather(x: Ptr<f32>, y: Ptr<f32>) {\n\
         \x20   let i = arange(0, 32);\n\
         \x20   let all = cluster_gather(load(x + program_id(0) * 32 + i));\n\
         \x20   store(y + program_id(0) * 32 + i, all.sum(0));\n\
         }\n",
    )
    .unwrap();
    // The default target (sm_80) has no clusters: the summary is for sm_90.
    let mut a = args(file.to_str().unwrap());
    let out = run(&a).unwrap();
    assert!(out.contains("target: sm_90"), "{out}");
    a.ptx = true;
    let out = run(&a).unwrap();
    assert!(
        out.contains(".target sm_90") && out.contains("barrier.cluster.wait"),
        "{out}"
    );
    if tilefuse::dsl::back::ptx::ptxas::find().is_ok() {
        a.ptx = false;
        a.ptxas = true;
        let out = run(&a).unwrap();
        assert!(out.contains("sm_80: none (thread-block clusters"), "{out}");
        assert!(
            out.contains("sm_90: ") && out.contains("registers"),
            "{out}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A variant whose ring only sm_90's shared memory holds (matmul's 128 x 256 x 64 at 4
/// stages) is shown for sm_90, as `#[kernel]` builds it, not refused for sm_80.
#[test]
fn hopper_only_variants_are_shown_for_sm_90() {
    let mut a = args("src/kernels/matmul.rs");
    a.kernel = Some("matmul".into());
    a.consts = [("BM", 128), ("BN", 256), ("BK", 64), ("GROUP_M", 8)]
        .map(|(n, v)| (n.to_string(), v))
        .to_vec();
    a.num_warps = Some(8);
    a.num_stages = Some(4);
    let out = run(&a).unwrap();
    assert!(out.contains("target: sm_90"), "{out}");
    assert!(out.contains("196608"), "{out}");
    if tilefuse::dsl::back::ptx::ptxas::find().is_ok() {
        a.ptxas = true;
        let out = run(&a).unwrap();
        assert!(out.contains("sm_80: none (more shared memory"), "{out}");
    }
    // Three stages fit sm_80: shown for the default target.
    a.num_stages = Some(3);
    a.ptxas = false;
    let out = run(&a).unwrap();
    assert!(out.contains("target: sm_80"), "{out}");
}

/// A kernel over dtypes (`matmul`'s `T = [bf16, f32]`) is found once per binding: its
/// bare name selects both, `matmul<f32>` one, and an unbound dtype is an error that
/// lists the bindings.
#[test]
fn a_dtype_generic_kernel_is_selected_by_name_or_binding() {
    let mut a = args("src/kernels/matmul.rs");
    a.kernel = Some("matmul".into());
    let both = run(&a).unwrap();
    assert!(
        both.contains("matmul<bf16>") && both.contains("matmul<f32>"),
        "{both}"
    );
    assert!(!both.contains("matmul_split"), "{both}");
    a.kernel = Some("matmul<f32>".into());
    let one = run(&a).unwrap();
    assert!(
        one.contains("matmul<f32>") && !one.contains("matmul<bf16>"),
        "{one}"
    );
    a.kernel = Some("matmul<f16>".into());
    let err = format!("{:#}", run(&a).unwrap_err());
    assert!(
        err.contains("no kernel `matmul<f16>`") && err.contains("`matmul<bf16>`"),
        "{err}"
    );
}

/// The occupancy lines count the SM of the part `--sm` names: a 128-thread program of
/// few registers is bound by threads, 16 on an A100's 2048 and 12 on an RTX 4090's
/// 1536, and sm_90 modules do not load on 8.x parts.
#[test]
fn occupancy_is_counted_on_the_part_asked_for() {
    if tilefuse::dsl::back::ptx::ptxas::find().is_err() {
        eprintln!("skipped: no ptxas");
        return;
    }
    let mut a = args(EXAMPLES);
    a.kernel = Some("vector_add".into());
    a.ptxas = true;
    let out = run(&a).unwrap();
    assert!(
        out.contains("on 8.0: 16 programs an SM (bound by threads)"),
        "{out}"
    );
    assert!(
        out.contains("on 9.0: 16 programs an SM (bound by threads)"),
        "{out}"
    );
    a.sm = Some((8, 9));
    let out = run(&a).unwrap();
    assert!(
        out.contains("on 8.9: 12 programs an SM (bound by threads)"),
        "{out}"
    );
    assert!(
        out.contains("on 8.9: none (sm_90 modules need compute capability 9.0)"),
        "{out}"
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let err = |a: &InspectArgs| format!("{:#}", run(a).unwrap_err());
    let e = err(&args("no/such/file.rs"));
    assert!(e.contains("cannot read no/such/file.rs"), "{e}");

    let mut a = args(EXAMPLES);
    a.kernel = Some("matmul".into());
    let e = err(&a);
    assert!(
        e.contains("no kernel `matmul`") && e.contains("`gemv` (line 42)"),
        "{e}"
    );

    let mut a = args(EXAMPLES);
    a.kernel = Some("gemv".into());
    a.consts = vec![("BLOCK".into(), 4)];
    let e = err(&a);
    assert!(
        e.contains("no constant `BLOCK`") && e.contains("BLOCK_N, BLOCK_K"),
        "{e}"
    );

    // A value the kernel cannot be compiled with names the kernel and the value.
    let mut a = args(EXAMPLES);
    a.kernel = Some("vector_add".into());
    a.consts = vec![("BLOCK".into(), 100)];
    let e = err(&a);
    assert!(
        e.contains("kernel `vector_add` (BLOCK = 100, num_warps = 4)"),
        "{e}"
    );

    let e = err(&args("Cargo.toml"));
    assert!(e.starts_with("Cargo.toml: line "), "{e}");
}

#[test]
fn the_binary_reports_errors_without_panicking() {
    let bin = env!("CARGO_BIN_EXE_tilefuse");
    let out = Command::new(bin)
        .args(["inspect", EXAMPLES, "--kernel", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: examples/common/mod.rs: no kernel `nope`"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    let out = Command::new(bin)
        .args(["inspect", EXAMPLES, "--const", "BLOCK"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected NAME=VALUE"));

    for (part, says) in [
        ("7.5", "no SM figures for this part (known: 8.0, 8.6"),
        ("nine", "expected a compute capability"),
    ] {
        let out = Command::new(bin)
            .args(["inspect", EXAMPLES, "--ptxas", "--sm", part])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&format!("`{part}`: {says}")), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }

    let out = Command::new(bin)
        .args(["inspect", EXAMPLES, "--kernel", "softmax", "--layouts"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("rematerialized"), "{stdout}");
}

/// Kernels whose strides declare nothing get a divisible form, and the summary says what
/// it assumes and which accesses it widens; declared or irrelevant parameters get none.
#[test]
fn reports_the_divisible_form() {
    let out = run(&args("examples/tutorial_03_matmul.rs")).unwrap();
    assert!(
        out.contains(
            "divisible form: also compiled assuming `n`, `k` multiples of 16, launched when they are: 3 access(es) wider (1 -> 8, 1 -> 8, 1 -> 8)"
        ),
        "{out}"
    );
    let out = run(&args(EXAMPLES)).unwrap();
    assert!(
        out.contains(
            "divisible form: also compiled assuming `k` a multiple of 16, launched when it is"
        ),
        "{out}"
    );
    // softmax's one element a thread cannot widen, whatever its sizes.
    let out = run(&args("examples/tutorial_02_fused_softmax.rs")).unwrap();
    assert!(
        out.contains(
            "divisible form: none (no integer parameter's divisibility by 16 widens an access)"
        ),
        "{out}"
    );
}

/// A kernel calling a helper of another module (`#[kernel]` resolves it by path) is
/// inspected with the helpers of its crate: every file under the nearest `Cargo.toml`.
#[test]
fn kernels_calling_helpers_of_other_files_compile() {
    let dir = std::env::temp_dir().join(format!("tilefuse-inspect-h{}", std::process::id()));
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("Cargo.toml"), "[package]\nname = \"h\"\n").unwrap();
    std::fs::write(
        dir.join("src/helpers.rs"),
        "#[tile_fn]\npub fn twice(x: Tile<f32>) -> Tile<f32> {\n    x * 2.0\n}\n",
    )
    .unwrap();
    let file = dir.join("src/k.rs");
    std::fs::write(
        &file,
        "#[kernel(num_warps = [4])]\n\
         fn k(x: Ptr<f32>) {\n\
         \x20   let offs = arange(0, 512);\n\
         \x20   store(x + offs, crate::helpers::twice(load(x + offs)));\n\
         }\n",
    )
    .unwrap();
    let out = run(&args(file.to_str().unwrap())).unwrap();
    assert!(out.contains("kernel `k`"), "{out}");
    assert!(out.contains("store  x "), "{out}");
    // Without the crate's other files the helper is unknown, and the error says so.
    std::fs::remove_file(dir.join("src/helpers.rs")).unwrap();
    let err = run(&args(file.to_str().unwrap())).unwrap_err().to_string();
    assert!(err.contains("unknown op `twice`"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
