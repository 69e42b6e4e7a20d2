//! How many programs of a kernel one SM holds at once, from its registers a thread,
//! threads a program and shared memory a program: the CUDA occupancy rules, offline.
//!
//! A GEMV launches one wave when its grid fits in `programs × SMs`; a grid just past
//! that runs a second, mostly empty wave (docs/perf.md, "Register limits by tile": 1024
//! programs at 7 an SM on 132 SMs took 13.7 µs, at 8 an SM 9.3 µs). `tilefuse inspect`
//! prints this next to ptxas' register count, with the register count that would fit
//! one more program.

use std::fmt;

use super::Target;

/// What one SM holds: the CUDA Programming Guide's per-compute-capability figures
/// ("Technical Specifications per Compute Capability").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmLimits {
    /// 32-bit registers.
    pub registers: u32,
    /// Threads.
    pub threads: u32,
    /// Programs (thread blocks).
    pub programs: u32,
    /// Shared memory, bytes (the per-SM total, not the per-program maximum).
    pub shared_bytes: u32,
}

/// Per compute capability `(major, minor)`: threads, programs and KiB of shared memory
/// an SM holds (every listed part has 64 Ki registers an SM).
const PARTS: [((u32, u32), u32, u32, u32); 7] = [
    ((8, 0), 2048, 32, 164),
    ((8, 6), 1536, 16, 100),
    ((8, 7), 2048, 16, 164),
    ((8, 9), 1536, 24, 100),
    ((9, 0), 2048, 32, 228),
    ((10, 0), 2048, 32, 228),
    ((12, 0), 1536, 24, 100),
];

impl SmLimits {
    /// The data-center part whose SM `target`'s limits are taken from: the A100 (8.0)
    /// for sm_80, the H100/H200 (9.0) for sm_90.
    pub fn part(target: Target) -> (u32, u32) {
        if target.hopper() {
            (9, 0)
        } else {
            (8, 0)
        }
    }

    /// The limits of `target`'s data-center SM ([`SmLimits::part`]). Other parts that
    /// run the same PTX hold fewer programs: see [`SmLimits::of_part`].
    pub fn of(target: Target) -> SmLimits {
        let (major, minor) = SmLimits::part(target);
        SmLimits::of_part(major, minor).expect("a listed part")
    }

    /// The compute capabilities [`SmLimits::of_part`] knows, as `(major, minor)`.
    pub fn known_parts() -> impl Iterator<Item = (u32, u32)> {
        PARTS.iter().map(|&(part, ..)| part)
    }

    /// The limits of one SM of compute capability `major.minor`, or `None` for a part
    /// not in [`SmLimits::known_parts`]. The consumer parts (8.6, 8.9, 12.0) hold 1536
    /// threads and 100 KiB of shared memory where the data-center ones hold 2048 and
    /// 164-228.
    pub fn of_part(major: u32, minor: u32) -> Option<SmLimits> {
        let &(_, threads, programs, shared_kib) =
            PARTS.iter().find(|(part, ..)| *part == (major, minor))?;
        Some(SmLimits {
            registers: 65536,
            threads,
            programs,
            shared_bytes: shared_kib * 1024,
        })
    }
}

/// Registers are handed to each warp in units of this many.
const REGISTER_UNIT: u32 = 256;
/// Shared memory the driver reserves for each resident program (sm_80 and later).
const RESERVED_SHARED: u32 = 1024;

/// The resource that stops one more program from fitting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Registers a thread times threads a program.
    Registers,
    /// Threads a program.
    Threads,
    /// Shared memory a program.
    SharedMemory,
    /// The SM's most programs.
    Programs,
}

/// Programs an SM holds at once, what bounds them, and (when registers do) the most
/// registers a thread that would fit one more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Occupancy {
    /// Resident programs an SM (0 when one program does not fit at all).
    pub programs: u32,
    /// What bounds them.
    pub limit: Limit,
    /// With [`Limit::Registers`]: the most registers a thread at which one more
    /// program fits, if the other limits allow it.
    pub registers_for_one_more: Option<u32>,
}

/// The occupancy of a program of `threads` threads using `registers` registers a
/// thread and `shared_bytes` of shared memory on one SM of `target`
/// ([`SmLimits::of`]).
pub fn occupancy(target: Target, registers: u32, threads: u32, shared_bytes: u32) -> Occupancy {
    occupancy_on(SmLimits::of(target), registers, threads, shared_bytes)
}

/// [`occupancy`] on an SM with the limits `sm` (one part: [`SmLimits::of_part`]).
pub fn occupancy_on(sm: SmLimits, registers: u32, threads: u32, shared_bytes: u32) -> Occupancy {
    let warps = threads.div_ceil(32).max(1);
    let per_warp = |regs: u32| (regs.max(1) * 32).div_ceil(REGISTER_UNIT) * REGISTER_UNIT;
    let by_registers = sm.registers / (per_warp(registers) * warps);
    let by_threads = sm.threads / (warps * 32);
    let by_shared = if shared_bytes == 0 {
        u32::MAX
    } else {
        sm.shared_bytes / (shared_bytes + RESERVED_SHARED)
    };
    // Ties go to the other limits: fewer registers would not fit another program.
    let (others, other_limit) = [
        (by_threads, Limit::Threads),
        (by_shared, Limit::SharedMemory),
        (sm.programs, Limit::Programs),
    ]
    .into_iter()
    .min_by_key(|&(n, _)| n)
    .expect("three limits");
    if others <= by_registers {
        return Occupancy {
            programs: others,
            limit: other_limit,
            registers_for_one_more: None,
        };
    }
    let programs = by_registers;
    // The largest per-warp allocation that fits `programs + 1`, in whole units.
    let unit_regs = sm.registers / (warps * (programs + 1)) / REGISTER_UNIT * REGISTER_UNIT / 32;
    let registers_for_one_more = (unit_regs >= 16).then_some(unit_regs.min(255));
    Occupancy {
        programs,
        limit: Limit::Registers,
        registers_for_one_more,
    }
}

impl fmt::Display for Occupancy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.limit {
            Limit::Registers => "registers",
            Limit::Threads => "threads",
            Limit::SharedMemory => "shared memory",
            Limit::Programs => "the SM's most programs",
        };
        write!(f, "{} programs an SM (bound by {why})", self.programs)?;
        if let Some(r) = self.registers_for_one_more {
            write!(
                f,
                "; at {r} registers a thread {} would fit (`max_registers({r}, ..)`)",
                self.programs + 1
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cases measured in docs/perf.md ("A register cap on the Q4_K GEMV", "Register
    /// limits by tile"): ptxas' counts for the Q4_K GEMV's tiles.
    #[test]
    fn register_counts_give_the_programs_an_sm_the_measurements_saw() {
        // 4 x 2048 over 4 warps: 72 registers hold 7 programs, 64 hold 8.
        let at72 = occupancy(Target::Sm90, 72, 128, 512);
        assert_eq!((at72.programs, at72.limit), (7, Limit::Registers));
        assert_eq!(at72.registers_for_one_more, Some(64));
        assert_eq!(occupancy(Target::Sm90, 64, 128, 512).programs, 8);
        // 16 x 1024 over 4 warps: 107 registers hold 4, the cap of 80 six.
        assert_eq!(occupancy(Target::Sm90, 107, 128, 0).programs, 4);
        assert_eq!(occupancy(Target::Sm90, 80, 128, 0).programs, 6);
        // Registers are allocated a warp at a time in units of 256: 73 and 80 alike.
        assert_eq!(
            occupancy(Target::Sm90, 73, 128, 0).programs,
            occupancy(Target::Sm90, 80, 128, 0).programs
        );
    }

    #[test]
    fn threads_shared_memory_and_the_program_count_bound_too() {
        // 32 registers, 1024 threads: two programs fill the SM's 2048 threads.
        let t = occupancy(Target::Sm90, 32, 1024, 0);
        assert_eq!(
            (t.programs, t.limit, t.registers_for_one_more),
            (2, Limit::Threads, None)
        );
        // 100 KiB of shared memory a program: two on sm_90 (228 KiB), one on sm_80.
        let s90 = occupancy(Target::Sm90, 32, 128, 100 * 1024);
        assert_eq!((s90.programs, s90.limit), (2, Limit::SharedMemory));
        assert_eq!(occupancy(Target::Sm80, 32, 128, 100 * 1024).programs, 1);
        // One warp of 16 registers: the SM's 32 programs.
        let p = occupancy(Target::Sm90, 16, 32, 0);
        assert_eq!((p.programs, p.limit), (32, Limit::Programs));
        // Registers bound, but one more program would break the thread limit instead.
        let r = occupancy(Target::Sm90, 255, 256, 0);
        assert_eq!((r.programs, r.limit), (1, Limit::Registers));
        assert_eq!(r.registers_for_one_more, Some(128));
        let full = occupancy(Target::Sm90, 40, 512, 0);
        assert_eq!((full.programs, full.limit), (3, Limit::Registers));
        assert_eq!(full.registers_for_one_more, Some(32));
        assert_eq!(occupancy(Target::Sm90, 32, 512, 0).limit, Limit::Threads);
    }

    /// The consumer parts' smaller SMs, as the CUDA occupancy calculator counts them.
    #[test]
    fn parts_with_smaller_sms_hold_fewer_programs() {
        let ada = SmLimits::of_part(8, 9).unwrap();
        // 32 registers, 512 threads: four on an A100's 2048 threads, three on 1536.
        assert_eq!(occupancy(Target::Sm80, 32, 512, 0).programs, 4);
        let t = occupancy_on(ada, 32, 512, 0);
        assert_eq!((t.programs, t.limit), (3, Limit::Threads));
        // One warp: the SM's program cap, 16 on 8.6, 24 on 8.9.
        let one_warp =
            |major, minor| occupancy_on(SmLimits::of_part(major, minor).unwrap(), 16, 32, 0);
        assert_eq!(
            (one_warp(8, 6).programs, one_warp(8, 6).limit),
            (16, Limit::Programs)
        );
        assert_eq!(one_warp(8, 9).programs, 24);
        // 40 KiB of shared memory a program: two in 100 KiB, four in the A100's 164.
        assert_eq!(occupancy_on(ada, 32, 128, 40 * 1024).programs, 2);
        assert_eq!(occupancy(Target::Sm80, 32, 128, 40 * 1024).programs, 4);
        // The register file is the same 64 Ki registers: 72 a thread over 4 warps still
        // holds 7 where threads allow it.
        assert_eq!(occupancy_on(ada, 72, 128, 0).programs, 7);
        // Targets map onto their data-center parts; unknown parts have no limits.
        assert_eq!(
            SmLimits::of(Target::Sm90a),
            SmLimits::of_part(9, 0).unwrap()
        );
        assert_eq!(SmLimits::of_part(7, 5), None);
        for (major, minor) in SmLimits::known_parts() {
            assert!(SmLimits::of_part(major, minor).is_some(), "{major}.{minor}");
        }
    }

    #[test]
    fn the_report_names_the_bound_and_the_register_count_to_aim_for() {
        let s = occupancy(Target::Sm90, 72, 128, 0).to_string();
        assert_eq!(
            s,
            "7 programs an SM (bound by registers); at 64 registers a thread 8 would fit (`max_registers(64, ..)`)"
        );
        assert_eq!(
            occupancy(Target::Sm90, 32, 1024, 0).to_string(),
            "2 programs an SM (bound by threads)"
        );
    }
}
