//! Every `#[kernel]` in the repository, in every listed specialization, assembles with
//! `ptxas` for sm_80 (unless it uses clusters or more shared memory than sm_80 has) and
//! sm_90 with no spills and no stack frame.
//!
//! The kernels are found by walking the sources (examples, benches, the root crate, the
//! engine, root tests) with `syn`, so new kernels are covered without listing them here;
//! a kernel may call the `#[tile_fn]` helpers of any walked file, as it may another
//! module's in its crate.
//! `kernel-dsl`'s own test kernels are checked by its tests. Without `ptxas` the test
//! only compiles and prints a notice; `TILEFUSE_REQUIRE_PTXAS=1` (set by `.ci/run`) makes
//! that a failure. `TILEFUSE_PTXAS_TABLE=FILE` writes every variant's registers and
//! spills to FILE (tab-separated, sorted), with a hash of its PTX (FNV-1a) that shows
//! which variants a compiler change touched, to compare two builds of the compiler.
//! `TILEFUSE_PTX_DUMP=DIR` writes every variant's PTX into DIR, named by a hash of the
//! variant without its line number (listed in DIR/index.tsv), so that two builds' PTX,
//! or the SASS `ptxas` makes of it, can be compared file by file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use tilefuse::dsl::back::ptx::{self, ptxas, PtxKernel, Target};
use tilefuse::dsl::front::{find_kernels_with, tile_fns};
use tilefuse::dsl::specialize;

/// Directories walked, relative to the repository root.
const ROOTS: &[&str] = &["examples", "benches", "src", "engine", "tests"];
/// Kernels that must not compile, on purpose.
const SKIP: &[&str] = &["tests/compile_fail", "engine/target"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        let rel = p.to_string_lossy().replace('\\', "/");
        if SKIP.iter().any(|s| rel.starts_with(s)) {
            continue;
        }
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// One kernel specialization compiled for one target, to assemble.
struct Job {
    what: String,
    target: Target,
    kernel: PtxKernel,
}

#[test]
fn every_kernel_assembles_without_spills() {
    let mut files = Vec::new();
    for r in ROOTS {
        rust_files(Path::new(r), &mut files);
    }
    // Every helper of the walked files, for kernels that call helpers of other modules.
    let elsewhere: Vec<syn::ItemFn> = files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .filter(|src| src.contains("tile_fn"))
        .filter_map(|src| tile_fns(&src).ok())
        .flatten()
        .collect();
    let mut failures = Vec::new();
    let mut jobs = Vec::new();
    let mut kernels = 0;
    let mut divisible_forms = 0;
    for file in &files {
        let src = std::fs::read_to_string(file).unwrap();
        if !src.contains("kernel") {
            continue;
        }
        let found = match find_kernels_with(&src, &elsewhere) {
            Ok(f) => f,
            Err(e) => {
                failures.push(format!("{}: {e}", file.display()));
                continue;
            }
        };
        for k in &found {
            kernels += 1;
            for spec in k.ast.specializations() {
                let consts: Vec<String> = spec
                    .consts
                    .iter()
                    .map(|(n, v)| format!("{n}={v}"))
                    .chain([format!("num_warps={}", spec.num_warps)])
                    .chain(
                        spec.num_stages
                            .filter(|_| k.ast.num_stages.len() > 1)
                            .map(|s| format!("num_stages={s}")),
                    )
                    .collect();
                let what = format!(
                    "{}:{} `{}` ({})",
                    file.display(),
                    k.line,
                    k.name,
                    consts.join(", ")
                );
                let ir = match k.compile(&spec) {
                    Ok((ir, _)) => ir,
                    Err(e) => {
                        failures.push(format!("{what}: {e}"));
                        continue;
                    }
                };
                // The divisible form `#[kernel]` embeds beside it, where there is one.
                let mut forms = vec![(what.clone(), ir)];
                if let Some(params) = specialize::divisible_params(&k.ast, &spec) {
                    let names: Vec<&str> = params
                        .iter()
                        .map(|&i| k.ast.params[i].name.as_str())
                        .collect();
                    let assumed = specialize::assume_divisible(&k.ast, &params);
                    let what = format!("{what} [divisible form: {}]", names.join(", "));
                    divisible_forms += 1;
                    if std::env::var("TILEFUSE_LIST_DIVISIBLE").is_ok() {
                        println!("{what}");
                    }
                    match tilefuse::dsl::compile(&assumed, &spec) {
                        Ok(ir) => forms.push((what, ir)),
                        Err(e) => failures.push(format!("{what}: {e}")),
                    }
                }
                for (what, ir) in forms {
                    // Clustered kernels, and those whose shared memory only sm_90 holds,
                    // need Hopper: the macro embeds no sm_80 PTX for them.
                    let mut hopper_only = ir.cluster_size() > 1;
                    for target in [Target::Sm90, Target::Sm80, Target::Sm90a] {
                        if target == Target::Sm80 && hopper_only {
                            continue;
                        }
                        // sm_90a modules exist for kernels whose `dot` takes `wgmma`.
                        if target == Target::Sm90a && !ir.has_dot() {
                            continue;
                        }
                        match ptx::compile(&ir, target) {
                            Ok(kernel) if target == Target::Sm90a && !kernel.uses_wgmma => {}
                            Ok(kernel) => {
                                if target == Target::Sm90 {
                                    hopper_only |= !ptx::has_sm80_module(&ir, &kernel);
                                }
                                jobs.push(Job {
                                    what: what.clone(),
                                    target,
                                    kernel,
                                })
                            }
                            Err(e) => failures.push(format!("{what} {}: {e}", target.name())),
                        }
                    }
                }
            }
        }
    }
    println!("ptxas_all: {divisible_forms} specializations have a divisible form");
    if let Ok(dir) = std::env::var("TILEFUSE_PTX_DUMP") {
        dump_ptx(Path::new(&dir), &jobs);
    }
    assert!(
        kernels >= 4 && jobs.len() >= 12,
        "found only {kernels} kernels ({} compiled variants): is the working directory the repository root?",
        jobs.len()
    );

    let bin = match ptxas::find() {
        Ok(bin) => Some(bin),
        Err(e) if std::env::var("TILEFUSE_REQUIRE_PTXAS").as_deref() == Ok("1") => {
            panic!("TILEFUSE_REQUIRE_PTXAS=1 but {e}")
        }
        Err(e) => {
            println!("ptxas_all: skipped assembling {} variants: {e}", jobs.len());
            None
        }
    };
    if let Some(bin) = bin {
        // ptxas is single-threaded: one call per core.
        let next = AtomicUsize::new(0);
        let failed = Mutex::new(Vec::new());
        let table = Mutex::new(Vec::new());
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(8));
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    while let Some(job) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let report = ptxas::assemble(&bin, &job.kernel, job.target);
                        if let Ok(r) = &report {
                            table.lock().unwrap().push(format!(
                                "{} {}\t{}\t{}\t{}\t{:016x}",
                                job.what,
                                job.target.name(),
                                r.registers,
                                r.spill_stores,
                                r.spill_loads,
                                ptx_hash(&job.kernel.ptx)
                            ));
                        }
                        let msg = match report {
                            Ok(r) if r.is_clean() => continue,
                            Ok(r) => format!("{}: {r}", job.what),
                            Err(e) => format!("{}: {e}", job.what),
                        };
                        failed.lock().unwrap().push(msg);
                    }
                });
            }
        });
        failures.extend(failed.into_inner().unwrap());
        // For compiler work: every variant's registers and spills, to diff two builds.
        if let Ok(path) = std::env::var("TILEFUSE_PTXAS_TABLE") {
            let mut rows = table.into_inner().unwrap();
            rows.sort();
            rows.insert(
                0,
                "variant\tregisters\tspill stores\tspill loads\tPTX hash".into(),
            );
            std::fs::write(&path, rows.join("\n") + "\n")
                .unwrap_or_else(|e| panic!("TILEFUSE_PTXAS_TABLE={path}: {e}"));
        }
        println!(
            "ptxas_all: {kernels} kernels, {} variants assembled with {}",
            jobs.len(),
            bin.display()
        );
    }
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Writes each job's PTX to `dir`, as `TILEFUSE_PTX_DUMP` asks.
fn dump_ptx(dir: &Path, jobs: &[Job]) {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut index = Vec::new();
    for job in jobs {
        // `file.rs:LINE `name` (..)` without the line, which moves with unrelated edits.
        let key = match job.what.split_once(' ') {
            Some((place, rest)) => {
                let file = place.rsplit_once(':').map_or(place, |(f, _)| f);
                format!("{file} {rest} {}", job.target.name())
            }
            None => format!("{} {}", job.what, job.target.name()),
        };
        let name = format!("{:016x}.ptx", ptx_hash(&key));
        std::fs::write(dir.join(&name), &job.kernel.ptx)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.join(&name).display()));
        index.push(format!("{name}\t{}\t{key}", job.kernel.entry));
    }
    index.sort();
    std::fs::write(dir.join("index.tsv"), index.join("\n") + "\n")
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
}

/// FNV-1a over the PTX text: stable across builds and toolchains, so two tables diff.
fn ptx_hash(ptx: &str) -> u64 {
    ptx.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
