//! What the Triton tutorial examples share: timing one launch on the GPU and printing
//! its bandwidth, the way docs/perf.md ("Triton's tutorials") compares them with
//! `benches/peers/tutorials.py`.

#![allow(dead_code)]

use tilefuse::dsl::runtime::timing::{self as perf, Stats, TimingOptions};
use tilefuse::engine::bench::PerfError;
use tilefuse::prelude::*;

/// Times `launch` (one kernel launch) with CUDA events: 10 warm-ups, then the median of
/// 50 samples of 20 back-to-back launches each. `None` on the CPU interpreter.
pub fn time(
    dev: &Device,
    mut launch: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Option<Stats>> {
    if !dev.is_cuda() {
        return Ok(None);
    }
    let opts = TimingOptions {
        warmup: 10,
        reps: 50,
    };
    let mut err = None;
    let stats = perf::time_events(dev, 20, opts, |_| {
        if let Err(e) = launch() {
            err = Some(e);
        }
        Ok::<(), PerfError>(())
    })?;
    if let Some(e) = err {
        return Err(e);
    }
    Ok(Some(stats))
}

/// Prints one line: the tutorial, the size, the error against the host, and on a GPU
/// the median time and GB/s for `bytes` moved per launch.
pub fn report(what: &str, size: &str, err: f64, stats: Option<Stats>, bytes: u64) {
    match stats {
        Some(s) => println!(
            "{what:<12} {size:<14} max err {err:.1e}  {:>9.2} us  {:>7.1} GB/s",
            s.median_us,
            s.gb_per_s(bytes)
        ),
        None => println!("{what:<12} {size:<14} max err {err:.1e}  (no GPU: not timed)"),
    }
}
