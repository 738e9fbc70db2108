// Tensor upload, conversion and hashing.
#include "models/weight_uploader.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "kernels/weight_layout.h"

namespace moeserve {
namespace {

std::string ShapeString(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

}  // namespace

absl::StatusOr<const TensorView*> Uploader::Get(const std::string& name) {
  const TensorView* t = src_.Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("checkpoint is missing tensor \"", name, "\""));
  const auto& want = shapes_.at(name);
  if (t->shape != want) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" has shape ", ShapeString(t->shape),
                                                   " but the config needs ", ShapeString(want)));
  }
  return t;
}

absl::StatusOr<HostMatrix> Uploader::ReadHost(const std::string& name, bool quantize_fp8) {
  ASSIGN_OR_RETURN(const TensorView* t, Get(name));
  if (t->shape.size() > 2) return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" is not a matrix"));
  ASSIGN_OR_RETURN(HostMatrix m, ReadHostMatrix(*t, src_.Find(name + "_scale_inv")));
  if (quantize_fp8 && !m.fp8) return QuantizeFp8(m);
  return m;
}

absl::StatusOr<WeightRef> Uploader::Matrix(const std::vector<std::string>& names, DType dtype, bool gemm_operand) {
  HostMatrix m;
  for (const auto& n : names) {
    ASSIGN_OR_RETURN(HostMatrix part, ReadHost(n, gemm_operand && dtype == DType::kF8E4M3));
    RETURN_IF_ERROR(m.Append(part, absl::StrCat("tensor \"", n, "\"")));
  }
  std::string key;
  for (const auto& n : names) key.append(n.data(), n.size() + 1);  // with the NUL
  return Store(key, m, dtype, gemm_operand);
}

absl::StatusOr<const float*> Uploader::Vector(const std::string& name) {
  ASSIGN_OR_RETURN(WeightRef w, Matrix({name}, DType::kF32, /*gemm_operand=*/false));
  return static_cast<const float*>(w.data);
}

absl::StatusOr<WeightRef> Uploader::Derived(const std::string& key, const HostMatrix& m, DType dtype) {
  return Store(key + std::string(1, '\0'), m, dtype, /*gemm_operand=*/true);
}

absl::StatusOr<WeightRef> Uploader::Store(const std::string& key, const HostMatrix& m, DType dtype, bool gemm_operand) {
  if (m.fp8) {
    if (!gemm_operand) return absl::InvalidArgumentError(absl::StrCat(key.c_str(), ": an FP8 tensor where a vector is read"));
    return StoreFp8(key, m);
  }
  const DType stored = dtype == DType::kF8E4M3 ? DType::kF32 : dtype;
  std::vector<uint8_t> host(m.values.size() * DTypeSize(stored));
  ConvertFromF32(m.values.data(), m.values.size(), stored, host.data());
  RecordDigest(key, m.rows, m.cols, stored, {{host.data(), host.size()}});
  const WeightLayout layout = gemm_operand ? backend_->PreferredWeightLayout(stored) : WeightLayout::kRowMajor;
  ASSIGN_OR_RETURN(DeviceBuffer buf, UploadWeight(backend_, host.data(), stored, m.rows, m.cols, layout));
  WeightRef w{buf.data(), stored, m.rows, m.cols, layout};
  *total_ += buf.bytes();
  buffers_->push_back(std::move(buf));
  return w;
}

void Uploader::RecordDigest(const std::string& key, int64_t rows, int64_t cols, DType dtype,
                            std::initializer_list<std::pair<const void*, size_t>> parts) {
  const int64_t shape[3] = {rows, cols, static_cast<int64_t>(dtype)};
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, shape, sizeof(shape));
  for (const auto& [data, bytes] : parts) XXH3_64bits_update(state, data, bytes);
  (*digests_)[key] = XXH3_64bits_digest(state);
  XXH3_freeState(state);
}

// FP8 weights stay row-major (the FP8 kernel's order), their scales beside them.
absl::StatusOr<WeightRef> Uploader::StoreFp8(const std::string& key, const HostMatrix& m) {
  RecordDigest(key, m.rows, m.cols, DType::kF8E4M3,
               {{m.bytes.data(), m.bytes.size()}, {m.scales.data(), m.scales.size() * sizeof(float)}});
  ASSIGN_OR_RETURN(DeviceBuffer buf, backend_->Allocate(std::max<size_t>(m.bytes.size(), 1)));
  RETURN_IF_ERROR(backend_->CopyToDevice(buf.data(), m.bytes.data(), m.bytes.size()));
  ASSIGN_OR_RETURN(DeviceBuffer sbuf, backend_->Allocate(m.scales.size() * sizeof(float)));
  RETURN_IF_ERROR(backend_->CopyToDevice(sbuf.data(), m.scales.data(), m.scales.size() * sizeof(float)));
  WeightRef w{buf.data(), DType::kF8E4M3, m.rows, m.cols, WeightLayout::kRowMajor, sbuf.as<float>()};
  *total_ += buf.bytes() + sbuf.bytes();
  buffers_->push_back(std::move(buf));
  buffers_->push_back(std::move(sbuf));
  return w;
}

absl::StatusOr<DeviceBuffer> UploadWeight(Backend* backend, const void* row_major, DType dtype, int64_t rows,
                                          int64_t cols, WeightLayout layout) {
  const size_t eb = DTypeSize(dtype);
  const size_t bytes = static_cast<size_t>(WeightStorageElems(layout, rows, cols)) * eb;
  ASSIGN_OR_RETURN(DeviceBuffer buf, backend->Allocate(bytes));
  if (layout == WeightLayout::kRowMajor) {
    RETURN_IF_ERROR(backend->CopyToDevice(buf.data(), row_major, bytes));
  } else {
    std::vector<uint8_t> packed(bytes);
    PackWeight(layout, row_major, rows, cols, eb, packed.data());
    RETURN_IF_ERROR(backend->CopyToDevice(buf.data(), packed.data(), bytes));
  }
  return buf;
}

}  // namespace moeserve
