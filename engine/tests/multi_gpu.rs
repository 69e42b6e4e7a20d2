//! Past one GPU: sharded checkpoints with progress, random weights written on the
//! device, the memory check, tensor-parallel options, and NCCL collectives (the last
//! on a machine with two GPUs; they skip with a message otherwise).

mod common;

use std::path::PathBuf;

use half::bf16;
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use tilefuse_dsl::runtime::testing::{gpu_or_skip, gpu_turn};
use tilefuse_dsl::runtime::Device;
use tilefuse_engine::comm::{capture_all, launch_all, Communicator};
use tilefuse_engine::device_init::{random_buffer, random_fill_block};
use tilefuse_engine::engine::check_placement;
use tilefuse_engine::memory::device_memory;
use tilefuse_engine::preset::{self, random_tensor, random_tensors, RandomTensor};
use tilefuse_engine::{Checkpoint, Engine, EngineOptions, Reference};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tilefuse-mgpu-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A fixture checkpoint split into two shards plus an index loads tensor for tensor
/// like the single file, reports its progress up to the total, and decodes alike.
#[test]
fn sharded_fixture_loads_with_progress() {
    let src = common::fixtures_dir().join("qwen3_tied_gqa");
    let dir = scratch("sharded-fixture");
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut names = st.names();
    names.sort();
    let (a, b) = names.split_at(names.len() / 2);
    let files = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    let mut map = serde_json::Map::new();
    for (part, file) in [(a, files[0]), (b, files[1])] {
        let views: Vec<(String, TensorView<'_>)> = part
            .iter()
            .map(|n| ((*n).to_string(), st.tensor(n).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(file)).unwrap();
        for n in part {
            map.insert((*n).to_string(), serde_json::json!(file));
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();

    let sharded = Checkpoint::open(&dir).unwrap();
    let single = Checkpoint::open(&src).unwrap();
    assert_eq!(sharded.config, single.config);
    assert_eq!(sharded.weights.names(), single.weights.names());
    assert_eq!(
        sharded.weights.file_of(b[0]).unwrap().file_name().unwrap(),
        files[1]
    );
    let mut reports = Vec::new();
    sharded
        .weights
        .prefetch(|done, total| reports.push((done, total)));
    let total = sharded.weights.total_bytes();
    assert_eq!(reports.first(), Some(&(0, total)));
    assert_eq!(reports.last(), Some(&(total, total)));
    assert!(reports.windows(2).all(|w| w[0].0 <= w[1].0));
    let on_disk: u64 = files
        .iter()
        .map(|f| std::fs::metadata(dir.join(f)).unwrap().len())
        .sum();
    assert_eq!(total, on_disk);

    let run = |c: &Checkpoint| {
        let mut r = Reference::new(c.config.clone(), c.model_weights().unwrap()).unwrap();
        [3u32, 1, 4, 1, 5]
            .iter()
            .enumerate()
            .map(|(p, &t)| r.forward(t, p).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(&sharded), run(&single));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--tp` is checked against the model before anything is allocated; a split model
/// (interpreter ranks here) generates the one-device model's greedy tokens.
#[test]
fn tensor_parallel_options_are_validated_and_split_models_generate() {
    let opts = |tp| EngineOptions {
        device: Device::cpu(),
        max_seq_len: Some(32),
        tp,
        ..EngineOptions::default()
    };
    let e = Engine::from_preset("tiny-llama3", 0, opts(2))
        .unwrap_err()
        .to_string();
    assert!(e.contains("num_key_value_heads = 1"), "{e}");
    let e = Engine::from_preset("tiny-qwen3", 0, opts(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("at least 1"), "{e}");
    let generate = |tp| {
        let mut engine = Engine::from_preset("tiny-qwen3", 4, opts(tp)).unwrap();
        assert_eq!(engine.decoder().is_some(), tp == 1);
        engine
            .generate(
                &[1, 2, 3],
                &tilefuse_engine::GenerateOptions {
                    max_new_tokens: 12,
                    stop_at_eos: false,
                    ..Default::default()
                },
                |_| std::ops::ControlFlow::Continue(()),
            )
            .unwrap()
            .tokens
    };
    let one = generate(1);
    assert_eq!(one.len(), 12);
    assert_eq!(generate(2), one);
}

/// On two GPUs (NCCL): the split decoder's greedy tokens over 64 steps equal one
/// GPU's, its logits within bf16 tolerance, and its captured graphs (one a GPU,
/// collectives inside) decode what its eager launches decode.
#[test]
fn split_decoder_on_two_gpus_matches_one_gpu_and_captures() {
    let Some(devs) = two_gpus("split_decoder_on_two_gpus_matches_one_gpu_and_captures") else {
        return;
    };
    let _turn = gpu_turn();
    let cfg = preset::config("qwen3-0.6b").unwrap();
    let w = preset::random_weights(&cfg, 7);
    let max_seq = 128;
    let mut one = tilefuse_engine::Decoder::new(&cfg, &w, &devs[0], max_seq).unwrap();
    let mut split = tilefuse_engine::decode::tp::TpDecoder::new(&cfg, &w, &devs, max_seq).unwrap();
    // Both decode the one-GPU model's greedy tokens (teacher-forced, so one near-tie
    // does not change every later input).
    let prompt = [1u32, 17, 42, 7];
    let mut token = prompt[0];
    let (mut tokens, mut one_tokens) = (Vec::new(), Vec::new());
    let (mut worst, mut near_ties) = (0.0f32, 0);
    for pos in 0..prompt.len() + 64 {
        if pos < prompt.len() {
            token = prompt[pos];
        }
        let want = one.forward(token, pos).unwrap();
        let got = split.forward(token, pos).unwrap();
        let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = want
            .iter()
            .zip(&got)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        worst = worst.max(d / scale);
        assert!(
            d <= 2e-2 * scale,
            "position {pos}: logits differ by {d} (largest {scale})"
        );
        let (next, next_pos) = split.read_state().unwrap();
        assert_eq!(next_pos, pos + 1);
        let want_next = one.read_state().unwrap().0;
        if next != want_next {
            // Only where the top two logits are closer than the two runs differ.
            let gap = want[want_next as usize] - want[next as usize];
            assert!(
                gap <= 2.0 * d,
                "position {pos}: token {next} for {want_next}, gap {gap}, difference {d}"
            );
            near_ties += 1;
        }
        token = want_next;
        tokens.push(next);
        one_tokens.push(want_next);
    }
    println!("qwen3-0.6b, tp 2 on two GPUs: {} of 68 greedy tokens equal (the rest near-ties); largest logit difference {worst:.2e} of the largest", 68 - near_ties);
    assert!(near_ties <= 2, "{near_ties} near-ties");
    // The same positions again from captured graphs: what the eager steps decoded.
    let eager: Vec<u32> = tokens.clone();
    split.set_input(prompt[0], 0).unwrap();
    match split.capture() {
        Ok(()) => {
            let mut token = prompt[0];
            for pos in 0..prompt.len() + 64 {
                if pos < prompt.len() {
                    token = prompt[pos];
                }
                split.set_input(token, pos).unwrap();
                split.step().unwrap();
                let got = split.read_state().unwrap().0;
                assert_eq!(got, eager[pos], "graph replay, position {pos}");
                token = one_tokens[pos];
            }
            println!("captured: one graph a GPU, NCCL collectives inside, replays decode the same tokens");
        }
        Err(e) => panic!("capturing the split step failed: {e}"),
    }
}

/// On two GPUs with peer access: the peer all-reduce (the default there) decodes
/// what NCCL decodes, both the one-GPU model's greedy tokens, and its captured graphs
/// (flags counted in device memory) replay hundreds of steps with the same tokens.
#[test]
fn peer_all_reduce_matches_nccl_and_one_gpu_and_replays() {
    use tilefuse_engine::decode::tp::{AllReduce, TpDecoder};
    let test = "peer_all_reduce_matches_nccl_and_one_gpu_and_replays";
    let Some(devs) = two_gpus(test) else {
        return;
    };
    let _turn = gpu_turn();
    let cfg = preset::config("qwen3-0.6b").unwrap();
    let w = preset::random_weights(&cfg, 11);
    let max_seq = 128;
    let mut split = TpDecoder::new(&cfg, &w, &devs, max_seq).unwrap();
    if !split.peer_available() {
        assert!(
            !std::env::var("TILEFUSE_REQUIRE_GPUS").is_ok_and(|v| v.parse().unwrap_or(0) >= 2),
            "{test}: TILEFUSE_REQUIRE_GPUS=2 but the GPUs cannot reach each other's memory"
        );
        println!("{test}: skipped: no peer access between the GPUs");
        return;
    }
    if std::env::var("TILEFUSE_ALLREDUCE").is_err() {
        assert_eq!(
            split.all_reduce(),
            AllReduce::Peer,
            "the default with peer access"
        );
    }
    // The one-GPU model's greedy tokens, fed to both split runs (teacher forcing).
    let prompt = [1u32, 17, 42, 7];
    let steps = prompt.len() + 64;
    let mut one = tilefuse_engine::Decoder::new(&cfg, &w, &devs[0], max_seq).unwrap();
    let mut inputs = Vec::new();
    let mut one_logits = Vec::new();
    let mut token = prompt[0];
    for pos in 0..steps {
        if pos < prompt.len() {
            token = prompt[pos];
        }
        inputs.push(token);
        one_logits.push(one.forward(token, pos).unwrap());
        token = one.read_state().unwrap().0;
    }
    drop(one);
    let trace = |split: &mut TpDecoder| -> Vec<(Vec<f32>, u32)> {
        (0..steps)
            .map(|pos| {
                let logits = split.forward(inputs[pos], pos).unwrap();
                (logits, split.read_state().unwrap().0)
            })
            .collect()
    };
    split.set_all_reduce(AllReduce::Nccl).unwrap();
    let nccl = trace(&mut split);
    split.set_all_reduce(AllReduce::Peer).unwrap();
    let peer = trace(&mut split);
    let (mut worst_nccl, mut worst_one, mut near_ties) = (0.0f32, 0.0f32, 0);
    let diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
    };
    for pos in 0..steps {
        let want = &one_logits[pos];
        let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // Both sum two partials with one f32 addition: the same values.
        let dn = diff(&peer[pos].0, &nccl[pos].0);
        worst_nccl = worst_nccl.max(dn / scale);
        assert_eq!(
            peer[pos].1, nccl[pos].1,
            "position {pos}: peer and NCCL tokens"
        );
        assert!(
            dn <= 1e-3 * scale,
            "position {pos}: peer and NCCL logits differ by {dn}"
        );
        let d = diff(&peer[pos].0, want);
        worst_one = worst_one.max(d / scale);
        assert!(
            d <= 2e-2 * scale,
            "position {pos}: logits differ from one GPU's by {d}"
        );
        let want_next = inputs.get(pos + 1).copied().unwrap_or(peer[pos].1);
        if pos + 1 >= prompt.len() && pos + 1 < steps && peer[pos].1 != want_next {
            let gap = want[want_next as usize] - want[peer[pos].1 as usize];
            assert!(
                gap <= 2.0 * d,
                "position {pos}: token {} for {want_next}",
                peer[pos].1
            );
            near_ties += 1;
        }
    }
    assert!(near_ties <= 2, "{near_ties} near-ties");
    println!(
        "qwen3-0.6b, tp 2, peer all-reduce: tokens equal NCCL's at all {steps} steps (logits within {worst_nccl:.1e} of the largest), one GPU's at {} (largest difference {worst_one:.2e})",
        steps - near_ties
    );
    // Graph replays: the same tokens, then 400 more steps at one position, each
    // exchange counting on from the last.
    split.set_input(prompt[0], 0).unwrap();
    split.capture().unwrap();
    for pos in 0..steps {
        split.set_input(inputs[pos], pos).unwrap();
        split.step().unwrap();
        assert_eq!(
            split.read_state().unwrap().0,
            peer[pos].1,
            "graph, position {pos}"
        );
    }
    let t = std::time::Instant::now();
    for _ in 0..400 {
        split.set_input(inputs[10], 10).unwrap();
        split.step().unwrap();
    }
    assert_eq!(split.read_state().unwrap(), (peer[10].1, 11));
    println!(
        "peer graphs: 400 replays, {:.3} ms each with the host's input copies",
        t.elapsed().as_secs_f64() * 1e3 / 400.0
    );
    // And back to NCCL on the same decoder.
    split.set_all_reduce(AllReduce::Nccl).unwrap();
    split.capture().unwrap();
    split.set_input(inputs[10], 10).unwrap();
    split.step().unwrap();
    assert_eq!(split.read_state().unwrap(), (peer[10].1, 11));
}

/// The fill kernel on the GPU writes the host preset's values to the bit: several
/// tensors packed in one buffer, a large one, and a whole tiny preset.
#[test]
fn device_fill_matches_host() {
    let Some(dev) = gpu_or_skip("device_fill_matches_host") else {
        return;
    };
    let _turn = gpu_turn();
    let spec = |name: &str, len, mean| RandomTensor {
        name: name.into(),
        len,
        mean,
        std: 0.02,
    };
    let big = spec("model.embed_tokens.weight", (1 << 22) + 3, 0.0);
    let norm = spec("model.norm.weight", 4096, 1.0);
    let got = random_buffer(&dev, &[&norm, &big], 17)
        .unwrap()
        .to_vec()
        .unwrap();
    let mut want = random_tensor(17, &norm.name, norm.len, norm.mean, norm.std);
    want.extend(random_tensor(17, &big.name, big.len, big.mean, big.std));
    assert_eq!(got.len(), want.len());
    let first_bad = got.iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(first_bad, None, "first differing element");

    let cfg = preset::config("tiny-qwen2").unwrap();
    let host = preset::random_weights(&cfg, 4);
    for (s, (name, _, values)) in random_tensors(&cfg).iter().zip(host.named_tensors(&cfg)) {
        let buf = random_buffer(&dev, &[s], 4).unwrap();
        assert_eq!(&buf.to_vec().unwrap()[..], values, "{name}");
    }

    // A column block (a down projection's tensor-parallel shard) and a row block.
    let down = spec("model.layers.3.mlp.down_proj.weight", 512 * 1536, 0.0);
    let whole = random_tensor(4, &down.name, down.len, 0.0, 0.02);
    let mut buf = dev.zeros::<bf16>(512 * 768).unwrap();
    random_fill_block(&dev, &mut buf, 0, &down, 4, 1536, 0..512, 768..1536).unwrap();
    let want: Vec<bf16> = whole
        .chunks_exact(1536)
        .flat_map(|row| row[768..].to_vec())
        .collect();
    assert_eq!(buf.to_vec().unwrap(), want);
    random_fill_block(&dev, &mut buf, 0, &down, 4, 1536, 256..512, 0..1536).unwrap();
    assert_eq!(buf.to_vec().unwrap(), whole[256 * 1536..]);

    // Speed: Qwen3-8B's untied LM head (1.2 GB of bf16).
    let head = spec("lm_head.weight", 151936 * 4096, 0.0);
    let t = std::time::Instant::now();
    let buf = random_buffer(&dev, &[&head], 0).unwrap();
    dev.synchronize().unwrap();
    let secs = t.elapsed().as_secs_f64();
    let sample: Vec<bf16> = buf.to_vec().unwrap()[..8].to_vec();
    assert_eq!(sample, random_tensor(0, &head.name, 8, 0.0, 0.02));
    println!(
        "device fill: {:.1} GB of bf16 in {:.1} ms (with allocation and zeroing), {:.0} GB/s",
        head.len as f64 * 2e-9,
        secs * 1e3,
        head.len as f64 * 2e-9 / secs
    );
}

/// The memory check sees the GPU's free memory, and a model larger than it fails at
/// once, before any weights are generated, naming the model and both sizes.
#[test]
fn too_big_a_model_fails_before_allocating() {
    let Some(dev) = gpu_or_skip("too_big_a_model_fails_before_allocating") else {
        return;
    };
    let _turn = gpu_turn();
    let (free, total) = device_memory(&dev).unwrap().unwrap();
    assert!(
        free <= total && total > 1 << 30,
        "free {free}, total {total}"
    );
    let opts = EngineOptions {
        device: dev.clone(),
        max_seq_len: Some(4096),
        ..EngineOptions::default()
    };
    let cfg = preset::config("llama-3.1-70b").unwrap();
    match check_placement("llama-3.1-70b", &cfg, &opts) {
        Err(e) => {
            let m = e.to_string();
            println!("{m}");
            assert!(
                m.contains("llama-3.1-70b needs") && m.contains("GiB are free"),
                "{m}"
            );
            let t = std::time::Instant::now();
            let e = Engine::from_preset("llama-3.1-70b", 0, opts).unwrap_err();
            assert_eq!(e.to_string(), m);
            assert!(t.elapsed().as_secs_f64() < 1.0, "{:?}", t.elapsed());
        }
        Ok(()) => println!(
            "too_big_a_model_fails_before_allocating: llama-3.1-70b fits this GPU ({:.1} GiB free); nothing to check",
            free as f64 / (1u64 << 30) as f64
        ),
    }
    // Qwen3-8B fits an 80 GB GPU.
    check_placement(
        "qwen3-8b",
        &preset::config("qwen3-8b").unwrap(),
        &EngineOptions {
            device: dev.clone(),
            max_seq_len: Some(4096),
            ..EngineOptions::default()
        },
    )
    .unwrap();
}

/// Two GPUs or more, or a skip with a message (`TILEFUSE_REQUIRE_GPUS=2` makes fewer
/// a failure).
fn two_gpus(test: &str) -> Option<Vec<Device>> {
    let first = gpu_or_skip(test)?;
    match Device::cuda(1) {
        Ok(second) => Some(vec![first, second]),
        Err(e) => {
            if std::env::var("TILEFUSE_REQUIRE_GPUS").is_ok_and(|v| v.parse().unwrap_or(0) >= 2) {
                panic!("{test}: TILEFUSE_REQUIRE_GPUS asks for 2 GPUs: {e}");
            }
            println!("{test}: skipped: needs 2 GPUs ({e})");
            None
        }
    }
}

/// Seeded values for rank `r`.
fn rank_values(r: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 + r * 104_729) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

#[test]
fn all_reduce_and_all_gather_across_two_gpus() {
    let Some(devs) = two_gpus("all_reduce_and_all_gather_across_two_gpus") else {
        return;
    };
    let _turn = gpu_turn();
    let comm = Communicator::new(&devs).unwrap();
    let n = 8192 + 5;
    let inputs: Vec<Vec<f32>> = (0..2).map(|r| rank_values(r, n)).collect();
    let sum: Vec<f32> = (0..n).map(|i| inputs[0][i] + inputs[1][i]).collect();

    // f32, in place.
    let mut bufs: Vec<_> = devs
        .iter()
        .zip(&inputs)
        .map(|(d, v)| d.upload(v).unwrap())
        .collect();
    let mut refs: Vec<_> = bufs.iter_mut().collect();
    comm.all_reduce_sum(&mut refs).unwrap();
    comm.synchronize().unwrap();
    for b in &bufs {
        assert_eq!(b.to_vec().unwrap(), sum);
    }

    // bf16: the sum of two bf16 values, rounded once.
    let halves: Vec<Vec<bf16>> = inputs
        .iter()
        .map(|v| v.iter().map(|&x| bf16::from_f32(x)).collect())
        .collect();
    let want: Vec<bf16> = (0..n)
        .map(|i| bf16::from_f32(halves[0][i].to_f32() + halves[1][i].to_f32()))
        .collect();
    let mut bufs: Vec<_> = devs
        .iter()
        .zip(&halves)
        .map(|(d, v)| d.upload(v).unwrap())
        .collect();
    let mut refs: Vec<_> = bufs.iter_mut().collect();
    comm.all_reduce_sum(&mut refs).unwrap();
    comm.synchronize().unwrap();
    for b in &bufs {
        let got = b.to_vec().unwrap();
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a.to_f32() - b.to_f32()).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst <= 2f32.powi(-6),
            "bf16 sum off by {worst} (one ulp at 2 is 2^-6)"
        );
    }

    // All-gather: each rank's token candidates, concatenated in rank order.
    let sends: Vec<_> = devs
        .iter()
        .enumerate()
        .map(|(r, d)| d.upload(&[r as i32 * 10 + 1, r as i32 * 10 + 2]).unwrap())
        .collect();
    let mut recvs: Vec<_> = devs.iter().map(|d| d.zeros::<i32>(4).unwrap()).collect();
    let send_refs: Vec<_> = sends.iter().collect();
    let mut recv_refs: Vec<_> = recvs.iter_mut().collect();
    comm.all_gather(&send_refs, &mut recv_refs).unwrap();
    comm.synchronize().unwrap();
    for b in &recvs {
        assert_eq!(b.to_vec().unwrap(), vec![1, 2, 11, 12]);
    }

    // Mismatched buffers are errors, not NCCL hangs.
    let mut short = devs[1].zeros::<f32>(3).unwrap();
    let mut ok = devs[0].zeros::<f32>(4).unwrap();
    let e = comm
        .all_reduce_sum(&mut [&mut ok, &mut short])
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 1") && e.contains("expected 4"), "{e}");
}

/// An all-reduce recorded into one CUDA graph per GPU, replayed with new inputs.
#[test]
fn captured_all_reduce_replays() {
    let Some(devs) = two_gpus("captured_all_reduce_replays") else {
        return;
    };
    let _turn = gpu_turn();
    let comm = Communicator::new(&devs).unwrap();
    let n = 5120;
    let mut bufs: Vec<_> = devs.iter().map(|d| d.zeros::<f32>(n).unwrap()).collect();
    // Once eagerly (NCCL connects on first use), then captured.
    {
        let mut refs: Vec<_> = bufs.iter_mut().collect();
        comm.all_reduce_sum(&mut refs).unwrap();
    }
    comm.synchronize().unwrap();
    let graphs = {
        let mut refs: Vec<_> = bufs.iter_mut().collect();
        capture_all(&devs, || comm.all_reduce_sum(&mut refs)).unwrap()
    };
    assert_eq!(graphs.len(), 2);
    for round in 0..3 {
        let inputs: Vec<Vec<f32>> = (0..2).map(|r| rank_values(r + round, n)).collect();
        for (b, v) in bufs.iter_mut().zip(&inputs) {
            b.copy_from_host(v).unwrap();
        }
        comm.synchronize().unwrap();
        launch_all(&graphs).unwrap();
        comm.synchronize().unwrap();
        let sum: Vec<f32> = (0..n).map(|i| inputs[0][i] + inputs[1][i]).collect();
        for (r, b) in bufs.iter().enumerate() {
            assert_eq!(b.to_vec().unwrap(), sum, "round {round}, rank {r}");
        }
    }
}
