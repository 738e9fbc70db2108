// DeepSeek-V2 / V3 config keys.
#include "models/deepseek_config.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {
namespace {

using config_json::Find;
using config_json::Json;
using config_json::ReadBool;
using config_json::ReadDouble;
using config_json::ReadInt;

constexpr const char* kDeepseekKeys[] = {
    "n_routed_experts", "moe_intermediate_size", "n_shared_experts", "kv_lora_rank", "q_lora_rank",
    "qk_rope_head_dim", "v_head_dim",  "qk_nope_head_dim", "qk_head_dim", "n_group", "topk_group", "topk_method",
    "first_k_dense_replace", "routed_scaling_factor", "scoring_func", "rope_interleave", "num_nextn_predict_layers",
    "moe_layer_freq", "pretraining_tp",
    // Training and deployment knobs that change nothing at inference: the auxiliary balance
    // loss, remote-code class names, the expert-parallel size the checkpoint was trained with.
    "aux_loss_alpha", "seq_aux", "auto_map", "ep_size"};

absl::Status Refuse(absl::string_view key, const Json& v, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", key, " ", v.dump(), " is not supported (", why, ")"));
}

// Keys that must hold one value here: moe_layer_freq 1 (every layer after the dense ones is
// MoE), pretraining_tp 1, attention_bias false are checked by the common parser.
absl::Status CheckFixed(const Json& j) {
  if (const Json* v = Find(j, "moe_layer_freq"); v && *v != 1) return Refuse("moe_layer_freq", *v, "only 1");
  if (const Json* v = Find(j, "pretraining_tp"); v && *v != 1) return Refuse("pretraining_tp", *v, "only 1");
  return absl::OkStatus();
}

absl::Status ReadMla(const Json& j, bool v3, ModelConfig* c) {
  MlaConfig& m = c->mla;
  m.q_lora_rank = 1536;
  m.kv_lora_rank = 512;
  m.qk_nope_head_dim = 128;
  m.qk_rope_head_dim = 64;
  m.v_head_dim = 128;
  // q_lora_rank null means no query compression (V2-Lite): the key present with null.
  if (auto it = j.find("q_lora_rank"); it != j.end() && it->is_null()) m.q_lora_rank = 0;
  RETURN_IF_ERROR(ReadInt(j, "q_lora_rank", false, &m.q_lora_rank));
  RETURN_IF_ERROR(ReadInt(j, "kv_lora_rank", false, &m.kv_lora_rank));
  RETURN_IF_ERROR(ReadInt(j, "qk_nope_head_dim", false, &m.qk_nope_head_dim));
  RETURN_IF_ERROR(ReadInt(j, "qk_rope_head_dim", false, &m.qk_rope_head_dim));
  RETURN_IF_ERROR(ReadInt(j, "v_head_dim", false, &m.v_head_dim));
  m.rope_interleave = true;  // V2 always rotates interleaved pairs (complex multiplication)
  if (v3) RETURN_IF_ERROR(ReadBool(j, "rope_interleave", &m.rope_interleave));
  if (const Json* v = Find(j, "qk_head_dim"); v && *v != m.qk_head_dim()) {
    return Refuse("qk_head_dim", *v, absl::StrCat("it must be qk_nope_head_dim + qk_rope_head_dim = ", m.qk_head_dim()));
  }
  for (auto [key, value, min] : {std::tuple{"q_lora_rank", m.q_lora_rank, int64_t{0}},
                                 {"kv_lora_rank", m.kv_lora_rank, 1}, {"qk_nope_head_dim", m.qk_nope_head_dim, 1},
                                 {"qk_rope_head_dim", m.qk_rope_head_dim, 2}, {"v_head_dim", m.v_head_dim, 1}}) {
    if (value < min) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key, "\" must be at least ", min, ", got ", value));
    }
  }
  if (m.qk_rope_head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: \"qk_rope_head_dim\" must be even for rotary embeddings, got ", m.qk_rope_head_dim));
  }
  c->head_dim = m.qk_rope_head_dim;  // as transformers sets it: the rotary width
  return absl::OkStatus();
}

// V3: sigmoid scores, correction bias, noaux_tc group limit. V2: softmax, greedy or
// group_limited_greedy.
// transformers' defaults of the keys a config may leave out, per class.
struct MoeDefaults {
  double routed_scaling_factor;
  int64_t n_group, topk_group, n_shared, dense_intermediate, first_k_dense, nextn;
};
constexpr MoeDefaults kV3Defaults{2.5, 8, 4, 1, 18432, 3, 1};
constexpr MoeDefaults kV2Defaults{1.0, 1, 1, 2, 11008, 0, 0};
constexpr MoeDefaults kGlmDefaults{1.0, 1, 1, 1, 10944, 1, 1};

absl::Status ReadRouter(const Json& j, bool v3, const MoeDefaults& d, ModelConfig* c) {
  RouterConfig& r = c->router;
  r.scoring = v3 ? RouterScoring::kSigmoid : RouterScoring::kSoftmax;
  r.correction_bias = v3;
  r.routed_scaling_factor = d.routed_scaling_factor;
  RETURN_IF_ERROR(ReadDouble(j, "routed_scaling_factor", &r.routed_scaling_factor));
  const std::string want_scoring = v3 ? "sigmoid" : "softmax";
  if (const Json* v = Find(j, "scoring_func"); v && *v != want_scoring) {
    return Refuse("scoring_func", *v, absl::StrCat(v3 ? "DeepseekV3" : "DeepseekV2", " scores with ", want_scoring));
  }
  std::string method = v3 ? "noaux_tc" : "greedy";
  if (const Json* v = Find(j, "topk_method")) {
    if (!v->is_string()) return config_json::TypeError("topk_method", "a string", *v);
    method = v->get<std::string>();
  }
  if (v3 && method != "noaux_tc") return Refuse("topk_method", Json(method), "DeepseekV3 routes with noaux_tc");
  if (!v3 && method != "greedy" && method != "group_limited_greedy") {
    return Refuse("topk_method", Json(method), "DeepseekV2: greedy or group_limited_greedy");
  }
  r.n_group = d.n_group;
  r.topk_group = d.topk_group;
  RETURN_IF_ERROR(ReadInt(j, "n_group", false, &r.n_group));
  RETURN_IF_ERROR(ReadInt(j, "topk_group", false, &r.topk_group));
  r.group_limit = v3 ? GroupLimit::kTopTwoSum : method == "group_limited_greedy" ? GroupLimit::kMaxScore : GroupLimit::kNone;
  if (r.group_limit == GroupLimit::kNone) {
    r.n_group = r.topk_group = 1;  // V2's greedy reads neither
    return absl::OkStatus();
  }
  const int64_t e = c->num_local_experts;
  if (r.n_group < 1 || e % r.n_group != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: \"n_group\" (", r.n_group, ") must divide n_routed_experts (", e, ")"));
  }
  if (r.topk_group < 1 || r.topk_group > r.n_group) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: \"topk_group\" (", r.topk_group, ") must be in [1, n_group = ", r.n_group, "]"));
  }
  if (r.group_limit == GroupLimit::kTopTwoSum && e / r.n_group < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: noaux_tc scores a group by its two best experts; groups of ", e / r.n_group, " cannot"));
  }
  if (r.topk_group * (e / r.n_group) < c->num_experts_per_tok) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: topk_group (", r.topk_group, ") groups of ",
                                                   e / r.n_group, " experts hold fewer than num_experts_per_tok (",
                                                   c->num_experts_per_tok, ")"));
  }
  return absl::OkStatus();
}

absl::Status ReadMlp(const Json& j, const MoeDefaults& d, ModelConfig* c) {
  int64_t n_shared = d.n_shared;
  RETURN_IF_ERROR(ReadInt(j, "n_shared_experts", false, &n_shared));
  if (n_shared < 0) return Refuse("n_shared_experts", Json(n_shared), "at least 0");
  c->shared_expert_intermediate_size = n_shared * c->intermediate_size;
  c->shared_expert_gated = false;
  c->dense_intermediate_size = d.dense_intermediate;
  RETURN_IF_ERROR(ReadInt(j, "intermediate_size", false, &c->dense_intermediate_size));
  c->first_k_dense_replace = d.first_k_dense;
  RETURN_IF_ERROR(ReadInt(j, "first_k_dense_replace", false, &c->first_k_dense_replace));
  if (c->first_k_dense_replace < 0 || c->first_k_dense_replace > c->num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: \"first_k_dense_replace\" must be in [0, ",
                                                   c->num_hidden_layers, "], got ", c->first_k_dense_replace));
  }
  if (c->first_k_dense_replace > 0 && c->dense_intermediate_size < 1) {
    return Refuse("intermediate_size", Json(c->dense_intermediate_size), "dense layers need at least 1");
  }
  c->num_nextn_predict_layers = d.nextn;
  RETURN_IF_ERROR(ReadInt(j, "num_nextn_predict_layers", false, &c->num_nextn_predict_layers));
  if (c->num_nextn_predict_layers < 0) return Refuse("num_nextn_predict_layers", Json(c->num_nextn_predict_layers), "at least 0");
  return absl::OkStatus();
}

constexpr const char* kGlmKeys[] = {"n_routed_experts", "moe_intermediate_size", "n_shared_experts",
                                    "routed_scaling_factor", "n_group", "topk_group", "first_k_dense_replace",
                                    "use_qk_norm", "partial_rotary_factor", "num_nextn_predict_layers"};

// GLM's share of the rotary dimensions: top-level (transformers 4) or in rope_parameters (5).
absl::Status ReadPartialRotary(const Json& j, ModelConfig* c) {
  c->partial_rotary_factor = 0.5;  // Glm4MoeConfig's default
  RETURN_IF_ERROR(ReadDouble(j, "partial_rotary_factor", &c->partial_rotary_factor));
  if (const Json* p = Find(j, "rope_parameters"); p != nullptr && p->is_object() && Find(*p, "partial_rotary_factor")) {
    double inner = 0;
    RETURN_IF_ERROR(ReadDouble(*p, "partial_rotary_factor", &inner));
    if (Find(j, "partial_rotary_factor") != nullptr && inner != c->partial_rotary_factor) {
      return Refuse("rope_parameters.partial_rotary_factor", Json(inner), "it disagrees with partial_rotary_factor");
    }
    c->partial_rotary_factor = inner;
  }
  const int64_t rd = c->rotary_dim();
  if (!(c->partial_rotary_factor > 0 && c->partial_rotary_factor <= 1) || rd < 2 || rd % 2 != 0) {
    return Refuse("partial_rotary_factor", Json(c->partial_rotary_factor),
                  absl::StrCat("it must give an even number of rotary dimensions in [2, head_dim = ", c->head_dim, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsGlmKey(const std::string& key) {
  return std::any_of(std::begin(kGlmKeys), std::end(kGlmKeys), [&](const char* k) { return key == k; });
}

absl::Status ReadGlmConfig(const Json& j, ModelConfig* c) {
  c->qkv_bias = false;
  RETURN_IF_ERROR(ReadBool(j, "attention_bias", &c->qkv_bias));  // q, k and v (o has none)
  bool qk_norm = false;
  RETURN_IF_ERROR(ReadBool(j, "use_qk_norm", &qk_norm));
  c->qk_norm = qk_norm ? QkNorm::kPerHead : QkNorm::kNone;
  RETURN_IF_ERROR(ReadPartialRotary(j, c));
  RETURN_IF_ERROR(ReadRouter(j, /*v3=*/true, kGlmDefaults, c));
  return ReadMlp(j, kGlmDefaults, c);
}

bool IsDeepseekKey(const std::string& key) {
  return std::any_of(std::begin(kDeepseekKeys), std::end(kDeepseekKeys), [&](const char* k) { return key == k; });
}

absl::Status ReadDeepseekConfig(const Json& j, ModelConfig* c) {
  const bool v3 = c->family == ModelFamily::kDeepseekV3;
  RETURN_IF_ERROR(CheckFixed(j));
  RETURN_IF_ERROR(ReadMla(j, v3, c));
  const MoeDefaults& d = v3 ? kV3Defaults : kV2Defaults;
  RETURN_IF_ERROR(ReadRouter(j, v3, d, c));
  RETURN_IF_ERROR(ReadMlp(j, d, c));
  // transformers' DeepseekV2 router never renormalises, whatever norm_topk_prob says (the
  // original code did when it was true): refuse rather than pick one meaning.
  if (!v3 && c->norm_topk_prob) {
    return Refuse("norm_topk_prob", Json(true), "DeepseekV2's router in transformers ignores it; only false");
  }
  // MLA has one latent "head" per token; num_key_value_heads (transformers writes the head
  // count) means nothing to it.
  c->num_key_value_heads = c->num_attention_heads;
  return ReadRopeScaling(j, c->max_position_embeddings, &c->rope_scaling);
}

ModelConfig DeepseekShape(ModelConfig c) {
  const bool glm = c.family == ModelFamily::kGlm4Moe;
  const bool v3 = c.family == ModelFamily::kDeepseekV3 || glm;  // GLM routes as V3
  if (glm) {  // grouped-query attention with biases, q/k norms and half-head RoPE
    c.qkv_bias = true;
    c.qk_norm = QkNorm::kPerHead;
    c.partial_rotary_factor = 0.5;
  } else {
    c.mla = MlaConfig{v3 ? c.hidden_size / 2 : 0, 2 * c.head_dim, c.head_dim, c.head_dim / 2, c.head_dim, true};
    c.head_dim = c.mla.qk_rope_head_dim;
    c.num_key_value_heads = c.num_attention_heads;
  }
  c.shared_expert_intermediate_size = (v3 ? 1 : 2) * c.intermediate_size;
  c.shared_expert_gated = false;
  c.first_k_dense_replace = c.num_hidden_layers > 1 ? 1 : 0;
  c.dense_intermediate_size = 2 * c.intermediate_size;
  c.num_nextn_predict_layers = 0;
  c.norm_topk_prob = v3;
  c.router = RouterConfig();
  if (v3) {
    const int64_t e = c.num_local_experts;
    c.router.scoring = RouterScoring::kSigmoid;
    c.router.group_limit = GroupLimit::kTopTwoSum;
    c.router.correction_bias = true;
    c.router.routed_scaling_factor = 2.5;
    c.router.n_group = e % 4 == 0 && e / 4 >= 2 ? 4 : 1;
    c.router.topk_group = c.router.n_group;
    // Half the groups when they still hold the top-k.
    if (c.router.n_group > 1 && (c.router.n_group / 2) * (e / c.router.n_group) >= c.num_experts_per_tok) {
      c.router.topk_group = c.router.n_group / 2;
    }
  }
  return c;
}

void WriteDeepseekConfig(const ModelConfig& c, Json* j) {
  Json& o = *j;
  const bool v3 = c.family == ModelFamily::kDeepseekV3;
  o.erase("shared_expert_intermediate_size");
  if (c.is_mla()) {
    o["q_lora_rank"] = c.mla.q_lora_rank > 0 ? Json(c.mla.q_lora_rank) : Json();
    o["kv_lora_rank"] = c.mla.kv_lora_rank;
    o["qk_nope_head_dim"] = c.mla.qk_nope_head_dim;
    o["qk_rope_head_dim"] = c.mla.qk_rope_head_dim;
    o["v_head_dim"] = c.mla.v_head_dim;
    o["head_dim"] = c.mla.qk_rope_head_dim;
    if (v3) o["rope_interleave"] = c.mla.rope_interleave;
  }
  if (c.family == ModelFamily::kGlm4Moe) {
    o["attention_bias"] = c.qkv_bias;
    o["use_qk_norm"] = c.qk_norm == QkNorm::kPerHead;
    o["partial_rotary_factor"] = c.partial_rotary_factor;
  }
  o["n_shared_experts"] = c.intermediate_size > 0 ? c.shared_expert_intermediate_size / c.intermediate_size : 0;
  o["intermediate_size"] = c.dense_intermediate_size;
  o["first_k_dense_replace"] = c.first_k_dense_replace;
  o["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  o["routed_scaling_factor"] = c.router.routed_scaling_factor;
  if (c.is_deepseek()) {
    o["scoring_func"] = v3 ? "sigmoid" : "softmax";
    o["topk_method"] = v3 ? "noaux_tc" : c.router.group_limit == GroupLimit::kMaxScore ? "group_limited_greedy" : "greedy";
  }
  o["n_group"] = c.router.n_group;
  o["topk_group"] = c.router.topk_group;
  if (c.rope_scaling.yarn) {
    const RopeScaling& y = c.rope_scaling;
    Json r = {{"type", "yarn"}, {"factor", y.factor}, {"original_max_position_embeddings", y.original_max_position_embeddings},
              {"beta_fast", y.beta_fast}, {"beta_slow", y.beta_slow}};
    if (y.mscale != 0) r["mscale"] = y.mscale;
    if (y.mscale_all_dim != 0) r["mscale_all_dim"] = y.mscale_all_dim;
    o["rope_scaling"] = r;
  }
}

absl::Status ReadRopeScaling(const Json& j, int64_t max_position_embeddings, RopeScaling* out) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const Json* p = Find(j, key);
    if (p == nullptr) continue;
    if (!p->is_object()) return config_json::TypeError(key, "an object", *p);
    std::string type = "default";
    for (const char* t : {"rope_type", "type"}) {
      if (const Json* v = Find(*p, t)) {
        if (!v->is_string()) return config_json::TypeError(t, "a string", *v);
        type = v->get<std::string>();
      }
    }
    if (type == "default") continue;
    if (type != "yarn") return Refuse(absl::StrCat(key, ".rope_type"), Json(type), "default or yarn");
    RopeScaling r;
    r.yarn = true;
    for (const auto& [k, v] : p->items()) {
      static constexpr const char* kKnown[] = {"rope_type", "type", "rope_theta", "factor",
                                               "original_max_position_embeddings", "beta_fast", "beta_slow",
                                               "mscale", "mscale_all_dim", "attention_factor", "truncate"};
      const std::string& name = k;  // a lambda may not capture a structured binding before clang 16
      if (std::none_of(std::begin(kKnown), std::end(kKnown), [&](const char* n) { return name == n; })) {
        return Refuse(absl::StrCat(key, ".", k), v, "not a YaRN key this build implements");
      }
    }
    r.factor = 0;
    RETURN_IF_ERROR(ReadDouble(*p, "factor", &r.factor));
    RETURN_IF_ERROR(ReadInt(*p, "original_max_position_embeddings", true, &r.original_max_position_embeddings));
    // No factor: transformers takes the context's growth over the original one.
    if (Find(*p, "factor") == nullptr && r.original_max_position_embeddings > 0) {
      r.factor = static_cast<double>(max_position_embeddings) / static_cast<double>(r.original_max_position_embeddings);
    }
    RETURN_IF_ERROR(ReadDouble(*p, "beta_fast", &r.beta_fast));
    RETURN_IF_ERROR(ReadDouble(*p, "beta_slow", &r.beta_slow));
    RETURN_IF_ERROR(ReadDouble(*p, "mscale", &r.mscale));
    RETURN_IF_ERROR(ReadDouble(*p, "mscale_all_dim", &r.mscale_all_dim));
    RETURN_IF_ERROR(ReadDouble(*p, "attention_factor", &r.attention_factor));
    RETURN_IF_ERROR(ReadBool(*p, "truncate", &r.truncate));
    if (!(r.factor >= 1.0)) return Refuse(absl::StrCat(key, ".factor"), Json(r.factor), "YaRN needs a factor of at least 1");
    if (r.original_max_position_embeddings < 1 || !(r.beta_fast > 0) || !(r.beta_slow > 0) || r.attention_factor < 0) {
      return Refuse(key, *p, "YaRN needs original_max_position_embeddings >= 1, positive betas and attention_factor");
    }
    *out = r;
  }
  return absl::OkStatus();
}

}  // namespace moeserve
