// The webgpu.h the library is built against, and the one place where the two
// implementations differ. Built plain, it is wgpu-native's (the wgpu wheel's headers; its
// symbols come from the process). Built with -DPIPELINE_WEBGPU_DAWN, it is Dawn's pre-1.0 C
// API (Chromium 133's, as dawn-python 0.3.0 ships it) as dawn_webgpu.h declares it, generated
// from dawn-python's ctypes bindings (dawn_webgpu.py), and every call goes through a function
// pointer bound by dlsym on dawn-python's library: both libraries export the same names and a
// process may hold both. The rest of the C++ calls webgpu.h by its names and uses the aliases
// below where the headers name a type differently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#ifdef PIPELINE_WEBGPU_DAWN
#include "dawn_webgpu.h"
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

// Every call the C++ makes (dawn_webgpu.CALLS), bound from dawn-python's library by
// bind_library; wgpu##name is WGPUProc##symbol, Dawn's "2" symbol where it has one.
#define PIPELINE_DAWN_DECLARE(name, symbol) extern WGPUProc##symbol wgpu##name;
PIPELINE_DAWN_CALLS(PIPELINE_DAWN_DECLARE)
#undef PIPELINE_DAWN_DECLARE

// The shared code starts its structs from wgpu-native's *_INIT macros. Here each is zero,
// which every field the shared code leaves has for its default, but a WGSL source's sType and
// the adapter's feature level (Core).
#define WGPU_STRLEN SIZE_MAX
#define WGPU_ADAPTER_INFO_INIT WGPUAdapterInfo{}
#define WGPU_BIND_GROUP_DESCRIPTOR_INIT WGPUBindGroupDescriptor{}
#define WGPU_BIND_GROUP_ENTRY_INIT WGPUBindGroupEntry{}
#define WGPU_BIND_GROUP_LAYOUT_DESCRIPTOR_INIT WGPUBindGroupLayoutDescriptor{}
#define WGPU_BIND_GROUP_LAYOUT_ENTRY_INIT WGPUBindGroupLayoutEntry{}
#define WGPU_BUFFER_DESCRIPTOR_INIT WGPUBufferDescriptor{}
#define WGPU_COMPUTE_PASS_DESCRIPTOR_INIT WGPUComputePassDescriptor{}
#define WGPU_COMPUTE_PIPELINE_DESCRIPTOR_INIT WGPUComputePipelineDescriptor{}
#define WGPU_DEVICE_DESCRIPTOR_INIT WGPUDeviceDescriptor{}
#define WGPU_LIMITS_INIT WGPULimits{}
#define WGPU_PIPELINE_LAYOUT_DESCRIPTOR_INIT WGPUPipelineLayoutDescriptor{}
#define WGPU_QUERY_SET_DESCRIPTOR_INIT WGPUQuerySetDescriptor{}
#define WGPU_SHADER_MODULE_DESCRIPTOR_INIT WGPUShaderModuleDescriptor{}
#define WGPU_REQUEST_ADAPTER_OPTIONS_INIT ::pipeline::webgpu::request_adapter_options()
#define WGPU_SHADER_SOURCE_WGSL_INIT ::pipeline::webgpu::shader_source_wgsl()

inline WGPURequestAdapterOptions request_adapter_options() {
  WGPURequestAdapterOptions options = {};
  options.featureLevel = WGPUFeatureLevel_Core;
  return options;
}

inline WGPUShaderSourceWGSL shader_source_wgsl() {
  WGPUShaderSourceWGSL source = {};
  source.chain.sType = WGPUSType_ShaderSourceWGSL;
  return source;
}
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
