// The native_layer_norm kernel's configuration rule and WGSL module, ported from
// pipeline/runtime/launch.py (`choose_config`, `KernelConfig.source`,
// `_written_out`). The .wgsl files themselves are embedded at build time from
// pipeline/wgsl/; tests/test_native.py holds the generated module byte for byte
// against Python's over many widths, so the two rules cannot drift apart unseen.
#pragma once

#include <cstdint>
#include <string>

namespace executorch {
namespace backends {
namespace webgpu {

constexpr uint32_t kMinWorkgroup = 64;
constexpr uint32_t kMaxThreadsPerRow = 256;
constexpr uint32_t kMaxHold = 8;  // values of a row one thread holds in registers at most
// Loads a thread holds at least, where the row has them (runtime/launch.py's MIN_HOLD and
// MIN_HOLD_NARROW_LOADS): 3 for float32 rows loaded as vec4 or vec2, else 4.
constexpr uint32_t kMinHold = 3;
constexpr uint32_t kMinHoldNarrowLoads = 4;
constexpr uint32_t kStreamUnroll = 4;  // values a streaming thread loads in one loop step
// A float32 launch split into exactly 4 vec4 loads a thread with at least this many
// threads takes twice the threads per row, 2 loads each (WIDE_LAUNCH_THREADS).
constexpr uint64_t kWideLaunchThreads = uint64_t{3} << 16;

struct KernelConfig {
  uint64_t width = 0;  // elements per row, compiled in
  uint32_t threads_per_row = 1;
  bool has_weight = false;
  bool has_bias = false;
  uint32_t subgroup_size = 0;  // 0: no subgroup operations (workgroup-memory merges)
  uint32_t workgroup = kMinWorkgroup;
  uint32_t hold = 0;  // 0: rows streamed; k > 0: each thread holds k values of its row
  uint32_t unroll = 1;
  uint32_t dtype = 0;  // of x and out: 0 float32, 1 float16, 2 bfloat16 (the blob's codes)
  uint32_t affine_dtype = 0;  // of weight and bias: dtype, or 0 with a half dtype
  bool pack2x16float = false;  // float16 stores through pack2x16float (the device probe's verdict)
  bool write_stats = true;  // mean and rstd stored (not where the delegate returns only out)

  uint32_t vec() const { return width % 4 == 0 ? 4 : width % 2 == 0 ? 2 : 1; }
  uint64_t row_vecs() const { return width / vec(); }
  bool row_in_subgroup() const { return threads_per_row <= subgroup_size; }
  // A row has more subgroup parts than a subgroup has lanes (KernelConfig.parts_tree).
  bool parts_tree() const {
    return subgroup_size > 0 && uint64_t{threads_per_row} > uint64_t{subgroup_size} * subgroup_size;
  }
  uint32_t rows_per_workgroup() const { return workgroup / threads_per_row; }
};

// `rows`: the launch's (0: the rule by width alone).
KernelConfig choose_config(uint64_t width, bool has_weight, bool has_bias, uint32_t subgroup_size,
                           uint32_t dtype, uint32_t affine_dtype, bool pack2x16float,
                           uint64_t rows = 0, bool write_stats = true);

// The shader compiler a module is written for: Tint (Dawn) needs `enable subgroups;` before
// subgroup operations, naga (wgpu-native, which this backend runs on) refuses it.
enum class ShaderCompiler { kNaga, kTint };

// `body` with the directives `compiler` needs for what it uses (device.py's ShaderFiles.module).
std::string module_source(const std::string& body, bool subgroups, ShaderCompiler compiler);

// The WGSL module: directives, reduction file (entry point), constants prelude, kernel written out.
std::string kernel_source(const KernelConfig& config, ShaderCompiler compiler = ShaderCompiler::kNaga);

// `source` with each line ending in `// <marker>` repeated `count` times, K (and the
// suffix _K of names) becoming 0u, 1u, ... (resp. _0, _1, ...).
std::string written_out(const std::string& source, const std::string& marker, uint32_t count);

// An embedded pipeline/wgsl/ file by name, or nullptr.
const std::string* wgsl_file(const std::string& name);

}  // namespace webgpu
}  // namespace backends
}  // namespace executorch
