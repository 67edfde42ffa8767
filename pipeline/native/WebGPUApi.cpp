#include "WebGPUApi.h"

#ifdef PIPELINE_WEBGPU_DAWN
#include <dlfcn.h>
#endif

namespace pipeline {
namespace webgpu {

#ifdef PIPELINE_WEBGPU_DAWN
namespace {
// How long one blocking poll waits for its future before the caller's loop runs again.
constexpr uint64_t kWaitSliceNs = 100'000'000;
bool bound = false;
}  // namespace

#define PIPELINE_DAWN_DEFINE(name, symbol) WGPUProc##symbol wgpu##name = nullptr;
PIPELINE_DAWN_CALLS(PIPELINE_DAWN_DEFINE)
#undef PIPELINE_DAWN_DEFINE

bool bind_library(const char* path, std::string* reason) {
  if (bound) {
    return true;
  }
  // The copy dawn-python loaded, where it has; never made global (wgpu-native's names).
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (handle == nullptr) {
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  }
  if (handle == nullptr) {
    const char* error = dlerror();
    *reason = std::string("cannot load Dawn's library: ") + (error ? error : path);
    return false;
  }
  std::string missing;
#define PIPELINE_DAWN_BIND(name, symbol)                                                  \
  wgpu##name = reinterpret_cast<decltype(wgpu##name)>(dlsym(handle, "wgpu" #symbol)); \
  if (wgpu##name == nullptr) missing += std::string(missing.empty() ? "" : ", ") + "wgpu" #symbol;
  PIPELINE_DAWN_CALLS(PIPELINE_DAWN_BIND)
#undef PIPELINE_DAWN_BIND
  if (!missing.empty()) {
    *reason = std::string(path) + " lacks " + missing + " (built for dawn-python 0.3.0's Dawn)";
    return false;
  }
  bound = true;
  return true;
}

bool library_bound(std::string* reason) {
  if (!bound) {
    *reason = "Dawn's library is not bound (pipeline_layer_norm_bind was not called)";
  }
  return bound;
}

WGPUInstance create_instance() {
  WGPUInstanceDescriptor descriptor = {};
  descriptor.features.timedWaitAnyEnable = true;
  return wgpuCreateInstance(&descriptor);
}

bool enumerate_adapters(WGPUInstance, std::vector<WGPUAdapter>*) { return false; }

bool get_limits(WGPUAdapter adapter, WGPULimits* limits) {
  WGPUSupportedLimits supported = {};
  const bool ok = wgpuAdapterGetLimits(adapter, &supported) == WGPUStatus_Success;
  *limits = supported.limits;
  return ok;
}

bool get_limits(WGPUDevice device, WGPULimits* limits) {
  WGPUSupportedLimits supported = {};
  const bool ok = wgpuDeviceGetLimits(device, &supported) == WGPUStatus_Success;
  *limits = supported.limits;
  return ok;
}

void describe_device(WGPUDeviceDescriptor* descriptor, DeviceExtras* extras, const WGPULimits& limits,
                     DeviceLostCallback lost, WGPUUncapturedErrorCallback error, void* userdata) {
  extras->limits.limits = limits;
  descriptor->requiredLimits = &extras->limits;
  extras->disabled_toggles[0] = "timestamp_quantization";
  extras->toggles.chain.sType = WGPUSType_DawnTogglesDescriptor;
  extras->toggles.disabledToggleCount = 1;
  extras->toggles.disabledToggles = extras->disabled_toggles;
  descriptor->nextInChain = &extras->toggles.chain;
  descriptor->deviceLostCallbackInfo2.mode = WGPUCallbackMode_AllowSpontaneous;
  descriptor->deviceLostCallbackInfo2.callback = lost;
  descriptor->uncapturedErrorCallbackInfo2.callback = error;
  descriptor->uncapturedErrorCallbackInfo2.userdata1 = userdata;
}

void poll(WGPUInstance instance, WGPUDevice, WGPUFuture future, bool block) {
  if (block && future.id != 0) {
    WGPUFutureWaitInfo wait = {future, false};
    wgpuInstanceWaitAny(instance, 1, &wait, kWaitSliceNs);
  } else {
    wgpuInstanceProcessEvents(instance);
  }
}

#else

bool bind_library(const char*, std::string*) { return true; }

bool library_bound(std::string*) { return true; }

WGPUInstance create_instance() { return wgpuCreateInstance(nullptr); }

bool enumerate_adapters(WGPUInstance instance, std::vector<WGPUAdapter>* adapters) {
  size_t count = wgpuInstanceEnumerateAdapters(instance, nullptr, nullptr);
  adapters->resize(count);
  if (count > 0) {
    count = wgpuInstanceEnumerateAdapters(instance, nullptr, adapters->data());
  }
  adapters->resize(count);
  return true;
}

bool get_limits(WGPUAdapter adapter, WGPULimits* limits) {
  *limits = WGPU_LIMITS_INIT;
  const bool ok = wgpuAdapterGetLimits(adapter, limits) == WGPUStatus_Success;
  limits->nextInChain = nullptr;
  return ok;
}

bool get_limits(WGPUDevice device, WGPULimits* limits) {
  *limits = WGPU_LIMITS_INIT;
  const bool ok = wgpuDeviceGetLimits(device, limits) == WGPUStatus_Success;
  limits->nextInChain = nullptr;
  return ok;
}

void describe_device(WGPUDeviceDescriptor* descriptor, DeviceExtras* extras, const WGPULimits& limits,
                     DeviceLostCallback lost, WGPUUncapturedErrorCallback error, void* userdata) {
  extras->limits = limits;
  descriptor->requiredLimits = &extras->limits;
  descriptor->deviceLostCallbackInfo.mode = WGPUCallbackMode_AllowSpontaneous;
  descriptor->deviceLostCallbackInfo.callback = lost;
  descriptor->uncapturedErrorCallbackInfo.callback = error;
  descriptor->uncapturedErrorCallbackInfo.userdata1 = userdata;
}

void poll(WGPUInstance instance, WGPUDevice device, WGPUFuture, bool block) {
  if (device != nullptr) {
    wgpuDevicePoll(device, block, nullptr);
  }
  wgpuInstanceProcessEvents(instance);
}

#endif

}  // namespace webgpu
}  // namespace pipeline
