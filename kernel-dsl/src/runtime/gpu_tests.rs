//! GPU launch tests with a hand-written PTX kernel (the backend is tested separately);
//! they skip without a GPU and fail under `TILEFUSE_REQUIRE_GPU=1`.

use super::testing::gpu_or_skip;
use super::*;
use crate::ir::{DType, ParamKind};

/// `out[i] = x[i] * a + (b as f32)` for `i < n`, one element per thread.
macro_rules! scale_add_body {
    () => {
        r#"
.address_size 64

.visible .entry scale_add(
    .param .u64 p_x,
    .param .u64 p_out,
    .param .f32 p_a,
    .param .u64 p_b,
    .param .u32 p_n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<5>;
    .reg .b64 %rd<9>;

    ld.param.u64 %rd1, [p_x];
    ld.param.u64 %rd2, [p_out];
    ld.param.f32 %f3, [p_a];
    ld.param.u64 %rd8, [p_b];
    ld.param.u32 %r1, [p_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.s32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mul.wide.s32 %rd5, %r5, 4;
    add.s64 %rd6, %rd3, %rd5;
    ld.global.f32 %f1, [%rd6];
    cvt.rn.f32.s64 %f4, %rd8;
    fma.rn.f32 %f2, %f1, %f3, %f4;
    add.s64 %rd7, %rd4, %rd5;
    st.global.f32 [%rd7], %f2;
DONE:
    ret;
}
"#
    };
}

/// The sm_80 module (also used by the PTX syntax check in CI-less environments).
pub(crate) const SCALE_ADD_SM80: &str = concat!(".version 7.8\n.target sm_80\n", scale_add_body!());
const SCALE_ADD_SM90: &str = concat!(".version 7.8\n.target sm_90\n", scale_add_body!());

static SCALE_ADD: KernelDef = KernelDef {
    name: "scale_add",
    source: "",
    const_names: &[],
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
            name: "a",
            kind: ParamKind::Scalar(DType::F32),
            written: false,
        },
        ParamDef {
            name: "b",
            kind: ParamKind::Scalar(DType::I64),
            written: false,
        },
        ParamDef {
            name: "n",
            kind: ParamKind::Scalar(DType::I32),
            written: false,
        },
    ],
    variants: &[
        Variant {
            consts: &[],
            num_warps: 1,
            num_stages: 2,
            ptx_sm80: Ptx::text(SCALE_ADD_SM80),
            ptx_sm90: Ptx::text(SCALE_ADD_SM90),
            ptx_sm90a: Ptx::text(""),
            entry: "scale_add",
            shared_bytes: 0,
            cluster: [1, 1, 1],
            assumes_divisible: 0,
            divisible_form: None,
            tma_maps: &[],
        },
        Variant {
            consts: &[],
            num_warps: 4,
            num_stages: 2,
            ptx_sm80: Ptx::text(SCALE_ADD_SM80),
            ptx_sm90: Ptx::text(""),
            ptx_sm90a: Ptx::text(""),
            entry: "scale_add",
            shared_bytes: 0,
            cluster: [1, 1, 1],
            assumes_divisible: 0,
            divisible_form: None,
            tma_maps: &[],
        },
    ],
};

fn expected(x: &[f32], a: f32, b: i64) -> Vec<f32> {
    x.iter().map(|v| v.mul_add(a, b as f32)).collect()
}

#[test]
fn gpu_launch_matches_host() {
    let _turn = crate::runtime::testing::gpu_turn();
    let Some(dev) = gpu_or_skip("gpu_launch_matches_host") else {
        return;
    };
    let n = 1000usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
    let xb = dev.upload(&x).unwrap();
    for warps in [1u32, 4] {
        let mut out = dev.alloc_filled(n + 5, f32::NAN).unwrap();
        let grid = (n as u32).div_ceil(32 * warps);
        SCALE_ADD
            .launch_dyn(
                &dev,
                LaunchConfig::from(grid).num_warps(warps),
                &[],
                &mut [
                    (&xb).into(),
                    (&mut out).into(),
                    2.5f32.into(),
                    (-3i64).into(),
                    (n as i32).into(),
                ],
            )
            .unwrap();
        let got = out.to_vec().unwrap();
        assert_eq!(&got[..n], &expected(&x, 2.5, -3)[..], "num_warps={warps}");
        // Threads past `n` must not write.
        assert!(got[n..].iter().all(|v| v.is_nan()));
    }
}

#[test]
fn gpu_launches_queue_without_sync_and_capture_into_graphs() {
    let _turn = crate::runtime::testing::gpu_turn();
    let Some(dev) = gpu_or_skip("gpu_launches_queue_without_sync_and_capture_into_graphs") else {
        return;
    };
    let n = 256usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut a = dev.upload(&x).unwrap();
    let mut b = dev.zeros::<f32>(n).unwrap();
    // Ping-pong 100 launches: each reads the previous result from the same stream.
    for i in 0..100 {
        let (src, dst) = if i % 2 == 0 {
            (&a, &mut b)
        } else {
            (&b, &mut a)
        };
        let mut args = [
            src.into(),
            dst.into(),
            1.0f32.into(),
            1i64.into(),
            (n as i32).into(),
        ];
        SCALE_ADD.launch_dyn(&dev, 8, &[], &mut args).unwrap();
    }
    let want: Vec<f32> = x.iter().map(|v| v + 100.0).collect();
    assert_eq!(a.to_vec().unwrap(), want);

    // Capture one launch into a CUDA graph; replaying it must work because launches
    // record no events and never synchronize.
    let cuda = dev.as_cuda().unwrap();
    let stream = cuda.stream();
    let mut out = dev.zeros::<f32>(n).unwrap();
    stream
        .begin_capture(
            cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
        .unwrap();
    let launched = SCALE_ADD.launch_dyn(
        &dev,
        8,
        &[],
        &mut [
            (&a).into(),
            (&mut out).into(),
            2.0f32.into(),
            0i64.into(),
            (n as i32).into(),
        ],
    );
    let graph = stream
        .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("a graph with one kernel node");
    launched.unwrap();
    assert!(
        out.to_vec().unwrap().iter().all(|&v| v == 0.0),
        "capture must not run the kernel"
    );
    graph.launch().unwrap();
    let want2: Vec<f32> = want.iter().map(|v| v * 2.0).collect();
    assert_eq!(out.to_vec().unwrap(), want2);
}

#[test]
fn gpu_reports_device_and_target() {
    let _turn = crate::runtime::testing::gpu_turn();
    let Some(dev) = gpu_or_skip("gpu_reports_device_and_target") else {
        return;
    };
    let cuda = dev.as_cuda().unwrap();
    println!(
        "device: {} (sm_{}{})",
        dev.name(),
        cuda.compute_capability().0,
        cuda.compute_capability().1
    );
    assert!(!dev.name().is_empty());
    assert!(dev.is_cuda());
    dev.synchronize().unwrap();
}

#[test]
fn hand_written_ptx_assembles() {
    // Checks the test kernel itself when `ptxas` is available (CI requires it).
    use crate::back::ptx::{ptxas, Target};
    let bin = match ptxas::find() {
        Ok(bin) => bin,
        Err(e) if std::env::var("TILEFUSE_REQUIRE_PTXAS").as_deref() == Ok("1") => panic!("{e}"),
        Err(e) => {
            println!("hand_written_ptx_assembles: skipped: {e}");
            return;
        }
    };
    for (target, ptx) in [
        (Target::Sm80, SCALE_ADD_SM80),
        (Target::Sm90, SCALE_ADD_SM90),
    ] {
        ptxas::assemble_text(&bin, ptx, "scale_add", target).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn readback_waits_for_its_copy_not_for_later_work() {
    let mut devs = vec![Device::cpu()];
    let _turn = crate::runtime::testing::gpu_turn();
    if let Some(gpu) = gpu_or_skip("readback_waits_for_its_copy_not_for_later_work") {
        devs.push(gpu);
    }
    for dev in devs {
        let mut buf = dev.upload(&[11i32, 12, 13]).unwrap();
        let mut rb = dev.readback::<i32>(2).unwrap();
        assert_eq!(rb.wait().unwrap(), &[0, 0], "{dev}: zeros before any copy");
        rb.enqueue(&buf).unwrap();
        // Queued after the copy: the readback must still see the old contents.
        buf.copy_from_host(&[21, 22, 23]).unwrap();
        assert_eq!(rb.wait().unwrap(), &[11, 12], "{dev}");
        rb.enqueue(&buf).unwrap();
        assert_eq!(rb.wait().unwrap(), &[21, 22], "{dev}");
        let short = dev.upload(&[1i32]).unwrap();
        assert!(rb.enqueue(&short).is_err(), "{dev}: a source too short");
        if dev.is_cuda() {
            let host = Device::cpu().upload(&[1i32, 2]).unwrap();
            let err = rb.enqueue(&host).unwrap_err().to_string();
            assert!(err.contains("different devices"), "{err}");
        }
    }
}
