// The HTTP fuzz target's custom mutator (fuzz/http_fuzz.cc is the target; both are built by
// benchmarks/fuzz_http.sh). Kept apart from the target: it knows the OpenAI request's field
// names and edge values, not what the target checks.
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {
using Json = nlohmann::json;
}  // namespace

// Structure-aware mutation, half of the time: a body that parses as JSON gets one of its values
// replaced by one of another type or an edge value, a key added, removed or renamed, or a value
// wrapped in an array; the other half, and any body that does not parse, libFuzzer's byte-level
// mutations. Type confusion (a number where a string is read) is what byte mutations rarely make.
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::mt19937 g(seed);
  if (g() % 2 == 0 || size > 16384) return LLVMFuzzerMutate(data, size, max_size);
  Json j = Json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_structured()) return LLVMFuzzerMutate(data, size, max_size);
  static const char* const kKeys[] = {
      "model", "prompt", "messages", "role", "content", "type", "text", "max_tokens", "max_completion_tokens",
      "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "stream", "stream_options",
      "include_usage", "logprobs", "top_logprobs", "priority", "retain_seconds", "cache_salt", "ignore_eos", "n",
      "best_of", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "echo", "suffix",
      "tools", "functions", "response_format", "image_url", "include_stop_str_in_output", "add_generation_prompt",
      "continue_final_message", "chat_template_kwargs", "enable_thinking", "add_special_tokens", "min_p", "min_tokens"};
  static const Json* const kValues = new Json(Json::parse(R"([
      null, true, false, 0, -1, 1, 2, 20, 21, 256, 257, 271, 272, 1023, 1024, 4096, 4097, 2147483647, 2147483648,
      4294967368, 9223372036854775807, 9223372036854775808, 18446744073709551615, -9223372036854775808,
      0.5, -0.0, 1.5, 100.5, 1e308, -1e308, 5e-324,
      "", "a", "text", "json_object", "user", "system", "assistant", "developer", "tool", "fast", "high", "low",
      "normal", "<bos>", "<eos>", "<|im_end|>", "\u00e9", "\ud83d\ude00", "{{ x }}", "{% for %}",
      [], {}, [1], [256, 1, 2], ["a"], [""], [[1]], {"type": "text", "text": "a"}, {"type": 1},
      {"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "text", "text": "a"}]},
      {"include_usage": true}
  ])"));
  std::vector<Json*> nodes;
  auto collect = [&](auto&& self, Json& v, int depth) -> void {
    nodes.push_back(&v);
    if (depth >= 32 || !v.is_structured()) return;
    for (Json& child : v) self(self, child, depth + 1);
  };
  collect(collect, j, 0);
  Json& node = *nodes[g() % nodes.size()];
  const Json& value = (*kValues)[g() % kValues->size()];
  const std::string key = kKeys[g() % std::size(kKeys)];
  switch (g() % 6) {
    case 0:  // a value of another type, or an edge value
    case 1:
      if (&node != &j) node = value;
      break;
    case 2:  // a key added (or set)
      if (node.is_object()) {
        node[key] = value;
      } else if (j.is_object()) {
        j[key] = value;
      }
      break;
    case 3:  // a key or element removed
      if (node.is_object() && !node.empty()) {
        node.erase(std::next(node.begin(), static_cast<long>(g() % node.size())));
      } else if (node.is_array() && !node.empty()) {
        node.erase(static_cast<size_t>(g() % node.size()));
      }
      break;
    case 4:  // a key renamed
      if (node.is_object() && !node.empty()) {
        auto it = std::next(node.begin(), static_cast<long>(g() % node.size()));
        Json moved = *it;
        node.erase(it);
        node[key] = std::move(moved);
      }
      break;
    default:  // an element repeated, or the value wrapped in an array
      if (node.is_array() && !node.empty() && node.size() < 64) {
        node.push_back(Json(node[g() % node.size()]));
      } else if (&node != &j) {
        node = Json::array({node});
      }
  }
  const std::string out = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}
