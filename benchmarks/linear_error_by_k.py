"""One nn.Linear's error against float64 as its K grows: eager float32 against ExecuTorch's
runtime (portable kernels; XNNPACK). Why files run in ExecuTorch's runtime are held against
ExecuTorch's own error on the same model, not a multiple of eager's.

    python benchmarks/linear_error_by_k.py [--ks 384,768,1536,3072] [--rows 256] [--out-features 256]

Prints, per K, the relative L2 and max abs error of each against eager float64 and the
ratio to eager float32's (seeded inputs and weights, the default init of nn.Linear).
"""

from __future__ import annotations

import argparse
import sys

import torch

from pipeline.evaluation.metrics import compare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default="384,768,1536,3072")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--out-features", type=int, default=256)
    args = parser.parse_args(argv)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner  # after --help
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    print("K     run        rel L2    x eager   max abs   x eager")
    for k in map(int, args.ks.split(",")):
        torch.manual_seed(k)
        linear = torch.nn.Linear(k, args.out_features).eval()
        x = torch.randn(args.rows, k)
        with torch.no_grad():
            exact = linear.double()(x.double())
            linear.float()
            eager = compare(linear(x), exact)
        rows = [("eager", eager)]
        for name, partitioners in (("portable", []), ("xnnpack", [XnnpackPartitioner()])):
            buffer = to_edge_transform_and_lower(torch.export.export(linear, (x,)),
                                                 partitioner=partitioners).to_executorch().buffer
            program = Runtime.get().load_program(buffer)  # kept alive while its method runs
            rows.append((name, compare(program.load_method("forward").execute([x])[0], exact)))
        for name, c in rows:
            print(f"{k:<5} {name:<10} {c['rel_l2']:.3g}  {c['rel_l2'] / eager['rel_l2']:6.2f}x   "
                  f"{c['max_abs']:.3g}  {c['max_abs'] / eager['max_abs']:6.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
