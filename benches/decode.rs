//! Criterion benchmark of whole decode steps: the Qwen3-0.6B preset (random weights)
//! with 1024 tokens of KV cached, one step per iteration, graph replay and eager
//! launches. The same code as `tilefuse bench`, which also prints the bandwidth floor.
//!
//! `cargo bench --bench decode`. Without a GPU it prints that it was skipped.

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use tilefuse::engine::decode::Decoder;

const CONTEXT: usize = 1024;

/// `iters` greedy steps from position `CONTEXT` (steps past the cache wrap back, so the
/// context stays within a few hundred tokens of 1024).
fn time_steps(dec: &mut Decoder, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(256);
        dec.set_input(1, CONTEXT).unwrap();
        dec.synchronize().unwrap();
        let t = Instant::now();
        for _ in 0..n {
            dec.step().unwrap();
            dec.read_state().unwrap();
        }
        total += t.elapsed();
        left -= n;
    }
    total
}

fn main() {
    let Some(dev) = tilefuse::dsl::runtime::testing::gpu_or_skip("benches/decode") else {
        println!("decode bench skipped: no CUDA device");
        return;
    };
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));
    let (cfg, weights) = tilefuse::engine::preset::load("qwen3-0.6b", 0).unwrap();
    let mut dec = Decoder::new(&cfg, &weights, &dev, CONTEXT + 300).unwrap();
    drop(weights);
    // Fill the cache once; every timed step re-decodes positions after it.
    dec.set_input(1, 0).unwrap();
    dec.capture().unwrap();
    for pos in 0..CONTEXT {
        dec.set_input((pos * 7919 % cfg.vocab_size) as u32, pos)
            .unwrap();
        dec.step().unwrap();
    }
    let bytes = dec.weight_bytes_per_step() + dec.kv_bytes_per_step(CONTEXT);
    let mut group = c.benchmark_group("decode/qwen3-0.6b_ctx1024");
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function("graph", |b| {
        b.iter_custom(|iters| time_steps(&mut dec, iters))
    });
    dec.release_graph();
    group.bench_function("eager", |b| {
        b.iter_custom(|iters| time_steps(&mut dec, iters))
    });
    group.finish();
    c.final_summary();
}
