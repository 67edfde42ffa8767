// What the two libraries' extern "C" entry points share (BackendLibrary.cpp,
// CallLibrary.cpp): both are built with hidden visibility, and report failures as
// text in a caller's buffer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "WebGPUApi.h"

// Only functions marked so are a library's interface.
#define PIPELINE_EXPORT __attribute__((visibility("default")))

namespace pipeline_entry {

// Copies `text` into `out` (NUL-terminated, truncated to `capacity`); returns its length.
inline size_t copy_out(const std::string& text, char* out, size_t capacity) {
  if (out != nullptr && capacity > 0) {
    const size_t n = std::min(text.size(), capacity - 1);
    std::memcpy(out, text.data(), n);
    out[n] = '\0';
  }
  return text.size();
}

// A library's bind entry point: the WebGPU calls bound from the implementation's library at
// `path` (webgpu::bind_library). 1 on success, else 0 and the reason in `reason`.
inline int bind_into(const char* path, char* reason, size_t capacity) {
  std::string why;
  if (!pipeline::webgpu::bind_library(path, &why)) {
    copy_out(why, reason, capacity);
    return 0;
  }
  return 1;
}

}  // namespace pipeline_entry
