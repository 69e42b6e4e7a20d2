//! Which compiled variant each prefill launch uses ([`PrefillPlan`]): tiles chosen per
//! launch from the sweep in docs/perf.md ("Batched prefill: operands through the ring,
//! tile sweep"), editable from `tilefuse bench --prefill-tiles`.

use tilefuse_dsl::runtime::{Device, KernelDef};

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::prefill_kernels::{
    PREFILL_ATTENTION, PREFILL_GATE_UP, PREFILL_GEMM, PREFILL_GEMM_SPLIT,
};

/// One launch's compiled variant: its compile-time constants in declaration order and
/// its warps per program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileChoice {
    /// Compile-time constants, in the kernel's declaration order.
    pub consts: Vec<i64>,
    /// Warps per program.
    pub num_warps: u32,
    /// At most this many K slices (split-K through `prefill_gemm_split`; 1: none). Only
    /// the `prefill_gemm` launches (QKV, O, down) split, and a chunk splits only as far
    /// as its tiles times the slices fit the GPU's SMs (long chunks do not split).
    pub splits: u32,
    /// The variant's pipelining depth (`num_stages`); `None` for the kernel's first
    /// compiled one. A split launch runs `prefill_gemm_split` at its own depth.
    pub num_stages: Option<u32>,
}

impl TileChoice {
    /// A GEMM's tile: `[BLOCK_M, BLOCK_N, BLOCK_K]` over `num_warps` warps, unsplit.
    pub fn gemm(block_m: i64, block_n: i64, block_k: i64, num_warps: u32) -> TileChoice {
        TileChoice {
            consts: vec![block_m, block_n, block_k],
            num_warps,
            splits: 1,
            num_stages: None,
        }
    }

    /// An attention tile: `[D, BLOCK_M, BLOCK_N]` over `num_warps` warps.
    pub fn attention(d: i64, block_m: i64, block_n: i64, num_warps: u32) -> TileChoice {
        TileChoice {
            consts: vec![d, block_m, block_n],
            num_warps,
            splits: 1,
            num_stages: None,
        }
    }

    /// This choice with K split into at most `splits` slices.
    pub fn split(self, splits: u32) -> TileChoice {
        TileChoice { splits, ..self }
    }

    /// This choice with the variant compiled `num_stages` deep.
    pub fn stages(self, num_stages: u32) -> TileChoice {
        TileChoice {
            num_stages: Some(num_stages),
            ..self
        }
    }

    pub(super) fn depth(&self) -> i64 {
        self.consts[2]
    }

    /// The K split of this GEMM choice for a `t x n x k` launch on `sms` SMs:
    /// `(slices, k_slice)`, at most [`TileChoice::splits`] slices and no more than fit
    /// the SMs beside the output's tiles in one wave, each a multiple of `BLOCK_K`
    /// (the last may be shorter), none empty; `(1, k)` when that is under two.
    pub fn slices(&self, t: usize, n: usize, k: usize, sms: usize) -> (usize, usize) {
        let tiles = t.div_ceil(self.rows() as usize) * n.div_ceil(self.cols() as usize);
        let s = (self.splits as usize).min(sms / tiles.max(1));
        if s < 2 {
            return (1, k);
        }
        let bk = self.depth() as usize;
        let k_slice = k.div_ceil(s).div_ceil(bk).max(1) * bk;
        let s = k.div_ceil(k_slice);
        if s < 2 {
            (1, k)
        } else {
            (s, k_slice)
        }
    }

    /// Split-K scratch this choice may need for chunks of up to `chunk` rows and `n`
    /// columns on `sms` SMs: `(f32 partials, tile counters)`, both 0 when unsplit.
    pub(super) fn split_room(&self, chunk: usize, n: usize, sms: usize) -> (usize, usize) {
        if self.splits <= 1 {
            return (0, 0);
        }
        let (bm, bn) = (self.rows() as usize, self.cols() as usize);
        let tiles = chunk.div_ceil(bm) * n.div_ceil(bn);
        // A split launch has slices x tiles <= sms, and t x n <= tiles x bm x bn.
        let partials = (self.splits as usize * chunk * n).min(sms.saturating_mul(bm * bn));
        (partials, tiles.min(sms))
    }

    pub(super) fn rows(&self) -> i64 {
        self.consts[0]
    }

    pub(super) fn cols(&self) -> i64 {
        self.consts[1]
    }
}

/// Which compiled variant each prefill launch uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefillPlan {
    /// `prefill_gemm` for the QKV projection: `[BLOCK_M, BLOCK_N, BLOCK_K]`.
    pub qkv: TileChoice,
    /// `prefill_gemm` for the O projection.
    pub o_proj: TileChoice,
    /// `prefill_gate_up`.
    pub gate_up: TileChoice,
    /// `prefill_gemm` for the down projection.
    pub down: TileChoice,
    /// `prefill_attention` for chunks of at least [`LONG_CHUNK`] tokens: `[D, BLOCK_M,
    /// BLOCK_N]`.
    pub attention: TileChoice,
    /// `prefill_attention` for shorter chunks (fewer query tiles: smaller ones keep
    /// more of the GPU busy).
    pub attention_short: TileChoice,
}

/// Chunks of at least this many tokens use [`PrefillPlan::attention`], shorter ones
/// [`PrefillPlan::attention_short`].
pub const LONG_CHUNK: usize = 2048;

impl PrefillPlan {
    /// The default plan for `cfg` on `dev`: on the interpreter the smallest tiles (16
    /// rows, little masked work); on a GPU the tiles of the sweep in docs/perf.md
    /// ("Batched prefill: operands through the ring, tile sweep"): attention tiles of
    /// 64 keys by 128 queries (64 for chunks shorter than [`LONG_CHUNK`]) over 8 warps.
    pub fn new(cfg: &ModelConfig, dev: &Device) -> Result<PrefillPlan> {
        let d = cfg.head_dim as i64;
        if ![32, 64, 128].contains(&d) {
            return Err(EngineError::Unsupported {
                message: format!("head_dim = {d} (prefill supports 32, 64, 128)"),
            });
        }
        let plan = if dev.is_cuda() {
            PrefillPlan {
                // 4-stage rings for every GEMM (512 tokens 3.56 -> 3.40 ms, 2048 tokens
                // 11.49 -> 11.15 ms on an H100; docs/perf.md "Deeper rings for the
                // unsplit GEMM"); a split launch keeps the split kernel's 5 stages.
                qkv: TileChoice::gemm(64, 64, 64, 4).stages(4),
                // K split in two where the output's tiles leave half the SMs idle
                // (512-token chunks: 3.83 -> 3.41 ms TTFT, docs/perf.md "Split-K in
                // the prefill"); longer chunks fill a wave and stay unsplit.
                o_proj: TileChoice::gemm(128, 64, 64, 8).split(2).stages(4),
                // 128 x 64 over 8 warps since the accumulators are stored in 16-byte
                // vectors (2048 tokens 9.40 -> 8.70 ms, 512 tokens 2.93 -> 2.87 ms on
                // an H200; docs/perf.md "The accumulator's store").
                gate_up: TileChoice::gemm(128, 64, 64, 8),
                down: TileChoice::gemm(128, 64, 64, 8).split(2).stages(4),
                attention: TileChoice::attention(d, 128, 64, 8),
                attention_short: TileChoice::attention(d, 64, 64, 8),
            }
        } else {
            let gemm = TileChoice::gemm(16, 32, 32, 4);
            PrefillPlan {
                qkv: gemm.clone(),
                o_proj: gemm.clone(),
                gate_up: gemm.clone(),
                down: gemm,
                // 64-key steps as on the GPU: the online softmax rounds alike.
                attention: TileChoice::attention(d, 16, 64, 4),
                attention_short: TileChoice::attention(d, 16, 64, 4),
            }
        };
        plan.check()?;
        Ok(plan)
    }

    /// This plan with the launches `spec` names replaced (to time other compiled
    /// variants): comma-separated `LAUNCH=TILE`, `LAUNCH` one of `qkv`, `o`, `gate_up`,
    /// `down` with `TILE` as `MxNxK/W` (`BLOCK_M x BLOCK_N x BLOCK_K`, warps; a GEMM
    /// may add `/P` for the variant pipelined `P` stages deep, and `qkv`, `o` and
    /// `down` `:S` for split-K into at most `S` slices, e.g. `o=128x64x64/8:2`,
    /// `qkv=64x64x64/4/4`), or `attention` or `attention_short` with `TILE` as `MxN/W`
    /// (query rows x keys, warps; the head dim stays). For example
    /// `qkv=128x64x64/8,attention=64x32/8`.
    /// The result passes
    /// [`PrefillPlan::check`].
    pub fn with_tiles(&self, spec: &str) -> Result<PrefillPlan> {
        let bad = |message: String| EngineError::Option { message };
        let mut plan = self.clone();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, tile) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("prefill tiles `{part}`: expected LAUNCH=TILE")))?;
            let (dims, warps) = tile
                .split_once('/')
                .ok_or_else(|| bad(format!("prefill tiles `{part}`: expected a `/WARPS`")))?;
            let (warps, splits) = match warps.split_once(':') {
                Some((w, s)) => {
                    if !matches!(name, "qkv" | "o" | "down") {
                        return Err(bad(format!(
                            "prefill tiles `{part}`: only qkv, o and down split K (`:S`)"
                        )));
                    }
                    let s: u32 = s
                        .parse()
                        .ok()
                        .filter(|&s| s >= 1)
                        .ok_or_else(|| bad(format!("prefill tiles `{part}`: slices `{s}`")))?;
                    (w, s)
                }
                None => (warps, 1),
            };
            let (warps, stages) = match warps.split_once('/') {
                Some((w, p)) => {
                    let p: u32 = p
                        .parse()
                        .ok()
                        .filter(|&p| p >= 1)
                        .ok_or_else(|| bad(format!("prefill tiles `{part}`: stages `{p}`")))?;
                    (w, Some(p))
                }
                None => (warps, None),
            };
            let num_warps: u32 = warps
                .parse()
                .map_err(|_| bad(format!("prefill tiles `{part}`: warps `{warps}`")))?;
            let dims: Vec<i64> = dims
                .split('x')
                .map(|x| x.parse::<i64>())
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| bad(format!("prefill tiles `{part}`: sizes `{dims}`")))?;
            let gemm = |dims: &[i64]| -> Result<TileChoice> {
                match dims {
                    [m, n, k] => Ok(TileChoice {
                        num_stages: stages,
                        ..TileChoice::gemm(*m, *n, *k, num_warps).split(splits)
                    }),
                    _ => Err(bad(format!("prefill tiles `{part}`: a GEMM tile is MxNxK"))),
                }
            };
            match name {
                "qkv" => plan.qkv = gemm(&dims)?,
                "o" => plan.o_proj = gemm(&dims)?,
                "gate_up" => plan.gate_up = gemm(&dims)?,
                "down" => plan.down = gemm(&dims)?,
                "attention" | "attention_short" => match dims[..] {
                    _ if stages.is_some() => {
                        return Err(bad(format!(
                            "prefill tiles `{part}`: attention tiles take no `/STAGES`"
                        )))
                    }
                    [m, n] => {
                        let c = TileChoice::attention(self.attention.consts[0], m, n, num_warps);
                        if name == "attention" {
                            plan.attention = c;
                        } else {
                            plan.attention_short = c;
                        }
                    }
                    _ => {
                        return Err(bad(format!(
                            "prefill tiles `{part}`: an attention tile is MxN"
                        )))
                    }
                },
                _ => {
                    return Err(bad(format!(
                        "prefill tiles `{part}`: the launches are qkv, o, gate_up, down, \
                         attention, attention_short"
                    )))
                }
            }
        }
        plan.check()?;
        Ok(plan)
    }

    /// Every launch of the plan with its kernel.
    pub fn choices(&self) -> [(&'static KernelDef, &TileChoice); 6] {
        [
            (&PREFILL_GEMM, &self.qkv),
            (&PREFILL_GEMM, &self.o_proj),
            (&PREFILL_GATE_UP, &self.gate_up),
            (&PREFILL_GEMM, &self.down),
            (&PREFILL_ATTENTION, &self.attention),
            (&PREFILL_ATTENTION, &self.attention_short),
        ]
    }

    /// Fails unless every launch names a compiled variant (the error lists them); a
    /// split launch needs its tile in `prefill_gemm_split` too (a chunk too long to
    /// split runs it through `prefill_gemm`), and only `prefill_gemm` launches split.
    pub fn check(&self) -> Result<()> {
        for (def, c) in self.choices() {
            def.variant_staged(&c.consts, Some(c.num_warps), c.num_stages)?;
            if c.splits > 1 {
                if !std::ptr::eq(def, &PREFILL_GEMM) {
                    return Err(EngineError::Option {
                        message: format!("{} does not split K", def.name),
                    });
                }
                PREFILL_GEMM_SPLIT.variant(&c.consts, Some(c.num_warps))?;
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for PrefillPlan {
    /// The plan in [`PrefillPlan::with_tiles`]'s notation.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (name, c) in [
            ("qkv", &self.qkv),
            ("o", &self.o_proj),
            ("gate_up", &self.gate_up),
            ("down", &self.down),
        ] {
            let [m, n, k] = c.consts[..] else {
                return Err(std::fmt::Error);
            };
            write!(f, "{name}={m}x{n}x{k}/{}", c.num_warps)?;
            if let Some(p) = c.num_stages {
                write!(f, "/{p}")?;
            }
            if c.splits > 1 {
                write!(f, ":{}", c.splits)?;
            }
            write!(f, ",")?;
        }
        let (a, s) = (&self.attention, &self.attention_short);
        write!(
            f,
            "attention={}x{}/{},attention_short={}x{}/{}",
            a.consts[1], a.consts[2], a.num_warps, s.consts[1], s.consts[2], s.num_warps
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_round_trip_and_bad_specs_are_named() {
        let cfg = crate::preset::config("qwen3-0.6b").unwrap();
        let cpu = PrefillPlan::new(&cfg, &Device::cpu()).unwrap();
        assert_eq!(cpu.with_tiles(&cpu.to_string()).unwrap(), cpu);
        let spec = "qkv=64x64x64/4,o=128x64x64/8,gate_up=64x64x64/4,down=128x64x64/8,\
                    attention=128x64/8,attention_short=64x64/8";
        let gpu = cpu.with_tiles(spec).unwrap();
        assert_eq!(gpu.to_string(), spec);
        assert_eq!(gpu.o_proj, TileChoice::gemm(128, 64, 64, 8));
        assert_eq!(gpu.attention.consts, vec![128, 128, 64]);
        assert_eq!(gpu.attention_short.consts, vec![128, 64, 64]);
        // Split-K for the prefill_gemm launches, with a tile both kernels compile.
        let split = cpu.with_tiles("o=16x32x32/4:3,down=16x32x32/4:2").unwrap();
        assert_eq!(split.o_proj, TileChoice::gemm(16, 32, 32, 4).split(3));
        assert_eq!(split.with_tiles(&split.to_string()).unwrap(), split);
        assert!(split.to_string().contains("o=16x32x32/4:3,"));
        // Launches left out keep their tiles.
        let one = cpu.with_tiles("down=64x64x64/8").unwrap();
        assert_eq!(one.qkv, cpu.qkv);
        assert_eq!(one.down, TileChoice::gemm(64, 64, 64, 8));
        // A pipelining depth picks that variant, and round-trips with the split.
        let staged = cpu
            .with_tiles("qkv=64x64x64/4/4,gate_up=64x64x64/4/3,o=128x64x64/8/4:2")
            .unwrap();
        assert_eq!(staged.qkv, TileChoice::gemm(64, 64, 64, 4).stages(4));
        assert_eq!(staged.gate_up, TileChoice::gemm(64, 64, 64, 4).stages(3));
        assert_eq!(
            staged.o_proj,
            TileChoice::gemm(128, 64, 64, 8).split(2).stages(4)
        );
        assert!(staged.to_string().contains("o=128x64x64/8/4:2,"));
        assert_eq!(staged.with_tiles(&staged.to_string()).unwrap(), staged);
        // Slices: within one wave of SMs, whole BLOCK_K steps, none empty.
        let c = TileChoice::gemm(128, 64, 64, 8).split(4);
        assert_eq!(c.slices(512, 1024, 3072, 132), (2, 1536));
        assert_eq!(c.slices(512, 1024, 3072, 264), (4, 768));
        assert_eq!(c.slices(2048, 1024, 3072, 132), (1, 3072));
        assert_eq!(c.slices(100, 64, 320, 132), (3, 128));
        assert_eq!(c.slices(100, 64, 64, 132), (1, 64));
        assert_eq!(
            TileChoice::gemm(128, 64, 64, 8).slices(8, 64, 4096, 132),
            (1, 4096)
        );
        for (t, n, k) in [
            (512, 1024, 3072),
            (1, 8, 200),
            (300, 136, 1000),
            (64, 64, 72),
        ] {
            for sms in [1, 132, usize::MAX] {
                let (s, ks) = c.slices(t, n, k, sms);
                assert!(s == 1 || ((s - 1) * ks < k && k <= s * ks && ks % 64 == 0));
                let (room, counters) = c.split_room(t, n, sms);
                let tiles = t.div_ceil(128) * n.div_ceil(64);
                assert!(
                    s == 1 || (s * t * n <= room && tiles <= counters),
                    "{t} {n} {k}"
                );
            }
        }
        for (bad, says) in [
            ("qkv=64x64/4", "MxNxK"),
            ("attention=64x64x64/8", "MxN"),
            ("attention=64x64", "/WARPS"),
            ("lm_head=64x64x64/4", "qkv, o, gate_up, down"),
            ("qkv", "LAUNCH=TILE"),
            ("qkv=64xbx64/4", "sizes"),
            ("qkv=64x64x64/3", "no compiled variant"),
            ("gate_up=16x32x32/4:2", "only qkv, o and down"),
            ("o=16x32x32/4:0", "slices"),
            ("o=64x64x64/4:2", "no compiled variant"),
            ("qkv=16x32x32/4/5", "num_stages=5"),
            ("qkv=64x64x64/4/x", "stages"),
            ("attention=64x64/8/4", "no `/STAGES`"),
        ] {
            let err = cpu.with_tiles(bad).unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
