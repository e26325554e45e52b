#!/usr/bin/env bash
# Instructions executed per GEMM on each AArch64 path, counted under qemu-aarch64 (Debian's qemu
# ships no TCG plugins, so no libinsn.so): qemu logs every translated block's instructions
# (`-d in_asm`) and every block it executes (`-d exec`, with chaining off so none is missed);
# their product summed is the executed instruction count. One GEMM is half the difference between
# the example `gemm_reps` doing it three times and once (on one thread, the main one; activation
# quantization included). Address randomisation is off (`setarch -R`) so that the runs, including
# the C library's alignment-dependent paths, repeat exactly.
# These are instruction counts of emulated code, not timings: no ARM machine is available here.
#
# usage: kernels-cpu/count-insns-aarch64.sh [N K [ROWS...]]   (default 512 768 1 8 64)
# needs: Debian's cargo/rustc with the arm64 std, aarch64-linux-gnu-gcc, qemu-aarch64
#        (`.ci/install-test-deps`). Prints a markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 1 ]; then
  echo "usage: $0 [N K [ROWS...]]" >&2
  exit 2
fi
N=${1:-512}
K=${2:-768}
[ $# -eq 0 ] || shift 2
ROWS=("$@")
[ ${#ROWS[@]} -gt 0 ] || ROWS=(1 8 64)
TARGET_DIR=${CARGO_TARGET_DIR_AARCH64:-target/aarch64-insns}
RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc CARGO_TARGET_DIR=$TARGET_DIR \
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
  /usr/bin/cargo build --quiet --release --locked -p kernels-cpu --example gemm_reps \
  --target aarch64-unknown-linux-gnu
EXE=$TARGET_DIR/aarch64-unknown-linux-gnu/release/examples/gemm_reps
# Executed guest instructions of one run (thread 0, the only one).
count() {
  # The log (hundreds of MB for the portable path) goes through a pipe, never to disk.
  setarch "$(uname -m)" -R qemu-aarch64 -cpu max -d in_asm,exec,nochain -D /dev/stderr \
    "$EXE" "$@" 2>&1 >/dev/null | awk '
    function norm(p) { sub(/^0x/, "", p); sub(/^0+/, "", p); return p }
    /^IN:/ { inblk = 1; first = ""; n = 0; next }
    inblk && /^0x[0-9a-f]+:/ { if (first == "") first = norm(substr($1, 1, length($1) - 1)); n++; next }
    inblk && !/^0x/ { if (first != "") size[first] = n; inblk = 0 }
    /^Trace 0: / { split($0, a, "/"); total += size[norm(a[2])] }
    END { printf "%d\n", total }
  '
}

echo "| path | type | rows | instructions | MACs | MACs per instruction |"
echo "|---|---|---:|---:|---:|---:|"
for ty in q4_0 q8_0 q4_k q6_k f32 f16; do
  for path in portable neon neon-dotprod neon-i8mm; do
    case "$ty:$path" in f*:neon-dotprod | f*:neon-i8mm) continue ;; esac
    for m in "${ROWS[@]}"; do
      one=$(count "$path" "$ty" "$N" "$K" "$m" 1)
      three=$(count "$path" "$ty" "$N" "$K" "$m" 3)
      insns=$(((three - one) / 2))
      macs=$((N * K * m))
      echo "| $path | $ty | $m | $insns | $macs | $(awk -v a="$macs" -v b="$insns" 'BEGIN { printf "%.2f", a / b }') |"
    done
  done
done
