"""The C++ headers generated at build time from the Python side, so that what Python
decides is written once (the ExecuTorch Vulkan backend's way with its shader variants):

- wgsl_sources.h: the kernel files of pipeline/wgsl/ as the Python runtime reads them, and
  the float16 pack probe's cases (pipeline.wgsl);
- kernel_config.h: the configuration rule evaluated into steps by row length and the pieces of
  every WGSL module (pipeline.wgsl.config): the C++ looks the rule up, picks pieces by the
  configuration and writes only the per-pipeline constants itself, as `constant` formats them;
- blob_layout.h: the delegate blob's byte layout and codes (pipeline.blob);
- environment.h: the names of the environment variables both sides read (pipeline.environment);
- tuned_layouts.h: the layouts tables that ship with the package (pipeline/wgsl/tuned/, read by
  pipeline.wgsl.layouts), as their binary twins: the C++ parses no text.

Imports no torch and no WebGPU implementation (`pipeline.native.build` runs it before
anything is compiled).
"""

from __future__ import annotations

import functools
import re
import struct

import numpy as np

from pipeline import blob, environment, wgsl
from pipeline.wgsl import config, layouts

# The kernel files the backend embeds (pipeline/wgsl/ also holds benchmark-only shaders).
WGSL_FILES = (
    "native_layer_norm.wgsl", "reduce_subgroup.wgsl", "reduce_workgroup.wgsl", "subgroup_size.wgsl", "f16_pack_probe.wgsl",
    "storage_float32.wgsl", "storage_half.wgsl", "storage_half_odd.wgsl", "storage_half_wide.wgsl", "half.wgsl",
)
# The kernel's numbers the C++ uses (a configuration's defaults and forms, the launch's grid
# limit, Params size and threaded copies), with their C++ types.
RULE_CONSTANTS = (
    ("MIN_WORKGROUP", "uint32_t"), ("THREADED_COPY_BYTES", "size_t"), ("MAX_GRID_X", "uint64_t"),
    ("PARAMS_BYTES", "uint64_t"), ("LATE_AFFINE_VALUES", "uint64_t"),
)
# C++ types of struct formats.
_CPP_TYPES = {"H": "uint16_t", "I": "uint32_t", "d": "double", "q": "int64_t", "s": "char"}
_NAMESPACE = ("namespace pipeline {\nnamespace webgpu {\n\n", "\n}  // namespace webgpu\n}  // namespace pipeline\n")


def headers() -> dict[str, str]:
    """Each generated header's name and text."""
    return {"wgsl_sources.h": wgsl_header(), "kernel_config.h": kernel_header(), "blob_layout.h": blob_header(),
            "environment.h": environment_header(), "tuned_layouts.h": tuned_layouts_header()}


def wgsl_header() -> str:
    """Each embedded kernel file as the Python runtime reads it (text mode, universal
    newlines), and the float16 pack probe's cases."""
    entries = "".join(f'    {{"{name}", {len(wgsl.source(name).encode())},\n     {literal(wgsl.source(name), 5)}}},\n'
                      for name in WGSL_FILES)
    return (_preamble("pipeline/wgsl/")
            + "struct EmbeddedWgsl {\n  const char* name;\n  size_t size;\n  const char* text;\n};\n\n"
            + "inline constexpr EmbeddedWgsl kEmbeddedWgsl[] = {\n" + entries + "};\n\n"
            + _f16_pack_cases())


def _f16_pack_cases() -> str:
    """The float16 pack probe's values (float32 bits) and their aten rounding (float16 bits),
    the very cases the Python runtime's probe checks (`pipeline.wgsl.f16_pack_cases`)."""
    values = wgsl.f16_pack_cases()
    want = wgsl.aten_f16_bits(values)

    def table(kind: str, name: str, items) -> str:
        body = ",".join(f"0x{int(v):x}" for v in items)
        return f"inline constexpr {kind} {name}[] = {{{body}}};\n"

    return (table("uint32_t", "kF16PackCaseBits", values.view(np.uint32))
            + table("uint16_t", "kF16PackExpected", want)
            + f"constexpr size_t kF16PackCases = {values.size};\n")


# Row lengths in loads the rule is evaluated on: where it changes no more past half of them
# (checked), the last step holds for every longer row.
RULE_SCAN_LOADS = 3 * config.MAX_HOLD * config.MAX_THREADS_PER_ROW
# More rows than any launch has: the form a launch of many rows takes.
MANY_ROWS = 1 << 62
_VECS = (1, 2, 4)


def rule_kinds() -> tuple[int, ...]:
    """The fewest loads a thread (config.least_loads) that rows of some dtype and load take."""
    return tuple(sorted({config.least_loads(dtype, vec) for dtype in blob.DTYPE_CODES for vec in _VECS}))


@functools.cache
def rule_steps(least: int) -> tuple[tuple[int, tuple[int, int, bool, int], tuple[int, int, bool, int], int], ...]:
    """config.row_shape evaluated for rows of at least `least` loads a thread: each row length
    in loads from which it changes, its form (threads per row, workgroup, rows held or not,
    unroll) for a launch of few rows and of many, and the rows from which a launch takes the
    second (MANY_ROWS where it never does: the two are one)."""
    steps = []
    for loads in range(1, RULE_SCAN_LOADS + 1):
        few = config.row_shape(loads, least, 0)
        many = config.row_shape(loads, least, MANY_ROWS)
        low, high = 1, MANY_ROWS  # the fewest rows that take the many-row form
        while many != few and low < high:
            middle = (low + high) // 2
            low, high = (middle + 1, high) if config.row_shape(loads, least, middle) != many else (low, middle)
        step = (_form(few), _form(many), low if many != few else MANY_ROWS)
        if not steps or steps[-1][1:] != step:
            steps.append((loads, *step))
    if steps[-1][0] > RULE_SCAN_LOADS // 2:
        raise RuntimeError(f"the configuration rule still changes at {steps[-1][0]} loads a row: "
                           f"scan further than RULE_SCAN_LOADS ({RULE_SCAN_LOADS})")
    return tuple(steps)


def _form(shape: tuple[int, int, int, int]) -> tuple[int, int, bool, int]:
    threads, workgroup, hold, unroll = shape
    return threads, workgroup, hold > 0, unroll


def _rule_header() -> str:
    def form(f: tuple[int, int, bool, int]) -> str:
        return f"{{{f[0]}, {f[1]}, {str(f[2]).lower()}, {f[3]}}}"

    kinds = rule_kinds()
    tables = "".join(
        f"inline constexpr RuleStep kRuleSteps{least}[] = {{\n" + "".join(
            f"    {{{loads}, {form(few)}, {form(many)}, {many_from}ull}},\n"
            for loads, few, many, many_from in rule_steps(least)) + "};\n"
        for least in kinds)
    spans = ", ".join(f"{{kRuleSteps{least}, {len(rule_steps(least))}}}" for least in kinds)
    assert sorted(blob.DTYPE_CODES.values()) == list(range(len(blob.DTYPE_CODES)))  # the C++ indexes by code
    kind_of = ",\n".join(
        "    {" + ", ".join(str(kinds.index(config.least_loads(dtype, vec))) for vec in _VECS) + "}"
        for dtype, _ in sorted(blob.DTYPE_CODES.items(), key=lambda item: item[1]))
    return ("\n// The configuration rule (config.row_shape) evaluated for each kind of row, by row length\n"
            + "// in loads: from `from_loads` on, until the next step, a launch takes `few_rows` below\n"
            + "// `many_rows_from` rows and `many_rows` from there (rows held in registers or streamed).\n"
            + "struct RuleForm {\n  uint32_t threads_per_row;\n  uint32_t workgroup;\n  bool held;\n"
            + "  uint32_t unroll;\n};\n"
            + "struct RuleStep {\n  uint64_t from_loads;\n  RuleForm few_rows;\n"
            + "  RuleForm many_rows;\n  uint64_t many_rows_from;\n};\n" + tables
            + "struct RuleSteps {\n  const RuleStep* steps;\n  size_t count;\n};\n"
            + f"inline constexpr RuleSteps kRuleKinds[] = {{{spans}}};\n"
            + "// The kind of a row by dtype code and load width (1, 2, 4 values; config.least_loads).\n"
            + f"inline constexpr uint32_t kRuleKindOf[][3] = {{\n{kind_of}}};\n")


def kernel_header() -> str:
    """The rule's steps and numbers, the directive each shader compiler needs before subgroup
    operations, the declarations chosen by V's width and the dtypes, and the kernel file in
    parts: plain runs, and each marked line written out for every value up to the most
    `choose_config` asks for (config.MOST_VALUES)."""
    numbers = "".join(f"constexpr {kind} {cpp_name(name)} = {getattr(config, name)};\n" for name, kind in RULE_CONSTANTS)
    compilers = list(wgsl.NEEDS_ENABLE_SUBGROUPS)
    directive = _selector("subgroups_directive(ShaderCompiler compiler)", [
        (f"compiler == ShaderCompiler::{cpp_name(c)}", wgsl.ShaderFiles(c).module("", subgroups=True))
        for c in compilers])
    vector = _selector("vector_declarations(uint32_t vec)",
                       [(f"vec == {vec}", config.vector_declarations(vec)) for vec in (1, 2, 4)])
    half = _selector("half_declarations(uint32_t vec, bool params_half)", [
        (f"vec == {vec} && {'' if params_half else '!'}params_half", config.half_declarations(vec, params_half))
        for vec in (1, 2, 4) for params_half in (False, True)])
    markers = list(config.MOST_VALUES)
    parts = []
    for marker, text in config.parts(wgsl.source(config.SHADER), tuple(markers)):
        if marker is None:
            parts.append(f"    {{Marker::kNone, 0,\n     {literal(text, 5)}}},\n")
            continue
        parts += [f"    {{Marker::{cpp_name(marker)}, {k}, {literal(config.value_line(text, k), 5)}}},\n"
                  for k in range(config.MOST_VALUES[marker])]
    return (_preamble("pipeline/wgsl/config.py") + _NAMESPACE[0]
            + "// The kernel's numbers (pipeline.wgsl.config's).\n" + numbers + _rule_header()
            + "\n// A layouts table's binary twin (pipeline/wgsl/layouts.py): its first bytes, version,\n"
            + "// header words after the magic, a record's words in order, and its name's suffix.\n"
            + f'constexpr char kLayoutsBinaryMagic[] = "{layouts.BINARY_MAGIC.decode("ascii")}";\n'
            + f"constexpr uint32_t kLayoutsBinaryVersion = {layouts.BINARY_VERSION};\n"
            + f"constexpr size_t kLayoutsHeaderWords = {layouts.HEADER_WORDS};\n"
            + f"enum LayoutsRecordField : size_t {{ {', '.join(cpp_name('record_' + f) for f in layouts.RECORD_FIELDS)}, "
            + "kLayoutsRecordWords };\n"
            + f"constexpr const char* kLayoutsTwinSuffix = \"{layouts.TWIN_SUFFIX}\";\n"
            + "\n// The shader compilers a module is written for.\n"
            + f"enum class ShaderCompiler {{ {', '.join(cpp_name(c) for c in compilers)} }};\n\n"
            + "// What a module that uses subgroup operations starts with, for `compiler`.\n" + directive
            + "\n// alias V, hsum and first_value for V's `vec` components.\n" + vector
            + "\n// The word types and conversions of a half dtype's storage file.\n" + half
            + f"\n// {config.SHADER} in parts: plain runs of lines, and each line marked `// <marker>` for\n"
            + "// each value it is written out for.\n"
            + f"enum class Marker : uint32_t {{ kNone, {', '.join(cpp_name(m) for m in markers)} }};\n"
            + "struct KernelPart {\n  Marker marker;\n  uint32_t value;\n  const char* text;\n};\n"
            + "inline constexpr KernelPart kKernelParts[] = {\n" + "".join(parts) + "};\n"
            + "\n// How often each marker's lines are written out (config.WRITTEN, by Marker after kNone):\n"
            + "// `count` times where every form of `when` holds and none of `unless` does.\n"
            + f"enum class Count : uint32_t {{ {', '.join(cpp_name(c) for c in config.COUNTS)} }};\n"
            + f"enum Form : uint32_t {{ {', '.join(f'{cpp_name(f)} = {1 << i}' for i, f in enumerate(config.FORMS))} }};\n"
            + "struct Written {\n  Count count;\n  uint32_t when;\n  uint32_t unless;\n};\n"
            + "inline constexpr Written kWritten[] = {\n" + "".join(
                f"    {{Count::{cpp_name(rule.count)}, {_forms(rule.when)}, {_forms(rule.unless)}}},\n"
                for rule in config.WRITTEN.values()) + "};\n" + _NAMESPACE[1])



def _forms(forms: tuple[str, ...]) -> str:
    """A set of KernelConfig forms as the C++ Form bits."""
    return " | ".join(cpp_name(form) for form in forms) or "0"


def environment_header() -> str:
    """The names of the environment variables both sides read, and their bounds (pipeline.environment)."""
    names = "".join(f"constexpr uint64_t {cpp_name(name)} = {value};\n" if isinstance(value, int)
                    else f'constexpr const char* {cpp_name(name)} = "{value}";\n'
                    for name, value in ((name, getattr(environment, name)) for name in environment.SHARED))
    return _preamble("pipeline/environment.py") + _NAMESPACE[0] + names + _NAMESPACE[1]


def tuned_layouts_header() -> str:
    """Each shipped layouts table (layouts.shipped: read and checked here, once) as its binary
    twin, the bytes a user's twin holds, with where it lives in the package."""
    tables = []
    for table in layouts.shipped():
        text = (layouts.SHIPPED_DIR / table.source.rpartition("/")[2]).read_bytes()
        data = table.binary(text)
        pieces = "\n     ".join('"' + "".join(_escape(b) for b in data[i:i + 16]) + '"' for i in range(0, len(data), 16))
        tables.append(f"    {{{literal(table.source)}, {len(data)},\n     {pieces}}},\n")
    return (_preamble(layouts.SHIPPED_SOURCE + "/") + _NAMESPACE[0]
            + "// A table as shipped: where it lives in the package, and its binary twin's `size` bytes.\n"
            + "struct ShippedTable {\n  const char* source;\n  size_t size;\n  const char* data;\n};\n\n"
            + "inline constexpr ShippedTable kShippedTables[] = {\n" + "".join(tables) + "};\n" + _NAMESPACE[1])


def blob_header() -> str:
    """The blob's codes, framing constants and each field's offset and type."""
    codes = "".join(f"constexpr uint32_t {cpp_name(name)} = {code};\n" for name, code in blob.DTYPE_CODES.items())
    itemsizes = ", ".join(str(blob.CONSTANT_ARRAYS[name].itemsize) for name in blob.DTYPE_CODES)
    names = ", ".join(f'"{name}"' for name in blob.DTYPE_CODES)
    sources = ", ".join(f"{cpp_name(name)} = {code}" for name, code in blob.SOURCE_CODES.items())
    outputs = ", ".join(f"{cpp_name(name)} = {i}" for i, name in enumerate(blob.OUTPUT_NAMES))
    return (_preamble("pipeline/blob.py") + _NAMESPACE[0]
            + "// Dtype codes of the params' dtype and affine_dtype fields, and each one's bytes and name.\n"
            + codes + f"inline constexpr uint32_t kDtypeBytes[] = {{{itemsizes}}};\n"
            + f"inline constexpr const char* kDtypeNames[] = {{{names}}};\n"
            + "// Where a weight or bias comes from (the *_source fields).\n"
            + f"enum class OperandSource : uint32_t {{ {sources} }};\n"
            + "// What a delegate returns (the entries of the outputs field).\n"
            + f"enum Output : uint32_t {{ {outputs} }};\n"
            + f"constexpr int64_t kDynamicDim = {blob.DYNAMIC};  // a normalized dim read from the input\n"
            + f"constexpr uint32_t kMaxNormalizedDims = {blob.MAX_NDIM};\n\n"
            + "namespace blob_layout {\n\n"
            + f'constexpr char kMagic[] = "{blob.MAGIC.decode("ascii")}";\n'
            + f"constexpr uint16_t kVersion = {blob.VERSION};\n"
            + f"constexpr uint32_t kByteOrderMark = 0x{blob.BYTE_ORDER_MARK:08x};\n"
            + f"constexpr uint16_t kOldestVersion = {blob.OLDEST_VERSION};  // version 3: op native_layer_norm only\n"
            + f"constexpr uint32_t kOpNativeLayerNorm = {blob.OP_NATIVE_LAYER_NORM};\n"
            + f"constexpr uint32_t kOpRmsNorm = {blob.OP_RMS_NORM};\n"
            + f"constexpr uint64_t kAlign = {blob.ALIGN};  // of the data section and each constant in it\n"
            + f"constexpr uint32_t kHeaderSize = {blob.HEADER.size};\n"
            + f"constexpr uint32_t kParamsSize = {blob.PARAMS.size};  // the fixed fields; ndim dims follow\n"
            + f"constexpr uint32_t kDimSize = {blob.DIM.size};\n\n"
            + "// A field of a section: its offset, and `count` values of T (little-endian) there.\n"
            + "template <typename T>\nstruct Field {\n  size_t offset;\n  size_t count = 1;\n};\n\n"
            + "// The header's fields, from the start of the blob.\n"
            + _fields("header_field", blob.HEADER_FIELDS)
            + "// The params' fields, from the start of the params section; ndim dims follow them.\n"
            + _fields("params_field", [*blob.PARAMS_FIELDS, ("dims", "0" + blob.DIM.format.lstrip("<"))])
            + "\n}  // namespace blob_layout\n" + _NAMESPACE[1])


def _fields(namespace: str, fields) -> str:
    """`namespace` of a Field per (name, struct format), at the offsets the formats give (a
    count of 0: as many as another field says)."""
    lines, offset = [], 0
    for name, fmt in fields:
        count, code = re.fullmatch(r"(\d*)(\w)", fmt).groups()
        kind, count = (f"char[{count}]", 1) if code == "s" else (_CPP_TYPES[code], int(count or 1))
        lines.append(f"inline constexpr Field<{kind}> {cpp_name(name)}{{{offset}, {count}}};\n")
        offset += struct.calcsize("<" + fmt)
    return f"namespace {namespace} {{\n" + "".join(lines) + f"}}  // namespace {namespace}\n"


def _selector(signature: str, cases: list[tuple[str, str]]) -> str:
    """A C++ function returning the text of the first case whose condition holds (nullptr
    when none does)."""
    body = "".join(f"  if ({condition}) {{\n    return {literal(text, 11)};\n  }}\n" for condition, text in cases)
    return f"inline const char* {signature} {{\n{body}  return nullptr;\n}}\n"


def cpp_name(name: str) -> str:
    """A Python name (or marker) as a C++ constant: THREADED_COPY_BYTES -> kThreadedCopyBytes."""
    return "k" + "".join(word.capitalize() for word in re.split(r"[^a-z0-9]+", name.lower()))


def literal(text: str, indent: int = 0) -> str:
    """`text` as a C++ string literal of one quoted piece per line (pieces after the first
    indented by `indent`): printable ASCII as is but for \\ " ?, any other byte an octal escape."""
    pieces = []
    for line in text.encode("utf-8").splitlines(keepends=True) or [b""]:
        piece = "".join(_escape(b) for b in line)
        pieces.append(f'"{piece}"')
    return ("\n" + " " * indent).join(pieces)


def _escape(byte: int) -> str:
    if byte == 0x0A:
        return "\\n"
    if byte in b'\\"?':
        return "\\" + chr(byte)
    return chr(byte) if 0x20 <= byte < 0x7F else f"\\{byte:03o}"


def _preamble(source: str) -> str:
    return (f"// Generated by pipeline/native/generate.py from {source}; do not edit.\n"
            "#pragma once\n\n#include <cstddef>\n#include <cstdint>\n\n")
