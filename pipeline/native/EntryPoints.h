// What the two libraries' extern "C" entry points share (BackendLibrary.cpp,
// CallLibrary.cpp): both are built with hidden visibility, and report failures as
// text in a caller's buffer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

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

}  // namespace pipeline_entry
