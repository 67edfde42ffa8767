#!/bin/bash
# Tune the kernel's layouts for the model shapes on this device, then time the kernel in them
# beside the same-run WGSL copy and torch.compile: bench_layer_norm.py's model shapes, as
# docs/measurements.md quotes them. Usage: benchmarks/tuned_layouts.sh OUT_DIR NAME
# (PIPELINE_WEBGPU picks wgpu or dawn). Knobs, in the environment:
#   FROM          a table of this device to start from (copied; the tuned launches replace its own)
#   SHAPES        what to tune (tune_layouts.py --shapes; default model)
#   TUNE_DTYPES   the dtypes tuned, in turn (default "float16 float32"; "" tunes nothing)
#   ROUNDS        tuning rounds per shape (default 3); MIN_GAIN (default: tune_layouts.py's)
#   BENCH_DTYPES  the dtypes benchmarked (default "float16 float32"); BENCH_SHAPES (default model)
#   BENCH_ROUNDS  bench_layer_norm.py --rounds (default 1)
set -euo pipefail
out=$1 name=$2
table=$out/$name.txt
if [ -n "${FROM:-}" ]; then cp "$FROM" "$table" && python3 scripts/tune_layouts.py --twin "$table"; fi
for dtype in ${TUNE_DTYPES-float16 float32}; do
  append=() && [ -e "$table" ] && append=(--append)
  python3 scripts/tune_layouts.py --shapes "${SHAPES:-model}" --dtype "$dtype" --rounds "${ROUNDS:-3}" \
    ${MIN_GAIN:+--min-gain "$MIN_GAIN"} --out "$table" "${append[@]}" 2>&1 | tee -a "$out/$name-tune.log"
done
for dtype in ${BENCH_DTYPES-float16 float32}; do
  PIPELINE_LAYOUTS=$table python3 scripts/bench_layer_norm.py --shapes "${BENCH_SHAPES:-model}" --dtype "$dtype" --repeats 200 \
    --rounds "${BENCH_ROUNDS:-1}" --json "$out/$name-bench-$dtype.json" 2>&1 | tee "$out/$name-bench-$dtype.log"
done
