"""The verdict for a file run in ExecuTorch's runtime: held against the same model run
there without our delegate, not against eager.

ExecuTorch's CPU kernels sum a linear's K products in sequence (portable equals a
sequential float32 sum; XNNPACK matches it), so their error against float64 grows about
as sqrt(K) where eager's stays flat: one nn.Linear's relative L2 error is 1.41x eager's at
K=384, 1.96x at 768, 2.76x at 1536, 3.8x at 3072 (portable and XNNPACK alike;
benchmarks/linear_error_by_k.py), with or without our delegate in the program. A fixed
multiple of eager measures ExecuTorch's matmuls, not us.

The reference is the same model exported with the same CPU backend and the same graph
passes, but no WebGPU delegate, run in ExecuTorch's runtime on the same inputs. The file
passes when its outputs are finite and, against eager float64:
- relative L2 error <= 1.1 x the reference's,
- max abs error <= 1.5 x the reference's,
and every WebGPU delegate call's outputs are bit-identical to the Python runtime's
delegate run on the same inputs (captured in ExecuTorch's runtime by the native backend).
Eager float32's errors are reported beside them, and for each call its input's statistics
and its error against float64 LayerNorm of that input beside eager's (`layer_norm_input`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import torch

from pipeline.evaluation.eager import run_eager, to_float64
from pipeline.evaluation.layer_norm_input import check_layer_norm_input
from pipeline.evaluation.metrics import compare, flatten_output

REL_L2_FACTOR = 1.1
MAX_ABS_FACTOR = 1.5
RULE = (f"ExecuTorch's runtime: relative L2 <= {REL_L2_FACTOR:g}x and max abs <= {MAX_ABS_FACTOR:g}x those of the "
        "same model exported with the same CPU backend and no WebGPU delegate, both against float64; LayerNorm "
        "outputs bit-identical to the Python runtime's")


def reference_buffer(spec, cpu_backend: str) -> bytes:
    """The same model as an exported file of `spec` with `cpu_backend`, without the WebGPU
    delegate: the same export, graph passes and constant folding, the CPU backend's
    partitioners only."""
    from pipeline.aot.lowering import export_for_cpu_backend, lower_exported

    exported, partitioners = export_for_cpu_backend(spec.module, spec.example_inputs, spec.dynamic_shapes,
                                                    cpu_backend)
    return lower_exported(exported, partitioners).to_executorch().buffer


def run_in_executorch(buffer: bytes, inputs: Sequence) -> list:
    """`buffer` (such as the reference) loaded in ExecuTorch's runtime as
    `pipeline.native.load` loads a file, and run once."""
    from pipeline.native.trace import TracedProgram

    with TracedProgram(buffer) as program:
        return program(*inputs)


def webgpu_call_order(pte) -> list[int]:
    """The plan's WebGPU delegate indices in the order its instructions call them. Raises
    ValueError when the order is not fixed (jumps or several chains)."""
    from pipeline.blob import BACKEND_ID

    plan = pte.plan
    if len(plan.chains) != 1 or any(hasattr(i.instr_args, "destination_instruction")
                                    for i in plan.chains[0].instructions):
        raise ValueError("the program's delegate calls have no fixed order (control flow): LayerNorm outputs "
                         "cannot be paired with the Python runtime's")
    return [i.instr_args.delegate_index for i in plan.chains[0].instructions
            if hasattr(i.instr_args, "delegate_index") and plan.delegates[i.instr_args.delegate_index].id == BACKEND_ID]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.is_floating_point() else t


def layer_norm_identity(pte, calls: list[list[torch.Tensor | None]]) -> list[dict[str, Any]]:
    """Each captured WebGPU delegate call against the Python runtime's delegate (same blob,
    same inputs): whether every output is bit-identical, the largest difference, and the
    call's input with the errors on it (`check_layer_norm_input`)."""
    from pipeline.runtime.delegate import LayerNormDelegate

    order = webgpu_call_order(pte)
    if len(order) != len(calls):
        raise ValueError(f"{len(calls)} WebGPU delegate calls captured, the plan makes {len(order)}")
    delegates: dict[int, LayerNormDelegate] = {}
    rows = []
    for k, (index, call) in enumerate(zip(order, calls)):
        if index not in delegates:
            delegates[index] = LayerNormDelegate(pte.delegate_bytes(pte.plan.delegates[index]))
        delegate = delegates[index]
        n_in = delegate.params.arguments
        got = call[n_in:]
        want = delegate(*call[:n_in])
        identical = len(got) == len(want) and all(
            g is not None and g.dtype == w.dtype and g.shape == w.shape and torch.equal(_bits(g), _bits(w))
            for g, w in zip(got, want))
        diff = max((float((g.double() - w.double()).abs().max()) if g.numel() else 0.0)
                   for g, w in zip(got, want) if g is not None and g.shape == w.shape)
        x = call[delegate.params.input_index]
        rows.append({"call": k, "delegate": index, "input_shape": list(x.shape), "dtype": str(x.dtype)[6:],
                     "identical": identical, "max_abs_difference": diff,
                     "input": asdict(check_layer_norm_input(delegate, call[:n_in], got))})
    return rows


def _errors(output, reference: torch.Tensor) -> dict[str, Any]:
    c = compare(flatten_output(output), reference)
    return {"rel_l2": c["rel_l2"], "max_abs": c["max_abs"], "cosine": c["cosine"], "sqnr_db": c["sqnr_db"],
            "finite": c["finite"]}


def evaluate_in_executorch(pte_path, summary: dict, spec, inputs: Sequence | None = None,
                           progress: Callable[[str], None] = lambda line: None,
                           eager: tuple | None = None, data: bytes | None = None,
                           outputs: dict | None = None) -> dict[str, Any]:
    """Run the exported file `pte_path` in ExecuTorch's runtime (capturing its WebGPU
    delegate calls), its no-delegate reference there, eager (at the file's dtype) and eager
    float64, on the example inputs of `spec` (or `inputs`); return the errors, the
    per-LayerNorm identity and the verdict (`passed`, `why` when not). `eager` passes the
    two eager outputs when the caller has them already; `data`, the file's bytes when the
    caller has read (and checked) them: those run, the path is not read again. Without it
    the file is read once here. `outputs`, a dict, receives the outputs compared: "delegated"
    (the file's, in ExecuTorch's runtime), "eager" and "fp64"."""
    from pipeline.pte.file import PteFile, read_private
    from pipeline.native.trace import TracedProgram

    if data is None:
        data = read_private(pte_path)
    inputs = tuple(spec.example_inputs if inputs is None else inputs)
    cpu_backend = summary.get("cpu_backend", "portable")
    progress(f"running {pte_path} in ExecuTorch's runtime, capturing its LayerNorm delegate calls")
    with TracedProgram(data, capture=True, source=str(pte_path)) as program:
        file_outputs = program(*inputs)
        calls = program.captured_calls()
    progress(f"exporting the reference: the same model with {cpu_backend}, no WebGPU delegate")
    started = time.perf_counter()
    reference_file = reference_buffer(spec, cpu_backend)
    export_seconds = time.perf_counter() - started
    progress("running the reference in ExecuTorch's runtime")
    reference_out = run_in_executorch(reference_file, inputs)
    if eager is None:
        progress("running eager and eager float64")
        eager = (run_eager(spec.module, inputs, keep_tensors=False).outputs,
                 run_eager(*to_float64(spec.module, inputs), keep_tensors=False).outputs)
    exact = flatten_output(eager[1])
    progress("re-running each captured LayerNorm call in the Python runtime")
    layer_norms = layer_norm_identity(PteFile(data, str(pte_path)), calls)

    if outputs is not None:
        outputs.update(delegated=file_outputs, eager=eager[0], fp64=eager[1])
    file_err, ref_err, eager_err = (_errors(file_outputs, exact), _errors(reference_out, exact),
                                    _errors(eager[0], exact))
    rel_ratio = file_err["rel_l2"] / ref_err["rel_l2"] if ref_err["rel_l2"] > 0 else float("inf")
    abs_ratio = file_err["max_abs"] / ref_err["max_abs"] if ref_err["max_abs"] > 0 else float("inf")
    different = [r["call"] for r in layer_norms if not r["identical"]]
    why = []
    if not file_err["finite"]:
        why.append("outputs are not finite")
    if not rel_ratio <= REL_L2_FACTOR:
        why.append(f"relative L2 error {rel_ratio:.3g}x the reference's (limit {REL_L2_FACTOR:g}x)")
    if not abs_ratio <= MAX_ABS_FACTOR:
        why.append(f"max abs error {abs_ratio:.3g}x the reference's (limit {MAX_ABS_FACTOR:g}x)")
    if different:
        why.append(f"LayerNorm call(s) {different[:5]} differ from the Python runtime's")
    return {
        "rule": RULE,
        "cpu_backend": cpu_backend,
        "dtype": summary.get("dtype", "float32"),
        "file_vs_fp64": file_err,
        "reference_vs_fp64": ref_err,
        "eager_vs_fp64": eager_err,
        "rel_l2_ratio": rel_ratio,
        "max_abs_ratio": abs_ratio,
        "rel_l2_factor": REL_L2_FACTOR,
        "max_abs_factor": MAX_ABS_FACTOR,
        "reference_export_seconds": round(export_seconds, 2),
        "layer_norms": layer_norms,
        "layer_norms_identical": not different,
        "passed": not why,
        "why": "; ".join(why),
    }


def verdict_lines(v: dict[str, Any]) -> list[str]:
    """The verdict's numbers, as run_pte and the report print them."""
    f, r, e = v["file_vs_fp64"], v["reference_vs_fp64"], v["eager_vs_fp64"]
    same = sum(row["identical"] for row in v["layer_norms"])
    return [
        f"vs float64: rel L2 {f['rel_l2']:.3g}, max abs {f['max_abs']:.3g} (this file)",
        f"            rel L2 {r['rel_l2']:.3g}, max abs {r['max_abs']:.3g} (reference: {v['cpu_backend']}, "
        "no WebGPU delegate, ExecuTorch's runtime)",
        f"            rel L2 {e['rel_l2']:.3g}, max abs {e['max_abs']:.3g} (eager {v.get('dtype', 'float32')})",
        f"file / reference: rel L2 {v['rel_l2_ratio']:.3f}x (limit {v['rel_l2_factor']:g}x), max abs "
        f"{v['max_abs_ratio']:.3f}x (limit {v['max_abs_factor']:g}x); file / eager: rel L2 "
        f"{f['rel_l2'] / e['rel_l2']:.2f}x, max abs {f['max_abs'] / e['max_abs']:.2f}x",
        f"LayerNorm delegate calls bit-identical to the Python runtime's: {same}/{len(v['layer_norms'])}",
    ]


def report_markdown(data: dict[str, Any]) -> str:
    """The accuracy report of a file run in ExecuTorch's runtime, as Markdown."""
    from pipeline.evaluation.render import INPUT_NOTE
    from pipeline.evaluation.report import markdown_table

    v = data["accuracy"]
    lines = [f"# Accuracy in ExecuTorch's runtime: {data['model']}-{data['variant']}", "",
             f"file: `{data['program']['pte']}` (sha256 {data['program']['pte_sha256'][:16]}...)", "",
             f"verdict: **{data['verdict']}**{'' if v['passed'] else ' (' + v['why'] + ')'}", "",
             f"rule: {v['rule']}", "", "```", *verdict_lines(v), "```", "",
             "## Errors against eager float64", "",
             markdown_table(["run", "rel L2", "max abs", "cosine", "SQNR dB"], _error_rows(v)), "",
             "## LayerNorm delegate calls: ExecuTorch's runtime vs the Python runtime, same inputs", "",
             markdown_table(["call", "delegate", "input shape", "dtype", "bit-identical", "max abs difference"],
                            _layer_norm_rows(v)), "",
             "## LayerNorm inputs in ExecuTorch's runtime", "", INPUT_NOTE, "",
             markdown_table(*_input_table(v)), ""]
    from pipeline.evaluation.render import transcripts_markdown

    lines[lines.index("## Errors against eager float64"):lines.index("## Errors against eager float64")] = (
        transcripts_markdown(data))
    return "\n".join(lines)


def report_html(data: dict[str, Any]) -> str:
    """The same report as one self-contained page."""
    import html

    from pipeline.evaluation.render import INPUT_NOTE
    from pipeline.evaluation.report import html_page, html_table

    v = data["accuracy"]
    verdict = (f"<h2 class='{'pass' if v['passed'] else 'fail'}'>{html.escape(data['verdict'])}</h2>"
               f"<p>{html.escape(v['why'])}</p><p>rule: {html.escape(v['rule'])}</p>"
               f"<pre>{html.escape(chr(10).join(verdict_lines(v)))}</pre>")
    from pipeline.evaluation.render import transcripts_html

    return html_page(f"Accuracy in ExecuTorch's runtime: {data['model']}-{data['variant']}", [
        verdict,
        *transcripts_html(data),
        "<h2>Errors against eager float64</h2>",
        html_table(["run", "rel L2", "max abs", "cosine", "SQNR dB"], _error_rows(v)),
        "<h2>LayerNorm delegate calls: ExecuTorch's runtime vs the Python runtime</h2>",
        html_table(["call", "delegate", "input shape", "dtype", "bit-identical", "max abs difference"],
                   _layer_norm_rows(v)),
        "<h2>LayerNorm inputs in ExecuTorch's runtime</h2>",
        f"<p>{html.escape(INPUT_NOTE)}</p>",
        html_table(*_input_table(v)),
    ])


def report_line(data: dict[str, Any]) -> str:
    v = data["accuracy"]
    same = sum(row["identical"] for row in v["layer_norms"])
    return (f"{data['model']:<10} {data['verdict']:<5} executorch/{v['cpu_backend']}: rel L2 {v['rel_l2_ratio']:.3f}x "
            f"and max abs {v['max_abs_ratio']:.3f}x the no-delegate reference's (limits {v['rel_l2_factor']:g}x, "
            f"{v['max_abs_factor']:g}x); eager's rel L2 {v['eager_vs_fp64']['rel_l2']:.3g} vs the file's "
            f"{v['file_vs_fp64']['rel_l2']:.3g}; LayerNorms bit-identical {same}/{len(v['layer_norms'])}"
            + _transcripts_count(data))


def _transcripts_count(data: dict[str, Any]) -> str:
    rows = data.get("transcripts", {}).get("utterances")
    return "" if rows is None else f"; transcripts {sum(r['tokens_identical'] for r in rows)}/{len(rows)} identical"


def _error_rows(v: dict[str, Any]) -> list[list[object]]:
    return [[name, e["rel_l2"], e["max_abs"], e["cosine"], e["sqnr_db"]] for name, e in (
        ("this file (ExecuTorch's runtime)", v["file_vs_fp64"]),
        (f"reference ({v['cpu_backend']}, no WebGPU delegate)", v["reference_vs_fp64"]),
        (f"eager {v.get('dtype', 'float32')}", v["eager_vs_fp64"]))]


def _layer_norm_rows(v: dict[str, Any]) -> list[list[object]]:
    return [[r["call"], r["delegate"], "x".join(map(str, r["input_shape"])), r["dtype"],
             "yes" if r["identical"] else "NO", r["max_abs_difference"]] for r in v["layer_norms"]]


def _input_table(v: dict[str, Any]) -> tuple[list[str], list[list[object]]]:
    """Each call's input statistics and the errors on that input."""
    from pipeline.evaluation.render import eager_label, input_cells, input_headers

    eager = eager_label({"dtype": v.get("dtype", "float32")})
    return (["call", "delegate", *input_headers(eager)],
            [[r["call"], r["delegate"], *input_cells(r.get("input"))] for r in v["layer_norms"]])
