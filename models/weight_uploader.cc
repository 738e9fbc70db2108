// Tensor upload, conversion and hashing.
#include "models/weight_uploader.h"

#include <xxhash.h>

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

absl::StatusOr<WeightRef> Uploader::Matrix(const std::vector<std::string>& names, DType dtype, bool gemm_operand) {
  std::vector<const TensorView*> parts;
  int64_t rows = 0, cols = -1;
  for (const auto& n : names) {
    ASSIGN_OR_RETURN(const TensorView* t, Get(n));
    // A vector is one row.
    const int64_t t_rows = t->shape.size() == 2 ? t->shape[0] : 1;
    const int64_t t_cols = t->shape.back();
    if (t->shape.size() > 2 || (cols >= 0 && t_cols != cols)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", n, "\" cannot be stacked"));
    }
    cols = t_cols;
    rows += t_rows;
    parts.push_back(t);
  }
  std::vector<uint8_t> host(static_cast<size_t>(rows * cols) * DTypeSize(dtype));
  size_t at = 0;
  std::vector<float> tmp;
  for (const TensorView* t : parts) {
    const size_t n = static_cast<size_t>(t->numel());
    if (t->dtype == dtype) {
      std::memcpy(host.data() + at, t->data, t->bytes);
    } else {
      tmp.resize(n);
      ConvertToF32(t->data, t->dtype, n, tmp.data());
      ConvertFromF32(tmp.data(), n, dtype, host.data() + at);
    }
    at += n * DTypeSize(dtype);
  }
  std::string key;
  for (const auto& n : names) key.append(n.data(), n.size() + 1);  // with the NUL
  return Store(key, host, rows, cols, dtype, gemm_operand);
}

absl::StatusOr<const float*> Uploader::Vector(const std::string& name) {
  ASSIGN_OR_RETURN(WeightRef w, Matrix({name}, DType::kF32, /*gemm_operand=*/false));
  return static_cast<const float*>(w.data);
}

absl::StatusOr<std::vector<float>> Uploader::ReadF32(const std::string& name) {
  ASSIGN_OR_RETURN(const TensorView* t, Get(name));
  std::vector<float> out(static_cast<size_t>(t->numel()));
  ConvertToF32(t->data, t->dtype, out.size(), out.data());
  return out;
}

absl::StatusOr<WeightRef> Uploader::Derived(const std::string& key, const std::vector<float>& values, int64_t rows,
                                            int64_t cols, DType dtype, bool gemm_operand) {
  MS_CHECK(static_cast<int64_t>(values.size()) == rows * cols);
  std::vector<uint8_t> host(values.size() * DTypeSize(dtype));
  ConvertFromF32(values.data(), values.size(), dtype, host.data());
  return Store(key + std::string(1, '\0'), host, rows, cols, dtype, gemm_operand);
}

absl::StatusOr<WeightRef> Uploader::Store(const std::string& key, const std::vector<uint8_t>& host, int64_t rows,
                                          int64_t cols, DType dtype, bool gemm_operand) {
  const int64_t shape[3] = {rows, cols, static_cast<int64_t>(dtype)};
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, shape, sizeof(shape));
  XXH3_64bits_update(state, host.data(), host.size());
  (*digests_)[key] = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  const WeightLayout layout = gemm_operand ? backend_->PreferredWeightLayout() : WeightLayout::kRowMajor;
  ASSIGN_OR_RETURN(DeviceBuffer buf, UploadWeight(backend_, host.data(), dtype, rows, cols, layout));
  WeightRef w{buf.data(), dtype, rows, cols, layout};
  *total_ += buf.bytes();
  buffers_->push_back(std::move(buf));
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
