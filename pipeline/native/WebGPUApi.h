// The webgpu.h the library is built against, and the one place where the two
// implementations differ. Built plain, it is wgpu-native's (the wgpu wheel's headers; its
// symbols come from the process). Built with -DPIPELINE_WEBGPU_DAWN, it is Dawn's pre-1.0
// header (Chromium 133's, as dawn-python 0.3.0 ships it), and every call goes through a
// function pointer bound by dlsym on dawn-python's library: both libraries export the same
// names and a process may hold both. The rest of the C++ calls webgpu.h by its names and
// uses the aliases below where the headers name a type differently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#ifdef PIPELINE_WEBGPU_DAWN
#define WGPU_SKIP_DECLARATIONS
#include <dawn/webgpu.h>
#else
#include <webgpu.h>
#include <wgpu.h>
#endif

#include "kernel_config.h"

namespace pipeline {
namespace webgpu {

#ifdef PIPELINE_WEBGPU_DAWN
// Dawn's "2" calls take the callback-info structs that wgpu-native's plain calls take.
using RequestAdapterCallbackInfo = WGPURequestAdapterCallbackInfo2;
using RequestDeviceCallbackInfo = WGPURequestDeviceCallbackInfo2;
using BufferMapCallbackInfo = WGPUBufferMapCallbackInfo2;
using PopErrorScopeCallbackInfo = WGPUPopErrorScopeCallbackInfo2;
using DeviceLostCallback = WGPUDeviceLostCallback2;
using PassTimestampWrites = WGPUComputePassTimestampWrites;
constexpr WGPUFeatureName kSubgroupsFeature = WGPUFeatureName_Subgroups;
// The implementation as layouts tables name it, and its shader compiler.
constexpr const char* kImplementation = "dawn";
constexpr ShaderCompiler kShaderCompiler = ShaderCompiler::kTint;
constexpr const char* kNoAdapterHelp =
    "without a GPU Dawn needs SwiftShader's Vulkan driver (Debian's chromium-common): run `make setup`";

// Every call the C++ makes, bound from dawn-python's library by bind_library.
#define PIPELINE_DAWN_CALLS(X)                                                                             \
  X(AdapterGetInfo) X(AdapterGetLimits) X(AdapterHasFeature) X(AdapterInfoFreeMembers) X(AdapterRelease)   \
  X(BindGroupLayoutRelease) X(BindGroupRelease) X(BufferDestroy) X(BufferGetConstMappedRange)              \
  X(BufferGetMappedRange) X(BufferRelease) X(BufferUnmap) X(CommandBufferRelease)                          \
  X(CommandEncoderBeginComputePass) X(CommandEncoderCopyBufferToBuffer) X(CommandEncoderFinish)            \
  X(CommandEncoderRelease) X(CommandEncoderResolveQuerySet) X(ComputePassEncoderDispatchWorkgroups)        \
  X(ComputePassEncoderEnd) X(ComputePassEncoderRelease) X(ComputePassEncoderSetBindGroup)                  \
  X(ComputePassEncoderSetPipeline) X(ComputePipelineGetBindGroupLayout) X(ComputePipelineRelease)          \
  X(CreateInstance) X(DeviceCreateBindGroup) X(DeviceCreateBindGroupLayout) X(DeviceCreateBuffer)          \
  X(DeviceCreateCommandEncoder) X(DeviceCreateComputePipeline) X(DeviceCreatePipelineLayout)               \
  X(DeviceCreateQuerySet) X(DeviceCreateShaderModule) X(DeviceGetLimits) X(DeviceGetQueue)                 \
  X(DevicePushErrorScope) X(InstanceProcessEvents) X(InstanceWaitAny) X(PipelineLayoutRelease)             \
  X(QuerySetRelease) X(QueueSubmit) X(QueueWriteBuffer) X(ShaderModuleRelease)
// Bound to Dawn's "2" symbols under wgpu-native's names.
#define PIPELINE_DAWN_CALLS_2(X) \
  X(InstanceRequestAdapter) X(AdapterRequestDevice) X(BufferMapAsync) X(DevicePopErrorScope)
#define PIPELINE_DAWN_DECLARE(name) extern WGPUProc##name wgpu##name;
#define PIPELINE_DAWN_DECLARE_2(name) extern WGPUProc##name##2 wgpu##name;
PIPELINE_DAWN_CALLS(PIPELINE_DAWN_DECLARE)
PIPELINE_DAWN_CALLS_2(PIPELINE_DAWN_DECLARE_2)
#undef PIPELINE_DAWN_DECLARE
#undef PIPELINE_DAWN_DECLARE_2
#else
using RequestAdapterCallbackInfo = WGPURequestAdapterCallbackInfo;
using RequestDeviceCallbackInfo = WGPURequestDeviceCallbackInfo;
using BufferMapCallbackInfo = WGPUBufferMapCallbackInfo;
using PopErrorScopeCallbackInfo = WGPUPopErrorScopeCallbackInfo;
using DeviceLostCallback = WGPUDeviceLostCallback;
using PassTimestampWrites = WGPUPassTimestampWrites;
constexpr auto kSubgroupsFeature = static_cast<WGPUFeatureName>(WGPUNativeFeature_Subgroup);
// One compiler, naga, for wgpu-native and the Python runtime's wgpu: one table serves both.
constexpr const char* kImplementation = "wgpu";
constexpr ShaderCompiler kShaderCompiler = ShaderCompiler::kNaga;
constexpr const char* kNoAdapterHelp = "without a GPU install Mesa's lavapipe: apt-get install mesa-vulkan-drivers";
#endif

// Binds the calls from the implementation's library at `path` (Dawn: dawn-python's, which
// the process may have loaded already); wgpu-native's come from the process, so there it
// does nothing. False with `reason`.
bool bind_library(const char* path, std::string* reason);
// Whether the calls are bound; else false with `reason`.
bool library_bound(std::string* reason);

// An instance whose waits may block (Dawn: timed WaitAny).
WGPUInstance create_instance();
// Every adapter the instance offers; false where the implementation enumerates none from C
// (Dawn: request the one it offers instead).
bool enumerate_adapters(WGPUInstance instance, std::vector<WGPUAdapter>* adapters);
// The adapter's or device's limits.
bool get_limits(WGPUAdapter adapter, WGPULimits* limits);
bool get_limits(WGPUDevice device, WGPULimits* limits);

// What a device descriptor points at, kept alive until the device is made.
struct DeviceExtras {
#ifdef PIPELINE_WEBGPU_DAWN
  WGPURequiredLimits limits = {};
  WGPUDawnTogglesDescriptor toggles = {};
  const char* disabled_toggles[1] = {nullptr};
#else
  WGPULimits limits = {};
#endif
};
// Fills in `descriptor`'s required limits (`limits`, kept in `extras`), a lost-device
// callback and an uncaptured-error callback with `userdata`; on Dawn also timestamps at
// full resolution, as the Python runtime asks (Dawn quantizes them unless told otherwise).
void describe_device(WGPUDeviceDescriptor* descriptor, DeviceExtras* extras, const WGPULimits& limits,
                     DeviceLostCallback lost, WGPUUncapturedErrorCallback error, void* userdata);

// Answers pending callbacks once. wgpu-native polls `device` (where not null; `block`: until
// its work is done); Dawn, `block`, waits up to a slice for `future` (where it has an id),
// else processes events.
void poll(WGPUInstance instance, WGPUDevice device, WGPUFuture future, bool block);

}  // namespace webgpu
}  // namespace pipeline
