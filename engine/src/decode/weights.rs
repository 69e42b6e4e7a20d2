//! A model's weights on the device, in the kernels' layout: fused `[q; k; v]` and
//! `[gate; up]` rows, each projection dense or quantized ([`Matrix`]), uploaded from host
//! weights ([`DeviceWeights::upload`]) or filled on the device by a tensor-parallel rank
//! (`tp.rs`), then handed to [`super::Decoder::from_device`].

use half::bf16;
use tilefuse_dsl::runtime::{Buffer, Device};

use super::matrix::{self, Matrix, QuantMatrix};
use super::{QuantLayer, QuantWeights};
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};

fn concat(parts: &[&[bf16]]) -> Vec<bf16> {
    parts.concat()
}

/// One layer's weights on the device, in the kernels' layout (see `Layer` in `mod.rs`).
pub(crate) struct LayerBuffers {
    pub(crate) input_norm: Buffer<bf16>,
    pub(crate) qkv_w: Matrix,
    /// `None`: the model has no q/k/v biases (zeros are allocated).
    pub(crate) qkv_b: Option<Buffer<bf16>>,
    pub(crate) q_norm: Option<Buffer<bf16>>,
    pub(crate) k_norm: Option<Buffer<bf16>>,
    pub(crate) o_w: Matrix,
    pub(crate) o_b: Option<Buffer<bf16>>,
    pub(crate) post_norm: Buffer<bf16>,
    pub(crate) gate_up_w: Matrix,
    pub(crate) down_w: Matrix,
}

/// A model's weights on the device, in the kernels' layout.
pub(crate) struct DeviceWeights {
    pub(crate) embed: Buffer<bf16>,
    /// `None` when the LM head is the embedding or quantized.
    pub(crate) lm_head: Option<Buffer<bf16>>,
    /// A quantized LM head (then `lm_head` is `None`).
    pub(crate) quant_head: Option<QuantMatrix>,
    pub(crate) final_norm: Buffer<bf16>,
    pub(crate) layers: Vec<LayerBuffers>,
}

impl DeviceWeights {
    /// Uploads `w` (checked against the shapes it is used with) in the kernels'
    /// layout: fused `[q; k; v]` and `[gate; up]` rows; the matrices `quant` gives are
    /// uploaded quantized in place of the dense ones (a fused projection only when all
    /// its parts are).
    pub(crate) fn upload(
        dev: &Device,
        embed: &[bf16],
        lm_head: Option<&[bf16]>,
        norm: &[bf16],
        layers: &[crate::model::LayerWeights<'_>],
        quant: &QuantWeights,
    ) -> Result<DeviceWeights> {
        let opt = |t: &Option<crate::model::Tensor<'_>>| -> Result<Option<Buffer<bf16>>> {
            Ok(match t {
                Some(t) => Some(dev.upload(t)?),
                None => None,
            })
        };
        let mut out = Vec::with_capacity(layers.len());
        let dense_layer = QuantLayer::default();
        for (li, lw) in layers.iter().enumerate() {
            let ql = quant.layers.get(li).unwrap_or(&dense_layer);
            let qkv_b = match (&lw.q_bias, &lw.k_bias, &lw.v_bias) {
                (Some(q), Some(k), Some(v)) => Some(dev.upload(&concat(&[q, k, v]))?),
                _ => None,
            };
            out.push(LayerBuffers {
                input_norm: dev.upload(&lw.input_norm)?,
                qkv_w: matrix::fused(
                    dev,
                    &[ql.q.as_ref(), ql.k.as_ref(), ql.v.as_ref()],
                    &[&lw.q_proj, &lw.k_proj, &lw.v_proj],
                )?,
                qkv_b,
                q_norm: opt(&lw.q_norm)?,
                k_norm: opt(&lw.k_norm)?,
                o_w: matrix::fused(dev, &[ql.o.as_ref()], &[&lw.o_proj])?,
                o_b: opt(&lw.o_bias)?,
                post_norm: dev.upload(&lw.post_attention_norm)?,
                gate_up_w: matrix::fused(
                    dev,
                    &[ql.gate.as_ref(), ql.up.as_ref()],
                    &[&lw.gate_proj, &lw.up_proj],
                )?,
                down_w: matrix::fused(dev, &[ql.down.as_ref()], &[&lw.down_proj])?,
            });
        }
        let quant_head = match &quant.lm_head {
            Some(m) => Some(QuantMatrix::upload(dev, &[m], true)?),
            None => None,
        };
        Ok(DeviceWeights {
            embed: dev.upload(embed)?,
            lm_head: match (lm_head, &quant_head) {
                (Some(t), None) => Some(dev.upload(t)?),
                _ => None,
            },
            quant_head,
            final_norm: dev.upload(norm)?,
            layers: out,
        })
    }
}

/// Checks that every quantized matrix of `quant` has the shape `cfg` gives it.
pub(crate) fn check_quant(cfg: &ModelConfig, quant: &QuantWeights) -> Result<()> {
    let (h, qd, kvd, im) = (
        cfg.hidden_size,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.intermediate_size,
    );
    if quant.layers.len() > cfg.num_layers {
        return Err(EngineError::Option {
            message: format!(
                "quantized weights for {} layers; the model has {}",
                quant.layers.len(),
                cfg.num_layers
            ),
        });
    }
    let check = |name: String,
                 m: &Option<crate::gguf::quant::PackedMatrix>,
                 shape: (usize, usize)| match m {
        Some(m) if m.shape() != shape => Err(EngineError::Option {
            message: format!(
                "quantized {name} is [{}, {}]; the config needs [{}, {}]",
                m.shape().0,
                m.shape().1,
                shape.0,
                shape.1
            ),
        }),
        _ => Ok(()),
    };
    for (i, l) in quant.layers.iter().enumerate() {
        let p = |n: &str| format!("layer {i} {n}");
        check(p("q_proj"), &l.q, (qd, h))?;
        check(p("k_proj"), &l.k, (kvd, h))?;
        check(p("v_proj"), &l.v, (kvd, h))?;
        check(p("o_proj"), &l.o, (h, qd))?;
        check(p("gate_proj"), &l.gate, (im, h))?;
        check(p("up_proj"), &l.up, (im, h))?;
        check(p("down_proj"), &l.down, (h, im))?;
    }
    check("lm_head".into(), &quant.lm_head, (cfg.vocab_size, h))
}
