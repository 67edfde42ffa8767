// extern "C" entry points that pipeline/native/__init__.py calls through ctypes: the
// registration, a device probe, and what tests hold against Python (the WGSL module, the
// layouts tables and the blob rules). Each returns a status instead of throwing.
#include <executorch/runtime/core/error.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "EntryPoints.h"
#include "LayerNormConfig.h"
#include "WebGPUDelegateHeader.h"
#include "WebGPUDevice.h"

namespace pipeline {
namespace webgpu {
executorch::runtime::Error register_webgpu_backend();
}  // namespace webgpu
}  // namespace pipeline

namespace webgpu = pipeline::webgpu;

using pipeline_entry::copy_out;

namespace {

// Each entry of `table` as eleven numbers into `out` while they fit (`capacity` numbers);
// returns the entries.
long long entries_out(const webgpu::LayoutTable& table, uint64_t* out, size_t capacity) {
  size_t at = 0;
  for (const auto& [launch, layout] : table.entries) {
    const auto [dtype, affine_dtype, weight, bias, stats, width, rows, rms] = launch;
    for (const uint64_t value : {uint64_t{dtype}, uint64_t{affine_dtype}, uint64_t{weight}, uint64_t{bias},
                                 uint64_t{stats}, width, rows, uint64_t{rms}, uint64_t{layout.threads_per_row},
                                 uint64_t{layout.workgroup}, uint64_t{layout.wide_words}}) {
      if (at < capacity) {
        out[at] = value;
      }
      ++at;
    }
  }
  return static_cast<long long>(table.entries.size());
}

}  // namespace

extern "C" {

// Binds the WebGPU calls from the implementation's library at `path` (the Dawn build:
// dawn-python's; wgpu-native's are linked, and there it does nothing). Call before any other.
// 1 on success, else 0 and the reason.
PIPELINE_EXPORT int pipeline_webgpu_bind(const char* path, char* reason, size_t capacity) {
  return pipeline_entry::bind_into(path, reason, capacity);
}

// The executorch::runtime::Error of registering "WebGPUBackend" (0: Ok). Idempotent.
PIPELINE_EXPORT int pipeline_webgpu_register() {
  return static_cast<int>(webgpu::register_webgpu_backend());
}

// 1 when a device is available; else 0 and the reason in `reason`.
PIPELINE_EXPORT int pipeline_webgpu_probe(char* reason, size_t capacity) {
  try {
    std::string why;
    webgpu::WebGPUDevice* device = webgpu::WebGPUDevice::get(&why);
    copy_out(device ? device->adapter_name() : why, reason, capacity);
    return device != nullptr;
  } catch (...) {
    copy_out("unexpected exception", reason, capacity);
    return 0;
  }
}

// The subgroup size the device's kernels use (0: none), or -1 without a device.
PIPELINE_EXPORT int pipeline_webgpu_subgroup_size() {
  webgpu::WebGPUDevice* device = webgpu::WebGPUDevice::get(nullptr);
  return device ? static_cast<int>(device->subgroup_size()) : -1;
}

// The most bytes one binding holds on the backend's device (0 without one).
PIPELINE_EXPORT uint64_t pipeline_webgpu_binding_limit() {
  webgpu::WebGPUDevice* device = webgpu::WebGPUDevice::get(nullptr);
  return device ? device->binding_limit() : 0;
}

// 1 when the device's float16 stores use pack2x16float, 0 when not, -1 without a device.
PIPELINE_EXPORT int pipeline_webgpu_pack2x16float() {
  webgpu::WebGPUDevice* device = webgpu::WebGPUDevice::get(nullptr);
  return device ? (device->pack2x16float() ? 1 : 0) : -1;
}

// The WGSL module for a configuration (an RMSNorm's with `rms`), in its layout from the table
// in `layouts` where that is not null (`layouts_size` bytes, a layouts table's binary twin); returns
// its length (copy into `out` when it fits `capacity` including the NUL), or -1 on failure.
PIPELINE_EXPORT long long pipeline_webgpu_wgsl_source(uint64_t width, int has_weight, int has_bias,
                                      uint32_t subgroup_size, uint32_t dtype, uint32_t affine_dtype,
                                      int pack2x16float, uint64_t rows, int write_stats, int rms, int tint,
                                      const char* layouts, size_t layouts_size, char* out, size_t capacity) {
  try {
    if (width == 0 || dtype > webgpu::kBfloat16 || affine_dtype > webgpu::kBfloat16 ||
        (rms != 0 && (has_bias != 0 || write_stats != 0))) {
      return -1;
    }
    webgpu::KernelConfig config = webgpu::choose_config(width, has_weight != 0, has_bias != 0, subgroup_size, dtype,
                                                        affine_dtype, pack2x16float != 0, rows, write_stats != 0,
                                                        rms != 0);
    if (layouts != nullptr) {
      webgpu::LayoutTable table;
      std::string why;
      if (!webgpu::decode_layouts(std::string(layouts, layouts_size), "<layouts>", nullptr, &table, &why)) {
        return -1;
      }
      config = table.config(config, rows);
    }
    const std::string source =
        webgpu::kernel_source(config, tint != 0 ? webgpu::ShaderCompiler::kTint : webgpu::ShaderCompiler::kNaga);
    if (source.size() < capacity) {
      copy_out(source, out, capacity);
    }
    return static_cast<long long>(source.size());
  } catch (...) {
    return -1;
  }
}

// The table in `data` (`size` bytes, a layouts table's binary twin: decode_layouts, refused
// unless written from `text`'s `text_size` bytes where `text` is not null): its adapter and
// implementation into `names` ("adapter\nimplementation"), and of each entry, in the table's
// order, eleven numbers into `out` while they fit (`capacity` numbers): dtype, affine_dtype,
// weight, bias, stats, width, rows, RMSNorm, threads per row, workgroup, words. Returns its
// entries, or -1 with the reason (naming `source`) in `names`.
PIPELINE_EXPORT long long pipeline_webgpu_decode_layouts(const char* data, size_t size, const char* source,
                                                         const char* text, size_t text_size, uint64_t* out,
                                                         size_t capacity, char* names, size_t names_capacity) {
  try {
    webgpu::LayoutTable table;
    std::string why;
    const uint64_t hash = text == nullptr ? 0 : webgpu::fnv1a64(std::string(text, text_size));
    if (!webgpu::decode_layouts(std::string(data, size), source, text == nullptr ? nullptr : &hash, &table, &why)) {
      copy_out(why, names, names_capacity);
      return -1;
    }
    copy_out(table.adapter + "\n" + table.implementation, names, names_capacity);
    return entries_out(table, out, capacity);
  } catch (...) {
    copy_out("unexpected exception", names, names_capacity);
    return -1;
  }
}

// The table shipped for `adapter` through `implementation` (shipped_layouts): its source into
// `source`, and its entries into `out` as pipeline_webgpu_decode_layouts writes them. Returns
// its entries, or -1 where no table ships for them.
PIPELINE_EXPORT long long pipeline_webgpu_shipped_layouts(const char* adapter, const char* implementation,
                                                          uint64_t* out, size_t capacity, char* source,
                                                          size_t source_capacity) {
  try {
    webgpu::LayoutTable table;
    if (!webgpu::shipped_layouts(adapter, implementation, &table)) {
      return -1;
    }
    copy_out(table.source, source, source_capacity);
    return entries_out(table, out, capacity);
  } catch (...) {
    return -1;
  }
}

// 1 when `data` is a valid delegate blob, else 0 with the reason in `reason`.
PIPELINE_EXPORT int pipeline_webgpu_check_blob(const uint8_t* data, size_t size, char* reason, size_t capacity) {
  try {
    webgpu::LayerNormBlob blob;
    std::string why;
    const bool ok = webgpu::decode_blob(data, size, &blob, &why);
    copy_out(why, reason, capacity);
    return ok ? 1 : 0;
  } catch (...) {
    copy_out("unexpected exception", reason, capacity);
    return 0;
  }
}

}  // extern "C"
