// Delegate-call tracing (see WebGPUDelegateTrace.h) and its extern "C" switches for
// pipeline/native/profiling.py. ExecuTorch's runtime hands every delegate call the
// program's EventTracer (BackendExecutionContext::event_tracer(), null unless the program
// was loaded with ETDump on); a runtime built without event tracing (the executorch wheel's
// _portable_lib) never opens an event block, and ETDumpGen aborts when an event is added
// outside one, so Python says which kind of runtime it is (`open_blocks`) and marks where
// each run starts.
#include "WebGPUDelegateTrace.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

namespace pipeline {
namespace webgpu {
namespace {

using executorch::runtime::EValue;
using executorch::runtime::EventTracer;
using executorch::runtime::kUnsetDelegateDebugIntId;
using executorch::runtime::Span;

struct TraceState {
  std::mutex mutex;
  std::atomic<bool> enabled{false};  // capture || etdump
  bool capture = false;
  bool etdump = false;
  bool open_blocks = false;
  uint64_t run = 0;              // bumped by Python before each execute
  uint64_t block_run = 0;        // the run the last block was opened for
  EventTracer* block_tracer = nullptr;
  uint32_t calls_in_run = 0;
  std::vector<TracedCall> calls;  // captured calls, in call order
};

TraceState& state() {
  static TraceState s;
  return s;
}

}  // namespace

// The scope of the delegate call running on this thread, if any.
thread_local DelegateTraceScope* current_scope = nullptr;

bool tracing_enabled() {
  return state().enabled.load(std::memory_order_relaxed);
}

bool gpu_time_wanted() {
  return current_scope != nullptr && current_scope->tracer_ != nullptr;
}

void add_gpu_time(uint64_t ns) {
  if (gpu_time_wanted()) {
    current_scope->gpu_timed_ = true;
    current_scope->gpu_ns_ += ns;
  }
}

DelegateTraceScope::DelegateTraceScope(EventTracer* tracer, uint64_t rows, uint64_t width, const char* dtype) {
  TraceState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  capturing_ = s.capture;
  const uint32_t call = s.calls_in_run++;
  if (!s.etdump || tracer == nullptr) {
    return;
  }
  if (s.open_blocks && (s.block_run != s.run || s.block_tracer != tracer)) {
    tracer->create_event_block("Execute");
    s.block_run = s.run;
    s.block_tracer = tracer;
  }
  name_ = "native_layer_norm #" + std::to_string(call);
  metadata_ = "rows=" + std::to_string(rows) + " width=" + std::to_string(width) + " dtype=" + dtype;
  // The tracer copies the name into its string table; it need not outlive the call.
  entry_ = tracer->start_profiling_delegate(name_.c_str(), kUnsetDelegateDebugIntId);
  tracer_ = tracer;
  outer_ = current_scope;
  current_scope = this;
}

DelegateTraceScope::~DelegateTraceScope() {
  if (tracer_ == nullptr) {
    return;
  }
  current_scope = outer_;
  if (!gpu_timed_) {
    metadata_ += " timing=wall";
    tracer_->end_profiling_delegate(entry_, metadata_.data(), metadata_.size());
    return;
  }
  // The event spans the GPU time of the call's launches from the call's start: the runtime's
  // ticks are nanoseconds on Linux's default platform layer (steady_clock), as the GPU's are.
  metadata_ += " timing=gpu";
  tracer_->log_profiling_delegate(name_.c_str(), kUnsetDelegateDebugIntId, entry_.start_time,
                                  entry_.start_time + static_cast<et_timestamp_t>(gpu_ns_), metadata_.data(),
                                  metadata_.size());
}

void DelegateTraceScope::capture(Span<EValue*> args) {
  if (!capturing_) {
    return;
  }
  TracedCall call;
  call.args.reserve(args.size());
  for (EValue* value : args) {
    TracedTensor traced;
    if (value != nullptr && value->isTensor()) {
      const executorch::aten::Tensor& t = value->toTensor();
      traced.scalar_type = static_cast<int32_t>(t.scalar_type());
      traced.sizes.assign(t.sizes().begin(), t.sizes().end());
      const auto* bytes = static_cast<const uint8_t*>(t.const_data_ptr());
      traced.data.assign(bytes, bytes + t.nbytes());
    } else {
      traced.scalar_type = -1;  // not a tensor: nothing to compare
    }
    call.args.push_back(std::move(traced));
  }
  TraceState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.calls.push_back(std::move(call));
}

}  // namespace webgpu
}  // namespace pipeline

namespace webgpu = pipeline::webgpu;

#define PIPELINE_EXPORT __attribute__((visibility("default")))

extern "C" {

// Switches tracing on or off and drops what was captured. `capture`: copy every call's
// tensors; `etdump`: an ETDump event per call where the runtime passes a tracer;
// `open_blocks`: the runtime opens no event block itself (open one per run).
PIPELINE_EXPORT void pipeline_webgpu_trace_configure(int capture, int etdump, int open_blocks) {
  webgpu::TraceState& s = webgpu::state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.capture = capture != 0;
  s.etdump = etdump != 0;
  s.open_blocks = open_blocks != 0;
  s.calls.clear();
  s.calls_in_run = 0;
  s.block_tracer = nullptr;
  s.enabled.store(s.capture || s.etdump, std::memory_order_relaxed);
}

// Marks the start of a run: the next traced call is call 0 (and opens a block).
PIPELINE_EXPORT void pipeline_webgpu_trace_begin_run() {
  webgpu::TraceState& s = webgpu::state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.run;
  s.calls_in_run = 0;
}

// Captured calls so far.
PIPELINE_EXPORT long long pipeline_webgpu_trace_calls() {
  webgpu::TraceState& s = webgpu::state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return static_cast<long long>(s.calls.size());
}

// Arguments of captured call `call`, or -1 when there is no such call.
PIPELINE_EXPORT long long pipeline_webgpu_trace_args(long long call) {
  webgpu::TraceState& s = webgpu::state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (call < 0 || static_cast<size_t>(call) >= s.calls.size()) {
    return -1;
  }
  return static_cast<long long>(s.calls[call].args.size());
}

// Argument `arg` of captured call `call`: its scalar type (-1: not a tensor) and rank
// into `scalar_type`/`ndim`, up to `max_dims` sizes into `sizes`, and its bytes into
// `data` when `capacity` holds them. Returns the byte count, or -1 for a bad index.
PIPELINE_EXPORT long long pipeline_webgpu_trace_arg(long long call, long long arg, int* scalar_type, int* ndim,
                                                    int64_t* sizes, int max_dims, void* data, size_t capacity) {
  webgpu::TraceState& s = webgpu::state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (call < 0 || static_cast<size_t>(call) >= s.calls.size() || arg < 0 ||
      static_cast<size_t>(arg) >= s.calls[call].args.size()) {
    return -1;
  }
  const webgpu::TracedTensor& t = s.calls[call].args[arg];
  *scalar_type = t.scalar_type;
  *ndim = static_cast<int>(t.sizes.size());
  std::copy_n(t.sizes.begin(), std::min<size_t>(t.sizes.size(), static_cast<size_t>(std::max(max_dims, 0))), sizes);
  if (data != nullptr && capacity >= t.data.size()) {
    std::memcpy(data, t.data.data(), t.data.size());
  }
  return static_cast<long long>(t.data.size());
}

}  // extern "C"
