//! Quantized launch configurations and the LM head's format compared inside the
//! captured step (`tilefuse bench --weights q4_k_m --quant-tiles SPEC`): each variant
//! is timed once a round, in turn with the default, over several rounds, so that the
//! GPU's drift over the run moves every variant alike.

use std::fmt;

use crate::decode::{median, Decoder};
use crate::error::{EngineError, Result};
use crate::gguf::device::QuantTiles;

/// Rounds of [`compare`]: every variant is timed once a round.
pub const QUANT_TILE_ROUNDS: usize = 7;

/// One variant of the quantized step: the LM head's format and configurations per
/// shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantTileSpec {
    /// The spec as given.
    pub text: String,
    /// `Some(true)`: the LM head read quantized; `Some(false)`: as bf16; `None`: as
    /// the engine's policy says (`gguf::quant::head_reads_quantized`).
    pub quant_head: Option<bool>,
    /// Bytes of each layer's quantized gate/up words the attention launch asks L2 for
    /// whatever their size (`prefetch=KiB`; `None`: the engine's,
    /// [`crate::tuning::attention_prefetch_words`]).
    pub prefetch_words: Option<usize>,
    /// Bytes of the next GEMV's quantized words each quantizer launch asks L2 for
    /// (`qprefetch=KiB`; `None`: the decoder's).
    pub quantizer_prefetch: Option<usize>,
    /// The attention's split count (`splits=N`; `None`: the decoder's).
    pub splits: Option<usize>,
    /// The attention's fewest positions a split (`min_chunk=N`; `None`: the decoder's).
    pub min_chunk: Option<usize>,
    /// Head columns a combine program merges (`combine_dc=N`, 32, 64 or 128 as
    /// compiled; `None`: the decoder's).
    pub combine_dc: Option<usize>,
    /// Configurations per shape (the rest as `QuantGemvConfig::for_step` chooses).
    pub tiles: QuantTiles,
}

impl QuantTileSpec {
    /// Parses `;`-separated entries: `head=quant` or `head=bf16`, `prefetch=KiB`,
    /// `qprefetch=KiB`,
    /// `splits=N`, `min_chunk=N`, `combine_dc=N`, and `[norm:][TYPE:]ROWSxCOLS=n,k,warps`
    /// ([`QuantTiles::parse`]). An empty spec is the default.
    pub fn parse(spec: &str) -> Result<QuantTileSpec> {
        let mut quant_head = None;
        let (mut prefetch_words, mut splits, mut min_chunk) = (None, None, None);
        let (mut combine_dc, mut quantizer_prefetch) = (None, None);
        let mut rest = Vec::new();
        for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let number = |v: &str| {
                v.trim().parse::<usize>().map_err(|_| EngineError::Option {
                    message: format!("`{entry}`: expected a whole number after `=`"),
                })
            };
            if let Some(kib) = entry.strip_prefix("prefetch=") {
                prefetch_words = Some(number(kib)? << 10);
                continue;
            }
            if let Some(kib) = entry.strip_prefix("qprefetch=") {
                quantizer_prefetch = Some(number(kib)? << 10);
                continue;
            }
            if let Some(n) = entry.strip_prefix("splits=") {
                splits = Some(number(n)?.max(1));
                continue;
            }
            if let Some(n) = entry.strip_prefix("min_chunk=") {
                min_chunk = Some(number(n)?.max(1));
                continue;
            }
            if let Some(n) = entry.strip_prefix("combine_dc=") {
                combine_dc = Some(number(n)?);
                continue;
            }
            match entry {
                "head=quant" => quant_head = Some(true),
                "head=bf16" => quant_head = Some(false),
                e if e.starts_with("head") => {
                    return Err(EngineError::Option {
                        message: format!("`{e}`: the head is `head=quant` or `head=bf16`"),
                    })
                }
                e => rest.push(e),
            }
        }
        Ok(QuantTileSpec {
            text: spec.trim().to_string(),
            quant_head,
            prefetch_words,
            quantizer_prefetch,
            splits,
            min_chunk,
            combine_dc,
            tiles: QuantTiles::parse(&rest.join(";"))?,
        })
    }
}

/// One variant's figures.
#[derive(Clone, Debug)]
pub struct QuantTileRow {
    /// The spec (`default` for the engine's own choices).
    pub spec: String,
    /// Whether the LM head was read quantized.
    pub quant_head: bool,
    /// Weight bytes a step reads (the LM head as read).
    pub weight_bytes: usize,
    /// Median milliseconds per step over the rounds (graph replays, GPU events).
    pub ms_per_token: f64,
    /// Median over the rounds of this variant's time over the default's in the same
    /// round, minus one (negative: faster).
    pub vs_default: f64,
}

/// What [`compare`] measured.
#[derive(Clone, Debug)]
pub struct QuantTileReport {
    /// The default first, then each spec in order.
    pub rows: Vec<QuantTileRow>,
    /// Rounds timed.
    pub rounds: usize,
    /// Graph replays per timing.
    pub tokens: usize,
    /// KV bytes a step reads (for the floor).
    pub kv_bytes: usize,
    /// The run's copy bandwidth, bytes per second.
    pub copy_bytes_per_s: Option<f64>,
}

/// Times the default step of `dec` and each of `specs` over [`QUANT_TILE_ROUNDS`]
/// rounds: `tokens` graph replays from `token` at `context` each. `other` is a decoder
/// of the same weights with the LM head in the other format (needed when a spec asks
/// for it). Leaves both decoders at their default configurations, without graphs.
pub fn compare(
    dec: &mut Decoder,
    mut other: Option<&mut Decoder>,
    specs: &[QuantTileSpec],
    token: u32,
    context: usize,
    tokens: usize,
) -> Result<Vec<QuantTileRow>> {
    let policy = dec.has_quant_head();
    let default = QuantTileSpec {
        text: "default".into(),
        quant_head: None,
        prefetch_words: None,
        quantizer_prefetch: None,
        splits: None,
        min_chunk: None,
        combine_dc: None,
        tiles: QuantTiles::default(),
    };
    let all: Vec<&QuantTileSpec> = std::iter::once(&default).chain(specs).collect();
    for s in &all {
        if s.quant_head.is_some_and(|q| q != policy) && other.is_none() {
            return Err(EngineError::Option {
                message: format!(
                    "`{}`: no decoder with the LM head {}",
                    s.text,
                    if policy { "as bf16" } else { "quantized" }
                ),
            });
        }
    }
    // The decoders' own plans, edited by each spec.
    let base = dec.plan().clone();
    let base_other = other.as_deref().map(|o| o.plan().clone());
    let mut ms = vec![Vec::new(); all.len()];
    for _ in 0..QUANT_TILE_ROUNDS {
        for (i, s) in all.iter().enumerate() {
            let (d, plan): (&mut Decoder, _) = match (s.quant_head, other.as_deref_mut()) {
                (Some(q), Some(o)) if q != policy => (o, base_other.clone()),
                _ => (&mut *dec, Some(base.clone())),
            };
            let mut plan = plan.unwrap_or_else(|| base.clone());
            if let Some(n) = s.splits {
                plan = plan.with_splits(n);
            }
            plan.min_chunk = s.min_chunk.unwrap_or(plan.min_chunk);
            plan.combine.consts.dc = s.combine_dc.unwrap_or(plan.combine.consts.dc);
            plan.prefetch_words = s.prefetch_words.or(plan.prefetch_words);
            plan.quantizer_prefetch = s.quantizer_prefetch.or(plan.quantizer_prefetch);
            d.set_plan(plan)?;
            d.set_quant_tiles(&s.tiles)?;
            d.capture()?;
            ms[i].push(d.time_replays(token, context, tokens)?);
        }
    }
    let mut rows = Vec::with_capacity(all.len());
    for (i, s) in all.iter().enumerate() {
        let d: &Decoder = match (s.quant_head, other.as_deref()) {
            (Some(q), Some(o)) if q != policy => o,
            _ => &*dec,
        };
        let rel: Vec<f64> = ms[i].iter().zip(&ms[0]).map(|(a, b)| a / b - 1.0).collect();
        rows.push(QuantTileRow {
            spec: s.text.clone(),
            quant_head: d.has_quant_head(),
            weight_bytes: d.weight_bytes_per_step(),
            ms_per_token: median(ms[i].clone()),
            vs_default: median(rel),
        });
    }
    dec.set_plan(base)?;
    if let (Some(o), Some(p)) = (other.as_deref_mut(), base_other) {
        o.set_plan(p)?;
    }
    for d in std::iter::once(dec).chain(other) {
        d.set_quant_tiles(&QuantTiles::default())?;
        d.release_graph();
    }
    Ok(rows)
}

impl fmt::Display for QuantTileReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "quantized variants (graph replays, {} a timing; medians of {} rounds, each \
             variant once a round):",
            self.tokens, self.rounds
        )?;
        writeln!(
            f,
            "{:>10} {:>10} {:>10} {:>11} {:>11}  {:<5} spec",
            "weight MB", "ms/token", "tokens/s", "% of floor", "vs default", "head"
        )?;
        for r in &self.rows {
            let pct = self.copy_bytes_per_s.map_or("-".to_string(), |bw| {
                let floor = (r.weight_bytes + self.kv_bytes) as f64 / bw * 1e3;
                format!("{:.1}%", 100.0 * floor / r.ms_per_token)
            });
            writeln!(
                f,
                "{:>10.1} {:>10.4} {:>10.1} {:>11} {:>+10.2}%  {:<5} {}",
                r.weight_bytes as f64 / 1e6,
                r.ms_per_token,
                1e3 / r.ms_per_token,
                pct,
                100.0 * r.vs_default,
                if r.quant_head { "quant" } else { "bf16" },
                r.spec
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::device::QuantGemvConfig;
    use crate::gguf::quant::GgmlType;

    #[test]
    fn specs_name_the_head_and_tiles_per_shape() {
        let s =
            QuantTileSpec::parse("head=bf16; 4096x4096=8,1024,8;151936x1024=16,1024,4").unwrap();
        assert_eq!(s.quant_head, Some(false));
        assert_eq!(
            s.tiles.get(GgmlType::Q6_K, 151936, 1024),
            Some(QuantGemvConfig {
                block_n: 16,
                block_k: 1024,
                num_warps: 4
            })
        );
        assert_eq!(
            s.tiles.get(GgmlType::Q4_K, 4096, 4096).map(|c| c.num_warps),
            Some(8)
        );
        assert_eq!(s.tiles.get(GgmlType::Q4_K, 4096, 1024), None);
        assert_eq!(QuantTileSpec::parse("").unwrap().quant_head, None);
        assert_eq!(QuantTileSpec::parse("").unwrap().prefetch_words, None);
        let p =
            QuantTileSpec::parse("prefetch=8192;4096x4096=8,1024,8;splits=16;min_chunk=1").unwrap();
        assert_eq!(p.prefetch_words, Some(8 << 20));
        assert_eq!((p.splits, p.min_chunk), (Some(16), Some(1)));
        assert_eq!(
            QuantTileSpec::parse("combine_dc=32").unwrap().combine_dc,
            Some(32)
        );
        let q = QuantTileSpec::parse("qprefetch=2048").unwrap();
        assert_eq!(q.quantizer_prefetch, Some(2 << 20));
        assert!(p.tiles.get(GgmlType::Q4_K, 4096, 4096).is_some());
        for bad in [
            "head=q6",
            "4096=8,1024,8",
            "4096x4096=8,1024",
            "axb=1,2,4",
            "prefetch=8M",
            "splits=x",
        ] {
            let e = QuantTileSpec::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad.split(';').next().unwrap()), "{bad}: {e}");
        }
    }
}
