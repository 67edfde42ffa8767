#include "LayerNormLaunch.h"

#include "HostCopy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace pipeline {
namespace webgpu {
namespace {

constexpr uint64_t kMinBufferBytes = 16;
constexpr WGPUBufferUsage kStorage =
    WGPUBufferUsage_Storage | WGPUBufferUsage_CopyDst | WGPUBufferUsage_CopySrc;
constexpr WGPUBufferUsage kUniform = WGPUBufferUsage_Uniform | WGPUBufferUsage_CopyDst;
constexpr WGPUBufferUsage kReadBack = WGPUBufferUsage_MapRead | WGPUBufferUsage_CopyDst;
constexpr WGPUBufferUsage kUpload = WGPUBufferUsage_MapWrite | WGPUBufferUsage_CopySrc;

// The kernel's Params struct: rows (u32), eps, a quiet NaN (f32), and 0 (u32), which the
// kernel xors into sums whose rounding it keeps (opaque in native_layer_norm.wgsl).
struct Params {
  uint32_t rows;
  float eps;
  float nan;
  uint32_t zero;
};
static_assert(sizeof(Params) == kParamsBytes, "Params must match the WGSL struct");

// eps rounded to float32 as Python's runtime rounds it (to nearest, +-inf from half an ulp
// past float's largest value on, NaN kept): a static_cast of a double past float's range is
// undefined behaviour.
float float_eps(double eps) {
  constexpr double kOverflow = 0x1.ffffffp127;
  if (std::isnan(eps)) {
    return std::numeric_limits<float>::quiet_NaN();
  }
  if (std::abs(eps) >= kOverflow) {
    return eps > 0 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
  }
  return static_cast<float>(eps);
}

uint64_t align4(uint64_t n) { return (n + 3) / 4 * 4; }
uint64_t align16(uint64_t n) { return (n + 15) / 16 * 16; }

}  // namespace

void LayerNormLaunch::write_words(WGPUBuffer buffer, const void* data, uint64_t bytes) {
  const uint64_t whole = bytes / 4 * 4;
  if (whole > 0) {
    wgpuQueueWriteBuffer(device_->queue(), buffer, 0, data, whole);
  }
  if (bytes > whole) {
    uint8_t tail[4] = {0, 0, 0, 0};
    std::memcpy(tail, static_cast<const uint8_t*>(data) + whole, bytes - whole);
    wgpuQueueWriteBuffer(device_->queue(), buffer, whole, tail, sizeof tail);
  }
}

LayerNormLaunch::~LayerNormLaunch() {
  for (Buffer* b : {&stamps_read_, &stamps_, &params_, &bias_, &weight_}) {
    if (b->buffer != nullptr) {
      wgpuBufferDestroy(b->buffer);
      wgpuBufferRelease(b->buffer);
    }
  }
  if (group_ != nullptr) {
    wgpuBindGroupRelease(group_);
  }
  for (auto& entry : pipelines_) {
    wgpuComputePipelineRelease(entry.second);
  }
  if (queries_ != nullptr) {
    wgpuQuerySetRelease(queries_);  // wgpu-native's destroy drops it too: release alone, once
  }
  if (pipeline_layout_ != nullptr) wgpuPipelineLayoutRelease(pipeline_layout_);
  if (bind_layout_ != nullptr) wgpuBindGroupLayoutRelease(bind_layout_);
}

bool LayerNormLaunch::ensure(Buffer* b, uint64_t size, WGPUBufferUsage usage, std::string* reason) {
  bool replaced = false;
  const bool ok = device_->grow(&b->buffer, &b->size, size, usage, &replaced, reason);
  // A new buffer may reuse the old handle's address: the kept bind group and the Params
  // buffer's rows no longer say anything.
  if (replaced && group_ != nullptr) {
    wgpuBindGroupRelease(group_);
    group_ = nullptr;
  }
  if (replaced && b == &params_) {
    params_rows_ = 0;
  }
  return ok;
}

bool LayerNormLaunch::prepare(const LayerNormBlob& blob, std::string* reason) {
  has_weight_ = blob.weight.source != OperandSource::kNone;
  has_bias_ = blob.bias.source != OperandSource::kNone;
  rms_ = blob.rms;
  dtype_ = blob.dtype;
  affine_dtype_ = blob.affine_dtype;
  eps_ = float_eps(blob.eps);

  // Explicit layout: x, weight, bias (read-only), out, mean, rstd, params. Unused
  // weight/bias bindings stay in it and get a placeholder buffer.
  WGPUBindGroupLayoutEntry entries[7];
  for (uint32_t i = 0; i < 7; ++i) {
    entries[i] = WGPU_BIND_GROUP_LAYOUT_ENTRY_INIT;
    entries[i].binding = i;
    entries[i].visibility = WGPUShaderStage_Compute;
    entries[i].buffer.type = i < 3 ? WGPUBufferBindingType_ReadOnlyStorage
                             : i < 6 ? WGPUBufferBindingType_Storage
                                     : WGPUBufferBindingType_Uniform;
  }
  WGPUBindGroupLayoutDescriptor layout_desc = WGPU_BIND_GROUP_LAYOUT_DESCRIPTOR_INIT;
  layout_desc.entryCount = 7;
  layout_desc.entries = entries;
  bind_layout_ = wgpuDeviceCreateBindGroupLayout(device_->device(), &layout_desc);
  WGPUPipelineLayoutDescriptor pipeline_desc = WGPU_PIPELINE_LAYOUT_DESCRIPTOR_INIT;
  pipeline_desc.bindGroupLayoutCount = 1;
  pipeline_desc.bindGroupLayouts = &bind_layout_;
  pipeline_layout_ = wgpuDeviceCreatePipelineLayout(device_->device(), &pipeline_desc);
  if (bind_layout_ == nullptr || pipeline_layout_ == nullptr) {
    *reason = "creating the pipeline layout failed";
    return false;
  }

  // A static width compiles now; a dynamic one on first use at each width.
  if (blob.width > 0) {
    const uint64_t row_bytes = blob.width * dtype_bytes(dtype_);
    const WGPULimits& limits = device_->limits();
    const uint64_t limit = std::min<uint64_t>(limits.maxStorageBufferBindingSize, limits.maxBufferSize);
    if (row_bytes > limit) {
      *reason = "a row of " + std::to_string(blob.width) +
                " values exceeds the adapter's binding limit of " + std::to_string(limit) + " bytes";
      return false;
    }
    // What most launches take: the rule by width, mean and rstd stored where returned.
    const bool stats = std::any_of(blob.outputs.begin(), blob.outputs.end(), [](uint32_t i) { return i != 0; });
    if (pipeline_for(config_for(blob.width, 0, stats), reason) == nullptr) {
      return false;
    }
  }
  const Operand* operands[2] = {&blob.weight, &blob.bias};
  Buffer* buffers[2] = {&weight_, &bias_};
  for (int i = 0; i < 2; ++i) {
    const uint64_t bytes =
        operands[i]->source == OperandSource::kNone ? 0 : blob.width * dtype_bytes(affine_dtype_);
    if (!ensure(buffers[i], align4(bytes), kStorage, reason)) {
      return false;
    }
    if (operands[i]->source == OperandSource::kConstant) {
      write_words(buffers[i]->buffer, operands[i]->constant, bytes);
    }
  }
  return device_->finish(reason);
}

KernelConfig LayerNormLaunch::config_for(uint64_t width, uint64_t rows, bool write_stats) const {
  const KernelConfig rule = choose_config(width, has_weight_, has_bias_, device_->subgroup_size(), dtype_,
                                          affine_dtype_, device_->pack2x16float(), rows, write_stats, rms_);
  return device_->layouts() == nullptr ? rule : device_->layouts()->config(rule, rows);
}

WGPUComputePipeline LayerNormLaunch::pipeline_for(const KernelConfig& config, std::string* reason) {
  // What varies between one delegate's launches: the rest is its blob's.
  const auto key =
      std::make_tuple(config.width, config.threads_per_row, config.workgroup, config.write_stats, config.wide_words);
  auto known = pipelines_.find(key);
  if (known != pipelines_.end()) {
    return known->second;
  }
  WGPUComputePipeline pipeline =
      device_->create_pipeline(kernel_source(config, kShaderCompiler), pipeline_layout_, "native_layer_norm.wgsl",
                               reason);
  if (pipeline != nullptr) {
    pipelines_.emplace(key, pipeline);
    device_->pipelines_compiled.fetch_add(1, std::memory_order_relaxed);
  }
  return pipeline;
}

bool LayerNormLaunch::run(const void* x, uint64_t rows, uint64_t width, const void* weight,
                          const void* bias, const LayerNormOutputs& outputs, std::string* reason,
                          GpuTime* gpu_time) {
  const uint64_t value_bytes = dtype_bytes(dtype_);
  const uint64_t row_bytes = width * value_bytes;
  const WGPULimits& limits = device_->limits();
  const uint64_t limit = std::min<uint64_t>(limits.maxStorageBufferBindingSize, limits.maxBufferSize);
  if (width == 0 || row_bytes > limit) {
    *reason = "a row of " + std::to_string(width) + " values does not fit the adapter's binding limit of " +
              std::to_string(limit) + " bytes";
    return false;
  }
  if (rows == 0) {
    return true;
  }
  // Input-sourced weight and bias are uploaded on every call.
  const uint64_t affine_bytes = width * dtype_bytes(affine_dtype_);
  if (weight != nullptr) {
    if (!ensure(&weight_, align4(affine_bytes), kStorage, reason)) return false;
    write_words(weight_.buffer, weight, affine_bytes);
  }
  if (bias != nullptr) {
    if (!ensure(&bias_, align4(affine_bytes), kStorage, reason)) return false;
    write_words(bias_.buffer, bias, affine_bytes);
  }
  // Launches of at most `chunk` rows keep every binding under the adapter's limit.
  const uint64_t chunk = std::max<uint64_t>(1, std::min(rows, limit / row_bytes));
  for (uint64_t start = 0; start < rows; start += chunk) {
    const uint64_t n = std::min(chunk, rows - start);
    LayerNormOutputs part;
    part.out = outputs.out ? static_cast<uint8_t*>(outputs.out) + start * row_bytes : nullptr;
    part.mean = outputs.mean ? outputs.mean + start : nullptr;
    part.rstd = outputs.rstd ? outputs.rstd + start : nullptr;
    // The configuration follows the launch's rows; mean and rstd are stored only if returned.
    const KernelConfig config = config_for(width, n, part.mean != nullptr || part.rstd != nullptr);
    WGPUComputePipeline pipeline = pipeline_for(config, reason);
    if (pipeline == nullptr ||
        !launch(pipeline, config, static_cast<const uint8_t*>(x) + start * row_bytes, n, width, part,
                reason, gpu_time)) {
      return false;
    }
  }
  return true;
}

bool LayerNormLaunch::launch(WGPUComputePipeline pipeline, const KernelConfig& config,
                             const uint8_t* x, uint64_t rows, uint64_t width,
                             const LayerNormOutputs& outputs, std::string* reason, GpuTime* gpu_time) {
  LaunchPlan plan;
  LaunchBuffers buffers;
  if (!plan_for(config, rows, width, &plan, reason) || !acquire(plan, &buffers, reason) ||
      !stage(x, rows, plan, buffers, reason)) {
    return false;
  }
  // The pass's GPU time for the call's ETDump event, where the device has timestamps (its
  // buffers are ensured before the bind group is kept: a new buffer drops that group).
  const bool timed = device_->has_timestamps() && gpu_time != nullptr;
  if (timed && !prepare_timestamps(reason)) {
    return false;
  }
  return submit(pipeline, plan, buffers, timed, reason) &&
         read_back(plan, buffers, outputs, timed ? gpu_time : nullptr, reason);
}

bool LayerNormLaunch::plan_for(const KernelConfig& config, uint64_t rows, uint64_t width, LaunchPlan* plan,
                               std::string* reason) const {
  // Workgroups in x and y; y carries what does not fit under 65,535 in x. Checked here:
  // wgpu-native treats some submit-time errors as fatal.
  const uint64_t groups = std::max<uint64_t>(1, (rows + config.rows_per_workgroup() - 1) /
                                                    config.rows_per_workgroup());
  const uint64_t grid_x = std::min(groups, kMaxGridX);
  const uint64_t grid_y = (groups + grid_x - 1) / grid_x;
  const uint64_t max_grid = device_->limits().maxComputeWorkgroupsPerDimension;
  if (grid_x > max_grid || grid_y > max_grid) {
    *reason = std::to_string(rows) + " rows need a " + std::to_string(grid_x) + "x" +
              std::to_string(grid_y) + " grid, past the adapter's " + std::to_string(max_grid) +
              " workgroups per dimension";
    return false;
  }
  plan->grid_x = static_cast<uint32_t>(grid_x);
  plan->grid_y = static_cast<uint32_t>(grid_y);
  // An odd count of 2-byte values ends mid-word: buffers, bindings and copies take whole words.
  plan->data_bytes = rows * width * dtype_bytes(dtype_);
  plan->word_bytes = align4(plan->data_bytes);
  plan->affine_bytes = align4(width * dtype_bytes(affine_dtype_));
  plan->stat_bytes = rows * 4;
  // One read-back buffer (one mapping): out, then mean, then rstd, each at a 16-byte offset.
  plan->mean_at = align16(plan->word_bytes);
  plan->rstd_at = plan->mean_at + align16(plan->stat_bytes);
  plan->write_stats = config.write_stats;
  plan->read_bytes = config.write_stats ? plan->rstd_at + plan->stat_bytes : plan->word_bytes;
  return true;
}

bool LayerNormLaunch::acquire(const LaunchPlan& plan, LaunchBuffers* b, std::string* reason) {
  using Device = WebGPUDevice;
  b->x = device_->scratch(Device::kScratchX, plan.word_bytes, kStorage, reason);
  b->out = b->x ? device_->scratch(Device::kScratchOut, plan.word_bytes, kStorage, reason) : nullptr;
  b->mean = b->out ? device_->scratch(Device::kScratchMean, plan.stat_bytes, kStorage, reason) : nullptr;
  b->rstd = b->mean ? device_->scratch(Device::kScratchRstd, plan.stat_bytes, kStorage, reason) : nullptr;
  b->read = b->rstd ? device_->scratch(Device::kScratchRead, plan.read_bytes, kReadBack, reason) : nullptr;
  b->upload = b->read ? device_->scratch(Device::kScratchUpload, plan.word_bytes, kUpload, reason) : nullptr;
  return b->upload != nullptr && ensure(&params_, kParamsBytes, kUniform, reason);
}

bool LayerNormLaunch::stage(const uint8_t* x, uint64_t rows, const LaunchPlan& plan, const LaunchBuffers& b,
                            std::string* reason) {
  // The input goes through the upload buffer, whose write mapping the last launch asked
  // for after its submit: answered while that launch's read-back waited, it is ready now
  // (no queue write, which allocates a staging buffer per write, and no wait here).
  WebGPUDevice::Scratch* upload = b.upload;
  if (upload->map == nullptr) {
    upload->map = device_->map_async(upload->buffer, WGPUMapMode_Write, upload->size);
  }
  auto* staged = static_cast<uint8_t*>(device_->mapped(upload->buffer, *upload->map, "upload", reason));
  upload->map.reset();
  if (staged == nullptr) {
    return false;
  }
  copy_bytes(staged, x, plan.data_bytes);
  std::memset(staged + plan.data_bytes, 0, plan.word_bytes - plan.data_bytes);
  wgpuBufferUnmap(upload->buffer);
  if (params_rows_ != rows) {  // eps is the delegate's own; a delegate's calls repeat their rows
    const Params params{static_cast<uint32_t>(rows), eps_, std::numeric_limits<float>::quiet_NaN(), 0};
    wgpuQueueWriteBuffer(device_->queue(), params_.buffer, 0, &params, sizeof params);
    params_rows_ = rows;
  }
  return true;
}

bool LayerNormLaunch::prepare_timestamps(std::string* reason) {
  if (queries_ == nullptr) {
    WGPUQuerySetDescriptor query_desc = WGPU_QUERY_SET_DESCRIPTOR_INIT;
    query_desc.type = WGPUQueryType_Timestamp;
    query_desc.count = 2;
    queries_ = wgpuDeviceCreateQuerySet(device_->device(), &query_desc);
  }
  return ensure(&stamps_, 16, WGPUBufferUsage_QueryResolve | WGPUBufferUsage_CopySrc, reason) &&
         ensure(&stamps_read_, 16, kReadBack, reason);
}

WGPUBindGroup LayerNormLaunch::bind_group(const LaunchPlan& plan, const LaunchBuffers& b) {
  // Each binding is exactly this launch's bytes (the buffers may be larger). A delegate's
  // calls repeat their shapes: the last group is kept while its buffers and sizes stay the same.
  const WGPUBuffer bound[7] = {b.x->buffer, weight_.buffer, bias_.buffer, b.out->buffer, b.mean->buffer,
                               b.rstd->buffer, params_.buffer};
  const uint64_t sizes[7] = {plan.word_bytes, has_weight_ ? plan.affine_bytes : kMinBufferBytes,
                             has_bias_ ? plan.affine_bytes : kMinBufferBytes, plan.word_bytes, plan.stat_bytes,
                             plan.stat_bytes, kParamsBytes};
  BindKey key;
  key.generation = device_->scratch_generation();
  for (uint32_t i = 0; i < 7; ++i) {
    key.buffers[i] = bound[i];
    key.sizes[i] = sizes[i];
  }
  if (group_ != nullptr && key == group_key_) {
    return group_;
  }
  WGPUBindGroupEntry entries[7];
  for (uint32_t i = 0; i < 7; ++i) {
    entries[i] = WGPU_BIND_GROUP_ENTRY_INIT;
    entries[i].binding = i;
    entries[i].buffer = bound[i];
    entries[i].size = sizes[i];
  }
  WGPUBindGroupDescriptor group_desc = WGPU_BIND_GROUP_DESCRIPTOR_INIT;
  group_desc.layout = bind_layout_;
  group_desc.entryCount = 7;
  group_desc.entries = entries;
  if (group_ != nullptr) {
    wgpuBindGroupRelease(group_);
  }
  group_ = wgpuDeviceCreateBindGroup(device_->device(), &group_desc);
  group_key_ = key;
  return group_;
}

bool LayerNormLaunch::submit(WGPUComputePipeline pipeline, const LaunchPlan& plan, const LaunchBuffers& b,
                             bool timed, std::string* reason) {
  WGPUBindGroup group = bind_group(plan, b);
  PassTimestampWrites writes = {};
  writes.querySet = queries_;
  writes.beginningOfPassWriteIndex = 0;
  writes.endOfPassWriteIndex = 1;
  WGPUComputePassDescriptor pass_desc = WGPU_COMPUTE_PASS_DESCRIPTOR_INIT;
  pass_desc.timestampWrites = timed ? &writes : nullptr;

  // The staged input into x, dispatch, then copy the results into the read-back buffers.
  WGPUCommandEncoder encoder = wgpuDeviceCreateCommandEncoder(device_->device(), nullptr);
  wgpuCommandEncoderCopyBufferToBuffer(encoder, b.upload->buffer, 0, b.x->buffer, 0, plan.word_bytes);
  WGPUComputePassEncoder pass = wgpuCommandEncoderBeginComputePass(encoder, &pass_desc);
  wgpuComputePassEncoderSetPipeline(pass, pipeline);
  wgpuComputePassEncoderSetBindGroup(pass, 0, group, 0, nullptr);
  wgpuComputePassEncoderDispatchWorkgroups(pass, plan.grid_x, plan.grid_y, 1);
  wgpuComputePassEncoderEnd(pass);
  wgpuComputePassEncoderRelease(pass);
  wgpuCommandEncoderCopyBufferToBuffer(encoder, b.out->buffer, 0, b.read->buffer, 0, plan.word_bytes);
  if (plan.write_stats) {
    wgpuCommandEncoderCopyBufferToBuffer(encoder, b.mean->buffer, 0, b.read->buffer, plan.mean_at, plan.stat_bytes);
    wgpuCommandEncoderCopyBufferToBuffer(encoder, b.rstd->buffer, 0, b.read->buffer, plan.rstd_at, plan.stat_bytes);
  }
  if (timed) {
    wgpuCommandEncoderResolveQuerySet(encoder, queries_, 0, 2, stamps_.buffer, 0);
    wgpuCommandEncoderCopyBufferToBuffer(encoder, stamps_.buffer, 0, stamps_read_.buffer, 0, 16);
  }
  WGPUCommandBuffer commands = wgpuCommandEncoderFinish(encoder, nullptr);
  wgpuCommandEncoderRelease(encoder);
  if (!device_->check(reason)) {  // an encoding error would make the submit fatal
    wgpuCommandBufferRelease(commands);
    return false;
  }
  wgpuQueueSubmit(device_->queue(), 1, &commands);
  wgpuCommandBufferRelease(commands);
  device_->dispatches.fetch_add(1, std::memory_order_relaxed);
  b.upload->map = device_->map_async(b.upload->buffer, WGPUMapMode_Write, b.upload->size);  // the next launch's
  return true;
}

bool LayerNormLaunch::read_back(const LaunchPlan& plan, const LaunchBuffers& b, const LayerNormOutputs& outputs,
                                GpuTime* gpu_time, std::string* reason) {
  // What the delegate returns, from one mapping of whole words (an out whose bytes end
  // mid-word takes its bytes alone).
  WebGPUDevice::Range ranges[3];
  size_t count = 0;
  if (outputs.out != nullptr) ranges[count++] = {0, plan.data_bytes, outputs.out};
  if (outputs.mean != nullptr) ranges[count++] = {plan.mean_at, plan.stat_bytes, outputs.mean};
  if (outputs.rstd != nullptr) ranges[count++] = {plan.rstd_at, plan.stat_bytes, outputs.rstd};
  if (!device_->read_ranges(b.read->buffer, plan.read_bytes, ranges, count, reason)) {
    return false;
  }
  if (gpu_time != nullptr) {
    uint64_t stamps[2] = {0, 0};  // nanoseconds
    if (!device_->read_buffer(stamps_read_.buffer, sizeof stamps, stamps, reason)) {
      return false;
    }
    gpu_time->measured = true;
    gpu_time->ns += stamps[1] > stamps[0] ? stamps[1] - stamps[0] : 0;
  }
  return device_->check(reason);  // the mapping waited for the work
}

}  // namespace webgpu
}  // namespace pipeline
