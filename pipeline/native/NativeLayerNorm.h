// The native_layer_norm op of one delegate: its compute pipeline(s), constant weight/bias
// on the GPU, and the launch of a (rows, width) float32 tensor, as
// pipeline/runtime/native_layer_norm.py launches it (same WGSL, same configuration, same
// split into launches under the binding limit, same 2D grid past 65,535 workgroups).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "NativeLayerNormConfig.h"
#include "WebGPUDelegateHeader.h"
#include "WebGPUDevice.h"

namespace executorch {
namespace backends {
namespace webgpu {

// Where results go; a null pointer is an output the delegate does not return.
struct LayerNormOutputs {
  float* out = nullptr;
  float* mean = nullptr;
  float* rstd = nullptr;
};

class NativeLayerNorm {
 public:
  explicit NativeLayerNorm(WebGPUDevice* device) : device_(device) {}
  ~NativeLayerNorm();
  NativeLayerNorm(const NativeLayerNorm&) = delete;
  NativeLayerNorm& operator=(const NativeLayerNorm&) = delete;

  // Creates the layouts, compiles the pipeline when the width is static and uploads the
  // blob's constants (so the blob may be freed afterwards). Call with the device locked.
  bool prepare(const LayerNormBlob& blob, std::string* reason);

  // Normalizes `rows` rows of `width` values. `weight`/`bias` are input-sourced values
  // (nullptr when the blob's source is not an input). Call with the device locked.
  bool run(const float* x, uint64_t rows, uint64_t width, const float* weight, const float* bias,
           const LayerNormOutputs& outputs, std::string* reason);

 private:
  struct Buffer {
    WGPUBuffer buffer = nullptr;
    uint64_t size = 0;
  };
  WGPUComputePipeline pipeline_for(uint64_t width, std::string* reason);
  bool ensure(Buffer* buffer, uint64_t size, WGPUBufferUsage usage, std::string* reason);
  bool launch(WGPUComputePipeline pipeline, const KernelConfig& config, const float* x,
              uint64_t rows, uint64_t width, const LayerNormOutputs& outputs, std::string* reason);

  WebGPUDevice* device_;
  bool has_weight_ = false;
  bool has_bias_ = false;
  float eps_ = 0.0f;
  WGPUBindGroupLayout bind_layout_ = nullptr;
  WGPUPipelineLayout pipeline_layout_ = nullptr;
  std::map<uint64_t, WGPUComputePipeline> pipelines_;  // by width
  Buffer weight_, bias_, x_, out_, mean_, rstd_, params_;
  Buffer out_read_, mean_read_, rstd_read_;
};

}  // namespace webgpu
}  // namespace backends
}  // namespace executorch
