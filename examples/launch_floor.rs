//! The cost of a dependent kernel launch inside a CUDA graph: the floor that a decode
//! step's launch structure puts under its time, whatever its kernels read.
//!
//! `cargo run --release --example launch_floor [-- --links L]` (`L` even, default 200)
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
//! A second table times the same dependency inside one launch, as a persistent kernel
//! would have it: eight phases a launch, each reading the block the next program wrote
//! in the phase before, behind a grid barrier built from the language's primitives
//! (`atomic_add` on a counter, then `wait_flag_at_least` on it, or a spin of
//! `atomic_add(count, 0)`); every program must be resident at once. Checked the same
//! way (on the interpreter with one program only: it runs programs one after another).
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

/// The counter of [`chain_phases`]' grid barriers back to zero, once the kernel before
/// has finished.
#[kernel(BLOCK = [32], num_warps = [1])]
pub fn zero_counter<const BLOCK: usize>(count: Ptr<i32>) {
    let i = arange(0, BLOCK);
    store(count + i, i & 0, i < 1);
}

/// One phase of [`chain_phases`]: `dst[offs] = src[from] + 1`, then a grid barrier:
/// every program bumps `count`, then waits until all `np` have, the `k`-th time, with
/// the flag handshake (`ATOMIC = 0`, a system-scope poll) or by spinning on the counter
/// itself (`ATOMIC = 1`, `atomic_add` of 0, acquire-release at device scope).
#[tile_fn]
#[allow(clippy::too_many_arguments)]
fn phase<const ATOMIC: usize>(
    src: Ptr<f32>,
    dst: Ptr<f32>,
    offs: Tile<i32>,
    from: Tile<i32>,
    m: Tile<bool>,
    count: Ptr<i32>,
    np: i32,
    k: i32,
) {
    let v = load(src + from, m, 0.0);
    store(dst + offs, v + 1.0, m);
    let mut seen = atomic_add(count, 1) + 1;
    if ATOMIC == 1 {
        while seen < k * np {
            seen = atomic_add(count, 0);
        }
    } else {
        wait_flag_at_least(count, k * np);
    }
}

/// Eight links in one launch: each phase reads the block the next program wrote in the
/// phase before (`a -> b -> a ...`), so the phases need a grid barrier between them
/// ([`phase`]'s), the dependency a persistent decode kernel would have in place of a
/// launch. Every program must be resident at once.
#[kernel(BLOCK = [256], ATOMIC = [0, 1], num_warps = [4])]
pub fn chain_phases<const BLOCK: usize, const ATOMIC: usize>(
    a: Ptr<f32>,
    b: Ptr<f32>,
    count: Ptr<i32>,
    n: i32,
) {
    let p = program_id(0);
    let np = num_programs(0);
    let offs = p * BLOCK + arange(0, BLOCK);
    let from = ((p + 1) % np) * BLOCK + arange(0, BLOCK);
    let m = offs < n;
    wait_for_prior_kernels();
    phase::<ATOMIC>(a, b, offs, from, m, count, np, 1);
    phase::<ATOMIC>(b, a, offs, from, m, count, np, 2);
    phase::<ATOMIC>(a, b, offs, from, m, count, np, 3);
    phase::<ATOMIC>(b, a, offs, from, m, count, np, 4);
    phase::<ATOMIC>(a, b, offs, from, m, count, np, 5);
    phase::<ATOMIC>(b, a, offs, from, m, count, np, 6);
    phase::<ATOMIC>(a, b, offs, from, m, count, np, 7);
    phase::<ATOMIC>(b, a, offs, from, m, count, np, 8);
}

/// The phases a [`chain_phases`] launch runs.
const PHASES: usize = 8;

/// `launches` launches of [`chain_phases`] over `p` programs, each after the counter's
/// reset: `launches * PHASES` links, the result in `bufs.0`.
fn persistent_chain(
    dev: &Device,
    bufs: &mut (Buffer<f32>, Buffer<f32>),
    count: &mut Buffer<i32>,
    p: u32,
    launches: usize,
    atomic: bool,
) -> anyhow::Result<()> {
    let n = (p * 256) as i32;
    for _ in 0..launches {
        let one = LaunchConfig::from(1).num_warps(1);
        ZeroCounterArgs { count: &mut *count }.launch(dev, one, ZeroCounterConsts { block: 32 })?;
        let cfg = LaunchConfig::from(p).num_warps(4);
        let consts = ChainPhasesConsts {
            block: 256,
            atomic: usize::from(atomic),
        };
        ChainPhasesArgs {
            a: &mut bufs.0,
            b: &mut bufs.1,
            count: &mut *count,
            n,
        }
        .launch(dev, cfg, consts)?;
    }
    Ok(())
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
    anyhow::ensure!(
        links >= 2 && links % 2 == 0,
        "--links: an even count of 2 or more"
    );
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
        let x: Vec<f32> = (0..n)
            .map(|_| (rng.next_u32() % 4096) as f32 / 4.0)
            .collect();
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
    // The same dependency as a grid barrier inside one launch. The interpreter runs
    // programs one after another, so a barrier there passes only with one program.
    let programs: Vec<u32> = if dev.is_cuda() {
        let sms = dev.info()?.sm_count as u32;
        vec![1, sms, 2 * sms]
    } else {
        vec![1]
    };
    let launches = links / PHASES;
    println!();
    println!("| programs | launches x phases | µs a phase (flag barrier) | µs a phase (atomic barrier) |");
    println!("|---|---|---|---|");
    for p in programs {
        let n = p as usize * 256;
        let x: Vec<f32> = (0..n)
            .map(|_| (rng.next_u32() % 4096) as f32 / 4.0)
            .collect();
        let mut timed = Vec::new();
        for atomic in [false, true] {
            let mut bufs = (dev.upload(&x)?, dev.alloc_filled(n, f32::NAN)?);
            let mut count = dev.zeros::<i32>(1)?;
            persistent_chain(&dev, &mut bufs, &mut count, p, launches, atomic)?;
            // Each phase reads the next program's block: after `k` phases value `i`
            // holds `x[i + k * 256 mod n] + k`.
            let k = launches * PHASES;
            let got = bufs.0.to_vec()?;
            for (i, g) in got.iter().enumerate() {
                let want = x[(i + k * 256) % n] + k as f32;
                anyhow::ensure!(
                    *g == want,
                    "{p} programs, grid barriers (atomic {atomic}): value {i} is {g}, not {want}"
                );
            }
            timed.push(if dev.is_cuda() {
                let graph = dev.capture(|| {
                    persistent_chain(&dev, &mut bufs, &mut count, p, launches, atomic)
                })?;
                let stats = graph.time(k, TimingOptions::default())?;
                format!("{:.2}", stats.median_us)
            } else {
                "(interpreter: not timed)".to_string()
            });
        }
        println!(
            "| {p} | {launches} x {PHASES} | {} | {} |",
            timed[0], timed[1]
        );
    }
    Ok(())
}
