//! The cost of a dependent kernel launch inside a CUDA graph: the floor that a decode
//! step's launch structure puts under its time, whatever its kernels read.
//!
//! `cargo run --release --example launch_floor`
//!
//! A chain of `L` launches of one tiny kernel, each reading what the one before it
//! wrote (`dst = src + 1` over `P` programs of 256 values, buffers alternating), is
//! captured as one graph and replayed; the time per launch is the replay's time over
//! `L`. Launches overlap as the decode step's do (programmatic dependent launch on
//! Hopper: a kernel's programs start before the previous kernel ends and wait for it
//! with `wait_for_prior_kernels()`), and, for comparison, serialized. The chain's result
//! is checked against the host (`L` added to random values) before it is timed.
//!
//! The step of a model with `launches` kernels cannot take less than `launches` times
//! the cost of one link: docs/perf.md ("The launch floor of the decode step") sets it
//! against the quantized step's bandwidth floor.
//!
//! Method (docs/perf.md): CUDA events around graph replays, median of 30 after 5
//! warm-ups. Without a GPU the chain runs once on the interpreter, checked, untimed.

#[path = "common/args.rs"]
mod args;

use tilefuse::dsl::runtime::timing::TimingOptions;
use tilefuse::engine::bench::Rng;
use tilefuse::prelude::*;

/// One link of the chain: `dst = src + 1` over `n` values, after the kernel that
/// wrote `src`.
#[kernel(BLOCK = [256], num_warps = [4])]
pub fn chain_link<const BLOCK: usize>(src: Ptr<f32>, dst: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let m = offs < n;
    wait_for_prior_kernels();
    let v = load(src + offs, m, 0.0);
    store(dst + offs, v + 1.0, m);
}

/// Launches the chain of `links` links over `p` programs: `bufs.0 -> bufs.1 -> bufs.0
/// ...`, each launch serialized or not. The result is in `bufs.0` for an even count.
fn chain(
    dev: &Device,
    bufs: &mut (Buffer<f32>, Buffer<f32>),
    p: u32,
    links: usize,
    serialized: bool,
) -> anyhow::Result<()> {
    let n = (p * 256) as i32;
    for i in 0..links {
        let mut cfg = LaunchConfig::from(p).num_warps(4);
        if serialized {
            cfg = cfg.serialized();
        }
        let (src, dst) = if i % 2 == 0 {
            (&bufs.0, &mut bufs.1)
        } else {
            (&bufs.1, &mut bufs.0)
        };
        ChainLinkArgs { src, dst, n }.launch(dev, cfg, ChainLinkConsts { block: 256 })?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let dev = Device::auto();
    let links: usize = args::value("--links").map_or(Ok(200), |v| v.parse())?;
    anyhow::ensure!(links >= 2 && links % 2 == 0, "--links: an even count of 2 or more");
    let programs: Vec<u32> = if dev.is_cuda() {
        let sms = dev.info()?.sm_count as u32;
        vec![1, sms, 4 * sms]
    } else {
        vec![3]
    };
    let mut rng = Rng::new(11);
    if dev.is_cuda() {
        println!("{}", dev.info()?.name);
    } else {
        println!("CPU interpreter (no GPU): the chain is checked, not timed");
    }
    println!("| programs | launches | µs a launch (overlapped) | µs a launch (serialized) |");
    println!("|---|---|---|---|");
    for p in programs {
        let n = p as usize * 256;
        // Quarter-integers: every sum along the chain is exact.
        let x: Vec<f32> = (0..n).map(|_| (rng.next_u32() % 4096) as f32 / 4.0).collect();
        let mut bufs = (dev.upload(&x)?, dev.alloc_filled(n, f32::NAN)?);
        let mut per_launch = Vec::new();
        for serialized in [false, true] {
            // Checked first: `links` added to every value (exact in f32 at these sizes).
            bufs.0.copy_from_host(&x)?;
            bufs.1.copy_from_host(&vec![f32::NAN; n])?;
            chain(&dev, &mut bufs, p, links, serialized)?;
            let got = bufs.0.to_vec()?;
            for (i, (g, v)) in got.iter().zip(&x).enumerate() {
                anyhow::ensure!(
                    *g == v + links as f32,
                    "{p} programs, serialized {serialized}: value {i} is {g}, not {v} + {links}"
                );
            }
            if !dev.is_cuda() {
                per_launch.push("(interpreter: not timed)".to_string());
                continue;
            }
            let graph = dev.capture(|| chain(&dev, &mut bufs, p, links, serialized))?;
            let stats = graph.time(links, TimingOptions::default())?;
            per_launch.push(format!("{:.2}", stats.median_us));
        }
        println!("| {p} | {links} | {} | {} |", per_launch[0], per_launch[1]);
    }
    Ok(())
}
