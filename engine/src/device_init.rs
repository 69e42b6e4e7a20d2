//! Random weights generated where they live: a kernel writes a preset's seeded
//! values straight into device memory, so a 70B-parameter preset needs no host
//! copy and no upload.
//!
//! Element `i` of a tensor is [`crate::preset::random_value`]`(key, i, mean, std)`,
//! a function of the seed, the tensor's name and `i` alone; [`random_fill`]
//! computes the same operations in the same order (integer hashing, then three
//! rounded f32 operations and a round-to-nearest-even bf16 conversion), so the
//! device's values are bit for bit those of [`crate::preset::random_weights`]
//! (`tests`, and `device_fill_matches_host` on the GPU).

use half::bf16;
use tilefuse_dsl::runtime::{Buffer, Device};
use tilefuse_macros::kernel;

use crate::error::{EngineError, Result};
use crate::preset::{tensor_key, RandomTensor, IRWIN_HALL_UNIT};

/// Elements one program of [`random_fill`] writes.
pub const FILL_BLOCK: usize = 2048;

/// `out[offset + i] = mean + std * z(key, j)` for `i < n`: the preset's random
/// values ([`crate::preset::random_value`]) of one tensor, or of a block of it, written
/// at `offset` of a buffer that may hold several (the decoder's fused `[q; k; v]`
/// rows).
///
/// Element `i` of the block is element `j = (row0 + i / cols) * row_len + col0 + i %
/// cols` of the whole tensor (row-major, `row_len` columns): a whole tensor is `row0 =
/// col0 = 0`, `cols = row_len`; a tensor-parallel shard picks rows or columns.
#[kernel(crate = tilefuse_dsl, B = [2048], num_warps = [4])]
pub fn random_fill<const B: usize>(
    out: Ptr<bf16>,
    key0: u32,
    key1: u32,
    offset: i32,
    n: i32,
    row0: i32,
    col0: i32,
    cols: i32,
    row_len: i32,
    mean: f32,
    std: f32,
    unit: f32,
) {
    let i = program_id(0) * B + arange(0, B);
    let ok = i < n;
    let j = (row0 + i / cols) * row_len + col0 + i % cols;
    // Two rounds of murmur3's finalizer over the index and the key: 64 bits.
    let mut a = ((j as u32) * 2654435761) ^ key0;
    a = a ^ (a >> 16);
    a = a * 2246822507;
    a = a ^ (a >> 13);
    a = a * 3266489909;
    a = a ^ (a >> 16);
    let mut b = a ^ key1;
    b = b ^ (b >> 16);
    b = b * 2246822507;
    b = b ^ (b >> 13);
    b = b * 3266489909;
    b = b ^ (b >> 16);
    // Irwin-Hall: four 16-bit uniforms summed, centred, scaled to unit variance.
    let sum = (a & 65535) + (a >> 16) + (b & 65535) + (b >> 16);
    let z = ((sum as f32) - 131070.0) * unit;
    store(out + offset + i, (mean + std * z) as bf16, ok);
}

/// Writes tensor `spec`'s values drawn with `seed` into `out[offset..offset + spec.len]`.
///
/// Fails when the range does not fit `out`, or when the tensor or the end of the
/// range is past what 32-bit kernel indices address (2^31 elements; the largest
/// tensor of the presets, Llama-3.1-70B's embedding, has 1.05e9).
pub fn random_fill_tensor(
    dev: &Device,
    out: &mut Buffer<bf16>,
    offset: usize,
    spec: &RandomTensor,
    seed: u64,
) -> Result<()> {
    let len = spec.len.max(1);
    random_fill_block(dev, out, offset, spec, seed, len, 0..spec.len / len, 0..len)
}

/// Writes the block `rows x cols` of tensor `spec` (row-major, `row_len` columns)
/// drawn with `seed` into `out[offset..]`, row after row: the values the host preset
/// has there. A tensor-parallel rank's shard ([`crate::tp::shard_weights`]) is a row
/// range (q/k/v, gate/up, LM head) or a column range (O, down) of the whole tensor.
#[allow(clippy::too_many_arguments)]
pub fn random_fill_block(
    dev: &Device,
    out: &mut Buffer<bf16>,
    offset: usize,
    spec: &RandomTensor,
    seed: u64,
    row_len: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
) -> Result<()> {
    let n = rows.len() * cols.len();
    let bad = |why: String| EngineError::Option {
        message: format!("random tensor `{}`: {why}", spec.name),
    };
    if row_len == 0 || spec.len % row_len != 0 {
        return Err(bad(format!(
            "{} elements are not rows of {row_len}",
            spec.len
        )));
    }
    if rows.end > spec.len / row_len || cols.end > row_len {
        return Err(bad(format!(
            "rows {rows:?} x columns {cols:?} exceed its {} x {row_len}",
            spec.len / row_len
        )));
    }
    let end = offset.checked_add(n).filter(|&e| e <= out.len());
    let Some(end) = end else {
        return Err(bad(format!(
            "{n} elements at offset {offset} do not fit a buffer of {}",
            out.len()
        )));
    };
    if end > i32::MAX as usize || spec.len > i32::MAX as usize {
        return Err(EngineError::Unsupported {
            message: format!(
                "random tensor `{}` ({} elements, written up to element {end}) is past the 2^31 elements a fill kernel addresses",
                spec.name, spec.len
            ),
        });
    }
    if n == 0 {
        return Ok(());
    }
    let [key0, key1] = tensor_key(seed, &spec.name);
    let grid = n.div_ceil(FILL_BLOCK) as u32;
    random_fill::<FILL_BLOCK>::launch(
        dev,
        grid,
        out,
        key0,
        key1,
        offset as i32,
        n as i32,
        rows.start as i32,
        cols.start as i32,
        cols.len() as i32,
        row_len as i32,
        spec.mean,
        spec.std,
        IRWIN_HALL_UNIT,
    )?;
    Ok(())
}

/// A new device buffer holding the concatenation of `specs`' values, in order
/// (one tensor, or fused rows such as `[gate; up]`).
pub fn random_buffer(dev: &Device, specs: &[&RandomTensor], seed: u64) -> Result<Buffer<bf16>> {
    let len = specs.iter().map(|s| s.len).sum();
    let mut out = dev.zeros::<bf16>(len)?;
    let mut offset = 0;
    for spec in specs {
        random_fill_tensor(dev, &mut out, offset, spec, seed)?;
        offset += spec.len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::{random_tensor, random_tensors};

    fn spec(name: &str, len: usize, mean: f32, std: f32) -> RandomTensor {
        RandomTensor {
            name: name.into(),
            len,
            mean,
            std,
        }
    }

    /// The interpreter (the kernel's semantics) writes exactly the host's values,
    /// at an offset, next to another tensor, with a partial last program.
    #[test]
    fn interpreter_fill_matches_host() {
        let dev = Device::cpu();
        let a = spec(
            "model.layers.0.mlp.gate_proj.weight",
            3 * FILL_BLOCK + 17,
            0.0,
            0.02,
        );
        let b = spec("model.norm.weight", 100, 1.0, 0.02);
        let buf = random_buffer(&dev, &[&a, &b], 9).unwrap();
        let got = buf.to_vec().unwrap();
        let mut want = random_tensor(9, &a.name, a.len, a.mean, a.std);
        want.extend(random_tensor(9, &b.name, b.len, b.mean, b.std));
        assert_eq!(got, want);
    }

    /// A whole tiny preset: every tensor the device writes equals the host preset's.
    #[test]
    fn interpreter_fill_matches_a_tiny_preset() {
        let cfg = crate::preset::config("tiny-qwen2").unwrap();
        let host = crate::preset::random_weights(&cfg, 5);
        let named = host.named_tensors(&cfg);
        let dev = Device::cpu();
        for (s, (name, _, values)) in random_tensors(&cfg).iter().zip(&named) {
            assert_eq!(&s.name, name);
            let buf = random_buffer(&dev, &[s], 5).unwrap();
            assert_eq!(&buf.to_vec().unwrap()[..], *values, "{name}");
        }
    }

    /// Each rank's shard filled on the device is the host split of the host preset.
    #[test]
    fn shards_filled_in_place_match_the_split() {
        let cfg = crate::preset::config("tiny-qwen3").unwrap();
        let host = crate::preset::random_weights(&cfg, 8);
        let plan = crate::tp::TpPlan::new(&cfg, 2).unwrap();
        let specs = random_tensors(&cfg);
        let find = |n: &str| specs.iter().find(|s| s.name == n).unwrap();
        let (h, hd, im, qd) = (
            cfg.hidden_size,
            cfg.head_dim,
            cfg.intermediate_size,
            cfg.q_dim(),
        );
        let dev = Device::cpu();
        for r in 0..2 {
            let shard = crate::tp::shard_weights(&cfg, &plan, &host, r);
            let s = plan.rank(r);
            let q_rows = s.heads.start * hd..s.heads.end * hd;
            let cases: [(&str, usize, _, _, &[bf16]); 4] = [
                (
                    "model.layers.1.self_attn.q_proj.weight",
                    h,
                    q_rows.clone(),
                    0..h,
                    &shard.layers[1].q_proj,
                ),
                (
                    "model.layers.1.self_attn.o_proj.weight",
                    qd,
                    0..h,
                    q_rows,
                    &shard.layers[1].o_proj,
                ),
                (
                    "model.layers.0.mlp.down_proj.weight",
                    im,
                    0..h,
                    s.intermediate.clone(),
                    &shard.layers[0].down_proj,
                ),
                (
                    "model.embed_tokens.weight",
                    h,
                    s.vocab.clone(),
                    0..h,
                    &shard.lm_head,
                ),
            ];
            for (name, row_len, rows, cols, want) in cases {
                let mut buf = dev.zeros::<bf16>(want.len() + 3).unwrap();
                random_fill_block(&dev, &mut buf, 3, find(name), 8, row_len, rows, cols).unwrap();
                assert_eq!(&buf.to_vec().unwrap()[3..], want, "rank {r}: {name}");
            }
        }
    }

    #[test]
    fn ranges_outside_the_buffer_are_errors() {
        let dev = Device::cpu();
        let mut buf = dev.zeros::<bf16>(10).unwrap();
        let e = random_fill_tensor(&dev, &mut buf, 4, &spec("t.weight", 7, 0.0, 1.0), 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.weight") && e.contains("offset 4"), "{e}");
        let t = spec("t.weight", 12, 0.0, 1.0);
        let e = random_fill_block(&dev, &mut buf, 0, &t, 0, 4, 0..2, 2..5)
            .unwrap_err()
            .to_string();
        assert!(e.contains("exceed its 3 x 4"), "{e}");
    }
}
