//! The host reference decoder: the oracle the kernel-based engine is checked
//! against. One token at a time, f32 arithmetic over bf16 weights, written to
//! be read top to bottom.
//!
//! It follows the structure of transformers' Qwen3/Qwen2/Llama modules run in
//! bf16 with eager attention, and mirrors where they round to bf16, so that
//! logits agree with transformers to bf16 precision. The roundings mirrored:
//!
//! - the hidden state (embedding row, both residual sums) is bf16;
//! - RMSNorm: mean of squares and `x * rsqrt(var + eps)` in f32, rounded to
//!   bf16, then multiplied by the bf16 weight and rounded again;
//! - every linear layer accumulates in f32 (bias added in f32) and rounds its
//!   output to bf16;
//! - RoPE: `inv_freq` and `pos * inv_freq` in f32, `cos`/`sin` rounded to
//!   bf16; `q*cos` and `rotate_half(q)*sin` each rounded, then their sum;
//! - attention: `q·k` rounded, times `head_dim^-0.5` rounded; softmax in f32
//!   rounded to bf16; `probs·v` accumulated in f32 and rounded;
//! - MLP: `silu(gate)` rounded, `* up` rounded;
//! - logits rounded to bf16 (transformers then casts them to f32).
//!
//! What is not mirrored: the order of f32 accumulation inside dot products,
//! and PyTorch's vectorized `exp` (used by softmax once a row has 16 or more
//! entries), which differs from libm's in the last bits of f32. Now and then
//! that moves a softmax probability across a bf16 rounding boundary; a random
//! model amplifies the one-ulp step, and logits then differ by ~1e-2
//! relative. Short contexts agree with transformers to ~1e-5 (the fixtures'
//! 6-digit rounding); the 300-token fixture to 1.4e-2 (see
//! `tests/reference_fixtures.rs`).

use half::bf16;

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::model::ModelWeights;
use crate::rope;

/// Rounds an f32 to the nearest bf16 (ties to even) and back.
#[inline]
pub(crate) fn bf(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// Widens bf16 to f32 (exact: bf16 is the top half of an f32).
#[inline]
pub(crate) fn f(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// `out = round(W x + b)` for `W` of shape `[out.len(), x.len()]`.
///
/// Large matrices are split by rows over threads; each row is still summed
/// in the same order, so the result does not depend on the thread count.
pub(crate) fn linear(w: &[bf16], bias: Option<&[bf16]>, x: &[f32], out: &mut [f32]) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads == 1 || out.len() * x.len() < (1 << 20) {
        return linear_rows(w, bias, x, out, 0);
    }
    let rows = out.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (i, chunk) in out.chunks_mut(rows).enumerate() {
            s.spawn(move || linear_rows(w, bias, x, chunk, i * rows));
        }
    });
}

/// Rows `first..first + out.len()` of [`linear`].
fn linear_rows(w: &[bf16], bias: Option<&[bf16]>, x: &[f32], out: &mut [f32], first: usize) {
    let n = x.len();
    for (r, y) in out.iter_mut().enumerate() {
        let o = first + r;
        let row = &w[o * n..(o + 1) * n];
        let mut acc = 0.0f32;
        for (wi, xi) in row.iter().zip(x) {
            acc += f(*wi) * xi;
        }
        if let Some(b) = bias {
            acc += f(b[o]);
        }
        *y = bf(acc);
    }
}

/// RMSNorm as transformers computes it in bf16 (see the module docs).
pub(crate) fn rms_norm(x: &[f32], weight: &[bf16], eps: f32, out: &mut [f32]) {
    let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv_rms = 1.0 / (mean_sq + eps).sqrt();
    for ((o, xi), wi) in out.iter_mut().zip(x).zip(weight) {
        *o = bf(f(*wi) * bf(xi * inv_rms));
    }
}

/// RMSNorm applied in place to each `head_dim`-wide slice (Qwen3's QK-norm).
pub(crate) fn rms_norm_heads(x: &mut [f32], weight: &[bf16], eps: f32) {
    let d = weight.len();
    let mut tmp = vec![0.0f32; d];
    for head in x.chunks_exact_mut(d) {
        rms_norm(head, weight, eps, &mut tmp);
        head.copy_from_slice(&tmp);
    }
}

/// Rotates each `head_dim`-wide slice of `x` by position `pos`
/// (rotate-half layout: pairs are `(i, i + head_dim/2)`).
pub(crate) fn rope(x: &mut [f32], inv_freq: &[f32], pos: usize) {
    let half = inv_freq.len();
    let (cos, sin) = rope::cos_sin(inv_freq, pos);
    for head in x.chunks_exact_mut(2 * half) {
        for i in 0..half {
            let (a, b) = (head[i], head[i + half]);
            // out[i] = a*cos - b*sin ; out[i+half] = b*cos + a*sin
            head[i] = bf(bf(a * cos[i]) + bf(-b * sin[i]));
            head[i + half] = bf(bf(b * cos[i]) + bf(a * sin[i]));
        }
    }
}

/// Decode attention of the query heads in `q` (`[heads][head_dim]`) over the
/// `scores.len()` cached positions (`[pos][kv_head][head_dim]`, `n_kv` heads;
/// consecutive query heads share a kv head), written to `out` (like `q`).
pub(crate) fn attend(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    n_kv: usize,
    hd: usize,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let n_heads = q.len() / hd;
    // Grouped-query attention: consecutive query heads share a kv head.
    let group = n_heads / n_kv;
    let scale = (hd as f32).powf(-0.5);
    for head in 0..n_heads {
        let kvh = head / group;
        let qh = &q[head * hd..(head + 1) * hd];
        for (p, s) in scores.iter_mut().enumerate() {
            let kp = &k_cache[(p * n_kv + kvh) * hd..(p * n_kv + kvh + 1) * hd];
            let dot: f32 = qh.iter().zip(kp).map(|(a, b)| a * b).sum();
            *s = bf(bf(dot) * scale);
        }
        // Softmax in f32, probabilities handed on as bf16.
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut denom = 0.0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            denom += *s;
        }
        for s in scores.iter_mut() {
            *s = bf(*s / denom);
        }
        let out = &mut out[head * hd..(head + 1) * hd];
        for (d, o) in out.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for (p, s) in scores.iter().enumerate() {
                acc += s * v_cache[(p * n_kv + kvh) * hd + d];
            }
            *o = bf(acc);
        }
    }
}

/// `gate = silu(gate) * up`, rounded as transformers rounds it in bf16.
pub(crate) fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        let silu = bf(*g / (1.0 + (-*g).exp()));
        *g = bf(silu * u);
    }
}

/// Index of the largest value; the first one on ties, like `torch.argmax`.
pub fn argmax(xs: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in xs.iter().enumerate() {
        if v > xs[best] {
            best = i;
        }
    }
    best
}

/// The reference decoder: weights, RoPE table and a growing KV cache.
#[derive(Debug)]
pub struct Reference<'a> {
    cfg: ModelConfig,
    w: ModelWeights<'a>,
    inv_freq: Vec<f32>,
    /// Per layer: keys after RoPE, `[pos][kv_head][head_dim]`, bf16 values.
    k_cache: Vec<Vec<f32>>,
    /// Per layer: values, same layout.
    v_cache: Vec<Vec<f32>>,
    /// Number of positions held in the cache.
    len: usize,
}

impl<'a> Reference<'a> {
    /// A decoder for `cfg` over `weights`, with an empty cache. Fails if a
    /// tensor's size does not match the config.
    pub fn new(cfg: ModelConfig, weights: ModelWeights<'a>) -> Result<Self> {
        weights.validate(&cfg)?;
        let inv_freq = rope::inv_freq(&cfg);
        let n = cfg.num_layers;
        Ok(Reference {
            cfg,
            w: weights,
            inv_freq,
            k_cache: vec![Vec::new(); n],
            v_cache: vec![Vec::new(); n],
            len: 0,
        })
    }

    /// The model's config.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The model's weights.
    pub fn weights(&self) -> &ModelWeights<'a> {
        &self.w
    }

    /// How many positions the KV cache holds.
    pub fn cached_len(&self) -> usize {
        self.len
    }

    /// Empties the KV cache.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    fn truncate(&mut self, len: usize) {
        let kv = self.cfg.kv_dim();
        for c in self.k_cache.iter_mut().chain(self.v_cache.iter_mut()) {
            c.truncate(len * kv);
        }
        self.len = len;
    }

    /// Runs `token` at position `pos` and returns the next-token logits
    /// (`vocab_size` of them, bf16 values as f32).
    ///
    /// `pos` may equal the cache length (append) or be smaller (the cache is
    /// cut back to `pos` first, as when re-decoding); a larger `pos` is an
    /// error, since the positions in between were never computed.
    pub fn forward(&mut self, token: u32, pos: usize) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let vocab = cfg.vocab_size;
        if token as usize >= vocab {
            return Err(EngineError::TokenOutOfRange { token, vocab });
        }
        if pos > self.len {
            return Err(EngineError::PositionGap {
                pos,
                cached: self.len,
            });
        }
        self.truncate(pos);
        let cfg = &self.cfg;
        let (h, hd, im) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
        let n_kv = cfg.num_kv_heads;
        let eps = cfg.rms_norm_eps as f32;

        // Embedding lookup: the hidden state starts as a bf16 row.
        let t = token as usize;
        let mut x: Vec<f32> = self.w.embed_tokens[t * h..(t + 1) * h]
            .iter()
            .map(|&v| f(v))
            .collect();

        let mut xn = vec![0.0f32; h];
        let mut q = vec![0.0f32; cfg.q_dim()];
        let mut k = vec![0.0f32; cfg.kv_dim()];
        let mut v = vec![0.0f32; cfg.kv_dim()];
        let mut attn = vec![0.0f32; cfg.q_dim()];
        let mut proj = vec![0.0f32; h];
        let mut gate = vec![0.0f32; im];
        let mut up = vec![0.0f32; im];
        let mut scores = vec![0.0f32; pos + 1];

        for (l, lw) in self.w.layers.iter().enumerate() {
            // --- attention block ---
            rms_norm(&x, &lw.input_norm, eps, &mut xn);
            linear(&lw.q_proj, lw.q_bias.as_deref(), &xn, &mut q);
            linear(&lw.k_proj, lw.k_bias.as_deref(), &xn, &mut k);
            linear(&lw.v_proj, lw.v_bias.as_deref(), &xn, &mut v);
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                rms_norm_heads(&mut q, qn, eps);
                rms_norm_heads(&mut k, kn, eps);
            }
            rope(&mut q, &self.inv_freq, pos);
            rope(&mut k, &self.inv_freq, pos);
            self.k_cache[l].extend_from_slice(&k);
            self.v_cache[l].extend_from_slice(&v);
            let (kc, vc) = (&self.k_cache[l], &self.v_cache[l]);

            attend(&q, kc, vc, n_kv, hd, &mut scores, &mut attn);
            linear(&lw.o_proj, lw.o_bias.as_deref(), &attn, &mut proj);
            for (xi, pi) in x.iter_mut().zip(&proj) {
                *xi = bf(*xi + pi);
            }

            // --- MLP block ---
            rms_norm(&x, &lw.post_attention_norm, eps, &mut xn);
            linear(&lw.gate_proj, None, &xn, &mut gate);
            linear(&lw.up_proj, None, &xn, &mut up);
            swiglu(&mut gate, &up);
            linear(&lw.down_proj, None, &gate, &mut proj);
            for (xi, pi) in x.iter_mut().zip(&proj) {
                *xi = bf(*xi + pi);
            }
        }
        self.len = pos + 1;

        // Final norm and LM head (tied heads reuse the embedding).
        rms_norm(&x, &self.w.norm, eps, &mut xn);
        let mut logits = vec![0.0f32; vocab];
        linear(self.w.lm_head(), None, &xn, &mut logits);
        Ok(logits)
    }

    /// Feeds `prompt` from an empty cache, then greedily generates up to
    /// `max_new` tokens (stopping after an eos token). Returns the generated
    /// tokens.
    pub fn generate_greedy(&mut self, prompt: &[u32], max_new: usize) -> Result<Vec<u32>> {
        self.reset();
        let mut logits = Vec::new();
        for (pos, &tok) in prompt.iter().enumerate() {
            logits = self.forward(tok, pos)?;
        }
        let mut out = Vec::with_capacity(max_new);
        if logits.is_empty() {
            return Ok(out);
        }
        for _ in 0..max_new {
            let next = argmax(&logits) as u32;
            out.push(next);
            if self.cfg.eos_token_ids.contains(&next) || out.len() == max_new {
                break;
            }
            logits = self.forward(next, self.len)?;
        }
        Ok(out)
    }
}
