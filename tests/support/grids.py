"""Parameter grids shared by the kernel's tests. Where a width costs a compile on a slow
compiler (Tint on SwiftShader, Chromium), a module samples one width of each class instead."""

from __future__ import annotations

# Row widths of every class the kernel tells apart: scalar, vec2 and vec4 loads; rows held by
# one thread, by a subgroup, by several subgroups; 768 and 1024 split into 4 vec4 loads a
# thread; rows streamed (wider than 8 values x 256 threads).
WIDTHS = [1, 2, 3, 5, 6, 7, 32, 128, 132, 384, 766, 768, 1023, 1024, 1280, 3072, 4097, 4098]
AFFINE = [(False, False), (True, False), (False, True), (True, True)]  # (has_weight, has_bias)
# (dtype, affine dtype): float32, and each half dtype with weight and bias like x or float32.
DTYPE_PAIRS = [("float32", "float32"), ("float16", "float16"), ("float16", "float32"), ("bfloat16", "bfloat16"),
               ("bfloat16", "float32")]
