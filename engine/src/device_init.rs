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

/// `out[offset + i] = mean + std * z(key, i)` for `i < n`: the preset's random
/// values ([`crate::preset::random_value`]) of one tensor, written at `offset`
/// of a buffer that may hold several (the decoder's fused `[q; k; v]` rows).
#[kernel(crate = tilefuse_dsl, B = [2048], num_warps = [4])]
pub fn random_fill<const B: usize>(
    out: Ptr<bf16>,
    key0: u32,
    key1: u32,
    offset: i32,
    n: i32,
    mean: f32,
    std: f32,
    unit: f32,
) {
    let i = program_id(0) * B + arange(0, B);
    let ok = i < n;
    // Two rounds of murmur3's finalizer over the index and the key: 64 bits.
    let mut a = ((i as u32) * 2654435761) ^ key0;
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
    let end = offset.checked_add(spec.len).filter(|&e| e <= out.len());
    let Some(end) = end else {
        return Err(EngineError::Option {
            message: format!(
                "random tensor `{}` ({} elements at offset {offset}) does not fit a buffer of {}",
                spec.name,
                spec.len,
                out.len()
            ),
        });
    };
    if end > i32::MAX as usize {
        return Err(EngineError::Unsupported {
            message: format!(
                "random tensor `{}` ends at element {end}, past the 2^31 elements a fill kernel addresses",
                spec.name
            ),
        });
    }
    if spec.len == 0 {
        return Ok(());
    }
    let [key0, key1] = tensor_key(seed, &spec.name);
    let grid = spec.len.div_ceil(FILL_BLOCK) as u32;
    random_fill::<FILL_BLOCK>::launch(
        dev,
        grid,
        out,
        key0,
        key1,
        offset as i32,
        spec.len as i32,
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

    #[test]
    fn ranges_outside_the_buffer_are_errors() {
        let dev = Device::cpu();
        let mut buf = dev.zeros::<bf16>(10).unwrap();
        let e = random_fill_tensor(&dev, &mut buf, 4, &spec("t.weight", 7, 0.0, 1.0), 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.weight") && e.contains("offset 4"), "{e}");
    }
}
