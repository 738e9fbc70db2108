// The CPU GEMM's planner (see gemm.h): cuts every task into work items of a variant's weight
// rows (one or two 8-row tiles, or AMX's B tiles) and a run of x rows, and hands them to the
// chosen variant's kernel (gemm_kernels.h).
#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/host_buffer.h"
#include "core/status.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/weight_layout.h"

namespace moeserve::cpu_fast {
namespace {

using TileFn = void (*)(const GemmTask&, const uint16_t*, const GemmItem&, GemmScratch*);

// How a variant cuts a task into work items and what activations it reads.
struct Variant {
  TileFn kernel;
  int64_t item_rows;    // weight rows per item: one kTiled8 tile, two (kBf16ItemRows), or kAmxItemRows
  int64_t row_chunk;    // x rows per item of a large GEMM
  int64_t group_bytes;  // weights per group of items (0: one tile a group; see RunGemms)
  TileFn swiglu_kernel = nullptr;  // the fused gate/up and SiLU (GemmTask::swiglu), if any,
  int64_t swiglu_columns = 0;      // and the output columns of one of its items
};

Variant VariantOf(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return {TileAvx512, kTileRows, kRowChunk, 0};
    case CpuIsa::kAvx512Bf16:
      return {TileAvx512Bf16, kBf16ItemRows, kRowChunk, kBf16GroupBytes, TileAvx512Bf16SwiGlu, kTileRows};
    case CpuIsa::kAmx: return {TileAmx, kAmxItemRows, kAmxRowChunk, kAmxGroupBytes, TileAmxSwiGlu, kSwiGluItemColumns};
    case CpuIsa::kAmxModel:
      return {TileAmxEmulated, kAmxItemRows, kAmxRowChunk, kAmxGroupBytes, TileAmxSwiGluEmulated, kSwiGluItemColumns};
    default: return {TileAvx2, kTileRows, kRowChunk, 0};
  }
}

// The rows a variant's activation layout is cut in (0: it reads x itself, the exact variants).
int64_t ActivationBlock(CpuIsa isa) {
  if (isa == CpuIsa::kAvx512Bf16) return kBf16RowBlock;
  return IsAmx(isa) ? kAmxRowBlock : 0;
}

// The variant that computes `t`: the bf16 ones take bf16 weights only (f32 weights keep their
// exact arithmetic rather than being rounded).
CpuIsa IsaForTask(const GemmTask& t, CpuIsa isa) {
  return RoundsActivations(isa) && t.w.dtype != DType::kBF16 ? ExactIsaFor(isa) : isa;
}

uint16_t RoundToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  // Round to nearest, ties to even; a NaN stays a (quiet) NaN. Branch-free, so it vectorises.
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t nan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

}  // namespace

void RoundRowsToBf16(const float* x, int64_t m, int64_t k, uint16_t* out) {
  const int64_t k8 = RoundUp(k, kTileCols);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t c = 0; c < k; ++c) out[i * k8 + c] = RoundToBf16(x[i * k + c]);
    for (int64_t c = k; c < k8; ++c) out[i * k8 + c] = 0;
  }
}

bool SwiGluFusable(CpuIsa isa, const WeightRef& w, int64_t inter) {
  if (w.dtype != DType::kBF16 || inter <= 0 || w.rows != 2 * inter) return false;
  if (IsAmx(isa)) return w.layout == WeightLayout::kAmxTiles && inter % kSwiGluItemColumns == 0;
  return isa == CpuIsa::kAvx512Bf16 && w.layout == WeightLayout::kTiled8 && inter % kTileRows == 0;
}

bool PacksSwiGluOutput(CpuIsa isa, int64_t inter) {
  return isa == CpuIsa::kAvx512Bf16 || (IsAmx(isa) && inter % kAmxTileK == 0);
}

int64_t PackedActivationElems(CpuIsa isa, int64_t m, int64_t k) {
  return IsAmx(isa) ? PaddedAmxElems(m, k) : PackedBf16Elems(m, k);
}

int64_t PackedRows(CpuIsa isa, int64_t m) { return RoundUp(m, ActivationBlock(isa)); }

void PackActivations(CpuIsa isa, const float* x, int64_t m, int64_t k, int64_t i0, int64_t i1, uint16_t* out) {
  if (IsAmx(isa)) return PadRowsAmx(x, m, k, i0, i1, out);
  MS_CHECK(isa == CpuIsa::kAvx512Bf16);
  PackRowsBf16(x, m, k, i0, i1, out);
}

const char* GemmInstructionKind(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return "f32-fma-512";
    case CpuIsa::kAvx512Bf16: return "bf16-dot-512";
    case CpuIsa::kAmx: return "amx-bf16";
    case CpuIsa::kAmxModel: return "scalar (the amx model)";
    default: return "f32-fma-256";
  }
}

namespace {

uint16_t* Bf16(const HostBuffer& b) { return reinterpret_cast<uint16_t*>(b.data()); }

// Every task's activations in its variant's layout (null for the exact variants and for tasks
// given x_packed), in 64-byte aligned memory: an AMX tile row (64 bytes) or a zmm load that
// straddles two cache lines costs two (measured: the amx kernel at half its speed on misaligned
// activations). Tasks of the same rows (x, m, k) on the same variant share one conversion (the
// q, k and v projections of a layer's input). The rounding is spread over the pool in pieces of
// a few row blocks: on one thread it would be a serial part of every large GEMM, as long as the
// tiles' arithmetic itself. A decode step's rows are converted inline.
struct Activations {
  std::vector<HostBuffer> owned;
  std::vector<const uint16_t*> of_task;  // per task
};

Activations PrepareActivations(ThreadPool& pool, std::span<const GemmTask> tasks, CpuIsa isa) {
  struct Piece {
    size_t task;
    int64_t i0, i1;
  };
  Activations acts;
  acts.owned.resize(tasks.size());
  acts.of_task.assign(tasks.size(), nullptr);
  std::vector<Piece> pieces;
  int64_t elems = 0;
  for (size_t k = 0; k < tasks.size(); ++k) {
    const GemmTask& t = tasks[k];
    const CpuIsa task_isa = IsaForTask(t, isa);
    const int64_t block = ActivationBlock(task_isa);
    if (t.m == 0 || t.w.rows == 0 || block == 0 || t.x_packed != nullptr) continue;
    const auto same_rows = [&](size_t j) {
      const GemmTask& o = tasks[j];
      return acts.of_task[j] != nullptr && o.x == t.x && o.m == t.m && o.w.cols == t.w.cols &&
             IsaForTask(o, isa) == task_isa;
    };
    size_t j = 0;
    while (j < k && !same_rows(j)) ++j;
    if (j < k) {
      acts.of_task[k] = acts.of_task[j];
      continue;
    }
    const int64_t rows = RoundUp(t.m, block), piece = 4 * block;
    // Every element is written (padding too), so the buffer needs no clearing.
    const int64_t size = PackedActivationElems(task_isa, t.m, t.w.cols);
    acts.owned[k] = HostBuffer::Uninitialized(static_cast<size_t>(size) * sizeof(uint16_t));
    MS_CHECK(!acts.owned[k].empty());  // out of memory, as new[] would have thrown
    acts.of_task[k] = Bf16(acts.owned[k]);
    for (int64_t i = 0; i < rows; i += piece) pieces.push_back({k, i, std::min(rows, i + piece)});
    elems += rows * t.w.cols;
  }
  auto convert = [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const Piece& p = pieces[static_cast<size_t>(n)];
      const GemmTask& t = tasks[p.task];
      PackActivations(IsaForTask(t, isa), t.x, t.m, t.w.cols, p.i0, p.i1, Bf16(acts.owned[p.task]));
    }
  };
  constexpr int64_t kInlineElems = 1 << 16;  // below this a pool dispatch costs more than it saves
  if (elems < kInlineElems || pieces.size() == 1) {
    convert(0, static_cast<int64_t>(pieces.size()));
  } else {
    pool.ParallelFor(static_cast<int64_t>(pieces.size()), 1, convert);
  }
  return acts;
}

}  // namespace

void RunGemms(ThreadPool& pool, std::span<const GemmTask> tasks, CpuIsa isa) {
  const Activations acts = PrepareActivations(pool, tasks, isa);
  std::vector<GemmItem> items;
  double work = 0;
  for (size_t k = 0; k < tasks.size(); ++k) {
    const GemmTask& t = tasks[k];
    if (t.m == 0 || t.w.rows == 0) continue;
    MS_CHECK(t.w.dtype == DType::kF32 || t.w.dtype == DType::kBF16);
    // Only the amx kernel reads weights stored as AMX tiles (the backend stores them so for it).
    MS_CHECK(t.w.layout != WeightLayout::kAmxTiles || IsAmx(IsaForTask(t, isa)));
    MS_CHECK(t.swiglu == 0 || (SwiGluFusable(IsaForTask(t, isa), t.w, t.swiglu) && !t.accumulate));
    MS_CHECK(t.x_packed == nullptr || ActivationBlock(IsaForTask(t, isa)) > 0);  // a layout of this variant
    MS_CHECK(t.y_packed == nullptr || (t.swiglu > 0 && PacksSwiGluOutput(IsaForTask(t, isa), t.swiglu)));
    const Variant v = VariantOf(IsaForTask(t, isa));
    const int64_t tiles = t.swiglu > 0 ? t.swiglu / v.swiglu_columns : (t.w.rows + v.item_rows - 1) / v.item_rows;
    const int64_t chunk = t.m <= kDirectMaxRows ? t.m : v.row_chunk;
    // Items run in groups of weight tiles, x rows outer within a group. The amx kernel's groups
    // hold ~1 MiB of B tiles, so an x block (one item's rows) stays in cache across the group's
    // tiles (in L1 up to K = 768) and the group's tiles stay in L2 across its x blocks; tile
    // after tile instead read all of x from beyond L2 once per tile (a 2000-token prompt's
    // q/k/v projection ran ~2x faster so, one core of the Sapphire Rapids VM). Weights the
    // backend did not store as AMX tiles (tests, benchmarks) are repacked per item, so per 32
    // x rows. The avx512-bf16 kernel groups too (on a Zen 5, whose vdpbf16ps runs at twice a
    // Sapphire Rapids core's rate, x's stream from L3 held it back); the exact kernels keep one
    // tile a group.
    const int64_t bytes = v.item_rows * RoundUp(t.w.cols, kAmxTileK) * static_cast<int64_t>(DTypeSize(t.w.dtype));
    const int64_t group = v.group_bytes > 0 ? std::max<int64_t>(1, v.group_bytes / std::max<int64_t>(1, bytes)) : 1;
    for (int64_t g0 = 0; g0 < tiles; g0 += group) {
      for (int64_t m0 = 0; m0 < t.m; m0 += chunk) {
        for (int64_t tile = g0; tile < std::min(tiles, g0 + group); ++tile) {
          items.push_back({static_cast<int32_t>(k), tile, m0, std::min(t.m, m0 + chunk)});
        }
      }
    }
    work += static_cast<double>(t.m) * t.w.rows * t.w.cols;
  }
  if (items.empty()) return;
  // Enough items per part that a part streams at least ~64 KiB of weights or does ~2 MFLOP.
  const double per_item = work / static_cast<double>(items.size());
  const int64_t grain = std::max<int64_t>(1, static_cast<int64_t>(32768.0 / std::max(1.0, per_item)));
  pool.ParallelFor(static_cast<int64_t>(items.size()), grain, [&](int64_t b, int64_t e) {
    GemmScratch scratch;
    for (int64_t n = b; n < e; ++n) {
      const GemmItem& it = items[static_cast<size_t>(n)];
      const GemmTask& t = tasks[static_cast<size_t>(it.task)];
      const Variant v = VariantOf(IsaForTask(t, isa));
      const TileFn kernel = t.swiglu > 0 ? v.swiglu_kernel : v.kernel;
      kernel(t, t.x_packed != nullptr ? t.x_packed : acts.of_task[static_cast<size_t>(it.task)], it, &scratch);
    }
  });
}

void BlasGemm(ThreadPool& pool, const GemmTask& t) {
  const int64_t n = t.w.rows, k = t.w.cols;
  if (t.m == 0 || n == 0) return;
  const float beta = t.accumulate ? 1.0f : 0.0f;
  constexpr int64_t kBlock = 64;  // rows of w per sgemm, a multiple of the tile height
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const size_t eb = DTypeSize(t.w.dtype);
  pool.ParallelFor(blocks, 1, [&](int64_t bb, int64_t be) {
    std::vector<float> block(static_cast<size_t>(kBlock * k));
    std::vector<uint8_t> row(static_cast<size_t>(k) * eb);
    for (int64_t b = bb; b < be; ++b) {
      const int64_t r0 = b * kBlock, rows = std::min(kBlock, n - r0);
      const int64_t run = WeightRowRun(t.w.layout, k);
      for (int64_t j = 0; j < rows; ++j) {
        for (int64_t c = 0; c < k; c += run) {
          const int64_t at = WeightIndex(t.w.layout, n, k, r0 + j, c);
          std::memcpy(row.data() + c * eb, static_cast<const uint8_t*>(t.w.data) + at * eb,
                      static_cast<size_t>(std::min<int64_t>(run, k - c)) * eb);
        }
        ConvertToF32(row.data(), t.w.dtype, static_cast<size_t>(k), block.data() + j * k);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(t.m),
                  static_cast<int>(rows), static_cast<int>(k), 1.0f, t.x, static_cast<int>(k),
                  block.data(), static_cast<int>(k), beta, t.y + r0, static_cast<int>(n));
    }
  });
}

}  // namespace moeserve::cpu_fast
