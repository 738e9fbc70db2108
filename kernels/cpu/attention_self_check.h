// The attention half of a kernel variant's self-check (kernel_select.cc): the multi-head and
// latent attention kernels a variant runs, over the caches they read, on a small paged batch of
// fresh random values (a decode past the first 512-key chunk, a prefill chunk, contexts of 1 and
// 41, blocks in random order), against float64 attention within attention_bound.h's bound, and
// each token bit-equal to itself computed alone (which on two threads splits the long context
// into its chunks). About 10 ms a variant; a variant whose attention computes wrongly is not used
// (one that faults takes its process down: the amx variant's checks run in a child process).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_isa.h"

namespace moeserve::cpu_fast {

// Paged attention as Backend::PagedAttention computes it.
using PagedAttentionFn = std::function<void(const float* q, const AttentionBatch& batch, const KvLayout& layout,
                                            int64_t layer, const void* cache, int64_t q_heads, float scale,
                                            float* out)>;
// Latent attention as Backend::PagedLatentAttention computes it.
using LatentAttentionFn =
    std::function<void(const float* q_latent, const float* q_rope, const AttentionBatch& batch, const KvLayout& layout,
                       int64_t layer, const void* cache, int64_t heads, int64_t latent_dim, float scale, float* out)>;

// The largest error seen of each check, as a fraction of its bound.
struct AttentionCheckErrors {
  double paged = 0, latent = 0;
};

// Empty when `attend` holds over a cache of `kv_dtype` (`bf16`: it rounds queries and
// probabilities to bf16, as the bf16 kernels do); else what failed, with the error and its bound
// or the token that differed alone.
std::string CheckPagedAttention(const PagedAttentionFn& attend, DType kv_dtype, bool bf16, std::mt19937& gen,
                                AttentionCheckErrors* errors);
std::string CheckLatentAttention(const LatentAttentionFn& attend, DType kv_dtype, bool bf16, std::mt19937& gen,
                                 AttentionCheckErrors* errors);

// Both on the kernels variant `isa` runs (AttentionKernelOf), over bf16 and f32 caches, on `pool`.
std::string CheckAttentionKernels(CpuIsa isa, ThreadPool& pool, std::mt19937& gen, AttentionCheckErrors* errors);

}  // namespace moeserve::cpu_fast
