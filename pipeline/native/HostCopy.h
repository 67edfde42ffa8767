// Copies between host memory and mapped GPU memory. A large copy is split over a few
// worker threads where the machine has cores to spare, as the Python runtime's
// device.copy_bytes splits it over torch's threads: same size threshold, same core rule,
// never in a forked child.
#pragma once

#include <cstddef>

namespace executorch {
namespace backends {
namespace webgpu {

// device.THREADED_COPY_BYTES (tests/test_native.py holds them equal).
constexpr size_t kThreadedCopyBytes = size_t{1} << 20;

// memcpy(dst, src, n); over threads when n >= kThreadedCopyBytes on 4 cores or more
// (PIPELINE_COPY_THREADS sets how many threads instead).
void copy_bytes(void* dst, const void* src, size_t n);

}  // namespace webgpu
}  // namespace backends
}  // namespace executorch
