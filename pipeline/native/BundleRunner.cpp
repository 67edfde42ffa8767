// ExecuTorch's runtime on a bundled program (ExecuTorch's devtools' BundledProgram: the
// program, its inputs and the outputs it is expected to give, in one flatbuffer), driven from
// C++ the way an application drives it: the program loaded from memory, the planned buffers
// and allocators its method asks for, the bundle's inputs set and its outputs checked by
// ExecuTorch's own bundled-program calls. No torch tensor crosses into ExecuTorch, so this
// runs where the Python bindings cannot take or give one (a torch other than the one
// ExecuTorch's wheel was built against). Those calls do not verify the bundle: its caller,
// pipeline.native.NativeBundle, reads and checks it first (pipeline/pte/bundle.py).
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <executorch/runtime/core/data_loader.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/core/memory_allocator.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>

#include "EntryPoints.h"

namespace et = ::executorch::runtime;

// ExecuTorch's bundled-program calls, as its devtools define them and _portable_lib exports
// them (the wheel ships their library, not their header).
namespace executorch::bundled_program {
et::Error get_program_data(void* file_data, size_t file_data_len, const void** out_program_data,
                           size_t* out_program_data_len);
et::Error load_bundled_input(et::Method& method, const void* bundled_program_ptr, size_t testset_idx);
et::Error verify_method_outputs(et::Method& method, const void* bundled_program_ptr, size_t testset_idx,
                                double rtol, double atol);
}  // namespace executorch::bundled_program

namespace {

constexpr size_t kAlignment = 64;
// The method's own allocations (its values, the delegates' handles) and scratch for kernels.
constexpr size_t kMethodPoolBytes = 64u << 20;
constexpr size_t kTempPoolBytes = 16u << 20;

// The program's bytes, lent to ExecuTorch without a copy.
class MemoryLoader final : public et::DataLoader {
 public:
  MemoryLoader(const void* data, size_t size) : data_(static_cast<const uint8_t*>(data)), size_(size) {}

  et::Result<et::FreeableBuffer> load(size_t offset, size_t size, const SegmentInfo&) const override {
    if (offset > size_ || size > size_ - offset) {
      return et::Error::InvalidArgument;
    }
    return et::FreeableBuffer(data_ + offset, size, nullptr);
  }

  et::Result<size_t> size() const override { return size_; }

 private:
  const uint8_t* data_;
  size_t size_;
};

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<uint8_t, AlignedFree>;

AlignedBytes aligned_copy(const void* data, size_t size) {
  const size_t rounded = (size + kAlignment - 1) / kAlignment * kAlignment;
  AlignedBytes bytes(static_cast<uint8_t*>(std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded)));
  if (bytes) {
    std::memcpy(bytes.get(), data, size);
  }
  return bytes;
}

std::string error_text(const char* what, et::Error error) {
  return std::string(what) + " failed with ExecuTorch error " + std::to_string(static_cast<uint32_t>(error));
}

// Everything a loaded method points at, at addresses that do not move.
struct Bundle {
  AlignedBytes bytes;
  size_t size = 0;
  std::string method_name;  // the method run, and its test case
  size_t test_case = 0;
  std::optional<MemoryLoader> loader;
  std::optional<et::Program> program;
  AlignedBytes method_pool{static_cast<uint8_t*>(std::aligned_alloc(kAlignment, kMethodPoolBytes))};
  AlignedBytes temp_pool{static_cast<uint8_t*>(std::aligned_alloc(kAlignment, kTempPoolBytes))};
  std::vector<std::vector<uint8_t>> planned;
  std::vector<et::Span<uint8_t>> planned_spans;
  std::optional<et::MemoryAllocator> method_allocator;
  std::optional<et::MemoryAllocator> temp_allocator;
  std::optional<et::HierarchicalAllocator> planned_memory;
  std::optional<et::MemoryManager> memory;
  std::optional<et::Method> method;
};

// The bundle's program loaded and its method ready, or the reason it is not.
std::string open(Bundle& b) {
  const void* program_data = nullptr;
  size_t program_size = 0;
  et::Error status = executorch::bundled_program::get_program_data(b.bytes.get(), b.size, &program_data,
                                                                   &program_size);
  if (status != et::Error::Ok) {
    return error_text("reading the bundle's program", status);
  }
  b.loader.emplace(program_data, program_size);
  et::Result<et::Program> program = et::Program::load(&*b.loader);
  if (!program.ok()) {
    return error_text("Program::load", program.error());
  }
  b.program.emplace(std::move(*program));
  et::Result<et::MethodMeta> meta = b.program->method_meta(b.method_name.c_str());
  if (!meta.ok()) {
    return error_text("method_meta", meta.error());
  }
  for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
    et::Result<int64_t> bytes = meta->memory_planned_buffer_size(i);
    if (!bytes.ok()) {
      return error_text("memory_planned_buffer_size", bytes.error());
    }
    b.planned.emplace_back(static_cast<size_t>(*bytes));
  }
  for (auto& buffer : b.planned) {
    b.planned_spans.emplace_back(buffer.data(), buffer.size());
  }
  if (!b.method_pool || !b.temp_pool) {
    return "no memory for the method's pools";
  }
  b.method_allocator.emplace(kMethodPoolBytes, b.method_pool.get());
  b.temp_allocator.emplace(kTempPoolBytes, b.temp_pool.get());
  b.planned_memory.emplace(et::Span<et::Span<uint8_t>>(b.planned_spans.data(), b.planned_spans.size()));
  b.memory.emplace(&*b.method_allocator, &*b.planned_memory, &*b.temp_allocator);
  et::Result<et::Method> method = b.program->load_method(b.method_name.c_str(), &*b.memory);
  if (!method.ok()) {
    return error_text("load_method", method.error());
  }
  b.method.emplace(std::move(*method));
  return {};
}

}  // namespace

extern "C" {

// The bundle in `data` (copied) with `method` loaded, to run its test case `test_case`; null
// and the reason in `reason` if not.
PIPELINE_EXPORT void* pipeline_bundle_open(const void* data, size_t size, const char* method, size_t test_case,
                                           char* reason, size_t capacity) {
  auto bundle = std::make_unique<Bundle>();
  bundle->bytes = aligned_copy(data, size);
  bundle->size = size;
  bundle->method_name = method;
  bundle->test_case = test_case;
  if (!bundle->bytes) {
    pipeline_entry::copy_out("no memory for the bundle", reason, capacity);
    return nullptr;
  }
  const std::string why = open(*bundle);
  if (!why.empty()) {
    pipeline_entry::copy_out(why, reason, capacity);
    return nullptr;
  }
  return bundle.release();
}

// Sets the bundle's inputs and executes the method; the execution's seconds in `seconds`.
// 1 on success, else 0 and the reason.
PIPELINE_EXPORT int pipeline_bundle_run(void* handle, double* seconds, char* reason, size_t capacity) {
  auto& b = *static_cast<Bundle*>(handle);
  et::Error status = executorch::bundled_program::load_bundled_input(*b.method, b.bytes.get(), b.test_case);
  if (status != et::Error::Ok) {
    pipeline_entry::copy_out(error_text("load_bundled_input", status), reason, capacity);
    return 0;
  }
  const auto started = std::chrono::steady_clock::now();
  status = b.method->execute();
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (status != et::Error::Ok) {
    pipeline_entry::copy_out(error_text("Method::execute", status), reason, capacity);
    return 0;
  }
  return 1;
}

// ExecuTorch's check of the last run's outputs against the bundle's: 1 when every value is
// within `atol` (no relative part), else 0.
PIPELINE_EXPORT int pipeline_bundle_verify(void* handle, double atol) {
  auto& b = *static_cast<Bundle*>(handle);
  return executorch::bundled_program::verify_method_outputs(*b.method, b.bytes.get(), b.test_case, 0.0, atol) ==
         et::Error::Ok;
}

PIPELINE_EXPORT long long pipeline_bundle_outputs(void* handle) {
  return static_cast<long long>(static_cast<Bundle*>(handle)->method->outputs_size());
}

// Output `index` of the last run: its byte count, copied into `out` when `capacity` holds it;
// -1 when it is not a tensor.
PIPELINE_EXPORT long long pipeline_bundle_output(void* handle, size_t index, void* out, size_t capacity) {
  const et::EValue& value = static_cast<Bundle*>(handle)->method->get_output(index);
  if (!value.isTensor()) {
    return -1;
  }
  const auto& tensor = value.toTensor();
  const size_t nbytes = tensor.nbytes();
  if (out != nullptr && nbytes <= capacity) {
    std::memcpy(out, tensor.const_data_ptr(), nbytes);
  }
  return static_cast<long long>(nbytes);
}

PIPELINE_EXPORT void pipeline_bundle_close(void* handle) { delete static_cast<Bundle*>(handle); }

}  // extern "C"
