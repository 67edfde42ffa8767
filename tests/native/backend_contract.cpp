// Drives the registered WebGPUBackend directly, as method.cpp would, with the argument
// lists ExecuTorch's runtime never lets through (it checks inputs before the delegate):
// wrong counts, non-tensors, wrong dtypes and shapes, null handles, bad compile specs.
// Built by tests/test_native.py into a shared library and called through ctypes; each
// case appends "name=result" lines to the report.
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/freeable_buffer.h>
#include <executorch/runtime/core/memory_allocator.h>
#include <executorch/runtime/core/portable_type/tensor_impl.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::aten::TensorImpl;
using executorch::runtime::ArrayRef;
using executorch::runtime::BackendExecutionContext;
using executorch::runtime::BackendInitContext;
using executorch::runtime::CompileSpec;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::MemoryAllocator;
using executorch::runtime::Span;
using executorch::runtime::TensorShapeDynamism;

namespace {

// A contiguous tensor over caller-owned storage.
struct OwnedTensor {
  OwnedTensor(ScalarType type, std::vector<int32_t> shape, size_t capacity_bytes)
      : sizes(std::move(shape)), storage(capacity_bytes) {
    for (size_t i = 0; i < sizes.size(); ++i) dim_order.push_back(static_cast<uint8_t>(i));
    strides.assign(sizes.size(), 1);
    for (int i = static_cast<int>(sizes.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * sizes[i + 1];
    impl = std::make_unique<TensorImpl>(type, sizes.size(), sizes.data(), storage.data(), dim_order.data(),
                                        strides.data(), TensorShapeDynamism::DYNAMIC_BOUND);
    value = EValue(Tensor(impl.get()));
  }
  float* floats() { return reinterpret_cast<float*>(storage.data()); }
  std::vector<int32_t> sizes;
  std::vector<uint8_t> dim_order;
  std::vector<int32_t> strides;
  std::vector<uint8_t> storage;
  std::unique_ptr<TensorImpl> impl;
  EValue value;
};

}  // namespace

// The blob must be a LayerNorm over (4,) with weight an input (argument 1), a constant
// bias, outputs (out, mean, rstd) and 2 arguments; `bias` is its constant.
extern "C" __attribute__((visibility("default"))) int pipeline_contract(const uint8_t* blob, size_t size,
                                                                         const float* bias, char* report,
                                                                         size_t capacity) {
  std::string out;
  auto note = [&](const char* name, int value) { out += std::string(name) + "=" + std::to_string(value) + "\n"; };
  auto* backend = executorch::runtime::get_backend_class("WebGPUBackend");
  if (backend == nullptr) {
    return -1;
  }
  std::vector<uint8_t> arena(1 << 16);
  MemoryAllocator allocator(arena.size(), arena.data());
  BackendInitContext init_context(&allocator);
  BackendExecutionContext context;

  // init: a truncated blob, a compile spec, a runtime allocator that is full.
  std::vector<uint8_t> copy(blob, blob + size);
  FreeableBuffer truncated(copy.data(), size - 1, nullptr);
  note("init_truncated", static_cast<int>(backend->init(init_context, &truncated, {}).error()));
  FreeableBuffer with_spec(copy.data(), size, nullptr);
  uint8_t spec_value = 1;
  CompileSpec spec{"key", {&spec_value, 1}};
  note("init_compile_spec", static_cast<int>(backend->init(init_context, &with_spec, ArrayRef<CompileSpec>(&spec, 1)).error()));
  MemoryAllocator empty(0, arena.data());
  BackendInitContext empty_context(&empty);
  FreeableBuffer for_empty(copy.data(), size, nullptr);
  note("init_no_memory", static_cast<int>(backend->init(empty_context, &for_empty, {}).error()));

  FreeableBuffer processed(copy.data(), size, nullptr);
  auto handle = backend->init(init_context, &processed, {});
  note("init", static_cast<int>(handle.error()));
  if (!handle.ok()) {
    std::strncpy(report, out.c_str(), capacity - 1);
    return 1;
  }
  note("freed", processed.size() == 0 ? 1 : 0);

  // Rows 2 of width 4; outputs with room for 3 rows (resized to 2 by execute).
  OwnedTensor x(ScalarType::Float, {2, 4}, 8 * 4), weight(ScalarType::Float, {4}, 16);
  OwnedTensor y(ScalarType::Float, {3, 4}, 12 * 4), mean(ScalarType::Float, {3, 1}, 12), rstd(ScalarType::Float, {3, 1}, 12);
  for (int i = 0; i < 8; ++i) x.floats()[i] = static_cast<float>(i * i % 7) - 2.5f;
  for (int i = 0; i < 4; ++i) weight.floats()[i] = 0.5f + i;
  EValue* args[5] = {&x.value, &weight.value, &y.value, &mean.value, &rstd.value};

  note("execute_null_handle", static_cast<int>(backend->execute(context, nullptr, Span<EValue*>(args, 5))));
  note("execute_4_args", static_cast<int>(backend->execute(context, handle.get(), Span<EValue*>(args, 4))));
  EValue* six[6] = {&x.value, &weight.value, &y.value, &mean.value, &rstd.value, &rstd.value};
  note("execute_6_args", static_cast<int>(backend->execute(context, handle.get(), Span<EValue*>(six, 6))));
  EValue number(static_cast<int64_t>(3));
  EValue* with_int[5] = {&number, &weight.value, &y.value, &mean.value, &rstd.value};
  note("execute_int_input", static_cast<int>(backend->execute(context, handle.get(), Span<EValue*>(with_int, 5))));
  EValue* int_output[5] = {&x.value, &weight.value, &number, &mean.value, &rstd.value};
  note("execute_int_output", static_cast<int>(backend->execute(context, handle.get(), Span<EValue*>(int_output, 5))));
  OwnedTensor x_int(ScalarType::Int, {2, 4}, 32);
  EValue* wrong_dtype[5] = {&x_int.value, &weight.value, &y.value, &mean.value, &rstd.value};
  note("execute_int32_x", static_cast<int>(backend->execute(context, handle.get(), Span<EValue*>(wrong_dtype, 5))));
  OwnedTensor x_double(ScalarType::Double, {2, 4}, 64);
  EValue* double_x[5] = {&x_double.value, &weight.value, &y.value, &mean.value, &rstd.value};
  note("execute_double_x", static_cast<int>(backend->execute(context, handle.get(), Span<EValue*>(double_x, 5))));
  OwnedTensor x_wide(ScalarType::Float, {2, 5}, 40);
  EValue* wide[5] = {&x_wide.value, &weight.value, &y.value, &mean.value, &rstd.value};
  note("execute_width_5", static_cast<int>(backend->execute(context, handle.get(), Span<EValue*>(wide, 5))));
  OwnedTensor weight_5(ScalarType::Float, {5}, 20);
  EValue* bad_weight[5] = {&x.value, &weight_5.value, &y.value, &mean.value, &rstd.value};
  note("execute_weight_5", static_cast<int>(backend->execute(context, handle.get(), Span<EValue*>(bad_weight, 5))));
  OwnedTensor y_rank3(ScalarType::Float, {1, 2, 4}, 32);
  EValue* bad_rank[5] = {&x.value, &weight.value, &y_rank3.value, &mean.value, &rstd.value};
  note("execute_output_rank", static_cast<int>(backend->execute(context, handle.get(), Span<EValue*>(bad_rank, 5))));
  OwnedTensor y_small(ScalarType::Float, {1, 4}, 16);
  EValue* small[5] = {&x.value, &weight.value, &y_small.value, &mean.value, &rstd.value};
  note("execute_output_too_small", static_cast<int>(backend->execute(context, handle.get(), Span<EValue*>(small, 5))));

  // A valid call, checked against a float64 reference; outputs resized to 2 rows.
  note("execute", static_cast<int>(backend->execute(context, handle.get(), Span<EValue*>(args, 5))));
  note("out_rows", y.impl->size(0));
  note("mean_rows", mean.impl->size(0));
  double worst = 0;
  for (int r = 0; r < 2; ++r) {
    double m = 0, v = 0;
    for (int i = 0; i < 4; ++i) m += x.floats()[r * 4 + i] / 4.0;
    for (int i = 0; i < 4; ++i) v += (x.floats()[r * 4 + i] - m) * (x.floats()[r * 4 + i] - m) / 4.0;
    const double rs = 1.0 / std::sqrt(v + 1e-5);
    worst = std::max(worst, std::fabs(mean.floats()[r] - m) + std::fabs(rstd.floats()[r] - rs));
    for (int i = 0; i < 4; ++i) {
      const double want = (x.floats()[r * 4 + i] - m) * rs * weight.floats()[i] + bias[i];
      worst = std::max(worst, std::fabs(y.floats()[r * 4 + i] - want));
    }
  }
  note("error_below_1e-5", worst < 1e-5 ? 1 : 0);
  backend->destroy(handle.get());
  backend->destroy(nullptr);
  std::strncpy(report, out.c_str(), capacity - 1);
  report[capacity - 1] = '\0';
  return 0;
}
