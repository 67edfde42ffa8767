// The native_layer_norm op of one delegate: its compute pipeline(s), constant weight/bias
// on the GPU, and the launch of a (rows, width) tensor of the blob's dtype, as
// pipeline/runtime/launch.py launches it (same WGSL, same configuration, same
// split into launches under the binding limit, same 2D grid past 65,535 workgroups).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "LayerNormConfig.h"
#include "WebGPUDelegateHeader.h"
#include "WebGPUDevice.h"

namespace pipeline {
namespace webgpu {

// Where results go; a null pointer is an output the delegate does not return. out is in
// the blob's dtype; mean and rstd are float32 as the kernel computes them (the caller
// rounds them to the affine dtype).
struct LayerNormOutputs {
  void* out = nullptr;
  float* mean = nullptr;
  float* rstd = nullptr;
};

// A call's GPU time: the sum of its launches' compute passes, from timestamp queries.
struct GpuTime {
  bool measured = false;  // false where the device has no timestamp queries
  uint64_t ns = 0;
};

class LayerNormLaunch {
 public:
  explicit LayerNormLaunch(WebGPUDevice* device) : device_(device) {}
  ~LayerNormLaunch();
  LayerNormLaunch(const LayerNormLaunch&) = delete;
  LayerNormLaunch& operator=(const LayerNormLaunch&) = delete;

  // Creates the layouts, compiles the pipeline when the width is static and uploads the
  // blob's constants (so the blob may be freed afterwards). Call with the device locked.
  bool prepare(const LayerNormBlob& blob, std::string* reason);

  // Normalizes `rows` rows of `width` values of the blob's dtype. `weight`/`bias` are
  // input-sourced values of its affine dtype (nullptr when the blob's source is not an
  // input). With `gpu_time`, the launches' GPU time is measured where the device can.
  // Call with the device locked.
  bool run(const void* x, uint64_t rows, uint64_t width, const void* weight, const void* bias,
           const LayerNormOutputs& outputs, std::string* reason, GpuTime* gpu_time = nullptr);

 private:
  struct Buffer {
    WGPUBuffer buffer = nullptr;
    uint64_t size = 0;
  };
  KernelConfig config_for(uint64_t width, uint64_t rows, bool write_stats) const;
  WGPUComputePipeline pipeline_for(const KernelConfig& config, std::string* reason);
  bool ensure(Buffer* buffer, uint64_t size, WGPUBufferUsage usage, std::string* reason);
  bool launch(WGPUComputePipeline pipeline, const KernelConfig& config, const uint8_t* x,
              uint64_t rows, uint64_t width, const LayerNormOutputs& outputs, std::string* reason,
              GpuTime* gpu_time);

  // One launch's grid and bytes: x and out in whole u32 words, mean and rstd after out in
  // the read-back buffer.
  struct LaunchPlan {
    uint32_t grid_x = 0, grid_y = 0;
    uint64_t data_bytes = 0, word_bytes = 0, affine_bytes = 0, stat_bytes = 0;
    uint64_t mean_at = 0, rstd_at = 0, read_bytes = 0;
    bool write_stats = false;
  };
  // The device's shared buffers a launch uses (WebGPUDevice::scratch).
  struct LaunchBuffers {
    WebGPUDevice::Scratch *x = nullptr, *out = nullptr, *mean = nullptr, *rstd = nullptr, *read = nullptr,
                          *upload = nullptr;
  };
  // The steps of `launch`, in order. False with `reason` where the grid exceeds the adapter.
  bool plan_for(const KernelConfig& config, uint64_t rows, uint64_t width, LaunchPlan* plan,
                std::string* reason) const;
  // The scratch buffers for `plan`, and the Params buffer.
  bool acquire(const LaunchPlan& plan, LaunchBuffers* buffers, std::string* reason);
  // The input into the upload buffer; Params written when the rows changed.
  bool stage(const uint8_t* x, uint64_t rows, const LaunchPlan& plan, const LaunchBuffers& buffers,
             std::string* reason);
  // The timestamp query set and its buffers.
  bool prepare_timestamps(std::string* reason);
  // The bind group of this launch's buffers and sizes (the last one, while they repeat).
  WGPUBindGroup bind_group(const LaunchPlan& plan, const LaunchBuffers& buffers);
  // Encodes upload copy, dispatch and read-back copies, and submits.
  bool submit(WGPUComputePipeline pipeline, const LaunchPlan& plan, const LaunchBuffers& buffers, bool timed,
              std::string* reason);
  // The outputs the delegate returns (and with `gpu_time`, the pass's time) from the read-back.
  bool read_back(const LaunchPlan& plan, const LaunchBuffers& buffers, const LayerNormOutputs& outputs,
                 GpuTime* gpu_time, std::string* reason);
  // Writes `bytes` at the start of `buffer`, the last partial u32 word zero-padded.
  void write_words(WGPUBuffer buffer, const void* data, uint64_t bytes);

  WebGPUDevice* device_;
  bool has_weight_ = false;
  bool has_bias_ = false;
  bool rms_ = false;  // an rms_norm's launches (the blob's op)
  uint32_t dtype_ = kFloat32;
  uint32_t affine_dtype_ = kFloat32;
  float eps_ = 0.0f;
  WGPUBindGroupLayout bind_layout_ = nullptr;
  WGPUPipelineLayout pipeline_layout_ = nullptr;
  // by (width, threads per row, workgroup, write_stats, wide_words): what choose_config and a tuned
  // layout vary for one delegate
  std::map<std::tuple<uint64_t, uint32_t, uint32_t, bool, bool>, WGPUComputePipeline> pipelines_;
  // The delegate's own buffers; a call's input, outputs, read-back and upload staging are
  // the device's, shared by every delegate (WebGPUDevice::scratch).
  Buffer weight_, bias_, params_;
  // The last launch's bind group, by its buffers, binding sizes and the device's scratch
  // generation.
  struct BindKey {
    uint64_t generation = 0;
    WGPUBuffer buffers[7] = {};
    uint64_t sizes[7] = {};
    bool operator==(const BindKey& o) const {
      return generation == o.generation && std::equal(buffers, buffers + 7, o.buffers) &&
             std::equal(sizes, sizes + 7, o.sizes);
    }
  };
  WGPUBindGroup group_ = nullptr;
  BindKey group_key_;
  uint64_t params_rows_ = 0;  // rows in the Params buffer (0: not written)
  // Timestamps around a launch's compute pass, when its ETDump event wants the GPU time.
  WGPUQuerySet queries_ = nullptr;
  Buffer stamps_, stamps_read_;
};

}  // namespace webgpu
}  // namespace pipeline
