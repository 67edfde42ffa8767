// The delegate blob (format version 3, docs/blob_format.md; pipeline/pte/blob.py is the
// Python side of the same contract): a 40-byte header, binary LayerNorm params, constants.
// Decoding depends on nothing but the C++ standard library, so the rules can be checked
// against Python's from a test without a device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace executorch {
namespace backends {
namespace webgpu {

constexpr int64_t kDynamicDim = -1;  // a normalized dim read from the input at run time
constexpr uint32_t kMaxNormalizedDims = 16;

enum class OperandSource : uint32_t { kNone = 0, kConstant = 1, kInput = 2 };

// Dtype codes of the params' dtype and affine_dtype fields.
constexpr uint32_t kFloat32 = 0;
constexpr uint32_t kFloat16 = 1;
constexpr uint32_t kBFloat16 = 2;
inline uint32_t dtype_bytes(uint32_t dtype) { return dtype == kFloat32 ? 4 : 2; }

struct Operand {
  OperandSource source = OperandSource::kNone;
  uint32_t index = 0;  // the delegate argument, for kInput
  // For kConstant: `width` values of the affine dtype inside the blob (valid while the
  // blob lives).
  const uint8_t* constant = nullptr;
};

// One native_layer_norm: everything fixed ahead of time (rows come from the input).
struct LayerNormBlob {
  uint32_t dtype = kFloat32;  // of x and out
  uint32_t affine_dtype = kFloat32;  // of weight, bias, mean and rstd
  double eps = 0.0;
  uint32_t input_index = 0;
  uint32_t arguments = 0;  // delegate inputs in all; the outputs follow them in `args`
  Operand weight;
  Operand bias;
  std::vector<uint32_t> outputs;  // indices into (out, mean, rstd), in delegate output order
  std::vector<int64_t> dims;  // normalized_shape; kDynamicDim where read from the input
  uint64_t width = 0;  // prod(dims) when all are static, else 0
};

// Decodes and validates `size` bytes at `data`. On a violation of any rule returns false
// with `reason` naming the field; never throws for bad input (only std::bad_alloc).
bool decode_blob(const uint8_t* data, size_t size, LayerNormBlob* blob, std::string* reason);

// CRC-32/ISO-HDLC, as zlib.crc32 computes it.
uint32_t crc32(const uint8_t* data, size_t size);

}  // namespace webgpu
}  // namespace backends
}  // namespace executorch
