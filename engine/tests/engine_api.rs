//! The library API: generation on every available device, graph replay against eager
//! launches, sampling, and errors for bad input.

mod common;

use std::ops::ControlFlow;

use tilefuse_dsl::runtime::testing::{gpu_or_skip, gpu_turn};
use tilefuse_dsl::runtime::Device;
use tilefuse_engine::reference::argmax;
use tilefuse_engine::{Engine, EngineError, EngineOptions, GenerateOptions, Sampling};

fn engine(dev: &Device, graph: bool, max_seq_len: usize) -> Engine {
    Engine::from_preset(
        "tiny-qwen3",
        7,
        EngineOptions {
            device: dev.clone(),
            max_seq_len: Some(max_seq_len),
            cuda_graph: graph,
            ..EngineOptions::default()
        },
    )
    .unwrap()
}

/// The interpreter, and the GPU when there is one; the guard keeps this binary's other
/// GPU tests off the device meanwhile.
fn cpu_and_gpu(test: &str) -> (std::sync::MutexGuard<'static, ()>, Vec<Device>) {
    let turn = gpu_turn();
    let mut devs = vec![Device::cpu()];
    devs.extend(gpu_or_skip(test));
    (turn, devs)
}

fn opts(max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens,
        stop_at_eos: false,
        keep_logits: true,
        ..GenerateOptions::default()
    }
}

#[test]
fn greedy_tokens_are_the_argmax_of_their_logits_and_stream_in_order() {
    let mut e = engine(&Device::cpu(), false, 64);
    let mut streamed = Vec::new();
    let out = e
        .generate(&[3, 17, 256, 9], &opts(10), |t| {
            streamed.push(t);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(out.tokens.len(), 10);
    assert_eq!(streamed, out.tokens);
    assert_eq!(out.logits.len(), 10);
    for (t, l) in out.tokens.iter().zip(&out.logits) {
        assert_eq!(l.len(), e.config().vocab_size);
        assert_eq!(*t as usize, argmax(l));
    }
    assert_eq!(out.decode_steps, 9);
    assert!(!out.used_graph);

    // A second call starts from an empty cache: the same prompt gives the same tokens.
    let again = e
        .generate(&[3, 17, 256, 9], &opts(10), |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(again.tokens, out.tokens);
}

#[test]
fn the_callback_stops_generation_and_eos_ends_it() {
    let mut e = engine(&Device::cpu(), false, 64);
    let mut n = 0;
    let out = e
        .generate(&[1, 2], &opts(20), |_| {
            n += 1;
            if n == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(out.tokens.len(), 3);

    // Make the first greedy token an end-of-sequence token: generation stops there.
    let first = out.tokens[0];
    let (cfg, w) = tilefuse_engine::preset::load("tiny-qwen3", 7).unwrap();
    let cfg = tilefuse_engine::ModelConfig {
        eos_token_ids: vec![first],
        ..cfg
    };
    let mut e = Engine::from_weights(
        &cfg,
        &w,
        EngineOptions {
            device: Device::cpu(),
            max_seq_len: Some(64),
            cuda_graph: false,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let out = e
        .generate(
            &[1, 2],
            &GenerateOptions {
                stop_at_eos: true,
                ..opts(20)
            },
            |_| ControlFlow::Continue(()),
        )
        .unwrap();
    assert_eq!(out.tokens, vec![first]);
    assert!(out.hit_eos);
}

#[test]
fn sampling_is_seeded_and_stays_in_the_top_k() {
    let (_turn, devs) = cpu_and_gpu("sampling_is_seeded_and_stays_in_the_top_k");
    for dev in &devs {
        // Graph replays on the GPU: each sample is written over the device's greedy
        // token before the next step.
        let mut e = engine(dev, dev.is_cuda(), 64);
        // The draw's launches replay as a graph too when steps do; without graphs they
        // launch one by one, and must draw the same tokens.
        let mut eager = dev.is_cuda().then(|| engine(dev, false, 64));
        // On the device: top-k with top-p, top-k alone (with this model's flat logits
        // mostly through the host fallback at temperature 1.5, mostly accepted at 0.2);
        // on the host: top-k above 64 with top-p.
        for (temperature, top_k, top_p) in [
            (1.5, 5, 0.95),
            (1.5, 5, 1.0),
            (0.2, 5, 1.0),
            (0.3, 100, 0.9),
        ] {
            let sampled = |e: &mut Engine, seed, keep_logits| {
                let o = GenerateOptions {
                    sampling: Sampling {
                        temperature,
                        top_k,
                        top_p,
                        seed,
                    },
                    keep_logits,
                    ..opts(24)
                };
                e.generate(&[5, 6, 7], &o, |_| ControlFlow::Continue(()))
                    .unwrap()
            };
            let a = sampled(&mut e, 1, true);
            let b = sampled(&mut e, 1, false);
            let c = sampled(&mut e, 2, false);
            assert_eq!(
                a.tokens, b.tokens,
                "{dev} top_p={top_p}: same seed, same tokens"
            );
            if let Some(eager) = eager.as_mut() {
                let d = sampled(eager, 1, false);
                assert_eq!(
                    (&d.tokens, d.host_draws),
                    (&b.tokens, b.host_draws),
                    "{dev} top_k={top_k} top_p={top_p}: graph and eager draws differ"
                );
            }
            assert_ne!(
                a.tokens, c.tokens,
                "{dev} top_p={top_p}: another seed, other tokens"
            );
            assert!(b.logits.is_empty());
            let on_device = a.tokens.len() - a.host_draws;
            if top_k > 64 {
                assert_eq!(
                    on_device, 0,
                    "{dev}: top-k {top_k} with top-p draws on the host"
                );
            }
            if temperature < 1.0 && top_k <= 64 {
                assert!(
                    on_device > 0,
                    "{dev} top_k={top_k}: no draw accepted on the device"
                );
            }
            for (t, l) in a.tokens.iter().zip(&a.logits) {
                let mut order: Vec<usize> = (0..l.len()).collect();
                order.sort_by(|&x, &y| l[y].total_cmp(&l[x]));
                assert!(
                    order[..top_k].contains(&(*t as usize)),
                    "{dev} top_p={top_p}: token {t} outside the top {top_k}"
                );
            }
        }
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let mut e = engine(&Device::cpu(), false, 16);
    let go = |e: &mut Engine, prompt: &[u32], o: &GenerateOptions| {
        e.generate(prompt, o, |_| ControlFlow::Continue(()))
            .unwrap_err()
    };
    assert!(matches!(
        go(&mut e, &[], &opts(4)),
        EngineError::EmptyPrompt
    ));
    let err = go(&mut e, &[1, 1000], &opts(4));
    assert!(
        matches!(
            err,
            EngineError::TokenOutOfRange {
                token: 1000,
                vocab: 1000
            }
        ),
        "{err}"
    );
    let err = go(&mut e, &[1; 10], &opts(8));
    assert!(err.to_string().contains("max_seq_len = 16"), "{err}");
    let bad = GenerateOptions {
        sampling: Sampling {
            temperature: f32::NAN,
            ..Sampling::greedy()
        },
        ..opts(4)
    };
    assert!(go(&mut e, &[1], &bad).to_string().contains("temperature"));
    // After errors the engine still works.
    let ok = e
        .generate(&[1, 2], &opts(3), |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(ok.tokens.len(), 3);

    let err = Engine::from_preset("no-such-model", 0, EngineOptions::default()).unwrap_err();
    assert!(err.to_string().contains("no-such-model"), "{err}");
    let err = Engine::load("/nonexistent/model", EngineOptions::default()).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/model"), "{err}");
}

#[test]
fn graph_replay_and_eager_launches_give_bit_identical_logits_over_80_tokens() {
    let Some(gpu) = gpu_or_skip("graph_replay_and_eager_launches_give_bit_identical_logits") else {
        return;
    };
    let _turn = gpu_turn();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 37 + 11) % 1000).collect();
    let mut runs = Vec::new();
    for graph in [true, false] {
        let mut e = engine(&gpu, graph, 128);
        let out = e
            .generate(&prompt, &opts(80), |_| ControlFlow::Continue(()))
            .unwrap();
        assert_eq!(out.used_graph, graph);
        assert_eq!(out.tokens.len(), 80);
        runs.push(out);
    }
    assert_eq!(runs[0].tokens, runs[1].tokens);
    for (step, (g, e)) in runs[0].logits.iter().zip(&runs[1].logits).enumerate() {
        let same = g.iter().zip(e).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "step {step}: graph and eager logits differ");
    }

    // The interpreter agrees with the GPU (to f32 summation order).
    let mut cpu = engine(&Device::cpu(), false, 128);
    let c = cpu
        .generate(&prompt, &opts(16), |_| ControlFlow::Continue(()))
        .unwrap();
    for (step, (g, c)) in runs[0].logits.iter().zip(&c.logits).enumerate() {
        let num: f32 = g.iter().zip(c).map(|(a, b)| (a - b) * (a - b)).sum();
        let den: f32 = c.iter().map(|b| b * b).sum();
        let rel = (num / den).sqrt();
        assert!(rel < 1e-2, "step {step}: GPU vs interpreter {rel:.3e}");
    }
}

#[test]
fn steps_past_the_cache_stay_in_bounds() {
    // Stepping past max_seq_len through the low-level API must not touch memory
    // outside the cache (the interpreter would report it as an error).
    let (cfg, w) = tilefuse_engine::preset::load("tiny-qwen3", 3).unwrap();
    let (_turn, devs) = cpu_and_gpu("steps_past_the_cache_stay_in_bounds");
    for dev in devs {
        let mut dec = tilefuse_engine::Decoder::new(&cfg, &w, &dev, 4).unwrap();
        dec.set_input(1, 0).unwrap();
        for _ in 0..7 {
            dec.step().unwrap();
        }
        let (_, pos) = dec.read_state().unwrap();
        assert_eq!(pos, 7, "on {dev}");
        assert!(
            dec.set_input(1, 4).is_err(),
            "set_input checks the position"
        );
    }
}

/// `time_replays` needs a GPU, a captured step and room in the cache for its steps,
/// and decodes them as generation does (the position advances once a replay);
/// `profile` times every block alone and inside the step.
#[test]
fn replay_timing_and_the_profile_check_their_input_and_decode_real_steps() {
    let (cfg, w) = tilefuse_engine::preset::load("tiny-qwen3", 5).unwrap();
    let (_turn, devs) = cpu_and_gpu("replay_timing_and_the_profile");
    for dev in devs {
        let mut dec = tilefuse_engine::Decoder::new(&cfg, &w, &dev, 32).unwrap();
        assert!(
            dec.time_replays(3, 0, 4).is_err(),
            "no captured step on {dev}"
        );
        if !dev.is_cuda() {
            assert!(dec.profile(2).is_err(), "profiling needs a GPU");
            continue;
        }
        dec.set_input(3, 0).unwrap();
        dec.capture().unwrap();
        assert!(dec.time_replays(3, 30, 4).is_err(), "30 + 4 > 32 positions");
        let ms = dec.time_replays(3, 10, 8).unwrap();
        assert!(ms.is_finite() && ms > 0.0, "{ms} ms a step");
        assert_eq!(
            dec.read_state().unwrap().1,
            18,
            "8 replays from position 10"
        );

        let blocks = dec.profile(2).unwrap();
        assert_eq!(blocks.len(), 9, "every block of a Qwen3 step");
        for b in &blocks {
            assert!(b.launches > 0 && b.us > 0.0, "{b:?}");
            assert!(b.in_step_us.is_finite(), "{b:?}");
        }
        let layers = blocks
            .iter()
            .find(|b| b.block == tilefuse_engine::decode::Block::Qkv)
            .unwrap();
        assert_eq!(layers.launches, cfg.num_layers);
    }
}

/// `timeline` stamps every program of one layer's launches, in launch order: no
/// program gets past its wait before every program of the launch before it has
/// exited (on the GPU too, where launches overlap), and the step it stamps computes
/// what an unstamped step does, with `state` restored afterwards.
#[test]
fn a_layer_timeline_stamps_every_program_after_the_launch_before_it() {
    use tilefuse_engine::decode::Block;
    let (cfg, w) = tilefuse_engine::preset::load("tiny-qwen3", 5).unwrap();
    let (_turn, devs) = cpu_and_gpu("a_layer_timeline");
    for dev in devs {
        let mut dec = tilefuse_engine::Decoder::new(&cfg, &w, &dev, 32).unwrap();
        dec.set_input(3, 5).unwrap();
        dec.step_eager().unwrap();
        let want = dec.read_logits().unwrap();
        let err = dec.timeline(cfg.num_layers, 1).unwrap_err().to_string();
        assert!(err.contains(&format!("layer {}", cfg.num_layers)), "{err}");

        dec.set_input(3, 5).unwrap();
        let runs = dec.timeline(1, 3).unwrap();
        assert_eq!(runs.len(), 3, "{dev}");
        for run in &runs {
            assert_eq!(run.layer, 1);
            let blocks: Vec<Block> = run.launches.iter().map(|l| l.block).collect();
            assert_eq!(
                blocks,
                [
                    Block::Qkv,
                    Block::Attention,
                    Block::Combine,
                    Block::OProj,
                    Block::GateUp,
                    Block::Down
                ],
                "{dev}"
            );
            common::check_timeline_order(run, &dev.to_string());
            if !dev.is_cuda() {
                for p in run.launches.iter().flat_map(|l| &l.programs) {
                    assert_eq!(p.sm, 0, "the interpreter has one processor");
                }
            }
        }
        assert_eq!(dec.read_state().unwrap(), (3, 5), "{dev}: state restored");
        dec.step_eager().unwrap();
        assert_eq!(dec.read_logits().unwrap(), want, "{dev}: the same step");
    }
}

/// Other compiled variants, split counts and chunk sizes compute the same step (up to
/// summation order), and plans that do not fit the decoder are refused with a message.
#[test]
fn every_launch_plan_computes_the_same_step() {
    use tilefuse_engine::decode::KernelChoice;
    use tilefuse_engine::kernels::{AttentionCombineConsts, AttentionSplitConsts};
    use tilefuse_engine::tuning::GemvConfig;
    let (cfg, w) = tilefuse_engine::preset::load("tiny-qwen3", 5).unwrap();
    let (_turn, devs) = cpu_and_gpu("every_launch_plan_computes_the_same_step");
    let tokens = [3u32, 141, 59, 26, 535, 89, 79, 323];
    let run = |dec: &mut tilefuse_engine::Decoder| -> Vec<Vec<f32>> {
        tokens
            .iter()
            .enumerate()
            .map(|(pos, &t)| dec.forward(t, pos).unwrap())
            .collect()
    };
    for dev in devs {
        let mut dec = tilefuse_engine::Decoder::new(&cfg, &w, &dev, 64).unwrap();
        let base = dec.plan().clone();
        let want = run(&mut dec);
        let same_step = |got: &[Vec<f32>], plan: &str| {
            for (step, (g, e)) in got.iter().zip(&want).enumerate() {
                let rel = common::rel_err(g, e);
                assert!(rel < 1e-2, "{dev} step {step}: {plan} differs by {rel:.3e}");
            }
        };
        let d = cfg.head_dim;
        let gemv = |block_n, block_k, stages, reduce_each, num_warps| GemvConfig {
            stages,
            reduce_each,
            ..GemvConfig::tile(block_n, block_k, num_warps)
        };
        // Split + combine with one split.
        let mut other = base.clone().with_attention_cluster(1, 1, 32);
        other.qkv = gemv(4, 1024, 1, 1, 4);
        other.o_proj = gemv(2, 1024, 2, 0, 8);
        other.gate_up = gemv(8, 256, 2, 0, 4);
        other.down = gemv(4, 4096, 1, 1, 8);
        other.attention = KernelChoice {
            consts: AttentionSplitConsts {
                d,
                g: 4,
                bs: 32,
                stages: 2,
                cluster: 1,
            },
            num_warps: 4,
        };
        other.combine = KernelChoice {
            consts: AttentionCombineConsts { d, s: 8, dc: 32 },
            num_warps: 4,
        };
        other.min_chunk = 16;
        let other = other.with_lm_head(gemv(16, 256, 2, 0, 4), cfg.vocab_size);
        assert_ne!(other, base);
        dec.set_plan(other).unwrap();
        same_step(&run(&mut dec), "other plan");

        // Clustered attention: two programs a cluster over 32-position tiles, and on
        // sm_90 GPUs the decode step's 8 and 16 over 64-position tiles where compiled.
        let sm90 = dev.as_cuda().is_some_and(|c| c.compute_capability().0 >= 9);
        let mut clusters = vec![(2, 32)];
        if sm90 {
            clusters.extend([(8, 64), (16, 64)]);
        }
        for (cluster, bs) in clusters {
            let mut plan = base.clone().with_attention_cluster(cluster, 0, bs);
            plan.attention.consts.stages = 2;
            if plan.check().is_err() && dev.is_cuda() {
                continue; // no variant for this head size
            }
            assert!(plan.clustered());
            dec.set_plan(plan).unwrap();
            assert_eq!(dec.kernels_per_step(), 3 + 5 * cfg.num_layers);
            same_step(&run(&mut dec), &format!("cluster of {cluster}"));
        }
        if !sm90 {
            // Without clusters (the interpreter emulates them) the plan is refused at
            // launch, with the reason.
            if let Some(c) = dev.as_cuda() {
                let plan = base.clone().with_attention_cluster(2, 0, 32);
                dec.set_plan(plan).unwrap();
                let err = dec.forward(tokens[0], 0).unwrap_err().to_string();
                assert!(
                    err.contains("sm_90") || err.contains("cluster"),
                    "{err} ({c:?})"
                );
            }
        }

        // More splits than the combine step is compiled for, or (on the interpreter,
        // which allocates partials for its plan's two) than the partials hold; a
        // cluster that is not one program per split.
        let unclustered = base.clone().with_attention_cluster(1, 1, 32);
        let mut too_many = vec![unclustered.clone().with_splits(1000)];
        if !dev.is_cuda() {
            too_many.push(unclustered.clone().with_splits(4));
        }
        too_many.push(base.clone().with_attention_cluster(2, 0, 32).with_splits(4));
        for plan in too_many {
            let err = dec.set_plan(plan).unwrap_err().to_string();
            assert!(err.contains("splits"), "{err}");
        }
        let mut uncompiled = base.clone();
        uncompiled.qkv = GemvConfig::tile(3, 256, 4);
        let err = dec.set_plan(uncompiled).unwrap_err().to_string();
        assert!(err.contains("rms_norm_gemv"), "{err}");
        // A refused plan leaves the decoder as it was.
        assert_eq!(dec.forward(tokens[0], 0).unwrap().len(), cfg.vocab_size);
    }
}

/// Greedy decoding without logits queues each step before reading the previous token;
/// it must give the tokens the step-by-step loop gives, also after a stop left a
/// queued step behind.
#[test]
fn pipelined_greedy_decoding_matches_step_by_step() {
    let (_turn, devs) = cpu_and_gpu("pipelined_greedy_decoding_matches_step_by_step");
    let prompt: Vec<u32> = (0..9).map(|i| (i * 53 + 7) % 1000).collect();
    for dev in devs {
        for graph in [false, dev.is_cuda()] {
            let mut e = engine(&dev, graph, 64);
            let stepwise = e
                .generate(&prompt, &opts(24), |_| ControlFlow::Continue(()))
                .unwrap();
            let lean = GenerateOptions {
                keep_logits: false,
                ..opts(24)
            };
            // Stop after 5 tokens (a step is already queued), then run again in full.
            let mut seen = 0;
            let stopped = e
                .generate(&prompt, &lean, |_| {
                    seen += 1;
                    if seen == 5 {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                })
                .unwrap();
            assert_eq!(stopped.tokens, stepwise.tokens[..5], "{dev} graph {graph}");
            assert_eq!(stopped.decode_steps, 4);
            let full = e
                .generate(&prompt, &lean, |_| ControlFlow::Continue(()))
                .unwrap();
            assert_eq!(full.tokens, stepwise.tokens, "{dev} graph {graph}");
            assert_eq!(full.decode_steps, 23);
            assert!(full.logits.is_empty());
        }
    }
}

#[test]
fn batched_prefill_is_the_default_and_matches_the_token_by_token_prompt() {
    let (_turn, devs) =
        cpu_and_gpu("batched_prefill_is_the_default_and_matches_the_token_by_token_prompt");
    assert!(GenerateOptions::default().batched_prefill);
    let prompt: Vec<u32> = (0..37).map(|i| (i * 41 + 5) % 500).collect();
    for dev in devs {
        for graph in [false, dev.is_cuda()] {
            let mut e = engine(&dev, graph, 64);
            let batched = e
                .generate(&prompt, &opts(6), |_| ControlFlow::Continue(()))
                .unwrap();
            let stepped = e
                .generate(
                    &prompt,
                    &GenerateOptions {
                        batched_prefill: false,
                        ..opts(6)
                    },
                    |_| ControlFlow::Continue(()),
                )
                .unwrap();
            let what = format!("{dev}, graph {graph}");
            assert!(
                batched.batched_prefill && !stepped.batched_prefill,
                "{what}"
            );
            assert_eq!(batched.tokens.len(), 6, "{what}");
            assert!(
                batched.first_token_time >= batched.prompt_time
                    && batched.prompt_tokens_per_s() > 0.0,
                "{what}: {batched:?}"
            );
            // The two prompt paths round differently (see tests/prefill.rs): the
            // first logits agree to the fixtures' tolerance, and while the tokens
            // agree so do the later steps'.
            for (step, (b, s)) in batched.logits.iter().zip(&stepped.logits).enumerate() {
                if step > 0 && batched.tokens[step - 1] != stepped.tokens[step - 1] {
                    break;
                }
                let rel = common::rel_err(b, s);
                assert!(
                    rel < 3e-2,
                    "{what} step {step}: batched vs stepped {rel:.3e}"
                );
            }
        }
    }
}
