#!/usr/bin/env bash
# Which kernel variants two builds of the compiler assemble to different SASS.
#
#   TILEFUSE_PTX_DUMP=/tmp/a cargo test --release --test ptxas_all   # build A
#   TILEFUSE_PTX_DUMP=/tmp/b cargo test --release --test ptxas_all   # build B
#   scripts/sass_diff.sh /tmp/a /tmp/b
#
# PTX differs for reasons SASS does not (register numbering, moves ptxas drops), so a
# compiler change is checked on what runs: each variant in both dumps is assembled with
# ptxas (TILEFUSE_PTXAS, else `ptxas` on PATH) for its target and disassembled with
# nvdisasm (NVDISASM, else `nvdisasm` on PATH; the `nvidia-cuda-nvdisasm` wheel has one),
# and the instruction text is compared. Prints one line per variant that differs, with
# its instruction counts, then a summary. JOBS (default: the cores) variants at a time.
set -euo pipefail

a=${1:?usage: sass_diff.sh DUMP_A DUMP_B}
b=${2:?usage: sass_diff.sh DUMP_A DUMP_B}
ptxas=${TILEFUSE_PTXAS:-ptxas}
nvdisasm=${NVDISASM:-nvdisasm}
jobs=${JOBS:-$(nproc)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Instructions only: no addresses, encodings, comments or labels.
sass_of() {
    local ptx=$1 arch=$2 out=$3
    "$ptxas" -arch="$arch" "$ptx" -o "$out.cubin"
    "$nvdisasm" -c "$out.cubin" 2>/dev/null |
        sed -e 's@/\*[^*]*\*/@@g' -e 's/;.*$//' -e 's/^[[:space:]]*//' |
        grep -v -e '^$' -e '^\.' -e ':$' >"$out.sass"
}
export -f sass_of
export ptxas nvdisasm

compare_one() {
    local file=$1 key=$2 a=$3 b=$4 work=$5
    local arch=${key##* }
    [[ -f "$b/$file" ]] || { echo "only in A: $key"; return; }
    if cmp -s "$a/$file" "$b/$file"; then
        return
    fi
    sass_of "$a/$file" "$arch" "$work/$file.a"
    sass_of "$b/$file" "$arch" "$work/$file.b"
    if ! cmp -s "$work/$file.a.sass" "$work/$file.b.sass"; then
        echo "SASS differs ($(wc -l <"$work/$file.a.sass") -> $(wc -l <"$work/$file.b.sass") instructions): $key"
    fi
    rm -f "$work/$file".*
}
export -f compare_one

cut -f1,3 "$a/index.tsv" |
    while IFS=$'\t' read -r file key; do
        printf '%s\0%s\0' "$file" "$key"
    done |
    xargs -0 -n 2 -P "$jobs" bash -c 'compare_one "$4" "$5" "$1" "$2" "$3"' \
        _ "$a" "$b" "$work" >"$work/report"
sort "$work/report"
total=$(wc -l <"$a/index.tsv")
differ=$(grep -c '^SASS differs' "$work/report" || true)
echo "sass_diff: $total variants in A, $differ assemble to different SASS in B"
