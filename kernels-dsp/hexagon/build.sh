#!/usr/bin/env bash
# Cross-compiles kernels-dsp for the Hexagon ISA with Debian's clang (no Hexagon SDK):
#   - v73: the kernels (integer HVX paths, serial worker pool) + the freestanding test driver,
#     linked into a static binary that runs under `qemu-hexagon -cpu v73`;
#   - v73, v75, v79, v81: compile checks of the kernels, both the integer-HVX build and the
#     HVX-float build (-DKDSP_HVX_FLOAT=1 -mhvx-qfloat), with the newest clang that accepts the CPU.
#     QEMU cannot execute HVX float (or HMX), so those builds are compile-checked only.
#
# Usage: hexagon/build.sh OUT_DIR [--run SEED]
# Writes OUT_DIR/report.txt with one line per target:
#   BUILT <cpu> <compiler> <binary>      COMPILED <cpu> <variant> <compiler>
#   SKIPPED <cpu> <reason>
# Exit status: 0 ok, 1 a compile/link failed, 3 no usable Hexagon toolchain (see README).
# KDSP_HEXAGON_CLANGS overrides the compilers tried (space separated, newest first).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
out="${1:?usage: hexagon/build.sh OUT_DIR [--run SEED]}"
mkdir -p "$out"
report="$out/report.txt"
: >"$report"

srcs=(dispatch.c tensor.c worker_pool.c matmul_f16_ops.c matmul_q4_ops.c flash_attn_ops.c
      norm_ops.c elementwise_ops.c quant_ops.c layout_ops.c rows_ops.c)
candidates=(${KDSP_HEXAGON_CLANGS:-clang-22 clang-21 clang-20 clang-19 clang})
common=(--target=hexagon-unknown-linux-musl -mhvx -mhvx-length=128b -O2 -std=c11 -ffreestanding
        -ffp-contract=off -fno-trapping-math -Wall -Wextra -Werror -I"$root/include" -I"$root/src" -DKDSP_POOL_SERIAL)

probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
echo 'int kdsp_probe(int x) { return x + 1; }' >"$probe_dir/probe.c"

# First compiler (newest first) that accepts -mcpu=hexagon<cpu>.
pick_clang() {
    local cpu="$1" cc
    for cc in "${candidates[@]}"; do
        command -v "$cc" >/dev/null 2>&1 || continue
        if "$cc" --target=hexagon-unknown-linux-musl -mcpu="hexagon$cpu" -mhvx -mhvx-length=128b \
            -c "$probe_dir/probe.c" -o "$probe_dir/probe.o" >/dev/null 2>&1; then
            echo "$cc"
            return 0
        fi
    done
    return 1
}

# The lld that ships with a given clang-NN (ld.lld-NN), else plain ld.lld.
pick_lld() {
    local cc="$1" ver
    ver="${cc##*-}"
    if [ "$ver" != "$cc" ] && command -v "ld.lld-$ver" >/dev/null 2>&1; then
        command -v "ld.lld-$ver"
    elif command -v ld.lld >/dev/null 2>&1; then
        command -v ld.lld
    else
        return 1
    fi
}

any_clang=""
for cc in "${candidates[@]}"; do
    if command -v "$cc" >/dev/null 2>&1; then any_clang="$cc"; break; fi
done
if [ -z "$any_clang" ] || ! pick_clang v73 >/dev/null; then
    echo "hexagon/build.sh: no clang with the Hexagon target (tried: ${candidates[*]}); install clang-19 lld-19 (see README)" >&2
    exit 3
fi

failed=0

compile_variant() { # cpu variant cc extra-flags...
    local cpu="$1" variant="$2" cc="$3"
    shift 3
    local dir="$out/$cpu-$variant"
    mkdir -p "$dir"
    local log="$dir/compile.log"
    : >"$log"
    local ok=1 s
    for s in "${srcs[@]}"; do
        if ! "$cc" "${common[@]}" -mcpu="hexagon$cpu" "$@" -c "$root/src/$s" -o "$dir/${s%.c}.o" >>"$log" 2>&1; then
            ok=0
        fi
    done
    if [ "$ok" = 1 ]; then
        echo "COMPILED $cpu $variant $cc" | tee -a "$report"
    else
        echo "FAILED $cpu $variant $cc (see $log)" | tee -a "$report"
        cat "$log" >&2
        failed=1
    fi
}

# 1. the runnable v73 binary
cc73="$(pick_clang v73)"
if lld="$(pick_lld "$cc73")"; then
    compile_variant v73 hvx-int "$cc73"
    dir="$out/v73-hvx-int"
    "$cc73" "${common[@]}" -mcpu=hexagonv73 -c "$here/driver.c" -o "$dir/driver.o"
    "$cc73" "${common[@]}" -mcpu=hexagonv73 -fno-builtin -c "$here/rt.c" -o "$dir/rt.o"
    bin="$out/kdsp_driver_v73"
    if "$cc73" --target=hexagon-unknown-linux-musl -mcpu=hexagonv73 -nostdlib -static -fuse-ld=lld \
        --ld-path="$lld" "$dir"/*.o -o "$bin"; then
        echo "BUILT v73 $cc73 $bin" | tee -a "$report"
    else
        echo "FAILED v73 link $cc73" | tee -a "$report"
        failed=1
    fi
else
    echo "hexagon/build.sh: no ld.lld for $cc73; install lld-19 (see README)" >&2
    exit 3
fi

# 2. compile checks, including the HVX-float paths QEMU cannot run
for cpu in v73 v75 v79 v81; do
    if cc="$(pick_clang "$cpu")"; then
        [ "$cpu" = v73 ] || compile_variant "$cpu" hvx-int "$cc"
        compile_variant "$cpu" hvx-float "$cc" -mhvx-qfloat -DKDSP_HVX_FLOAT=1
    else
        tried=""
        for c in "${candidates[@]}"; do
            command -v "$c" >/dev/null 2>&1 && tried="$tried $c"
        done
        echo "SKIPPED $cpu no installed clang accepts -mcpu=hexagon$cpu (installed:${tried:- none}; clang-19 stops at hexagonv73, clang-22 adds v75..v81)" | tee -a "$report"
    fi
done

if [ "${2:-}" = "--run" ]; then
    qemu-hexagon -cpu v73 "$out/kdsp_driver_v73" "${3:-1}"
fi
exit "$failed"
