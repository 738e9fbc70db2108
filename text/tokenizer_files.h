// The Hugging Face tokenizer files of moeserve's own checkpoints, so that `make-model` writes a
// directory that transformers, vLLM and moeserve all load with the same tokenizer: a
// tokenizer.json whose ids are the byte tokenizer's (byte b is id b through the byte-level
// alphabet, no merges; <bos> 256, <eos> 257, <pad> 258, BOS added in front), a
// tokenizer_config.json with a ChatML chat template (the same prompt moeserve renders for
// models without a template), and a generation_config.json.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace moeserve {

std::string ByteTokenizerJson();
std::string ByteTokenizerConfigJson();
std::string ByteGenerationConfigJson();
// Writes the three files into `dir`.
absl::Status WriteByteTokenizerFiles(const std::string& dir);

}  // namespace moeserve
