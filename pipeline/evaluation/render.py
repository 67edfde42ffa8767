"""Coverage audit and accuracy report as Markdown, HTML and a one-screen summary."""

from __future__ import annotations

import html

from pipeline.evaluation.layer_norm_input import OUTLIER_SIGMAS
from pipeline.evaluation.report import Flagged, error_plot, fmt, html_page, html_table, markdown_table, png_img

_COVERAGE_HEADERS = ["#", "module", "input shape", "row width", "affine", "origin", "delegated", "reason"]


def _title(data: dict, kind: str) -> str:
    variant = f" ({data['variant']})" if data.get("variant") else ""
    return f"{kind}: {data['model']}{variant}"


def _env_lines(env: dict) -> list[str]:
    versions = ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items())
    return [
        f"adapter: {env.get('adapter', '?')} ({env.get('backend', '?')})",
        f"cpu: {env.get('cpu', '?')}",
        f"seed: {env.get('seed')}",
        f"versions: {versions}",
    ]


def _weights_lines(data: dict) -> list[str]:
    weights = data.get("weights")
    if weights is None:
        return []
    if weights["checkpoint"] is None:
        return ["weights: seeded random"]
    line = (f"weights: checkpoint {weights['checkpoint']} ({weights['format']}, {weights['stored']} weights; "
            f"sha256 {weights['sha256']})")
    return [line]


def _coverage_rows(data: dict) -> list[list[object]]:
    return [
        [i, r["module_path"] or "<root>", "x".join(str(d) for d in r["input_shape"]), r["row_width"],
         r["affine"], r["origin"], "yes" if r["delegated"] else "NO", r["reason"]]
        for i, r in enumerate(data["layer_norms"])
    ]


def _coverage_summary(data: dict) -> list[str]:
    c = data["coverage"]
    lines = [
        f"verdict: {data['verdict']}",
        f"eager calls: {c['eager_calls']} {c['eager_by_op']}  graph ops: {c['graph_ops']}  "
        f"delegated: {c['delegated']}",
    ]
    if c.get("by_kind"):
        lines.append("by kind: " + kinds_text(c["by_kind"]))
    lines += [f"norm-like chain left on the CPU: {m}" for m in data.get("norm_like", [])]
    lines += [f"eager call missing from graph: {m}" for m in data["missing_from_graph"]]
    lines += [f"dead code (output unused, removed by lowering): {m}" for m in data.get("dead_code", [])]
    lines += [f"note: {n}" for n in data["notes"]]
    return lines


def _markdown(data: dict, kind: str, summary: list[str], body: list[str]) -> str:
    parts = [f"# {_title(data, kind)}", ""]
    parts += [f"- {line}" for line in summary + _weights_lines(data) + _env_lines(data["environment"])]
    return "\n".join(parts + ["", *body, ""])


def _html(data: dict, kind: str, passed: bool, summary: list[str], sections: list[str]) -> str:
    items = "".join(f"<li>{html.escape(line)}</li>" for line in summary + _weights_lines(data)
                    + _env_lines(data["environment"]))
    verdict = f"<h2 class='{'pass' if passed else 'fail'}'>{html.escape(data['verdict'])}</h2><ul>{items}</ul>"
    return html_page(_title(data, kind), [verdict, *sections])


def coverage_markdown(data: dict) -> str:
    return _markdown(data, "Coverage audit", _coverage_summary(data),
                     [markdown_table(_COVERAGE_HEADERS, _coverage_rows(data))])


def coverage_html(data: dict) -> str:
    return _html(data, "Coverage audit", data["verdict"] == "complete", _coverage_summary(data),
                 [html_table(_COVERAGE_HEADERS, _coverage_rows(data))])


def kinds_text(by_kind: dict) -> str:
    """Delegated of found, per norm kind, with eager's calls where eager runs the kind as one
    op: "LayerNorm 3/3 (eager 3), RMSNorm 5/5"."""
    return ", ".join(f"{kind} {c['delegated']}/{c['graph']}" + ("" if c["eager"] is None else f" (eager {c['eager']})")
                     for kind, c in by_kind.items())


def coverage_line(data: dict) -> str:
    c = data["coverage"]
    kinds = f"  [{kinds_text(c['by_kind'])}]" if c.get("by_kind") else ""
    return (f"{data['model']:<10} {data['verdict']:<10} eager {c['eager_calls']:>3}  graph {c['graph_ops']:>3}  "
            f"delegated {c['delegated']:>3}{kinds}")


def _accuracy_headers(data: dict) -> list[str]:
    eager = eager_label(data["accuracy"])
    short = eager.removeprefix("eager ")
    return ["#", "module", "origin", "row width", "delegated vs fp64", f"delegated vs {short}",
            f"{eager} vs fp64", "note"]


def _accuracy_rows(data: dict) -> list[list[object]]:
    return [
        [i, e["module_path"] or "<root>", e["origin"], e["row_width"], e["delegated_vs_fp64"],
         e["delegated_vs_fp32"], e["eager_fp32_vs_fp64"], e["note"]]
        for i, e in enumerate(data["layer_norms"])
    ]


def _accuracy_summary(data: dict) -> list[str]:
    a = data["accuracy"]
    d, e = a["delegated_vs_fp64"], a["eager_fp32_vs_fp64"]
    worst = a["worst_layer_norm"]
    eager = eager_label(a)
    single = [] if a.get("eager_float32_vs_fp64_max_abs") is None else [
        f"eager fp32 (same {a['dtype']} weights and inputs) vs fp64: max abs {fmt(a['eager_float32_vs_fp64_max_abs'])}"]
    return [
        f"dtype: {a.get('dtype', 'float32')}",
        f"verdict: {data['verdict']} (delegated max error <= {fmt(a['envelope'])} x {eager}'s, outputs finite)",
        f"delegated vs fp64: max abs {fmt(d['max_abs'])}, rel L2 {fmt(d['rel_l2'])}, "
        f"cosine {d['cosine']:.9f}, SQNR {fmt(d['sqnr_db'])} dB, finite {d['finite']}",
        f"{eager} vs fp64: max abs {fmt(e['max_abs'])}, rel L2 {fmt(e['rel_l2'])}, "
        f"cosine {e['cosine']:.9f}, SQNR {fmt(e['sqnr_db'])} dB",
        *single,
        "worst LayerNorm: " + ("–" if worst is None else f"{worst['module_path'] or '<root>'} "
                                                          f"({worst['node']}) max abs {fmt(worst['max_abs'])}"),
        *_input_summary(data),
        *_inputs_lines(data),
    ]


def _input_summary(data: dict) -> list[str]:
    s = data.get("layer_norm_inputs")
    if s is None or s["max_abs"] is None:
        return []

    def at(key: str) -> str:
        return f"{fmt(s[key])} ({s[key + '_at'] or '<root>'})" if s[key] is not None else "–"

    return [f"LayerNorm inputs: max |x| {at('max_abs')}, largest |x−mean|/std of a row {at('max_dev_over_std')}, "
            f"largest |mean|/std {at('max_mean_over_std')}; {s['outlier_layer_norms']} LayerNorm(s) with a row "
            f"beyond {fmt(s['outlier_sigmas'])} std"]


INPUT_NOTE = (f"Per-LayerNorm input, as the delegate received it (float64): std is a row's population standard "
              f"deviation without eps; ratios beyond {OUTLIER_SIGMAS:g} are marked. A constant row (std 0) is "
              "counted and left out of the ratios (– when no row has a spread); a row holding inf or NaN is counted "
              "and left out of all but max |x|. The errors are max abs against float64 LayerNorm of that same "
              "input (the kernel alone, no upstream difference), over all rows and on the outlier row (the row of "
              "the largest |x−mean|/std).")


def input_headers(eager: str) -> list[str]:
    """The columns of `input_cells`, eager's named `eager` (e.g. "eager fp32")."""
    return ["rows", "row width", "max |x|", "max |x−mean|/std", "max |mean|/std", "min row std", "constant rows",
            "non-finite rows", "delegated vs fp64", f"{eager} vs fp64", "outlier row",
            "delegated vs fp64 (outlier row)", f"{eager} vs fp64 (outlier row)"]


def input_cells(given: dict | None) -> list[object]:
    """One LayerNorm's `input` (a `layer_norm_input.LayerNormInput` as a dict; None: not
    seen) as table cells, ratios beyond OUTLIER_SIGMAS flagged."""
    given = given or {}
    s = given.get("stats") or {}
    return [s.get("rows"), s.get("width"), s.get("max_abs"), _flag(s.get("max_dev_over_std")),
            _flag(s.get("max_mean_over_std")), s.get("min_row_std"), s.get("constant_rows"), s.get("nonfinite_rows"),
            given.get("delegated_vs_fp64"), given.get("eager_fp32_vs_fp64"), s.get("outlier_row"),
            given.get("outlier_row_delegated_vs_fp64"), given.get("outlier_row_eager_fp32_vs_fp64")]


def _flag(value: float | None) -> object:
    return Flagged(value) if value is not None and value > OUTLIER_SIGMAS else value


def _input_headers(data: dict) -> list[str]:
    return ["#", "module", *input_headers(eager_label(data["accuracy"]))]


def _input_rows(data: dict) -> list[list[object]]:
    return [[i, e["module_path"] or "<root>", *input_cells(e.get("input"))] for i, e in enumerate(data["layer_norms"])]


def _inputs_lines(data: dict) -> list[str]:
    inputs, section = data.get("inputs"), data.get("transcripts")
    lines = []
    if inputs is not None and inputs.get("audio"):
        lines.append(f"inputs: log-mel of {', '.join(inputs['audio'])} (sha256 {inputs['audio_sha256']})")
    if section is not None:
        from pipeline.evaluation.transcripts import verdict_line

        lines.append(verdict_line(section) + ("" if section["identical"] else ": the verdict fails"))
    return lines


def eager_label(accuracy: dict) -> str:
    """What the delegated program is held against: eager at the report's dtype."""
    short = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
    return f"eager {short[accuracy.get('dtype', 'float32')]}"


def accuracy_plot(data: dict) -> bytes:
    """Per-LayerNorm errors (end to end, and on the delegate's own input) above the input
    rows' largest ratios to their std, on one x axis."""
    rows = data["layer_norms"]
    eager = eager_label(data["accuracy"])
    return error_plot(
        [e["module_path"] for e in rows],
        {
            "delegated vs eager fp64": [e["delegated_vs_fp64"] for e in rows],
            f"{eager} vs eager fp64": [e["eager_fp32_vs_fp64"] for e in rows],
            f"delegated vs {eager}": [e["delegated_vs_fp32"] for e in rows],
            "delegated vs fp64, same input": [_input(e, "delegated_vs_fp64") for e in rows],
            f"{eager} vs fp64, same input": [_input(e, "eager_fp32_vs_fp64") for e in rows],
        },
        f"per-LayerNorm error: {data['model']}",
        inputs={
            "max |x−mean|/std of a row": [_input(e, "stats", "max_dev_over_std") for e in rows],
            "max |mean|/std of a row": [_input(e, "stats", "max_mean_over_std") for e in rows],
        },
        threshold=OUTLIER_SIGMAS,
    )


def _input(entry: dict, *keys: str) -> float | None:
    value = entry.get("input")
    for key in keys:
        value = None if value is None else value.get(key)
    return value


def accuracy_markdown(data: dict) -> str:
    return _markdown(data, "Accuracy report", _accuracy_summary(data),
                     [*transcripts_markdown(data), "Per-LayerNorm max abs error (the HTML page has the plot):", "",
                      markdown_table(_accuracy_headers(data), _accuracy_rows(data)), "",
                      INPUT_NOTE, "", markdown_table(_input_headers(data), _input_rows(data))])


def accuracy_html(data: dict) -> str:
    return _html(data, "Accuracy report", data["verdict"] == "pass", _accuracy_summary(data),
                 [*transcripts_html(data),
                  png_img(accuracy_plot(data), "per-LayerNorm max abs error, and the input rows in std"),
                  "<h2>LayerNorm inputs</h2>", f"<p>{html.escape(INPUT_NOTE)}</p>",
                  html_table(_input_headers(data), _input_rows(data)),
                  "<h2>LayerNorm errors</h2>", html_table(_accuracy_headers(data), _accuracy_rows(data))])


def _transcript_headers(section: dict) -> list[str]:
    program = section["program"]
    headers = ["audio", "spoken", "from eager's encoder output", f"from the {program} program's", "tokens identical",
               "token agreement", "first difference", f"encoder {program} vs fp64", "encoder eager vs fp64"]
    if any("encoder_eager_float32_vs_fp64_max_abs" in r for r in section["utterances"]):
        headers.append("encoder eager fp32 vs fp64")
    return headers


def _transcript_rows(section: dict) -> list[list[object]]:
    program = section["program"]
    rows = []
    for r in section["utterances"]:
        row = [r["audio"], r["spoken"], r["text_eager"], r[f"text_{program}"], "yes" if r["tokens_identical"] else "NO",
               r["token_agreement"], r["first_difference"], r[f"encoder_{program}_vs_fp64_max_abs"],
               r["encoder_eager_vs_fp64_max_abs"]]
        if "encoder_eager_float32_vs_fp64_max_abs" in r:
            row.append(r["encoder_eager_float32_vs_fp64_max_abs"])
        rows.append(row)
    return rows


def _transcript_intro(section: dict) -> str:
    from pipeline.evaluation.transcripts import verdict_line

    return (f"{verdict_line(section)}; decode: {section['decode']}. The verdict fails when the tokens differ. "
            "Encoder-output errors are max abs against eager float64, per utterance.")


def transcripts_markdown(data: dict) -> list[str]:
    """The transcript check's section (none when the report has none), as Markdown lines."""
    section = data.get("transcripts")
    if section is None:
        return []
    return ["## Transcripts", "", _transcript_intro(section), "",
            markdown_table(_transcript_headers(section), _transcript_rows(section)), ""]


def transcripts_html(data: dict) -> list[str]:
    """The same section as HTML fragments."""
    section = data.get("transcripts")
    if section is None:
        return []
    return ["<h2>Transcripts</h2>", f"<p>{html.escape(_transcript_intro(section))}</p>",
            html_table(_transcript_headers(section), _transcript_rows(section))]


def accuracy_line(data: dict) -> str:
    a = data["accuracy"]
    worst = a["worst_layer_norm"]
    single = "" if a.get("eager_float32_vs_fp64_max_abs") is None else (
        f"  (eager fp32 {fmt(a['eager_float32_vs_fp64_max_abs'])})")
    return (f"{data['model']:<10} {data['verdict']:<5} delegated {fmt(a['delegated_vs_fp64_max_abs']):>8}  "
            f"{eager_label(a)} {fmt(a['eager_fp32_vs_fp64_max_abs']):>8}{single}  cos {a['cosine']:.7f}  "
            f"SQNR {fmt(a['sqnr_db'])} dB  worst LN {'–' if worst is None else worst['module_path']}"
            f"{_input_line(data)}{_transcripts_count(data)}")


def _transcripts_count(data: dict) -> str:
    section = data.get("transcripts")
    if section is None:
        return ""
    rows = section["utterances"]
    return f"  transcripts {sum(r['tokens_identical'] for r in rows)}/{len(rows)} identical"


def _input_line(data: dict) -> str:
    s = data.get("layer_norm_inputs")
    if s is None or s["max_dev_over_std"] is None:
        return ""
    return f"  LN inputs up to {fmt(s['max_dev_over_std'])} std ({s['outlier_layer_norms']} past {fmt(s['outlier_sigmas'])})"
