#!/bin/bash
# Run 30 (issue 30, item 3): float16 at 4 MB or more beside the same-run WGSL copy. The
# committed table of run 28 (benchmarks/results/h200-words/) has its float16 launches of 4 MB
# or more tuned again in 5 rounds with a 1% threshold, then the kernel is benchmarked in the
# new table in 3 interleaved rounds with the copy, then timed beside the exact floors
# (probe_half_floor.py). Each step is cut off at its share of one 10-minute device call; what
# it wrote stays. Usage: benchmarks/half_at_copy.sh wgpu|dawn OUT_DIR
set -uo pipefail
impl=$1 out=$2
export PIPELINE_WEBGPU=$impl
shapes=4096x768,4096x1024,36864x128,9216x256,73728x128,18432x256,4608x512,4096x3072,8192x1024
table=$out/h200-$impl.txt
SECONDS=0
FROM=benchmarks/results/h200-words/h200-$impl.txt SHAPES=$shapes TUNE_DTYPES=float16 ROUNDS=5 MIN_GAIN=1.01 \
  BENCH_DTYPES= timeout 280 benchmarks/tuned_layouts.sh "$out" "h200-$impl"
echo "tuned in $SECONDS s"
PIPELINE_LAYOUTS=$table timeout 200 python3 scripts/bench_layer_norm.py --shapes model --dtype float16 \
  --repeats 200 --rounds 3 --json "$out/h200-$impl-bench-float16.json" 2>&1 | tee "$out/h200-$impl-bench-float16.log"
echo "benchmarked by $SECONDS s"
PIPELINE_LAYOUTS=$table timeout $((560 - SECONDS)) python3 benchmarks/probe_half_floor.py --dtypes float16 \
  --rounds 3 --variants kernel,floor_kernel,floor_wide --json "$out/probe-$impl-30.json" 2>&1 | tee "$out/probe-$impl-30.log"
echo "probed by $SECONDS s"
