#!/bin/bash
# Run 28: a committed layouts table of version 1 (the H200's, benchmarks/results/h200-tuned/)
# carried to version 2 (every entry without 16-byte words), its float16 launches tuned again
# now that plain half rows may be read in words (float32's stay), then benchmarked.
# Usage: benchmarks/words_table.sh OLD_TABLE OUT_DIR NAME DTYPES (DTYPES: which dtypes
# bench_layer_norm runs, e.g. "float16 float32"; PIPELINE_WEBGPU picks wgpu or dawn).
set -euo pipefail
old=$1 out=$2 name=$3
carried=$(mktemp)
trap 'rm -f "$carried"' EXIT
sed -e 's/^pipeline-layouts 1$/pipeline-layouts 2/' -e 's/^\(layout .*\) \([0-9.]*\)$/\1 0 \2/' \
    -e 's/workgroup gain$/workgroup wide_words gain/' "$old" > "$carried"
FROM=$carried TUNE_DTYPES=float16 BENCH_DTYPES=$4 benchmarks/tuned_layouts.sh "$out" "$name"
