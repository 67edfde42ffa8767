#include "WebGPUDevice.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "HostCopy.h"
#include "LayerNormConfig.h"
#include "environment.h"
#include "wgsl_sources.h"

namespace pipeline {
namespace webgpu {
namespace {

// Same switches as the Python runtime (pipeline/runtime/device.py).
// Poll rounds before a wait is declared stuck (each round blocks on the GPU first).
constexpr int kMaxPollRounds = 100000;
// How long a wait spins on non-blocking polls before it blocks, on a GPU: a blocked poll's
// wake-up is tens of microseconds of a small call (CUDA's default also spins while it
// waits). PIPELINE_POLL_SPIN_US overrides it (0: block at once). A CPU adapter never spins:
// its "GPU" is these cores.
constexpr const char* kPollSpinEnv = "PIPELINE_POLL_SPIN_US";
constexpr long kPollSpinMicros = 1000;

WGPUStringView view(const char* s) { return WGPUStringView{s, s ? std::strlen(s) : 0}; }
WGPUStringView view(const std::string& s) { return WGPUStringView{s.data(), s.size()}; }

std::string text(WGPUStringView v) {
  if (v.data == nullptr) {
    return "";
  }
  return v.length == WGPU_STRLEN ? std::string(v.data) : std::string(v.data, v.length);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string name_of(WGPUAdapter adapter) {
  WGPUAdapterInfo info = WGPU_ADAPTER_INFO_INIT;
  if (wgpuAdapterGetInfo(adapter, &info) != WGPUStatus_Success) {
    return "unknown";
  }
  std::string name = text(info.device);
  if (name.empty()) name = text(info.description);
  if (name.empty()) name = text(info.vendor);
  wgpuAdapterInfoFreeMembers(info);
  return name.empty() ? "unknown" : name;
}

struct AdapterRequest {
  bool done = false;
  WGPUAdapter adapter = nullptr;
  std::string message;
};

struct DeviceRequest {
  bool done = false;
  WGPUDevice device = nullptr;
  std::string message;
};

struct ScopeResult {
  bool done = false;
  WGPUErrorType type = WGPUErrorType_NoError;
  std::string message;
};

void on_adapter(WGPURequestAdapterStatus status, WGPUAdapter adapter, WGPUStringView message,
                void* userdata1, void*) {
  auto* request = static_cast<AdapterRequest*>(userdata1);
  request->adapter = status == WGPURequestAdapterStatus_Success ? adapter : nullptr;
  request->message = text(message);
  request->done = true;
}

void on_device(WGPURequestDeviceStatus status, WGPUDevice device, WGPUStringView message,
               void* userdata1, void*) {
  auto* request = static_cast<DeviceRequest*>(userdata1);
  request->device = status == WGPURequestDeviceStatus_Success ? device : nullptr;
  request->message = text(message);
  request->done = true;
}

void on_scope(WGPUPopErrorScopeStatus, WGPUErrorType type, WGPUStringView message, void* userdata1,
              void*) {
  auto* result = static_cast<ScopeResult*>(userdata1);
  result->type = type;
  result->message = text(message);
  result->done = true;
}

// userdata1: a heap copy of the request's shared pointer, dropped here (the request
// outlives its owner's interest: a buffer destroyed with a pending map answers later).
void on_map(WGPUMapAsyncStatus status, WGPUStringView message, void* userdata1, void*) {
  auto* request = static_cast<std::shared_ptr<WebGPUDevice::MapRequest>*>(userdata1);
  (*request)->status = status;
  (*request)->message = text(message);
  (*request)->done = true;
  delete request;
}

void on_uncaptured_error(WGPUDevice const*, WGPUErrorType, WGPUStringView message, void* userdata1,
                         void*) {
  auto* first = static_cast<std::string*>(userdata1);
  if (first->empty()) {
    *first = text(message);
    if (first->empty()) *first = std::string("unspecified ") + kImplementation + " error";
  }
}

void on_device_lost(WGPUDevice const*, WGPUDeviceLostReason, WGPUStringView, void*, void*) {}

// What a path that is not a regular file is, in pipeline.ioutil.file_kind's words.
const char* file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a named pipe";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

// The bytes of the file at `path` into `data`, as the Python runtime reads a layouts file
// (ioutil.read_regular): "" or why not.
std::string read_regular(const char* path, std::string* data) {
  // Opened without blocking (a named pipe would wait for a writer), refused unless a regular
  // file, and at most kLayoutsMaxBytes read (/dev/zero never ends).
  std::string why;
  const int fd = ::open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  struct stat info {};
  if (fd < 0) {
    const int error = errno;
    // A socket, or a device with no driver behind it, does not open: say what it is.
    why = error == ENXIO && ::stat(path, &info) == 0 ? std::string("Not a regular file (") + file_kind(info.st_mode) + ")"
                                                     : std::strerror(error);
  } else if (::fstat(fd, &info) != 0) {
    why = std::strerror(errno);
  } else if (S_ISDIR(info.st_mode)) {
    why = std::strerror(EISDIR);
  } else if (!S_ISREG(info.st_mode)) {
    why = std::string("Not a regular file (") + file_kind(info.st_mode) + ")";
  } else {
    char chunk[4096];
    while (why.empty() && data->size() <= kLayoutsMaxBytes) {
      const ssize_t got = ::read(fd, chunk, sizeof chunk);
      if (got < 0 && errno != EINTR) {
        why = std::strerror(errno);
      } else if (got == 0) {
        break;
      } else if (got > 0) {
        data->append(chunk, static_cast<size_t>(got));
      }
    }
    if (why.empty() && data->size() > kLayoutsMaxBytes) {
      why = "Larger than " + std::to_string(kLayoutsMaxBytes) + " bytes";
    }
  }
  if (fd >= 0) {
    ::close(fd);
  }
  return why;
}


}  // namespace

WebGPUDevice* WebGPUDevice::get(std::string* reason) {
  // Created once and kept for the life of the process: releasing wgpu-native objects
  // from static destructors at exit races with the library's own teardown.
  static std::string failure;
  static WebGPUDevice* const shared = [] {
    auto* device = new (std::nothrow) WebGPUDevice();
    if (device == nullptr) {
      failure = "out of memory";
      return static_cast<WebGPUDevice*>(nullptr);
    }
    if (!device->open(&failure)) {
      return static_cast<WebGPUDevice*>(nullptr);  // half-opened objects are kept, not reused
    }
    return device;
  }();
  if (shared == nullptr && reason != nullptr) {
    *reason = failure;
  }
  return shared;
}

bool WebGPUDevice::wait(const bool* done, WGPUFuture future) {
  long spin = cpu_adapter_ ? 0 : kPollSpinMicros;
  if (const char* env = std::getenv(kPollSpinEnv); env != nullptr && *env != '\0') {
    spin = std::max(0L, std::strtol(env, nullptr, 10));
  }
  if (spin > 0 && device_ != nullptr) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin);
    while (!*done && std::chrono::steady_clock::now() < until) {
      poll(instance_, device_, future, false);
    }
  }
  for (int round = 0; round < kMaxPollRounds && !*done; ++round) {
    poll(instance_, device_, future, true);
    if (!*done && device_ == nullptr) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  return *done;
}

bool WebGPUDevice::open(std::string* reason) {
  if (!library_bound(reason)) {
    return false;
  }
  instance_ = create_instance();
  if (instance_ == nullptr) {
    *reason = "wgpuCreateInstance failed";
    return false;
  }
  // Adapter: by name when PIPELINE_WGPU_ADAPTER is set, else the high-performance one.
  const char* wanted = std::getenv(kAdapterEnv);
  const bool found = wanted != nullptr && *wanted != '\0' ? adapter_named(wanted, reason) : request_adapter(reason);
  if (!found) {
    return false;
  }
  adapter_name_ = name_of(adapter_);
  if (!read_layouts(reason)) {
    return false;
  }
  WGPUAdapterInfo info = WGPU_ADAPTER_INFO_INIT;
  if (wgpuAdapterGetInfo(adapter_, &info) == WGPUStatus_Success) {
    cpu_adapter_ = info.adapterType == WGPUAdapterType_CPU;
    wgpuAdapterInfoFreeMembers(info);
  }
  if (!open_device(reason)) {
    return false;
  }
  // The probes, unless the Python runtime's switches turn them off.
  const char* subgroups = std::getenv(kSubgroupsEnv);
  if (has_subgroups_ && !(subgroups != nullptr && std::strcmp(subgroups, "0") == 0)) {
    probe_subgroup_size();
  }
  const char* f16_pack = std::getenv(kF16PackEnv);
  if (!(f16_pack != nullptr && std::strcmp(f16_pack, "0") == 0)) {
    probe_f16_pack();
  }
  return true;
}

bool WebGPUDevice::read_layouts(std::string* reason) {
  const char* path = std::getenv(kLayoutsEnv);
  // Unset: the table shipped for this adapter, where one is; "none": the rule everywhere.
  if (path == nullptr || *path == '\0') {
    shipped_layouts(adapter_name_, kImplementation, &layouts_);
    return true;
  }
  if (std::strcmp(path, kLayoutsNone) == 0) {
    return true;
  }
  // The text only for its hash: the table comes from its binary twin beside it.
  std::string text, twin;
  std::string why = read_regular(path, &text);
  if (!why.empty()) {
    *reason = std::string(path) + ": cannot read the layouts file: " + why;
    return false;
  }
  const std::string twin_path = std::string(path) + kLayoutsTwinSuffix;
  why = read_regular(twin_path.c_str(), &twin);
  if (!why.empty()) {
    *reason = twin_path + ": cannot read the binary twin of " + path + ", the table the C++ backend reads (" +
              "scripts/tune_layouts.py --twin " + path + " writes it): " + why;
    return false;
  }
  const uint64_t hash = fnv1a64(text);
  if (!decode_layouts(twin, twin_path, &hash, &layouts_, reason)) {
    return false;  // the device does not open: nothing reads layouts_
  }
  layouts_.source = path;
  if (layouts_.adapter != adapter_name_ || layouts_.implementation != kImplementation) {
    *reason = std::string(path) + ": tuned on '" + layouts_.adapter + "' through " + layouts_.implementation +
              "; this device is '" + adapter_name_ + "' through " + kImplementation +
              ". Tune this device (scripts/tune_layouts.py) or unset " + kLayoutsEnv;
    return false;
  }
  return true;
}

bool WebGPUDevice::adapter_named(const char* wanted, std::string* reason) {
  std::vector<WGPUAdapter> adapters;
  if (!enumerate_adapters(instance_, &adapters)) {  // the one adapter offered, by its name
    if (!request_adapter(reason)) {
      return false;
    }
    adapters.push_back(adapter_);
    adapter_ = nullptr;
  }
  std::string seen;
  for (size_t i = 0; i < adapters.size(); ++i) {
    std::string name = name_of(adapters[i]);
    if (adapter_ == nullptr && lower(name).find(lower(wanted)) != std::string::npos) {
      adapter_ = adapters[i];
    } else {
      wgpuAdapterRelease(adapters[i]);
    }
    seen += (seen.empty() ? "" : ", ") + name;
  }
  if (adapter_ == nullptr) {
    *reason = std::string(kAdapterEnv) + "=" + wanted + " matches no adapter; " + kImplementation + " sees: " +
              (seen.empty() ? "none" : seen);
    return false;
  }
  return true;
}

bool WebGPUDevice::request_adapter(std::string* reason) {
  WGPURequestAdapterOptions options = WGPU_REQUEST_ADAPTER_OPTIONS_INIT;
  options.powerPreference = WGPUPowerPreference_HighPerformance;
  AdapterRequest request;
  RequestAdapterCallbackInfo callback = {};
  callback.mode = WGPUCallbackMode_AllowProcessEvents;
  callback.callback = on_adapter;
  callback.userdata1 = &request;
  const WGPUFuture future = wgpuInstanceRequestAdapter(instance_, &options, callback);
  if (!wait(&request.done, future) || request.adapter == nullptr) {
    *reason = std::string(kImplementation) + " found no GPU adapter (" + request.message + "); " + kNoAdapterHelp;
    return false;
  }
  adapter_ = request.adapter;
  return true;
}

bool WebGPUDevice::open_device(std::string* reason) {
  // The adapter's full limits, subgroups and timestamp queries when offered.
  WGPULimits adapter_limits;
  if (!get_limits(adapter_, &adapter_limits)) {
    *reason = "wgpuAdapterGetLimits failed on " + adapter_name_;
    return false;
  }
  has_subgroups_ = wgpuAdapterHasFeature(adapter_, kSubgroupsFeature);
  has_timestamps_ = wgpuAdapterHasFeature(adapter_, WGPUFeatureName_TimestampQuery);
  std::vector<WGPUFeatureName> features;
  if (has_subgroups_) features.push_back(kSubgroupsFeature);
  if (has_timestamps_) features.push_back(WGPUFeatureName_TimestampQuery);
  WGPUDeviceDescriptor descriptor = WGPU_DEVICE_DESCRIPTOR_INIT;
  descriptor.label = view("pipeline native");
  descriptor.requiredFeatureCount = features.size();
  descriptor.requiredFeatures = features.empty() ? nullptr : features.data();
  DeviceExtras extras;
  describe_device(&descriptor, &extras, adapter_limits, on_device_lost, on_uncaptured_error, &uncaptured_error_);
  DeviceRequest request;
  RequestDeviceCallbackInfo callback = {};
  callback.mode = WGPUCallbackMode_AllowProcessEvents;
  callback.callback = on_device;
  callback.userdata1 = &request;
  const WGPUFuture future = wgpuAdapterRequestDevice(adapter_, &descriptor, callback);
  if (!wait(&request.done, future) || request.device == nullptr) {
    *reason = "requesting a device from " + adapter_name_ + " failed: " + request.message;
    return false;
  }
  device_ = request.device;
  queue_ = wgpuDeviceGetQueue(device_);
  if (!get_limits(device_, &limits_)) {
    *reason = "wgpuDeviceGetLimits failed";
    return false;
  }
  return true;
}

// Runs one probe shader (an embedded pipeline/wgsl/ file) once over `groups` workgroups:
// binding i is a storage buffer of bindings[i].size bytes, filled from bindings[i].data when
// it is not null; the bytes of binding `read` are copied to `out`. False when the shader is
// missing or does not compile, or the read-back fails.
bool WebGPUDevice::run_probe(const char* shader, const std::vector<ProbeBinding>& bindings, uint32_t groups,
                             size_t read, void* out, bool subgroups) {
  const std::string* source = wgsl_file(shader);
  std::string reason;
  // With the directives the compiler needs for subgroup operations (Tint's), as the kernel's.
  const std::string code = source ? (subgroups ? subgroups_directive(kShaderCompiler) : "") + *source : "";
  WGPUComputePipeline pipeline = source ? create_pipeline(code, nullptr, shader, &reason) : nullptr;
  if (pipeline == nullptr) {
    return false;
  }
  WGPUBufferDescriptor desc = WGPU_BUFFER_DESCRIPTOR_INIT;
  desc.usage = WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc | WGPUBufferUsage_CopyDst;
  std::vector<WGPUBuffer> buffers;
  std::vector<WGPUBindGroupEntry> entries;
  for (const ProbeBinding& binding : bindings) {
    desc.size = binding.size;
    buffers.push_back(wgpuDeviceCreateBuffer(device_, &desc));
    if (binding.data != nullptr) {
      wgpuQueueWriteBuffer(queue_, buffers.back(), 0, binding.data, binding.size);
    }
    WGPUBindGroupEntry entry = WGPU_BIND_GROUP_ENTRY_INIT;
    entry.binding = static_cast<uint32_t>(entries.size());
    entry.buffer = buffers.back();
    entry.size = binding.size;
    entries.push_back(entry);
  }
  desc.usage = WGPUBufferUsage_MapRead | WGPUBufferUsage_CopyDst;
  desc.size = bindings[read].size;
  WGPUBuffer staging = wgpuDeviceCreateBuffer(device_, &desc);

  WGPUBindGroupLayout layout = wgpuComputePipelineGetBindGroupLayout(pipeline, 0);
  WGPUBindGroupDescriptor group_desc = WGPU_BIND_GROUP_DESCRIPTOR_INIT;
  group_desc.layout = layout;
  group_desc.entryCount = entries.size();
  group_desc.entries = entries.data();
  WGPUBindGroup group = wgpuDeviceCreateBindGroup(device_, &group_desc);

  WGPUCommandEncoder encoder = wgpuDeviceCreateCommandEncoder(device_, nullptr);
  WGPUComputePassEncoder pass = wgpuCommandEncoderBeginComputePass(encoder, nullptr);
  wgpuComputePassEncoderSetPipeline(pass, pipeline);
  wgpuComputePassEncoderSetBindGroup(pass, 0, group, 0, nullptr);
  wgpuComputePassEncoderDispatchWorkgroups(pass, groups, 1, 1);
  wgpuComputePassEncoderEnd(pass);
  wgpuComputePassEncoderRelease(pass);
  wgpuCommandEncoderCopyBufferToBuffer(encoder, buffers[read], 0, staging, 0, bindings[read].size);
  WGPUCommandBuffer commands = wgpuCommandEncoderFinish(encoder, nullptr);
  wgpuQueueSubmit(queue_, 1, &commands);
  wgpuCommandBufferRelease(commands);
  wgpuCommandEncoderRelease(encoder);

  const bool ok = read_buffer(staging, bindings[read].size, out, &reason);
  wgpuBindGroupRelease(group);
  wgpuBindGroupLayoutRelease(layout);
  wgpuBufferRelease(staging);
  for (WGPUBuffer buffer : buffers) {
    wgpuBufferRelease(buffer);
  }
  wgpuComputePipelineRelease(pipeline);
  return ok;
}

// Runs f16_pack_probe.wgsl on the Python runtime's cases (embedded at build time): float16
// stores use pack2x16float only when every case came back as aten rounds it, NaN as a NaN.
void WebGPUDevice::probe_f16_pack() {
  std::vector<uint16_t> got(kF16PackCases);
  const uint32_t groups = static_cast<uint32_t>((kF16PackCases / 2 + 63) / 64);
  if (!run_probe("f16_pack_probe.wgsl",
                 {{kF16PackCaseBits, kF16PackCases * sizeof(uint32_t)}, {nullptr, kF16PackCases * sizeof(uint16_t)}},
                 groups, 1, got.data())) {
    return;
  }
  bool all = true;
  for (size_t i = 0; i < kF16PackCases && all; ++i) {
    const uint32_t bits = kF16PackCaseBits[i];
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    all = nan ? ((got[i] & 0x7c00u) == 0x7c00u && (got[i] & 0x03ffu) != 0) : got[i] == kF16PackExpected[i];
  }
  pack2x16float_ = all;
}

// Runs subgroup_size.wgsl once, as the Python runtime does: the smallest subgroup size
// any invocation of a 256-thread workgroup sees. Anything but a power of two up to 256
// turns subgroups off.
void WebGPUDevice::probe_subgroup_size() {
  const uint32_t start = 0xFFFFFFFFu;
  uint32_t size = 0;
  if (run_probe("subgroup_size.wgsl", {{&start, sizeof start}}, 1, 0, &size, true)) {
    subgroup_size_ = size > 0 && size <= 256 && (size & (size - 1)) == 0 ? size : 0;
  }
}

WGPUComputePipeline WebGPUDevice::create_pipeline(const std::string& wgsl, WGPUPipelineLayout layout,
                                                  const char* label, std::string* reason) {
  wgpuDevicePushErrorScope(device_, WGPUErrorFilter_Validation);
  WGPUShaderSourceWGSL code = WGPU_SHADER_SOURCE_WGSL_INIT;
  code.code = view(wgsl);
  WGPUShaderModuleDescriptor module_desc = WGPU_SHADER_MODULE_DESCRIPTOR_INIT;
  module_desc.nextInChain = &code.chain;
  module_desc.label = view(label);
  WGPUShaderModule module = wgpuDeviceCreateShaderModule(device_, &module_desc);
  WGPUComputePipelineDescriptor desc = WGPU_COMPUTE_PIPELINE_DESCRIPTOR_INIT;
  desc.label = view(label);
  desc.layout = layout;
  desc.compute.module = module;
  desc.compute.entryPoint = view("main");
  WGPUComputePipeline pipeline = wgpuDeviceCreateComputePipeline(device_, &desc);
  ScopeResult scope;
  PopErrorScopeCallbackInfo callback = {};
  callback.mode = WGPUCallbackMode_AllowProcessEvents;
  callback.callback = on_scope;
  callback.userdata1 = &scope;
  const WGPUFuture future = wgpuDevicePopErrorScope(device_, callback);
  const bool answered = wait(&scope.done, future);
  if (module != nullptr) {
    wgpuShaderModuleRelease(module);
  }
  if (!answered || scope.type != WGPUErrorType_NoError || pipeline == nullptr) {
    *reason = std::string("compiling ") + label + " failed: " +
              (answered ? scope.message : "no answer from the device");
    if (pipeline != nullptr) {
      wgpuComputePipelineRelease(pipeline);
    }
    return nullptr;
  }
  return pipeline;
}

std::shared_ptr<WebGPUDevice::MapRequest> WebGPUDevice::map_async(WGPUBuffer buffer, WGPUMapMode mode,
                                                                   size_t size) {
  auto request = std::make_shared<MapRequest>();
  request->mode = mode;
  request->size = size;
  BufferMapCallbackInfo callback = {};
  callback.mode = WGPUCallbackMode_AllowProcessEvents;
  callback.callback = on_map;
  callback.userdata1 = new std::shared_ptr<MapRequest>(request);
  request->future = wgpuBufferMapAsync(buffer, mode, 0, size, callback);
  return request;
}

void* WebGPUDevice::mapped(WGPUBuffer buffer, const MapRequest& request, const char* what, std::string* reason) {
  if (!wait(&request.done, request.future) || request.status != WGPUMapAsyncStatus_Success) {
    *reason = std::string("mapping the ") + what + " buffer failed: " +
              (request.done ? request.message : std::string("no answer from the device"));
    return nullptr;
  }
  // wgpu-native hands out a read mapping through either call, Dawn only through the const
  // one, WebGPU's for reads.
  void* range = request.mode == WGPUMapMode_Write
                    ? wgpuBufferGetMappedRange(buffer, 0, request.size)
                    : const_cast<void*>(wgpuBufferGetConstMappedRange(buffer, 0, request.size));
  if (range == nullptr) {
    wgpuBufferUnmap(buffer);
    *reason = std::string("mapping the ") + what + " buffer failed";
  }
  return range;
}

void* WebGPUDevice::map(WGPUBuffer buffer, WGPUMapMode mode, size_t size, const char* what,
                         std::string* reason) {
  return mapped(buffer, *map_async(buffer, mode, size), what, reason);
}

bool WebGPUDevice::read_buffer(WGPUBuffer buffer, size_t size, void* dst, std::string* reason) {
  const Range all{0, size, dst};
  return read_ranges(buffer, size, &all, 1, reason);
}

bool WebGPUDevice::read_ranges(WGPUBuffer buffer, size_t size, const Range* ranges, size_t count,
                               std::string* reason) {
  const auto* mapped = static_cast<const uint8_t*>(map(buffer, WGPUMapMode_Read, size, "read-back", reason));
  if (mapped == nullptr) {
    return false;
  }
  for (size_t i = 0; i < count; ++i) {
    copy_bytes(ranges[i].dst, mapped + ranges[i].offset, ranges[i].size);
  }
  wgpuBufferUnmap(buffer);
  return true;
}

bool WebGPUDevice::grow(WGPUBuffer* buffer, uint64_t* capacity, uint64_t size, WGPUBufferUsage usage,
                        bool* replaced, std::string* reason) {
  size = std::max<uint64_t>(size, 16);
  *replaced = false;
  if (*buffer != nullptr && *capacity >= size) {
    return true;
  }
  if (size > limits_.maxBufferSize) {
    *reason = "a buffer of " + std::to_string(size) + " bytes exceeds the adapter's maxBufferSize " +
              std::to_string(limits_.maxBufferSize);
    return false;
  }
  if (*buffer != nullptr) {
    wgpuBufferDestroy(*buffer);
    wgpuBufferRelease(*buffer);
    *buffer = nullptr;
    *capacity = 0;
  }
  *replaced = true;
  WGPUBufferDescriptor desc = WGPU_BUFFER_DESCRIPTOR_INIT;
  desc.size = size;
  desc.usage = usage;
  *buffer = wgpuDeviceCreateBuffer(device_, &desc);
  if (*buffer == nullptr) {
    *reason = "allocating a GPU buffer of " + std::to_string(size) + " bytes failed";
    return false;
  }
  buffers_allocated.fetch_add(1, std::memory_order_relaxed);
  *capacity = size;
  return true;
}

WebGPUDevice::Scratch* WebGPUDevice::scratch(ScratchRole role, uint64_t size, WGPUBufferUsage usage,
                                             std::string* reason) {
  Scratch& s = scratch_[role];
  bool replaced = false;
  const bool ok = grow(&s.buffer, &s.size, size, usage, &replaced, reason);
  if (replaced) {
    s.map.reset();  // a request of the old buffer answers nobody
    ++scratch_generation_;
  }
  return ok ? &s : nullptr;
}

bool WebGPUDevice::finish(std::string* reason) {
  poll(instance_, device_, WGPUFuture{}, true);
  return check(reason);
}

bool WebGPUDevice::check(std::string* reason) {
  if (!uncaptured_error_.empty()) {
    *reason = std::string(kImplementation) + " error: " + uncaptured_error_;
    uncaptured_error_.clear();
    return false;
  }
  return true;
}

}  // namespace webgpu
}  // namespace pipeline
