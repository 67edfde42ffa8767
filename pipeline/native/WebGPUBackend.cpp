// WebGPUBackend: ExecuTorch's BackendInterface for our delegate blobs. A thin adapter:
// blob rules live in WebGPUDelegateHeader, the device in WebGPUDevice, the kernel launch
// in LayerNormLaunch. No exception and no abort crosses this boundary.
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/exec_aten/util/dim_order_util.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/core/portable_type/bfloat16.h>
#include <executorch/runtime/core/portable_type/half.h>
#include <executorch/runtime/platform/log.h>

#include <array>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "LayerNormLaunch.h"
#include "WebGPUDelegateHeader.h"
#include "WebGPUDelegateTrace.h"
#include "WebGPUDevice.h"

namespace pipeline {
namespace webgpu {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::aten::Tensor;
using executorch::runtime::ArrayRef;
using executorch::runtime::Backend;
using executorch::runtime::BackendExecutionContext;
using executorch::runtime::BackendInitContext;
using executorch::runtime::BackendInterface;
using executorch::runtime::CompileSpec;
using executorch::runtime::DelegateHandle;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::EventTracer;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::kTensorDimensionLimit;
using executorch::runtime::Result;
using executorch::runtime::Span;

constexpr const char* kBackendName = "WebGPUBackend";

// One initialised delegate: its decoded params and its op. Lives in runtime-allocator
// memory (placement new); `destroy` runs the destructor.
struct WebGPUDelegate {
  explicit WebGPUDelegate(WebGPUDevice* device) : device(device), op(device) {}
  WebGPUDevice* device;
  LayerNormBlob blob;  // constant pointers cleared once `processed` is freed
  LayerNormLaunch op;
};

// The blob's dtype codes as ExecuTorch's scalar types.
ScalarType scalar_type(uint32_t dtype) {
  return dtype == kFloat16 ? ScalarType::Half : dtype == kBfloat16 ? ScalarType::BFloat16 : ScalarType::Float;
}

// `n` float32 statistics rounded once to the half `dtype`, as aten rounds them.
void round_to(uint32_t dtype, const float* from, void* to, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (dtype == kFloat16) {
      static_cast<executorch::aten::Half*>(to)[i] = executorch::aten::Half(from[i]);
    } else {
      static_cast<executorch::aten::BFloat16*>(to)[i] = executorch::aten::BFloat16(from[i]);
    }
  }
}

// A tensor of `dtype` in the default (contiguous) dim order, or the reason it is not.
bool check_tensor(EValue* value, const char* what, uint32_t index, uint32_t dtype, std::string* reason) {
  if (value == nullptr || !value->isTensor()) {
    *reason = std::string(what) + " (argument " + std::to_string(index) + ") is not a tensor";
    return false;
  }
  const Tensor& t = value->toTensor();
  if (t.scalar_type() != scalar_type(dtype)) {
    *reason = std::string(what) + " (argument " + std::to_string(index) + ") has dtype " +
              std::to_string(static_cast<int>(t.scalar_type())) + ", not " + kDtypeNames[dtype];
    return false;
  }
  if (!executorch::runtime::is_contiguous_dim_order(t.dim_order().data(), t.dim_order().size())) {
    *reason = std::string(what) + " (argument " + std::to_string(index) + ") is not contiguous";
    return false;
  }
  return true;
}

// x's row width (the product of its trailing, normalized dims; dynamic ones read from x),
// or 0 with the reason x does not fit the blob.
uint64_t row_width(const LayerNormBlob& blob, const Tensor& x, std::string* reason) {
  const size_t ndim = blob.dims.size();
  const size_t rank = static_cast<size_t>(x.dim());
  if (rank < ndim) {
    *reason = "input of rank " + std::to_string(rank) + " has fewer dims than the " +
              std::to_string(ndim) + " normalized ones";
    return 0;
  }
  uint64_t width = 1;
  for (size_t i = 0; i < ndim; ++i) {
    const int64_t size = x.size(rank - ndim + i);
    if (blob.dims[i] != kDynamicDim && size != blob.dims[i]) {
      *reason = "input dim " + std::to_string(rank - ndim + i) + " is " + std::to_string(size) +
                ", the normalized shape says " + std::to_string(blob.dims[i]);
      return 0;
    }
    if (size < 1) {
      *reason = "normalized dim " + std::to_string(i) + " of the input is empty";
      return 0;
    }
    width *= static_cast<uint64_t>(size);  // bounded: it is a factor of numel
  }
  return width;
}

// Input-sourced weight and bias (the affine dtype, shaped like the normalized dims) into
// `operands`; constant ones stay null (the launch holds them).
bool affine_operands(const LayerNormBlob& blob, Span<EValue*> args, const Tensor& x, const void* operands[2],
                     std::string* reason) {
  const size_t ndim = blob.dims.size();
  const size_t rank = static_cast<size_t>(x.dim());
  const Operand* roles[2] = {&blob.weight, &blob.bias};
  for (int i = 0; i < 2; ++i) {
    if (roles[i]->source != OperandSource::kInput) {
      continue;
    }
    const char* what = i == 0 ? "weight" : "bias";
    if (!check_tensor(args[roles[i]->index], what, roles[i]->index, blob.affine_dtype, reason)) {
      return false;
    }
    const Tensor& t = args[roles[i]->index]->toTensor();
    bool same = static_cast<size_t>(t.dim()) == ndim;
    for (size_t k = 0; same && k < ndim; ++k) {
      same = t.size(k) == x.size(rank - ndim + k);
    }
    if (!same) {
      *reason = std::string(what) + " does not have the normalized shape";
      return false;
    }
    operands[i] = t.const_data_ptr();
  }
  return true;
}

// Outputs follow the inputs: each resized (out = x's shape, mean/rstd = rows then 1s), and
// the first tensor of each kind recorded in `first`.
Error resize_outputs(const LayerNormBlob& blob, Span<EValue*> args, const Tensor& x, std::array<void*, 3>* first,
                     std::string* reason) {
  const size_t ndim = blob.dims.size();
  const size_t rank = static_cast<size_t>(x.dim());
  std::array<SizesType, kTensorDimensionLimit> stat_sizes{};
  for (size_t i = 0; i < rank; ++i) {
    stat_sizes[i] = i < rank - ndim ? static_cast<SizesType>(x.size(i)) : 1;
  }
  for (size_t i = 0; i < blob.outputs.size(); ++i) {
    const uint32_t at = blob.arguments + static_cast<uint32_t>(i);
    const uint32_t dtype = blob.outputs[i] == kOut ? blob.dtype : blob.affine_dtype;
    if (!check_tensor(args[at], "output", at, dtype, reason)) {
      return Error::InvalidArgument;
    }
    Tensor& t = args[at]->toTensor();
    if (static_cast<size_t>(t.dim()) != rank) {
      *reason = "output " + std::to_string(i) + " has rank " + std::to_string(t.dim()) +
                ", the input " + std::to_string(rank);
      return Error::InvalidArgument;
    }
    const uint32_t kind = blob.outputs[i];
    Error resized = executorch::runtime::resize_tensor(
        t, kind == kOut ? x.sizes() : ArrayRef<SizesType>(stat_sizes.data(), rank));
    if (resized != Error::Ok) {
      *reason = "resizing output " + std::to_string(i) + " failed";
      return resized;
    }
    if ((*first)[kind] == nullptr) {
      (*first)[kind] = t.mutable_data_ptr();
    }
  }
  return Error::Ok;
}

// One launch into the first output of each kind. The kernel gives mean and rstd in float32;
// half ones are rounded here, once.
bool launch(WebGPUDelegate* d, const Tensor& x, uint64_t rows, uint64_t width, const void* const operands[2],
            const std::array<void*, 3>& first, std::string* reason) {
  const uint32_t affine_dtype = d->blob.affine_dtype;
  const bool half_stats = affine_dtype != kFloat32;
  std::vector<float> stats(half_stats ? 2 * rows : 0);
  float* mean = half_stats ? (first[kMean] ? stats.data() : nullptr) : static_cast<float*>(first[kMean]);
  float* rstd = half_stats ? (first[kRstd] ? stats.data() + rows : nullptr) : static_cast<float*>(first[kRstd]);
  LayerNormOutputs outputs{first[kOut], mean, rstd};
  {
    std::lock_guard<std::mutex> lock(d->device->mutex());
    GpuTime gpu_time;
    if (!d->op.run(x.const_data_ptr(), rows, width, operands[0], operands[1], outputs, reason,
                   gpu_time_wanted() ? &gpu_time : nullptr)) {
      return false;
    }
    if (gpu_time.measured) {
      add_gpu_time(gpu_time.ns);
    }
  }
  if (half_stats) {
    if (first[kMean] != nullptr) round_to(affine_dtype, mean, first[kMean], rows);
    if (first[kRstd] != nullptr) round_to(affine_dtype, rstd, first[kRstd], rows);
  }
  return true;
}

Error run_delegate(WebGPUDelegate* d, Span<EValue*> args, EventTracer* tracer, std::string* reason) {
  const LayerNormBlob& blob = d->blob;
  const size_t n_args = static_cast<size_t>(blob.arguments) + blob.outputs.size();
  if (args.size() != n_args) {
    *reason = "expected " + std::to_string(blob.arguments) + " inputs and " +
              std::to_string(blob.outputs.size()) + " outputs, got " + std::to_string(args.size()) +
              " arguments";
    return Error::InvalidArgument;
  }
  if (!check_tensor(args[blob.input_index], "input", blob.input_index, blob.dtype, reason)) {
    return Error::InvalidArgument;
  }
  const Tensor& x = args[blob.input_index]->toTensor();
  const uint64_t width = row_width(blob, x, reason);
  if (width == 0) {
    return Error::InvalidArgument;
  }
  const uint64_t rows = static_cast<uint64_t>(x.numel()) / width;
  // Switched on from Python: an ETDump event around the call, a copy of its tensors after it.
  std::optional<DelegateTraceScope> trace;
  if (tracing_enabled()) {
    trace.emplace(tracer, rows, width, kDtypeNames[blob.dtype]);
  }
  const void* operands[2] = {nullptr, nullptr};
  if (!affine_operands(blob, args, x, operands, reason)) {
    return Error::InvalidArgument;
  }
  std::array<void*, 3> first{nullptr, nullptr, nullptr};
  Error resized = resize_outputs(blob, args, x, &first, reason);
  if (resized != Error::Ok) {
    return resized;
  }
  if (!launch(d, x, rows, width, operands, first, reason)) {
    return Error::Internal;
  }
  // An output the delegate returns twice is copied from its first tensor.
  for (size_t i = 0; i < blob.outputs.size(); ++i) {
    Tensor& t = args[blob.arguments + i]->toTensor();
    void* src = first[blob.outputs[i]];
    if (t.mutable_data_ptr() != src) {
      std::memcpy(t.mutable_data_ptr(), src, t.nbytes());
    }
  }
  if (trace) {
    trace->capture(args);
  }
  return Error::Ok;
}

// Decodes the blob into `d` and prepares its pipeline (init's work).
Error prepare_delegate(WebGPUDelegate* d, FreeableBuffer* processed, WebGPUDevice* device, std::string* reason) {
  Result<const void*> data = processed->data_safe();
  if (!data.ok()) {
    *reason = "the delegate blob's data cannot be read";
    return Error::DelegateInvalidCompatibility;
  }
  if (!decode_blob(static_cast<const uint8_t*>(data.get()), processed->size(), &d->blob, reason)) {
    return Error::DelegateInvalidCompatibility;
  }
  std::lock_guard<std::mutex> lock(device->mutex());
  return d->op.prepare(d->blob, reason) ? Error::Ok : Error::Internal;
}

// Runs `body` (returning an Error and filling `reason`) with no exception crossing the
// backend boundary, and logs a failure of `stage`.
template <typename Body>
Error guarded(const char* stage, Body&& body) {
  std::string reason;
  Error error;
  try {
    error = body(&reason);
  } catch (const std::bad_alloc&) {
    reason = "out of memory";
    error = Error::MemoryAllocationFailed;
  } catch (...) {
    reason = "unexpected exception";
    error = Error::Internal;
  }
  if (error != Error::Ok) {
    ET_LOG(Error, "WebGPUBackend %s failed (0x%x): %s", stage, static_cast<unsigned>(error), reason.c_str());
  }
  return error;
}

class WebGPUBackend final : public BackendInterface {
 public:
  bool is_available() const override {
    std::string reason;
    if (WebGPUDevice::get(&reason) == nullptr) {
      ET_LOG(Error, "WebGPUBackend unavailable: %s", reason.c_str());
      return false;
    }
    return true;
  }

  Result<DelegateHandle*> init(BackendInitContext& context, FreeableBuffer* processed,
                               ArrayRef<CompileSpec> compile_specs) const override {
    std::string reason;
    WebGPUDevice* device = WebGPUDevice::get(&reason);
    if (device == nullptr) {
      ET_LOG(Error, "WebGPUBackend init: no device: %s", reason.c_str());
      return Error::NotSupported;
    }
    if (compile_specs.size() != 0) {
      ET_LOG(Error, "WebGPUBackend init: takes no compile specs, got %zu", compile_specs.size());
      return Error::DelegateInvalidCompatibility;
    }
    if (processed == nullptr) {
      ET_LOG(Error, "WebGPUBackend init: no delegate blob");
      return Error::DelegateInvalidCompatibility;
    }
    WebGPUDelegate* d = context.get_runtime_allocator()->allocateInstance<WebGPUDelegate>();
    if (d == nullptr) {
      ET_LOG(Error, "WebGPUBackend init: allocating the delegate failed");
      return Error::MemoryAllocationFailed;
    }
    new (d) WebGPUDelegate(device);
    const Error error =
        guarded("init", [&](std::string* why) { return prepare_delegate(d, processed, device, why); });
    if (error != Error::Ok) {
      // The runtime never calls destroy() for a failed init: tear down our half here.
      std::lock_guard<std::mutex> lock(device->mutex());
      d->~WebGPUDelegate();
      return error;
    }
    // Constants are on the GPU now; the blob is not needed any more.
    d->blob.weight.constant = nullptr;
    d->blob.bias.constant = nullptr;
    processed->Free();
    return d;
  }

  Error execute(BackendExecutionContext& context, DelegateHandle* handle, Span<EValue*> args) const override {
    if (handle == nullptr) {
      ET_LOG(Error, "WebGPUBackend execute: no handle");
      return Error::InvalidArgument;
    }
    return guarded("execute",
                   [&](std::string* why) {
                     return run_delegate(static_cast<WebGPUDelegate*>(handle), args, context.event_tracer(), why);
                   });
  }

  void destroy(DelegateHandle* handle) const override {
    if (handle == nullptr) {
      return;
    }
    auto* d = static_cast<WebGPUDelegate*>(handle);
    std::lock_guard<std::mutex> lock(d->device->mutex());
    d->~WebGPUDelegate();
  }
};

}  // namespace

// Registers the backend once per process; later calls return the first call's result.
// A function-local static (rather than a namespace-scope initializer) so that loading
// the library does nothing until asked.
Error register_webgpu_backend() {
  static WebGPUBackend backend;
  static const Error registered = executorch::runtime::register_backend(Backend{kBackendName, &backend});
  return registered;
}

}  // namespace webgpu
}  // namespace pipeline
