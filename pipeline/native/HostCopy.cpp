#include "HostCopy.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace pipeline {
namespace webgpu {
namespace {

// Each part at least this large; by default at most kDefaultThreads parts (the caller
// copies one), kMaxParts when PIPELINE_COPY_THREADS asks for more.
constexpr size_t kMinPartBytes = size_t{256} << 10;
constexpr unsigned kDefaultThreads = 8;
constexpr unsigned kMaxParts = 32;
// A worker that finished a copy spins this long for the next before it sleeps: a call's
// read-back follows its upload by one GPU round trip, and a sleeping thread's wake-up costs
// about what a part of a MB copy takes.
constexpr std::chrono::microseconds kSpin{200};

std::atomic<bool> forked{false};

unsigned cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    return static_cast<unsigned>(CPU_COUNT(&set));
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

// Workers that copy parts of one job at a time. Jobs come from callers that hold the
// device lock, but the pool takes its own lock, so it never relies on that.
class CopyPool {
 public:
  explicit CopyPool(unsigned workers) {
    for (unsigned i = 0; i < workers; ++i) {
      threads_.emplace_back([this] { work(); });
    }
  }
  // Never destroyed: the process's exit must not join threads that may be spinning.
  unsigned workers() const { return static_cast<unsigned>(threads_.size()); }

  void copy(uint8_t* dst, const uint8_t* src, size_t n, unsigned parts) {
    std::lock_guard<std::mutex> caller(callers_);
    dst_ = dst;
    src_ = src;
    n_ = n;
    parts_ = parts;
    done_.store(0, std::memory_order_relaxed);
    // Publishes the job: a worker that claims a part through next_ sees the fields above.
    next_.store(1, std::memory_order_release);  // part 0 is the caller's
    {
      std::lock_guard<std::mutex> lock(mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    copy_part(0);
    for (unsigned p; (p = next_.fetch_add(1, std::memory_order_acq_rel)) < parts_;) {
      copy_part(p);
      done_.fetch_add(1, std::memory_order_acq_rel);
    }
    while (done_.load(std::memory_order_acquire) < parts_ - 1) {
      std::this_thread::yield();
    }
  }

 private:
  void copy_part(unsigned p) {
    const size_t begin = n_ * p / parts_;
    const size_t end = n_ * (p + 1) / parts_;
    std::memcpy(dst_ + begin, src_ + begin, end - begin);
  }

  void work() {
    uint64_t seen = 0;
    for (;;) {
      auto spun = std::chrono::steady_clock::now();
      while (generation_.load(std::memory_order_acquire) == seen &&
             std::chrono::steady_clock::now() - spun < kSpin) {
        std::this_thread::yield();
      }
      if (generation_.load(std::memory_order_acquire) == seen) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      }
      seen = generation_.load(std::memory_order_acquire);
      for (unsigned p; (p = next_.fetch_add(1, std::memory_order_acq_rel)) < parts_;) {
        copy_part(p);
        done_.fetch_add(1, std::memory_order_acq_rel);
      }
    }
  }

  std::vector<std::thread> threads_;
  std::mutex callers_;  // one job at a time
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<unsigned> next_{0};
  std::atomic<unsigned> done_{0};
  uint8_t* dst_ = nullptr;
  const uint8_t* src_ = nullptr;
  size_t n_ = 0;
  unsigned parts_ = 0;
};

// Threads a large copy uses, the caller's included: PIPELINE_COPY_THREADS when set (1: none;
// tests set it to run the pool on any machine), else every core up to kDefaultThreads where
// there are 4 or more, else 1.
unsigned copy_threads() {
  const char* env = std::getenv("PIPELINE_COPY_THREADS");
  if (env != nullptr && *env != '\0') {
    const long n = std::strtol(env, nullptr, 10);
    return static_cast<unsigned>(std::clamp<long>(n, 1, kMaxParts));
  }
  return cores() >= 4 ? std::min(kDefaultThreads, cores()) : 1;
}

CopyPool* pool() {
  // Threads do not survive fork(): a forked child copies on its own thread.
  static const bool registered = pthread_atfork(nullptr, nullptr, [] { forked.store(true); }) == 0;
  static CopyPool* const instance = copy_threads() > 1 ? new CopyPool(copy_threads() - 1) : nullptr;
  (void)registered;
  return forked.load() ? nullptr : instance;
}

}  // namespace

void copy_bytes(void* dst, const void* src, size_t n) {
  CopyPool* workers = n >= kThreadedCopyBytes ? pool() : nullptr;
  const unsigned parts =
      workers ? static_cast<unsigned>(std::min<size_t>(workers->workers() + 1, n / kMinPartBytes)) : 1;
  if (parts < 2) {
    std::memcpy(dst, src, n);
    return;
  }
  workers->copy(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, parts);
}

}  // namespace webgpu
}  // namespace pipeline
