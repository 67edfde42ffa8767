"""The environment variables that both the Python runtime and the C++ backend read, and the
bound on the file one names (the C++ gets them from a header generated from this module,
pipeline/native/generate.py)."""

# Part of an adapter's name: the one to use where several are offered.
ADAPTER_ENV = "PIPELINE_WGPU_ADAPTER"
# "0" turns subgroup reductions off (the workgroup-memory path is used, as without the feature).
SUBGROUPS_ENV = "PIPELINE_WGPU_SUBGROUPS"
# "0" keeps float16 stores on the kernel's integer rounding even where pack2x16float passed its probe.
F16_PACK_ENV = "PIPELINE_WGPU_PACK2X16FLOAT"

# A layouts file tuned on this device (pipeline.wgsl.layouts, scripts/tune_layouts.py): launches
# it names take its threads per row and workgroup size instead of the rule's. Unset, the table
# shipped for the device's adapter and implementation is taken where there is one
# (pipeline/wgsl/tuned/); LAYOUTS_NONE takes the rule everywhere.
LAYOUTS_ENV = "PIPELINE_LAYOUTS"
LAYOUTS_NONE = "none"
# The most bytes of that file either side reads (a tuned table is a few kB): a larger file, or
# one that is not a regular file (a named pipe, /dev/zero), is refused.
LAYOUTS_MAX_BYTES = 4 << 20

SHARED = ("ADAPTER_ENV", "SUBGROUPS_ENV", "F16_PACK_ENV", "LAYOUTS_ENV", "LAYOUTS_NONE", "LAYOUTS_MAX_BYTES")
