// What the backend records about its delegate calls when Python asks it to: an ETDump
// profiling event per call (ExecuTorch's devtools read it), and a copy of each call's
// tensors (the evaluator re-runs them in the Python runtime and compares bit for bit).
// Off by default: then execute() pays one relaxed atomic load.
#pragma once

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/event_tracer.h>
#include <executorch/runtime/core/span.h>

#include <cstdint>
#include <string>
#include <vector>

namespace pipeline {
namespace webgpu {

// One tensor argument of a delegate call, copied out.
struct TracedTensor {
  int32_t scalar_type = 0;  // executorch::aten::ScalarType
  std::vector<int64_t> sizes;
  std::vector<uint8_t> data;
};

// One delegate call: every argument (inputs, then outputs) in the runtime's order.
struct TracedCall {
  std::vector<TracedTensor> args;
};

// An event's name is "native_layer_norm #K" (K: the call's index within its run, so the
// Inspector lists each delegate of a forward apart) and its metadata the text
// "rows=R width=W dtype=D timing=T". T is gpu where the device has timestamp queries: the
// event spans the GPU time of the call's compute passes, from the call's start. Otherwise
// T is wall: wall time, host to host (upload, launch, read-back).

// Wraps one delegate call in execute(): opens its ETDump event (when switched on and the
// runtime passed a tracer) and closes it on destruction.
class DelegateTraceScope {
 public:
  DelegateTraceScope(executorch::runtime::EventTracer* tracer, uint64_t rows, uint64_t width, const char* dtype);
  ~DelegateTraceScope();
  DelegateTraceScope(const DelegateTraceScope&) = delete;
  DelegateTraceScope& operator=(const DelegateTraceScope&) = delete;

  // Records the call's arguments when capturing (after the call, so outputs are written).
  void capture(executorch::runtime::Span<executorch::runtime::EValue*> args);

 private:
  executorch::runtime::EventTracer* tracer_ = nullptr;  // non-null while an event is open
  executorch::runtime::EventTracerEntry entry_{};
  std::string name_;
  std::string metadata_;
  bool capturing_ = false;
  bool gpu_timed_ = false;  // the call's launches added their GPU time
  uint64_t gpu_ns_ = 0;
  DelegateTraceScope* outer_ = nullptr;

  friend bool gpu_time_wanted();
  friend void add_gpu_time(uint64_t ns);
};

// True when any tracing is switched on (cheap check for the hot path).
bool tracing_enabled();

// Whether the delegate call running on this thread records an ETDump event that wants the
// GPU time of its launches (timestamp queries around each compute pass).
bool gpu_time_wanted();
// Adds one launch's GPU time, in nanoseconds, to that event.
void add_gpu_time(uint64_t ns);

}  // namespace webgpu
}  // namespace pipeline
