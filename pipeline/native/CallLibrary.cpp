// extern "C" entry points of libpipeline_layer_norm.so, the Python runtime's delegate call
// in one crossing (pipeline/runtime/native_call.py): a delegate opened from its blob, then
// each call uploads, launches and reads back in C++ (LayerNormLaunch, the native backend's
// own launch). No ExecuTorch here: the library links nothing but what wgpu-py has loaded
// (its Dawn build, nothing: it binds dawn-python's library when told where it is).
// Each function returns a status instead of throwing.
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "EntryPoints.h"
#include "HostCopy.h"
#include "LayerNormLaunch.h"
#include "WebGPUDelegateHeader.h"
#include "WebGPUDevice.h"

namespace webgpu = pipeline::webgpu;

using pipeline_entry::copy_out;

namespace {

struct Delegate {
  explicit Delegate(webgpu::WebGPUDevice* d) : device(d), op(d) {}
  webgpu::WebGPUDevice* device;
  webgpu::LayerNormLaunch op;
};

}  // namespace

extern "C" {

// Binds the WebGPU calls from the implementation's library at `path` (Dawn: dawn-python's;
// wgpu-native's come from the process, and there it does nothing). Call before any other.
// 1 on success, else 0 and the reason.
PIPELINE_EXPORT int pipeline_layer_norm_bind(const char* path, char* reason, size_t capacity) {
  return pipeline_entry::bind_into(path, reason, capacity);
}

// 1 when a device is available, with the adapter's name in `text`; else 0 and the reason.
PIPELINE_EXPORT int pipeline_layer_norm_device(char* text, size_t capacity) {
  try {
    std::string why;
    webgpu::WebGPUDevice* device = webgpu::WebGPUDevice::get(&why);
    copy_out(device ? device->adapter_name() : why, text, capacity);
    return device != nullptr;
  } catch (...) {
    copy_out("unexpected exception", text, capacity);
    return 0;
  }
}

// 1 when a device is available, with the source of the layouts table it took in `text` (""
// where it takes the rule); else 0 and the reason.
PIPELINE_EXPORT int pipeline_layer_norm_layouts(char* text, size_t capacity) {
  try {
    std::string why;
    webgpu::WebGPUDevice* device = webgpu::WebGPUDevice::get(&why);
    const webgpu::LayoutTable* table = device ? device->layouts() : nullptr;
    copy_out(device ? (table ? table->source : "") : why, text, capacity);
    return device != nullptr;
  } catch (...) {
    copy_out("unexpected exception", text, capacity);
    return 0;
  }
}

// The subgroup size the device's kernels use (0: none), or -1 without a device.
PIPELINE_EXPORT int pipeline_layer_norm_subgroup_size() {
  webgpu::WebGPUDevice* device = webgpu::WebGPUDevice::get(nullptr);
  return device ? static_cast<int>(device->subgroup_size()) : -1;
}

// The most bytes one binding holds on the library's device (0 without one).
PIPELINE_EXPORT uint64_t pipeline_layer_norm_binding_limit() {
  webgpu::WebGPUDevice* device = webgpu::WebGPUDevice::get(nullptr);
  return device ? device->binding_limit() : 0;
}

// The size from which host copies run over threads (HostCopy): the generated value of
// pipeline/wgsl/config.py's THREADED_COPY_BYTES, as compiled into this library.
PIPELINE_EXPORT uint64_t pipeline_layer_norm_threaded_copy_bytes() { return webgpu::kThreadedCopyBytes; }

// The library device's counters into `out` (zeros without a device): kernel launches
// submitted, kernel pipelines compiled, buffers allocated for launches.
PIPELINE_EXPORT void pipeline_layer_norm_counters(uint64_t out[3]) {
  webgpu::WebGPUDevice* device = webgpu::WebGPUDevice::get(nullptr);
  out[0] = device ? device->dispatches.load(std::memory_order_relaxed) : 0;
  out[1] = device ? device->pipelines_compiled.load(std::memory_order_relaxed) : 0;
  out[2] = device ? device->buffers_allocated.load(std::memory_order_relaxed) : 0;
}

// A delegate for the blob `data` (its constants uploaded; the bytes may be freed after), or
// null with the reason in `reason`.
PIPELINE_EXPORT void* pipeline_layer_norm_open(const uint8_t* data, size_t size, char* reason, size_t capacity) {
  try {
    std::string why;
    webgpu::LayerNormBlob blob;
    if (!webgpu::decode_blob(data, size, &blob, &why)) {
      copy_out(why, reason, capacity);
      return nullptr;
    }
    webgpu::WebGPUDevice* device = webgpu::WebGPUDevice::get(&why);
    if (device == nullptr) {
      copy_out(why, reason, capacity);
      return nullptr;
    }
    auto delegate = std::make_unique<Delegate>(device);
    std::lock_guard<std::mutex> lock(device->mutex());
    if (!delegate->op.prepare(blob, &why)) {
      copy_out(why, reason, capacity);
      return nullptr;
    }
    return delegate.release();
  } catch (const std::bad_alloc&) {
    copy_out("out of memory opening the delegate", reason, capacity);
  } catch (...) {
    copy_out("unexpected exception", reason, capacity);
  }
  return nullptr;
}

// Normalizes `rows` rows of `width` contiguous values of the blob's dtype at `x`: out in
// that dtype, mean and rstd in float32 (each output skipped where its pointer is null).
// `weight`/`bias`: the affine dtype's values for input-sourced operands, else null.
// 1 on success, else 0 and the reason.
PIPELINE_EXPORT int pipeline_layer_norm_run(void* handle, const void* x, uint64_t rows, uint64_t width,
                                            const void* weight, const void* bias, void* out, float* mean,
                                            float* rstd, char* reason, size_t capacity) {
  try {
    auto* d = static_cast<Delegate*>(handle);
    webgpu::LayerNormOutputs outputs{out, mean, rstd};
    std::string why;
    std::lock_guard<std::mutex> lock(d->device->mutex());
    if (!d->op.run(x, rows, width, weight, bias, outputs, &why)) {
      copy_out(why, reason, capacity);
      return 0;
    }
    return 1;
  } catch (const std::bad_alloc&) {
    copy_out("out of memory in the delegate call", reason, capacity);
  } catch (...) {
    copy_out("unexpected exception", reason, capacity);
  }
  return 0;
}

PIPELINE_EXPORT void pipeline_layer_norm_close(void* handle) {
  auto* d = static_cast<Delegate*>(handle);
  if (d != nullptr) {
    std::lock_guard<std::mutex> lock(d->device->mutex());
    delete d;
  }
}

}  // extern "C"
