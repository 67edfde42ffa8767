#include "WebGPUDelegateHeader.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace executorch {
namespace backends {
namespace webgpu {
namespace {

constexpr char kMagic[4] = {'W', 'G', 'L', 'N'};
constexpr uint16_t kVersion = 3;
constexpr uint32_t kHeaderSize = 40;
constexpr uint32_t kByteOrderMark = 0x01020304;
constexpr uint32_t kParamsFixedSize = 64;
constexpr uint32_t kOpLayerNormLaunch = 1;
constexpr uint64_t kAlign = 16;

// Header field offsets.
constexpr size_t kVersionOffset = 4;
constexpr size_t kHeaderSizeOffset = 6;
constexpr size_t kBomOffset = 8;
constexpr size_t kParamsOffsetOffset = 12;
constexpr size_t kParamsSizeOffset = 16;
constexpr size_t kDataOffsetOffset = 20;
constexpr size_t kDataSizeOffset = 24;
constexpr size_t kTotalSizeOffset = 28;
constexpr size_t kChecksumOffset = 32;
constexpr size_t kReservedOffset = 36;

// Params field offsets, from the start of the params section.
constexpr size_t kOp = 0;
constexpr size_t kDtype = 4;
constexpr size_t kEps = 8;
constexpr size_t kInputIndex = 16;
constexpr size_t kArguments = 20;
constexpr size_t kWeightSource = 24;
constexpr size_t kWeightIndex = 28;
constexpr size_t kBiasSource = 32;
constexpr size_t kBiasIndex = 36;
constexpr size_t kNumOutputs = 40;
constexpr size_t kOutputs = 44;
constexpr size_t kNdim = 56;
constexpr size_t kAffineDtype = 60;
constexpr size_t kDims = 64;

// Little-endian reads, independent of the host's byte order.
uint64_t read_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) {
    v = (v << 8) | p[i];
  }
  return v;
}
uint16_t u16(const uint8_t* p) { return static_cast<uint16_t>(read_le(p, 2)); }
uint32_t u32(const uint8_t* p) { return static_cast<uint32_t>(read_le(p, 4)); }
int64_t i64(const uint8_t* p) {
  uint64_t bits = read_le(p, 8);
  int64_t v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
double f64(const uint8_t* p) {
  uint64_t bits = read_le(p, 8);
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

uint64_t align16(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool fail(std::string* reason, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
bool fail(std::string* reason, const char* fmt, ...) {
  char text[256];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(text, sizeof text, fmt, args);
  va_end(args);
  *reason = std::string("delegate blob: ") + text;
  return false;
}

bool decode_operand(const uint8_t* params, size_t source_at, size_t index_at, const char* role,
                    Operand* operand, std::string* reason) {
  uint32_t source = u32(params + source_at);
  uint32_t index = u32(params + index_at);
  if (source > static_cast<uint32_t>(OperandSource::kInput)) {
    return fail(reason, "%s_source %u is not 0 (none), 1 (constant) or 2 (input)", role, source);
  }
  operand->source = static_cast<OperandSource>(source);
  if (operand->source != OperandSource::kInput && index != 0) {
    return fail(reason, "%s_index %u must be 0 when %s_source is %u", role, index, role, source);
  }
  operand->index = index;
  return true;
}

}  // namespace

uint32_t crc32(const uint8_t* data, size_t size) {
  static const auto table = [] {
    struct Table { uint32_t entries[256]; } t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) {
        c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      }
      t.entries[n] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) {
    crc = table.entries[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  }
  return crc ^ 0xFFFFFFFFu;
}

bool decode_blob(const uint8_t* data, size_t size, LayerNormBlob* blob, std::string* reason) {
  // Header.
  if (data == nullptr || size < kHeaderSize) {
    return fail(reason, "truncated: %zu bytes, the header alone is %u", size, kHeaderSize);
  }
  if (std::memcmp(data, kMagic, sizeof kMagic) != 0) {
    return fail(reason, "magic %02x%02x%02x%02x is not \"WGLN\": not a WebGPU delegate blob",
                data[0], data[1], data[2], data[3]);
  }
  uint16_t version = u16(data + kVersionOffset);
  if (version < kVersion) {
    return fail(reason, "version %u is older than this runtime's %u, re-export the model", version,
                kVersion);
  }
  if (version > kVersion) {
    return fail(reason, "version %u is newer than this runtime's %u", version, kVersion);
  }
  if (version != kVersion) {
    return fail(reason, "version %u is not %u", version, kVersion);
  }
  if (u16(data + kHeaderSizeOffset) != kHeaderSize) {
    return fail(reason, "header_size %u is not %u", u16(data + kHeaderSizeOffset), kHeaderSize);
  }
  if (u32(data + kBomOffset) != kByteOrderMark) {
    return fail(reason, "bom 0x%08x is not 0x%08x", u32(data + kBomOffset), kByteOrderMark);
  }
  const uint64_t total = u32(data + kTotalSizeOffset);
  if (total != size) {
    return fail(reason, "total_size %llu is not the blob's %zu bytes",
                static_cast<unsigned long long>(total), size);
  }
  if (u32(data + kReservedOffset) != 0) {
    return fail(reason, "reserved 0x%08x is not 0", u32(data + kReservedOffset));
  }
  const uint32_t checksum = crc32(data + kHeaderSize, size - kHeaderSize);
  if (u32(data + kChecksumOffset) != checksum) {
    return fail(reason, "checksum 0x%08x does not match the contents' CRC-32 0x%08x",
                u32(data + kChecksumOffset), checksum);
  }
  const uint64_t params_offset = u32(data + kParamsOffsetOffset);
  const uint64_t params_size = u32(data + kParamsSizeOffset);
  const uint64_t data_offset = u32(data + kDataOffsetOffset);
  const uint64_t data_size = u32(data + kDataSizeOffset);
  if (params_offset != kHeaderSize) {
    return fail(reason, "params_offset %llu is not %u",
                static_cast<unsigned long long>(params_offset), kHeaderSize);
  }
  if (params_size < kParamsFixedSize || params_offset + params_size > total) {
    return fail(reason, "params_size %llu is below %u or runs past total_size %llu",
                static_cast<unsigned long long>(params_size), kParamsFixedSize,
                static_cast<unsigned long long>(total));
  }
  const uint8_t* params = data + params_offset;
  const uint32_t ndim = u32(params + kNdim);
  if (ndim < 1 || ndim > kMaxNormalizedDims) {
    return fail(reason, "ndim %u is not in 1..%u", ndim, kMaxNormalizedDims);
  }
  if (params_size != kParamsFixedSize + 8ull * ndim) {
    return fail(reason, "params_size %llu is not 64 + 8 * ndim (%u)",
                static_cast<unsigned long long>(params_size), ndim);
  }
  if (data_offset != align16(params_offset + params_size)) {
    return fail(reason, "data_offset %llu is not align16(params end %llu)",
                static_cast<unsigned long long>(data_offset),
                static_cast<unsigned long long>(params_offset + params_size));
  }
  if (data_offset + data_size != total) {
    return fail(reason, "data_offset %llu + data_size %llu is not total_size %llu",
                static_cast<unsigned long long>(data_offset),
                static_cast<unsigned long long>(data_size), static_cast<unsigned long long>(total));
  }
  for (uint64_t at = params_offset + params_size; at < data_offset; ++at) {
    if (data[at] != 0) {
      return fail(reason, "padding byte %llu before the data section is not 0",
                  static_cast<unsigned long long>(at));
    }
  }

  // Params.
  if (u32(params + kOp) != kOpLayerNormLaunch) {
    return fail(reason, "op %u is not 1 (native_layer_norm)", u32(params + kOp));
  }
  blob->dtype = u32(params + kDtype);
  blob->affine_dtype = u32(params + kAffineDtype);
  if (blob->dtype > kBFloat16) {
    return fail(reason, "dtype %u is not 0 (float32), 1 (float16) or 2 (bfloat16)", blob->dtype);
  }
  if (blob->affine_dtype > kBFloat16) {
    return fail(reason, "affine_dtype %u is not 0 (float32), 1 (float16) or 2 (bfloat16)",
                blob->affine_dtype);
  }
  blob->eps = f64(params + kEps);
  if (!std::isfinite(blob->eps) || !(blob->eps >= 0.0)) {
    return fail(reason, "eps %g is not finite and >= 0", blob->eps);
  }
  blob->input_index = u32(params + kInputIndex);
  blob->arguments = u32(params + kArguments);
  if (!decode_operand(params, kWeightSource, kWeightIndex, "weight", &blob->weight, reason) ||
      !decode_operand(params, kBiasSource, kBiasIndex, "bias", &blob->bias, reason)) {
    return false;
  }
  const uint32_t n_outputs = u32(params + kNumOutputs);
  if (n_outputs < 1 || n_outputs > 3) {
    return fail(reason, "n_outputs %u is not in 1..3", n_outputs);
  }
  blob->outputs.clear();
  for (uint32_t i = 0; i < 3; ++i) {
    uint32_t output = u32(params + kOutputs + 4 * i);
    if (i < n_outputs && output > 2) {
      return fail(reason, "outputs[%u] %u is not 0 (out), 1 (mean) or 2 (rstd)", i, output);
    }
    if (i >= n_outputs && output != 0) {
      return fail(reason, "outputs[%u] %u is unused and must be 0", i, output);
    }
    if (i < n_outputs) {
      blob->outputs.push_back(output);
    }
  }
  blob->dims.clear();
  bool dynamic = false;
  for (uint32_t i = 0; i < ndim; ++i) {
    int64_t dim = i64(params + kDims + 8 * i);
    if (dim < 1 && dim != kDynamicDim) {
      return fail(reason, "dims[%u] %lld is neither >= 1 nor -1 (dynamic)", i,
                  static_cast<long long>(dim));
    }
    dynamic = dynamic || dim == kDynamicDim;
    blob->dims.push_back(dim);
  }
  const bool affine = blob->weight.source != OperandSource::kNone ||
                     blob->bias.source != OperandSource::kNone;
  if (dynamic && affine) {
    return fail(reason, "a dynamic dim needs weight_source and bias_source both 0 (none)");
  }
  // aten's rule: weight and bias (and so mean and rstd) like x, or float32 with a half x;
  // without weight and bias, mean and rstd are x's dtype.
  if (blob->affine_dtype != blob->dtype && !(affine && blob->affine_dtype == kFloat32)) {
    return fail(reason, "affine_dtype %u must be dtype %u%s", blob->affine_dtype, blob->dtype,
                affine ? " or 0 (float32)" : " without weight or bias");
  }

  // Delegate argument indices: x and input-sourced weight/bias, distinct and in range.
  if (blob->input_index >= blob->arguments) {
    return fail(reason, "input_index %u is not below arguments %u", blob->input_index,
                blob->arguments);
  }
  for (const Operand* op : {&blob->weight, &blob->bias}) {
    const char* role = op == &blob->weight ? "weight" : "bias";
    if (op->source != OperandSource::kInput) {
      continue;
    }
    if (op->index >= blob->arguments) {
      return fail(reason, "%s_index %u is not below arguments %u", role, op->index,
                  blob->arguments);
    }
    if (op->index == blob->input_index) {
      return fail(reason, "%s_index %u is input_index too", role, op->index);
    }
  }
  if (blob->weight.source == OperandSource::kInput &&
      blob->bias.source == OperandSource::kInput && blob->weight.index == blob->bias.index) {
    return fail(reason, "weight_index and bias_index are both %u", blob->bias.index);
  }

  // Width: with every dim static, its bytes must fit in a u32 (a dynamic width is
  // checked against the device's limits at run time).
  uint64_t width = 1;
  for (int64_t dim : blob->dims) {
    if (dynamic) {
      break;
    }
    if (static_cast<uint64_t>(dim) > 0xFFFFFFFFull / 4 / width) {
      return fail(reason, "a row of prod(dims) floats does not fit in u32 bytes");
    }
    width *= static_cast<uint64_t>(dim);
  }
  blob->width = dynamic ? 0 : width;

  // Data: the constant weight, then the constant bias, each width values of the affine
  // dtype, zero-padded to a multiple of 16 bytes.
  const uint64_t constant_bytes = width * dtype_bytes(blob->affine_dtype);
  const uint64_t stride = align16(constant_bytes);
  uint64_t expected_data = 0;
  for (Operand* op : {&blob->weight, &blob->bias}) {
    op->constant = nullptr;
    if (op->source == OperandSource::kConstant) {
      op->constant = data + data_offset + expected_data;
      expected_data += stride;
    }
  }
  if (data_size != expected_data) {
    return fail(reason, "data_size %llu is not the %llu bytes its constants take",
                static_cast<unsigned long long>(data_size),
                static_cast<unsigned long long>(expected_data));
  }
  for (const Operand* op : {&blob->weight, &blob->bias}) {
    if (op->constant == nullptr) {
      continue;
    }
    for (uint64_t at = constant_bytes; at < stride; ++at) {
      if (op->constant[at] != 0) {
        return fail(reason, "padding after the %s constant is not 0", op == &blob->weight ? "weight" : "bias");
      }
    }
  }
  return true;
}

}  // namespace webgpu
}  // namespace backends
}  // namespace executorch
