"""Parameter grids shared by the kernel's tests. Where a width costs a compile on a slow
compiler (Tint on SwiftShader, Chromium), a module samples one width of each class instead.

A grid whose whole product costs CI minutes is thinned (`thinned`): CI runs the rows in which
every pair of values meets (`all_pairs`) or a list the test names; PIPELINE_FULL_GRID=1
(`make test-kernel-full`) runs every row."""

from __future__ import annotations

import itertools
import os

FULL_GRID_ENV = "PIPELINE_FULL_GRID"


def full_grid() -> bool:
    """Whether thinned grids run whole (PIPELINE_FULL_GRID=1: `make test-kernel-full`)."""
    return os.environ.get(FULL_GRID_ENV) == "1"


# Row widths of every class the kernel tells apart: scalar, vec2 and vec4 loads; rows held by
# one thread, by a subgroup, by several subgroups; 768 and 1024 split into 4 vec4 loads a
# thread; rows streamed (wider than 8 values x 256 threads).
WIDTHS = [1, 2, 3, 5, 6, 7, 32, 128, 132, 384, 766, 768, 1023, 1024, 1280, 3072, 4097, 4098]
AFFINE = [(False, False), (True, False), (False, True), (True, True)]  # (has_weight, has_bias)
# The kernel's row-merge paths (the `reduction` fixture of tests/conftest.py).
REDUCTIONS = ["subgroup", "workgroup", "streamed", "streamed-workgroup"]
# (dtype, affine dtype): float32, and each half dtype with weight and bias like x or float32.
DTYPE_PAIRS = [("float32", "float32"), ("float16", "float16"), ("float16", "float32"), ("bfloat16", "bfloat16"),
               ("bfloat16", "float32")]


def thinned(*axes: list, keep: list | None = None) -> list[tuple]:
    """The rows of the product of `axes` that CI runs, in the product's order: those of `keep`
    (default: `all_pairs(*axes)`), or every row under `full_grid()`. Two axes or more;
    values must be hashable."""
    if len(axes) < 2:
        raise ValueError(f"thinned takes two axes or more, got {len(axes)}")
    product = list(itertools.product(*axes))
    kept = set(all_pairs(*axes) if keep is None else keep)
    missing = kept - set(product)
    if missing:
        raise ValueError(f"keep names rows outside the grid: {sorted(missing, key=repr)}")
    return product if full_grid() else [row for row in product if row in kept]


def all_pairs(*axes: list) -> list[tuple]:
    """Rows of one value from each axis in which every pair of values of any two axes meets
    at least once (in-parameter-order): a width meets every reduction path and every affine
    form, a path every affine form, in far fewer rows than the full product. Deterministic.
    The two longest axes are crossed in full; each further axis takes, row by row, the value
    that meets the most pairs not yet met, and rows are added for what is left."""
    order = sorted(range(len(axes)), key=lambda i: -len(axes[i]))
    sizes = [len(axes[i]) for i in order]
    if not sizes or min(sizes) == 0:
        return []
    if len(sizes) == 1:
        rows = [[v] for v in range(sizes[0])]
    else:
        rows = [[a, b] for a in range(sizes[0]) for b in range(sizes[1])]
    for k in range(2, len(sizes)):
        unmet = {(j, vj, vk) for j in range(k) for vj in range(sizes[j]) for vk in range(sizes[k])}
        used = [0] * sizes[k]
        for row in rows:
            best = max(range(sizes[k]), key=lambda v: (sum((j, row[j], v) in unmet for j in range(k)), -used[v]))
            row.append(best)
            used[best] += 1
            unmet -= {(j, row[j], best) for j in range(k)}
        while unmet:
            j, vj, vk = min(unmet)
            row = [None] * k + [vk]
            row[j] = vj
            for other in range(k):
                if row[other] is None:
                    row[other] = next((v for v in range(sizes[other]) if (other, v, vk) in unmet), 0)
            rows.append(row)
            unmet -= {(i, row[i], vk) for i in range(k)}
    # Back to the axes' own order and values.
    position = {axis: n for n, axis in enumerate(order)}
    return [tuple(axes[i][row[position[i]]] for i in range(len(axes))) for row in rows]
