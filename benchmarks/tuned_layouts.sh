#!/bin/bash
# Tune the kernel's layouts for the model shapes on this device (float16, then float32 into
# the same table), then time the kernel in them beside the same-run WGSL copy and
# torch.compile: bench_layer_norm.py's model shapes, as docs/measurements.md quotes them.
# Usage: benchmarks/tuned_layouts.sh OUT_DIR NAME  (PIPELINE_WEBGPU picks wgpu or dawn)
set -euo pipefail
out=$1 name=$2
table=$out/$name.txt
python3 scripts/tune_layouts.py --shapes model --dtype float16 --rounds 3 --out "$table" 2>&1 | tee "$out/$name-tune.log"
python3 scripts/tune_layouts.py --shapes model --dtype float32 --rounds 3 --out "$table" --append 2>&1 | tee -a "$out/$name-tune.log"
for dtype in float16 float32; do
  PIPELINE_LAYOUTS=$table python3 scripts/bench_layer_norm.py --shapes model --dtype $dtype --repeats 200 \
    --json "$out/$name-bench-$dtype.json" 2>&1 | tee "$out/$name-bench-$dtype.log"
done
