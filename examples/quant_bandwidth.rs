//! The quantized GEMVs (Q8_0, Q4_K, Q5_K, Q6_K, Q4_0, Q3_K, IQ4_XS) against the device's copy ceiling, at
//! Qwen3-0.6B's and Qwen3-8B's layer shapes.
//!
//! `cargo run --release --example quant_bandwidth [-- --sweep] [--8b] [--only TYPE:NxK]
//! [--config N,K,WARPS]`
//!
//! Prints one table: per type, shape and variant (plain, residual), the best compiled
//! launch configuration's time for the GEMV alone (over an activation quantized
//! before the timing), the bytes the kernel must read (the quantized arrays, the int8
//! activation with its block scales, bias and output), GB/s, and the share of the
//! measured device-to-device copy ceiling (the target: 70% or more on the layer
//! shapes), with the bf16 GEMV's bytes for the same shape beside them, the time of the
//! configuration the decode step uses (`QuantGemvConfig::for_shape`), and that of the
//! step's pair: the activation quantizer and the GEMV. `--sweep` adds every
//! configuration's time; `--8b` times Qwen3-8B's shapes only; `--only Q4_K:4096x12288`
//! one type and shape, `--config 8,1024,8` one launch configuration (with `--only`, one
//! kernel for a profiler). `--dequant` times the batched prefill's dequantization to
//! bf16 instead (`DeviceQuantMatrix::dequantize_into`, each compiled tile): the bytes
//! it reads and writes against the copy ceiling. `--tokens` times the short prefill's
//! multi-token GEMVs instead (`DeviceQuantMatrix::gemv_tokens`, every compiled tile, for
//! 2, 4, 8 and 32 tokens): the best tile's time, the time a token, and the weights' bytes
//! read once over that time against the copy ceiling (the chunk's floor: a launch reads
//! them once a group of `T` tokens, the later groups partly from L2), beside the time of
//! the tile the prefill picks (`TokensTile::for_shape`). Without a GPU it says so and
//! exits 0.
//!
//! Method (docs/perf.md, as `examples/bandwidth.rs`): CUDA events around CUDA-graph
//! replays of launches that cycle through copies of the weights larger than 4x L2
//! together; median of 30 after 5 warm-ups.

#[path = "common/args.rs"]
mod args;

use tilefuse::dsl::runtime::timing::{self as perf, TimingOptions};
use tilefuse::engine::bench::{PerfError, Rng};
use tilefuse::engine::gguf::device::{
    DeviceQuantMatrix, QuantGemvConfig, QuantOut, QuantRows, QuantSpare, QuantVariant, TokensTile,
};
use tilefuse::engine::gguf::quant::{GgmlType, PackedMatrix};
use tilefuse::prelude::*;

/// Qwen3-0.6B's and Qwen3-8B's decode GEMV shapes: (rows, columns, what).
const SHAPES: [(usize, usize, &str); 8] = [
    (4096, 1024, "QKV"),
    (1024, 2048, "O"),
    (6144, 1024, "gate+up"),
    (1024, 3072, "down"),
    (6144, 4096, "8B QKV"),
    (4096, 4096, "8B O"),
    (24576, 4096, "8B gate+up"),
    (4096, 12288, "8B down"),
];

fn main() {
    let sweep = std::env::args().any(|a| a == "--sweep");
    let only_8b = std::env::args().any(|a| a == "--8b");
    let dev = Device::auto();
    if !dev.is_cuda() {
        println!("quant_bandwidth: skipped: no CUDA device");
        return;
    }
    let ran = if std::env::args().any(|a| a == "--dequant") {
        dequant(&dev, only_8b)
    } else if std::env::args().any(|a| a == "--tokens") {
        tokens(&dev, only_8b)
    } else {
        run(&dev, sweep, only_8b)
    };
    if let Err(e) = ran {
        eprintln!("quant_bandwidth: error: {e}");
        std::process::exit(1);
    }
}

/// Random blocks of `ty` with sane f16 scales, in the file's layout.
fn random_blocks(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let (block, size) = ty.block().expect("a known type");
    let (block, size) = (block as usize, size as usize);
    let mut out: Vec<u8> = (0..rows * cols / block * size)
        .map(|_| rng.next_u64() as u8)
        .collect();
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    for blk in out.chunks_exact_mut(size) {
        match ty {
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::IQ4_XS => blk[0..2].copy_from_slice(&scale),
            GgmlType::Q4_K | GgmlType::Q5_K => {
                blk[0..2].copy_from_slice(&scale);
                blk[2..4].copy_from_slice(&scale);
            }
            _ => blk[size - 2..].copy_from_slice(&scale),
        }
    }
    out
}

fn run(dev: &Device, sweep: bool, only_8b: bool) -> Result<(), Box<dyn std::error::Error>> {
    let (info, opts, ceiling) = device_and_ceiling(dev)?;
    println!("| type | shape | what | variant | config (n, k, warps) | µs | bytes | GB/s | % of copy | bf16 bytes | step's config µs | quantizer + GEMV µs | programs an SM, waves |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rng = Rng::new(27);
    let mut sweeps = Vec::new();
    // `--only TYPE:NxK` and `--config N,K,WARPS`.
    let only = args::value("--only");
    let config = match args::value("--config") {
        Some(c) => {
            let v: Vec<usize> = c
                .split(',')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("--config {c:?}: {e} (expected N,K,WARPS)"))?;
            let found = QuantGemvConfig::all()
                .into_iter()
                .find(|q| v.len() == 3 && [q.block_n, q.block_k, q.num_warps as usize] == v[..]);
            Some(found.ok_or_else(|| format!("--config {c:?} is not a compiled configuration"))?)
        }
        None => None,
    };
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q3_K,
        GgmlType::IQ4_XS,
    ] {
        for &(n, k, what) in SHAPES.iter().filter(|s| !only_8b || s.2.starts_with("8B")) {
            if only.as_ref().is_some_and(|o| *o != format!("{ty}:{n}x{k}")) {
                continue;
            }
            let packed = PackedMatrix::pack(ty, &random_blocks(&mut rng, ty, n, k), n, k, what)?;
            // Copies of the weights that together exceed 4x L2, so every launch streams
            // from DRAM.
            let copies = (4 * info.l2_bytes / packed.device_bytes()).clamp(2, 256) + 1;
            let mats: Vec<DeviceQuantMatrix> = (0..copies)
                .map(|_| DeviceQuantMatrix::upload(dev, &packed))
                .collect::<Result<_, _>>()?;
            let a = dev.upload(&vec![bf16::from_f32(0.5); k])?;
            let bias = dev.upload(&vec![bf16::from_f32(0.0); n])?;
            let mut ys: Vec<Buffer<bf16>> = (0..copies)
                .map(|_| dev.upload(&vec![bf16::from_f32(1.0); n]))
                .collect::<Result<_, _>>()?;
            // int8 activations and their block scales.
            let act_bytes = k + k / 32 * 4;
            let bytes = (packed.device_bytes() + act_bytes + 2 * n + 2 * n) as u64;
            let mut spare = QuantSpare::new(dev, k)?;
            spare.quantize(dev, QuantVariant::Plain, &a, k, false, false, None)?;
            let chosen = QuantGemvConfig::for_shape(ty, n, k);
            for variant in ["plain", "residual"] {
                let residual = variant != "plain";
                let mut best: Option<(f64, QuantGemvConfig)> = None;
                let mut chosen_us = f64::NAN;
                for cfg in QuantGemvConfig::all() {
                    // Q5_K's variants cover the step's tiles only.
                    if config.is_some_and(|c| c != cfg)
                        || !mats[0].gemv_compiled(cfg, residual, false, false)
                    {
                        continue;
                    }
                    let (stats, _method) = perf::time_graph(dev, copies, opts, |i| {
                        let out = QuantOut::Rows {
                            y: &mut ys[i],
                            row0: 0,
                            bias: &bias,
                        };
                        mats[i]
                            .launch_quantized(dev, cfg, residual, out, &mut spare, false)
                            .map_err(|e| PerfError(e.to_string()))
                    })?;
                    let us = stats.median_us;
                    if cfg == chosen {
                        chosen_us = us;
                    }
                    if sweep {
                        sweeps.push(format!(
                            "{ty} {n}x{k} {variant} {cfg:?}: {us:.2} µs ({})",
                            waves(&mats[0], dev, cfg, residual, info.sm_count)?
                        ));
                    }
                    if best.is_none_or(|(b, _)| us < b) {
                        best = Some((us, cfg));
                    }
                }
                let (us, cfg) = best.expect("at least one configuration");
                let gbs = bytes as f64 / (us * 1e-6) / 1e9;
                // The step's pair at the step's configuration.
                let (pair, _method) = perf::time_graph(dev, copies, opts, |i| {
                    mats[i]
                        .gemv(
                            dev, chosen, &a, None, &bias, &mut ys[i], residual, &mut spare,
                        )
                        .map_err(|e| PerfError(e.to_string()))
                })?;
                println!(
                    "| {ty} | {n}x{k} | {what} | {} | {}, {}, {} | {us:.2} | {bytes} | {gbs:.0} | {:.0}% | {} | {chosen_us:.2} | {:.2} | {} |",
                    variant,
                    cfg.block_n,
                    cfg.block_k,
                    cfg.num_warps,
                    100.0 * gbs / ceiling.gb_per_s(),
                    2 * n * k,
                    pair.median_us,
                    waves(&mats[0], dev, cfg, residual, info.sm_count)?
                );
            }
        }
    }
    if sweep {
        println!();
        for s in sweeps {
            println!("{s}");
        }
    }
    Ok(())
}

/// The device, the timing options, and the copy ceiling measured with them (printed).
/// Programs an SM and waves of a configuration's grid, in words.
fn waves(
    m: &DeviceQuantMatrix,
    dev: &Device,
    cfg: QuantGemvConfig,
    residual: bool,
    sms: usize,
) -> Result<String, Box<dyn std::error::Error>> {
    Ok(match m.waves(dev, cfg, residual, sms)? {
        Some((per_sm, waves)) => format!("{per_sm}, {waves:.2}"),
        None => "-".into(),
    })
}

fn device_and_ceiling(
    dev: &Device,
) -> Result<(perf::DeviceInfo, TimingOptions, perf::CopyCeiling), Box<dyn std::error::Error>> {
    let info = dev.info()?;
    let opts = TimingOptions {
        warmup: 5,
        reps: 30,
    };
    let ceiling = perf::copy_ceiling(dev, 1 << 30, opts)?;
    println!(
        "{} ({} SMs, L2 {} MiB); copy ceiling {:.0} GB/s",
        info.name,
        info.sm_count,
        info.l2_bytes >> 20,
        ceiling.gb_per_s()
    );
    println!();
    Ok((info, opts, ceiling))
}

/// `--dequant`: each type's dequantization to bf16 at each shape, every compiled tile.
fn dequant(dev: &Device, only_8b: bool) -> Result<(), Box<dyn std::error::Error>> {
    let (info, opts, ceiling) = device_and_ceiling(dev)?;
    println!("| type | shape | what | tile (rows, blocks) | µs | bytes read + written | GB/s | % of copy |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut rng = Rng::new(28);
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q3_K,
        GgmlType::IQ4_XS,
    ] {
        for &(n, k, what) in SHAPES.iter().filter(|s| !only_8b || s.2.starts_with("8B")) {
            let packed = PackedMatrix::pack(ty, &random_blocks(&mut rng, ty, n, k), n, k, what)?;
            let bytes = packed.device_bytes() + 2 * n * k;
            let copies = (4 * info.l2_bytes / bytes).clamp(2, 256) + 1;
            let mats: Vec<DeviceQuantMatrix> = (0..copies)
                .map(|_| DeviceQuantMatrix::upload(dev, &packed))
                .collect::<Result<_, _>>()?;
            let mut outs: Vec<Buffer<bf16>> = (0..copies)
                .map(|_| dev.alloc_filled(n * k, bf16::NAN))
                .collect::<Result<_, _>>()?;
            for tile in [(1, 8), (1, 32), (4, 8), (4, 32)] {
                let (stats, _method) = perf::time_graph(dev, copies, opts, |i| {
                    mats[i]
                        .dequantize_tile(dev, &mut outs[i], 0, tile)
                        .map_err(|e| PerfError(e.to_string()))
                })?;
                let us = stats.median_us;
                let gbs = bytes as f64 / (us * 1e-6) / 1e9;
                println!(
                    "| {ty} | {n}x{k} | {what} | {}, {} | {us:.2} | {bytes} | {gbs:.0} | {:.0}% |",
                    tile.0,
                    tile.1,
                    100.0 * gbs / ceiling.gb_per_s()
                );
            }
        }
    }
    Ok(())
}

/// `--tokens`: the multi-token GEMVs at each shape, every compiled tile, over 2, 4, 8
/// and 32 tokens (one launch: `cdiv(tokens, T)` passes over the weights).
fn tokens(dev: &Device, only_8b: bool) -> Result<(), Box<dyn std::error::Error>> {
    let (info, opts, ceiling) = device_and_ceiling(dev)?;
    println!("| type | shape | what | tokens | tile (rows, cols, tokens a program) | µs | µs a token | weight bytes | GB/s (weights once) | % of copy | for_shape's tile µs |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rng = Rng::new(29);
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q3_K,
        GgmlType::IQ4_XS,
    ] {
        for &(n, k, what) in SHAPES.iter().filter(|s| !only_8b || s.2.starts_with("8B")) {
            let packed = PackedMatrix::pack(ty, &random_blocks(&mut rng, ty, n, k), n, k, what)?;
            let bytes = packed.device_bytes();
            let copies = (4 * info.l2_bytes / bytes).clamp(2, 256) + 1;
            let mats: Vec<DeviceQuantMatrix> = (0..copies)
                .map(|_| DeviceQuantMatrix::upload(dev, &packed))
                .collect::<Result<_, _>>()?;
            let bias = dev.upload(&vec![bf16::from_f32(0.0); n])?;
            for tokens in [2, 4, 8, 32] {
                let a: Vec<bf16> = (0..tokens * k)
                    .map(|_| bf16::from_f32(rng.unit() * 2.0))
                    .collect();
                let a = dev.upload(&a)?;
                let mut rows = QuantRows::new(dev, tokens, k)?;
                rows.quantize(dev, &a, tokens, k)?;
                let mut ys: Vec<Buffer<bf16>> = (0..copies)
                    .map(|_| dev.alloc_filled(tokens * n, bf16::from_f32(1.0)))
                    .collect::<Result<_, _>>()?;
                let chosen = TokensTile::for_shape(n, tokens);
                let mut best: Option<(f64, TokensTile)> = None;
                let mut chosen_us = f64::NAN;
                for block_n in [4, 8, 16] {
                    for block_k in [512, 1024] {
                        for t in [2, 4, 8] {
                            let tile = TokensTile {
                                block_n,
                                block_k,
                                tokens: t,
                            };
                            if t > tokens.next_power_of_two() {
                                continue;
                            }
                            let (stats, _method) = perf::time_graph(dev, copies, opts, |i| {
                                mats[i]
                                    .gemv_tokens(dev, tile, &rows, &bias, &mut ys[i], 0, n, false)
                                    .map_err(|e| PerfError(e.to_string()))
                            })?;
                            let us = stats.median_us;
                            if tile == chosen {
                                chosen_us = us;
                            }
                            if best.is_none_or(|(b, _)| us < b) {
                                best = Some((us, tile));
                            }
                        }
                    }
                }
                let (us, tile) = best.expect("at least one tile");
                let gbs = bytes as f64 / (us * 1e-6) / 1e9;
                println!(
                    "| {ty} | {n}x{k} | {what} | {tokens} | {}, {}, {} | {us:.2} | {:.2} | {bytes} | {gbs:.0} | {:.0}% | {chosen_us:.2} |",
                    tile.block_n,
                    tile.block_k,
                    tile.tokens,
                    us / tokens as f64,
                    100.0 * gbs / ceiling.gb_per_s(),
                );
            }
        }
    }
    Ok(())
}
