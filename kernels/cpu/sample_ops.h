// Sampling a token per row of logits on the CPU, two ways with one contract (Backend::SampleRows):
//   - SortSampleRow: sorts the candidates, as engine/sampling.h's Sampler does; the oracle.
//   - RadixSampleRow: never sorts. Each decision (the top_k-th candidate, the end of the
//     nucleus, the sampled token) is a descent over the 64-bit order key, a byte per pass:
//     a 256-bucket histogram (of counts or of probability mass) of the candidates that match
//     the key so far picks the next byte. Every pass is a reduction over the vocabulary, which
//     is how the CUDA kernel (cuda_kernels.cu) runs it with one thread block per row; this is
//     the same algorithm, serially, so that the CPU tests check the GPU's method.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/sample_order.h"

namespace moeserve::cpu_sample {

int32_t SortSampleRow(const float* logits, int64_t vocab, const SampleSpec& spec);
int32_t RadixSampleRow(const float* logits, int64_t vocab, const SampleSpec& spec);

}  // namespace moeserve::cpu_sample
