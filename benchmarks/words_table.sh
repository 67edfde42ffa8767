#!/bin/bash
# Re-tune the float16 model shapes of a committed layouts table of version 1 (the H200's,
# benchmarks/results/h200-tuned/) now that plain half rows may be read in 16-byte words: the
# table is carried to version 2 (every entry without words), its float16 launches tuned again
# (--append replaces them; float32's stay), then the kernel timed in it beside the same-run
# WGSL copy and torch.compile. Usage: benchmarks/words_table.sh OLD_TABLE OUT_DIR NAME DTYPES
# (PIPELINE_WEBGPU picks wgpu or dawn; DTYPES: which bench_layer_norm runs, e.g. "float16 float32").
set -euo pipefail
old=$1 out=$2 name=$3 dtypes=$4
table=$out/$name.txt
if [ ! -e "$table" ]; then
  sed -e 's/^pipeline-layouts 1$/pipeline-layouts 2/' -e 's/^\(layout .*\) \([0-9.]*\)$/\1 0 \2/' \
      -e 's/workgroup gain$/workgroup wide_words gain/' "$old" > "$table"
  python3 scripts/tune_layouts.py --shapes model --dtype float16 --rounds 3 --out "$table" --append 2>&1 \
    | tee "$out/$name-tune.log"
fi
for dtype in $dtypes; do
  PIPELINE_LAYOUTS=$table python3 scripts/bench_layer_norm.py --shapes model --dtype "$dtype" --repeats 200 \
    --json "$out/$name-bench-$dtype.json" 2>&1 | tee "$out/$name-bench-$dtype.log"
done
