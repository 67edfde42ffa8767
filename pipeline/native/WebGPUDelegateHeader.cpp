#include "WebGPUDelegateHeader.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <type_traits>
#include <utility>

namespace pipeline {
namespace webgpu {
namespace {

namespace layout = blob_layout;
namespace header = blob_layout::header_field;
namespace params = blob_layout::params_field;

// Value `index` of `field` in the section at `section`: little-endian, whatever the host's
// byte order.
template <typename T>
T read(const uint8_t* section, layout::Field<T> field, size_t index = 0) {
  static_assert(std::is_arithmetic_v<T> && sizeof(T) <= sizeof(uint64_t), "fields are numbers");
  const uint8_t* p = section + field.offset + index * sizeof(T);
  uint64_t bits = 0;
  for (size_t i = sizeof(T); i-- > 0;) {
    bits = (bits << 8) | p[i];
  }
  if constexpr (sizeof(T) == sizeof(uint64_t)) {
    T value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  } else {
    return static_cast<T>(bits);
  }
}

uint64_t align(uint64_t n) { return (n + layout::kAlign - 1) / layout::kAlign * layout::kAlign; }

unsigned long long ull(uint64_t n) { return static_cast<unsigned long long>(n); }

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

// Where a blob's sections lie, once its framing is checked.
struct Sections {
  const uint8_t* params = nullptr;
  uint32_t ndim = 0;
  const uint8_t* data = nullptr;
  uint64_t data_size = 0;
  uint16_t version = 0;
};

// The header: identity, version, fixed sizes, the CRC of everything after it, and sections
// that tile the blob (params, zero padding, data) exactly.
bool check_framing(const uint8_t* data, size_t size, Sections* sections, std::string* reason) {
  if (data == nullptr || size < layout::kHeaderSize) {
    return fail(reason, "truncated: %zu bytes, the header alone is %u", size, layout::kHeaderSize);
  }
  if (std::memcmp(data + header::kMagic.offset, layout::kMagic, sizeof layout::kMagic - 1) != 0) {
    return fail(reason, "magic %02x%02x%02x%02x is not \"%s\": not a WebGPU delegate blob", data[0], data[1],
                data[2], data[3], layout::kMagic);
  }
  const uint16_t version = read(data, header::kVersion);
  if (version < layout::kOldestVersion) {
    return fail(reason, "version %u is older than this runtime's %u (it reads %u and up), re-export the model",
                version, layout::kVersion, layout::kOldestVersion);
  }
  if (version > layout::kVersion) {
    return fail(reason, "version %u is newer than this runtime's %u", version, layout::kVersion);
  }
  if (read(data, header::kHeaderSize) != layout::kHeaderSize) {
    return fail(reason, "header_size %u is not %u", read(data, header::kHeaderSize), layout::kHeaderSize);
  }
  if (read(data, header::kBom) != layout::kByteOrderMark) {
    return fail(reason, "bom 0x%08x is not 0x%08x", read(data, header::kBom), layout::kByteOrderMark);
  }
  const uint64_t total = read(data, header::kTotalSize);
  if (total != size) {
    return fail(reason, "total_size %llu is not the blob's %zu bytes", ull(total), size);
  }
  if (read(data, header::kReserved) != 0) {
    return fail(reason, "reserved 0x%08x is not 0", read(data, header::kReserved));
  }
  const uint32_t checksum = crc32(data + layout::kHeaderSize, size - layout::kHeaderSize);
  if (read(data, header::kChecksum) != checksum) {
    return fail(reason, "checksum 0x%08x does not match the contents' CRC-32 0x%08x", read(data, header::kChecksum),
                checksum);
  }
  const uint64_t params_offset = read(data, header::kParamsOffset);
  const uint64_t params_size = read(data, header::kParamsSize);
  const uint64_t data_offset = read(data, header::kDataOffset);
  const uint64_t data_size = read(data, header::kDataSize);
  if (params_offset != layout::kHeaderSize) {
    return fail(reason, "params_offset %llu is not %u", ull(params_offset), layout::kHeaderSize);
  }
  if (params_size < layout::kParamsSize || params_offset + params_size > total) {
    return fail(reason, "params_size %llu is below %u or runs past total_size %llu", ull(params_size),
                layout::kParamsSize, ull(total));
  }
  const uint32_t ndim = read(data + params_offset, params::kNdim);
  if (ndim < 1 || ndim > kMaxNormalizedDims) {
    return fail(reason, "ndim %u is not in 1..%u", ndim, kMaxNormalizedDims);
  }
  if (params_size != layout::kParamsSize + uint64_t{layout::kDimSize} * ndim) {
    return fail(reason, "params_size %llu is not %u + %u * ndim (%u)", ull(params_size), layout::kParamsSize,
                layout::kDimSize, ndim);
  }
  if (data_offset != align(params_offset + params_size)) {
    return fail(reason, "data_offset %llu is not align16(params end %llu)", ull(data_offset),
                ull(params_offset + params_size));
  }
  if (data_offset + data_size != total) {
    return fail(reason, "data_offset %llu + data_size %llu is not total_size %llu", ull(data_offset),
                ull(data_size), ull(total));
  }
  for (uint64_t at = params_offset + params_size; at < data_offset; ++at) {
    if (data[at] != 0) {
      return fail(reason, "padding byte %llu before the data section is not 0", ull(at));
    }
  }
  *sections = Sections{data + params_offset, ndim, data + data_offset, data_size, version};
  return true;
}

bool decode_operand(const uint8_t* section, layout::Field<uint32_t> source_field,
                    layout::Field<uint32_t> index_field, const char* role, Operand* operand, std::string* reason) {
  const uint32_t source = read(section, source_field);
  const uint32_t index = read(section, index_field);
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

// The params' fields, each against its own rule, then aten's rules between them.
bool decode_params(uint16_t version, const uint8_t* section, uint32_t ndim, LayerNormBlob* blob,
                   std::string* reason) {
  const uint32_t op = read(section, params::kOp);
  // Version 3 is version 4 with native_layer_norm alone.
  if (op != layout::kOpNativeLayerNorm && (version == 3 || op != layout::kOpRmsNorm)) {
    return fail(reason, version == 3 ? "op %u is not %u (native_layer_norm) in version 3"
                                     : "op %u is not %u (native_layer_norm) or %u (rms_norm)",
                op, layout::kOpNativeLayerNorm, layout::kOpRmsNorm);
  }
  blob->rms = op == layout::kOpRmsNorm;
  blob->dtype = read(section, params::kDtype);
  blob->affine_dtype = read(section, params::kAffineDtype);
  for (const auto& [name, code] : {std::pair{"dtype", blob->dtype}, std::pair{"affine_dtype", blob->affine_dtype}}) {
    if (code >= std::size(kDtypeNames)) {
      return fail(reason, "%s %u is not 0 (float32), 1 (float16) or 2 (bfloat16)", name, code);
    }
  }
  // Any value, as aten takes it: the kernel gives NaN where var + eps < 0 or NaN.
  blob->eps = read(section, params::kEps);
  blob->input_index = read(section, params::kInputIndex);
  blob->arguments = read(section, params::kArguments);
  if (!decode_operand(section, params::kWeightSource, params::kWeightIndex, "weight", &blob->weight, reason) ||
      !decode_operand(section, params::kBiasSource, params::kBiasIndex, "bias", &blob->bias, reason)) {
    return false;
  }
  const uint32_t n_outputs = read(section, params::kNOutputs);
  if (n_outputs < 1 || n_outputs > params::kOutputs.count) {
    return fail(reason, "n_outputs %u is not in 1..%zu", n_outputs, params::kOutputs.count);
  }
  blob->outputs.clear();
  for (uint32_t i = 0; i < params::kOutputs.count; ++i) {
    const uint32_t output = read(section, params::kOutputs, i);
    if (i < n_outputs && output > kRstd) {
      return fail(reason, "outputs[%u] %u is not 0 (out), 1 (mean) or 2 (rstd)", i, output);
    }
    if (i >= n_outputs && output != 0) {
      return fail(reason, "outputs[%u] %u is unused and must be 0", i, output);
    }
    if (i < n_outputs) {
      blob->outputs.push_back(output);
    }
  }
  if (blob->rms && (blob->bias.source != OperandSource::kNone || blob->outputs != std::vector<uint32_t>{kOut})) {
    return fail(reason, "an rms_norm has no bias and returns out alone");
  }
  blob->dims.clear();
  bool dynamic = false;
  for (uint32_t i = 0; i < ndim; ++i) {
    const int64_t dim = read(section, params::kDims, i);
    if (dim < 1 && dim != kDynamicDim) {
      return fail(reason, "dims[%u] %lld is neither >= 1 nor -1 (dynamic)", i, static_cast<long long>(dim));
    }
    dynamic = dynamic || dim == kDynamicDim;
    blob->dims.push_back(dim);
  }
  const bool affine = blob->weight.source != OperandSource::kNone || blob->bias.source != OperandSource::kNone;
  if (dynamic && affine) {
    return fail(reason, "a dynamic dim needs weight_source and bias_source both 0 (none)");
  }
  // aten's rule: weight and bias (and so mean and rstd) like x, or float32 with a half x;
  // without weight and bias, mean and rstd are x's dtype.
  if (blob->affine_dtype != blob->dtype && !(affine && blob->affine_dtype == kFloat32)) {
    return fail(reason, "affine_dtype %u must be dtype %u%s", blob->affine_dtype, blob->dtype,
                affine ? " or 0 (float32)" : " without weight or bias");
  }
  return true;
}

// Delegate argument indices: x and input-sourced weight/bias, distinct and in range.
bool check_arguments(const LayerNormBlob& blob, std::string* reason) {
  if (blob.input_index >= blob.arguments) {
    return fail(reason, "input_index %u is not below arguments %u", blob.input_index, blob.arguments);
  }
  for (const Operand* op : {&blob.weight, &blob.bias}) {
    const char* role = op == &blob.weight ? "weight" : "bias";
    if (op->source != OperandSource::kInput) {
      continue;
    }
    if (op->index >= blob.arguments) {
      return fail(reason, "%s_index %u is not below arguments %u", role, op->index, blob.arguments);
    }
    if (op->index == blob.input_index) {
      return fail(reason, "%s_index %u is input_index too", role, op->index);
    }
  }
  if (blob.weight.source == OperandSource::kInput && blob.bias.source == OperandSource::kInput &&
      blob.weight.index == blob.bias.index) {
    return fail(reason, "weight_index and bias_index are both %u", blob.bias.index);
  }
  return true;
}

// The row width: with every dim static, its bytes must fit in a u32 (a dynamic width is
// checked against the device's limits at run time).
bool decode_width(LayerNormBlob* blob, std::string* reason) {
  uint64_t width = 1;
  for (int64_t dim : blob->dims) {
    if (dim == kDynamicDim) {
      blob->width = 0;
      return true;
    }
  }
  for (int64_t dim : blob->dims) {
    if (static_cast<uint64_t>(dim) > 0xFFFFFFFFull / 4 / width) {
      return fail(reason, "a row of prod(dims) floats does not fit in u32 bytes");
    }
    width *= static_cast<uint64_t>(dim);
  }
  blob->width = width;
  return true;
}

// The data section: the constant weight, then the constant bias, each `width` values of the
// affine dtype, zero-padded to a multiple of 16 bytes.
bool decode_constants(const Sections& sections, LayerNormBlob* blob, std::string* reason) {
  const uint64_t constant_bytes = blob->width * dtype_bytes(blob->affine_dtype);
  const uint64_t stride = align(constant_bytes);
  uint64_t expected = 0;
  for (Operand* op : {&blob->weight, &blob->bias}) {
    op->constant = nullptr;
    if (op->source == OperandSource::kConstant) {
      op->constant = sections.data + expected;
      expected += stride;
    }
  }
  if (sections.data_size != expected) {
    return fail(reason, "data_size %llu is not the %llu bytes its constants take", ull(sections.data_size),
                ull(expected));
  }
  for (const Operand* op : {&blob->weight, &blob->bias}) {
    for (uint64_t at = constant_bytes; op->constant != nullptr && at < stride; ++at) {
      if (op->constant[at] != 0) {
        return fail(reason, "padding after the %s constant is not 0", op == &blob->weight ? "weight" : "bias");
      }
    }
  }
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
  Sections sections;
  return check_framing(data, size, &sections, reason) && decode_params(sections.version, sections.params, sections.ndim, blob, reason) &&
         check_arguments(*blob, reason) && decode_width(blob, reason) && decode_constants(sections, blob, reason);
}

}  // namespace webgpu
}  // namespace pipeline
