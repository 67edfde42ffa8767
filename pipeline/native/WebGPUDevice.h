// The process's adapter, device and queue (wgpu-native's, or Dawn's: WebGPUApi.h), created
// on first use and shared by every delegate. wgpu-native has no wgpuInstanceWaitAny (it
// panics), so every asynchronous step uses WGPUCallbackMode_AllowProcessEvents and a poll
// loop (on Dawn the loop waits on the step's future); errors go to an uncaptured-error
// callback or an error scope instead of the default fatal handler.
#pragma once

#include "WebGPUApi.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "LayerNormConfig.h"

namespace pipeline {
namespace webgpu {

class WebGPUDevice {
 public:
  // The shared device, or nullptr with `reason` when no adapter or device can be had.
  // Never throws.
  static WebGPUDevice* get(std::string* reason);

  WGPUDevice device() const { return device_; }
  WGPUQueue queue() const { return queue_; }
  const WGPULimits& limits() const { return limits_; }
  // The most bytes one binding holds: a row of x must fit in one.
  uint64_t binding_limit() const {
    return limits_.maxStorageBufferBindingSize < limits_.maxBufferSize ? limits_.maxStorageBufferBindingSize
                                                                       : limits_.maxBufferSize;
  }
  // The smallest subgroup size the kernel may rely on; 0 when subgroups are not used.
  uint32_t subgroup_size() const { return subgroup_size_; }
  // Whether pack2x16float rounds as aten does here (f16_pack_probe.wgsl): float16 stores use it.
  bool pack2x16float() const { return pack2x16float_; }
  const std::string& adapter_name() const { return adapter_name_; }
  // The layouts tuned on this device: the table PIPELINE_LAYOUTS names, or, unset, the one
  // shipped for this adapter; nullptr where there is none (the rule's).
  const LayoutTable* layouts() const { return layouts_.source.empty() ? nullptr : &layouts_; }
  // Whether the device has timestamp queries (a delegate call's GPU time for ETDump).
  bool has_timestamps() const { return has_timestamps_; }

  // All GPU work of the backend runs under this lock (the queue and the pools are shared).
  std::mutex& mutex() { return mutex_; }

  // Creates a shader module and a compute pipeline inside a validation error scope.
  // Returns nullptr with `reason` on a compile or validation error.
  WGPUComputePipeline create_pipeline(const std::string& wgsl, WGPUPipelineLayout layout,
                                      const char* label, std::string* reason);

  // Maps the first `size` bytes of `buffer` once the GPU is done with it; nullptr with
  // `reason` (naming the `what` buffer) if that fails. The caller unmaps.
  void* map(WGPUBuffer buffer, WGPUMapMode mode, size_t size, const char* what, std::string* reason);

  // Maps `buffer` for reading, waits, and copies its first `size` bytes to `dst`.
  bool read_buffer(WGPUBuffer buffer, size_t size, void* dst, std::string* reason);

  // Bytes [offset, offset + size) of a mapped buffer, copied to `dst`.
  struct Range {
    size_t offset;
    size_t size;
    void* dst;
  };
  // Maps the first `size` bytes of `buffer` for reading once, and copies each range out.
  bool read_ranges(WGPUBuffer buffer, size_t size, const Range* ranges, size_t count, std::string* reason);

  // One request to map a buffer, answered by a later poll.
  struct MapRequest {
    WGPUMapMode mode = WGPUMapMode_Read;
    size_t size = 0;
    bool done = false;
    WGPUMapAsyncStatus status = WGPUMapAsyncStatus_Error;
    std::string message;
    WGPUFuture future = {};
  };
  // Asks for the first `size` bytes of `buffer` mapped once the GPU is done with it; returns
  // at once. Waiting polls the device, so requests made earlier are answered meanwhile.
  std::shared_ptr<MapRequest> map_async(WGPUBuffer buffer, WGPUMapMode mode, size_t size);
  // Waits for `request` and returns its mapping (the caller unmaps); nullptr with `reason`
  // (naming the `what` buffer) if it failed.
  void* mapped(WGPUBuffer buffer, const MapRequest& request, const char* what, std::string* reason);

  // Waits for submitted work; false with `reason` if a validation error was reported since
  // the last call.
  bool finish(std::string* reason);

  // False with `reason` if a validation error was reported since the last call. No wait:
  // wgpu-native reports an error from the call that makes it.
  bool check(std::string* reason);

  // Since the device was opened (the runtime's stats()): kernel launches submitted, kernel
  // pipelines compiled, and buffers allocated for launches.
  std::atomic<uint64_t> dispatches{0};
  std::atomic<uint64_t> pipelines_compiled{0};
  std::atomic<uint64_t> buffers_allocated{0};

  // Makes `*buffer` (of `*capacity` bytes) hold at least `size` bytes (16 at least) of
  // `usage`: a new buffer replaces a smaller one, and `*replaced` says so. False with
  // `reason` past the adapter's maxBufferSize or when allocation fails.
  bool grow(WGPUBuffer* buffer, uint64_t* capacity, uint64_t size, WGPUBufferUsage usage, bool* replaced,
            std::string* reason);

  // Buffers every launch shares (launches run under mutex()): a call's input, output,
  // statistics, read-back and upload staging, sized by the largest call so far, not once
  // per delegate. `map` is the upload buffer's pending write mapping.
  enum ScratchRole { kScratchX, kScratchOut, kScratchMean, kScratchRstd, kScratchRead, kScratchUpload, kScratchRoles };
  struct Scratch {
    WGPUBuffer buffer = nullptr;
    uint64_t size = 0;
    std::shared_ptr<MapRequest> map;
  };
  // The shared buffer for `role`, grown to at least `size` bytes; nullptr with `reason`.
  Scratch* scratch(ScratchRole role, uint64_t size, WGPUBufferUsage usage, std::string* reason);
  // Bumped whenever a scratch buffer is replaced: bind groups over the old ones are stale
  // (a new buffer may reuse an old handle's address).
  uint64_t scratch_generation() const { return scratch_generation_; }

 private:
  WebGPUDevice() = default;
  bool open(std::string* reason);
  // The steps of `open`: the adapter whose name holds `wanted` (any case), or the one wgpu
  // offers for high performance; then the device with the adapter's limits and features.
  bool adapter_named(const char* wanted, std::string* reason);
  bool request_adapter(std::string* reason);
  bool open_device(std::string* reason);
  // The table PIPELINE_LAYOUTS names, when set (but to "none"): false with `reason` when it
  // cannot be read or was tuned on another adapter or implementation; unset, the one shipped
  // for this adapter through wgpu, if any.
  bool read_layouts(std::string* reason);
  // One storage binding of a probe shader: its size, and its initial bytes (null: none).
  struct ProbeBinding {
    const void* data;
    size_t size;
  };
  bool run_probe(const char* shader, const std::vector<ProbeBinding>& bindings, uint32_t groups, size_t read,
                 void* out, bool subgroups = false);
  void probe_subgroup_size();
  void probe_f16_pack();
  // Polls the device and processes events until `*done` (the callback of `future`), or gives up.
  bool wait(const bool* done, WGPUFuture future = {});

  WGPUInstance instance_ = nullptr;
  WGPUAdapter adapter_ = nullptr;
  WGPUDevice device_ = nullptr;
  WGPUQueue queue_ = nullptr;
  WGPULimits limits_ = WGPU_LIMITS_INIT;
  uint32_t subgroup_size_ = 0;
  bool pack2x16float_ = false;
  bool has_subgroups_ = false;
  bool has_timestamps_ = false;
  bool cpu_adapter_ = false;  // lavapipe, SwiftShader: waits never spin
  std::string adapter_name_;
  LayoutTable layouts_;
  std::string uncaptured_error_;  // the first error nobody captured, reported by finish()
  Scratch scratch_[kScratchRoles];
  uint64_t scratch_generation_ = 0;
  std::mutex mutex_;
};

}  // namespace webgpu
}  // namespace pipeline
