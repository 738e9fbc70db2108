#!/usr/bin/env python3
"""Builds tiny random checkpoints of each supported Hugging Face MoE family with transformers'
own config classes and save_pretrained, and records transformers' logits for a few prompts and
its greedy continuations; tests/models/hf_families_test.cc loads each directory with moeserve
and compares. Not part of CI (it needs torch):

    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch==2.9.1 transformers==4.57.1 \
        tokenizers==0.22.1 safetensors
    /tmp/hfvenv/bin/python scripts/make-hf-fixtures.py tests/models/fixtures/hf [family ...]

The DeepSeek and GLM fixtures (deepseekv3, deepseekv3fp8, deepseekv2lite, deepseekv2group, glm4moe), the
Qwen ones with dense layers (qwen2moedense, qwen3moedense) and the first four families again as
transformers 5 saves them (mixtral5, qwen2moe5, qwen3moe5, olmoe5) were made with transformers
5.19 (pass their names to regenerate only them), the first four with 4.57.1.

Each family's directory gets config.json, model.safetensors (float32), generation_config.json,
the tokenizer trained by scripts/make-tokenizer-fixtures.py (the qwen one) and the family's
chat template, plus expected.json: per prompt its ids, the greedy continuation, and the file
and shape of its logits (raw little-endian float32, [positions, vocab]).
"""
import json
import os
import re
import shutil
import sys

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers.utils.chat_template_utils import _compile_jinja_template
from transformers import (MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM, Qwen2MoeConfig,
                          Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)
try:  # transformers >= 4.57 (the DeepSeek and GLM fixtures)
    from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM,
                              Glm4MoeConfig, Glm4MoeForCausalLM)
except ImportError:
    DeepseekV3Config = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(ROOT, "tests/models/fixtures/tokenizers/qwen/tokenizer.json")
TEMPLATES = os.path.join(ROOT, "tests/models/fixtures/chat_templates")
PROMPTS = ["The quick brown fox jumps over the lazy dog.", "日本語のテキスト and 🙂 emoji",
           "def f(x):\n    return x * 2  # 42"]
COMMON = dict(vocab_size=1201, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, bos_token_id=None, eos_token_id=2, tie_word_embeddings=False)


def families():
    yield "mixtral", "mixtral", MixtralForCausalLM, MixtralConfig(
        **COMMON, intermediate_size=48, num_local_experts=8, num_experts_per_tok=2, rope_theta=50000.0,
        rms_norm_eps=1e-5, sliding_window=None)
    yield "qwen2moe", "qwen2moe", Qwen2MoeForCausalLM, Qwen2MoeConfig(
        **COMMON, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, rope_theta=10000.0, rms_norm_eps=1e-6,
        decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False)
    yield "qwen3moe", "qwen3moe", Qwen3MoeForCausalLM, Qwen3MoeConfig(
        **COMMON, head_dim=24, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, rope_theta=1000000.0, rms_norm_eps=1e-6,
        decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False)
    yield "olmoe", "olmoe", OlmoeForCausalLM, OlmoeConfig(
        **COMMON, intermediate_size=8, num_experts=64, num_experts_per_tok=8, norm_topk_prob=False,
        rope_theta=10000.0, rms_norm_eps=1e-5, clip_qkv=None)


# Multi-head latent attention with every part exercised: a dense first layer, YaRN with its
# mscale, group-limited routing with a (random, non-zero) correction bias for V3; V2-Lite without
# query compression and with greedy softmax routing; V2 with group_limited_greedy.
MLA = dict(vocab_size=1201, hidden_size=64, num_attention_heads=4, max_position_embeddings=256, bos_token_id=None,
           eos_token_id=2, tie_word_embeddings=False, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
           v_head_dim=16, moe_intermediate_size=32, intermediate_size=96, n_routed_experts=8, num_experts_per_tok=2,
           rms_norm_eps=1e-6)


def deepseek_families():
    # GLM-4.5: grouped-query attention with q/k/v biases, per-head q/k norms, RoPE on half of
    # each head (head_dim independent of the hidden size), and DeepSeek-V3's MoE.
    yield "glm4moe", "qwen2moe", Glm4MoeForCausalLM, Glm4MoeConfig(
        **COMMON, head_dim=24, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=True, attention_bias=True,
        partial_rotary_factor=0.5, rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    yield "deepseekv3", "qwen2moe", DeepseekV3ForCausalLM, DeepseekV3Config(
        **MLA, num_hidden_layers=3, q_lora_rank=48, first_k_dense_replace=1, n_shared_experts=1, n_group=4,
        topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 64, "beta_fast": 32,
                         "beta_slow": 1})
    yield "deepseekv2lite", "qwen2moe", DeepseekV2ForCausalLM, DeepseekV2Config(
        **MLA, num_hidden_layers=2, q_lora_rank=None, first_k_dense_replace=1, n_shared_experts=2,
        topk_method="greedy", n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 0.707,
                         "mscale_all_dim": 0.707, "original_max_position_embeddings": 64, "beta_fast": 32,
                         "beta_slow": 1})
    # FP8 block-scaled weights (DeepSeek-V3's own format), with widths that leave partial
    # 128 x 128 blocks at the edges (192, 160, 144 + 16, 320).
    yield "deepseekv3fp8", "qwen2moe", DeepseekV3ForCausalLM, DeepseekV3Config(
        **{**MLA, "hidden_size": 192, "kv_lora_rank": 144, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
           "v_head_dim": 32, "moe_intermediate_size": 160, "intermediate_size": 320},
        num_hidden_layers=2, q_lora_rank=160, first_k_dense_replace=1, n_shared_experts=1, n_group=4,
        topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 64, "beta_fast": 32,
                         "beta_slow": 1})
    yield "deepseekv2group", "qwen2moe", DeepseekV2ForCausalLM, DeepseekV2Config(
        **MLA, num_hidden_layers=2, q_lora_rank=24, first_k_dense_replace=0, n_shared_experts=1,
        topk_method="group_limited_greedy", n_group=4, topk_group=2, norm_topk_prob=False,
        routed_scaling_factor=16.0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


# Qwen-MoE with dense MLP layers between the MoE layers, saved by transformers 5 (whose
# Qwen3MoeConfig writes num_local_experts): decoder_sparse_step 2 makes layers 0 and 2 dense,
# mlp_only_layers [3] layer 3; Qwen3 with mlp_only_layers [1] alone.
def dense_families():
    yield "qwen2moedense", "qwen2moe", Qwen2MoeForCausalLM, Qwen2MoeConfig(
        **{**COMMON, "num_hidden_layers": 4}, intermediate_size=80, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
        rope_theta=10000.0, rms_norm_eps=1e-6, decoder_sparse_step=2, mlp_only_layers=[3], use_sliding_window=False)
    yield "qwen3moedense", "qwen3moe", Qwen3MoeForCausalLM, Qwen3MoeConfig(
        **{**COMMON, "num_hidden_layers": 3}, head_dim=24, intermediate_size=80, moe_intermediate_size=32,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, rope_theta=1000000.0, rms_norm_eps=1e-6,
        decoder_sparse_step=1, mlp_only_layers=[1], use_sliding_window=False)


# The linear layers a DeepSeek FP8 checkpoint stores as float8_e4m3fn (not the embedding, the
# lm_head, the norms or the router).
FP8_SAVED = re.compile(r"(self_attn\.(q_a_proj|q_b_proj|q_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)"
                       r"|mlp\.(gate_proj|up_proj|down_proj)|experts\.\d+\.(gate|up|down)_proj"
                       r"|shared_experts\.(gate|up|down)_proj)\.weight$")


def fp8_blocks(w):
    """float8_e4m3fn values and their 128 x 128 block scales (the block's largest magnitude / 448)."""
    rows, cols = w.shape
    br, bc = -(-rows // 128), -(-cols // 128)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    scale = torch.ones(br, bc, dtype=torch.float32)
    for i in range(br):
        for j in range(bc):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].float()
            s = blk.abs().max() / 448.0
            s = s if s > 0 else torch.tensor(1.0)
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (blk / s).to(torch.float8_e4m3fn)
            scale[i, j] = s
    return q, scale


def fp8_dequant(q, scale):
    s = scale.repeat_interleave(128, 0)[:q.shape[0]].repeat_interleave(128, 1)[:, :q.shape[1]]
    return q.float() * s


def round_through_fp8(model, config):
    """Replaces each weight the checkpoint will store in FP8 by its FP8 value times its block
    scale, so that transformers' f32 forward computes with exactly the dequantized weights. The
    fused expert parameters of transformers 5 are quantized per saved tensor (gate, up, down)."""
    inter = config.moe_intermediate_size
    for name, p in model.named_parameters():
        if name.endswith("experts.gate_up_proj"):
            for e in range(p.shape[0]):
                for part in (slice(0, inter), slice(inter, 2 * inter)):
                    p.data[e, part] = fp8_dequant(*fp8_blocks(p.data[e, part]))
        elif name.endswith("experts.down_proj"):
            for e in range(p.shape[0]):
                p.data[e] = fp8_dequant(*fp8_blocks(p.data[e]))
        elif p.dim() == 2 and FP8_SAVED.search(name):
            p.data.copy_(fp8_dequant(*fp8_blocks(p.data)))


def write_fp8_checkpoint(d):
    """Rewrites d's f32 checkpoint with FP8 weights and weight_scale_inv, checking that each
    stored value comes back exactly, and declares it in config.json."""
    from safetensors.torch import load_file, save_file
    path = os.path.join(d, "model.safetensors")
    tensors = load_file(path)
    out = {}
    for name, t in tensors.items():
        if FP8_SAVED.search(name):
            q, scale = fp8_blocks(t)
            assert torch.equal(fp8_dequant(q, scale), t), name
            out[name] = q
            out[name + "_scale_inv"] = scale
        else:
            out[name] = t
    save_file(out, path, metadata={"format": "pt"})
    config = json.load(open(os.path.join(d, "config.json")))
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                     "activation_scheme": "dynamic"}
    json.dump(config, open(os.path.join(d, "config.json"), "w"), indent=2)


def main():
    out_root = sys.argv[1]
    only = set(sys.argv[2:])
    tok = Tokenizer.from_file(TOKENIZER)
    chosen = list(families())
    if DeepseekV3Config is not None:  # transformers 5: the same four families as it saves them, and the rest
        chosen += [(name + "5", *rest) for name, *rest in families()] + list(deepseek_families()) + list(dense_families())
    for name, template, cls, config in chosen:
        if only and name not in only:
            continue
        torch.manual_seed(1234)
        config.torch_dtype = torch.float32
        model = cls(config).eval()
        with torch.no_grad():  # weights far from the initializer's tiny values, norms not all ones
            for pname, p in model.named_parameters():
                if p.dim() == 1:
                    p.copy_(1.0 + 0.2 * torch.randn_like(p) if "norm" in pname else 0.2 * torch.randn_like(p))
                else:
                    p.copy_(torch.randn_like(p) / np.sqrt(p.shape[-1]))
            for bname, b in model.named_buffers():  # DeepSeek-V3's correction bias, zero at init
                if "e_score_correction_bias" in bname:
                    b.copy_(0.1 * torch.randn_like(b))
            if name.endswith("fp8"):
                round_through_fp8(model, config)
        d = os.path.join(out_root, name)
        shutil.rmtree(d, ignore_errors=True)
        model.save_pretrained(d, safe_serialization=True)
        if name.endswith("fp8"):
            write_fp8_checkpoint(d)
        shutil.copy(TOKENIZER, os.path.join(d, "tokenizer.json"))
        chat = open(os.path.join(TEMPLATES, template + ".jinja"), encoding="utf-8").read()
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "bos_token": None,
                   "chat_template": chat}, open(os.path.join(d, "tokenizer_config.json"), "w"), indent=2)
        # The chat prompt as transformers renders it (the tokenizer's special tokens passed as
        # apply_chat_template passes them: eos_token only, bos_token is unset) and its ids.
        chat_messages = [{"role": "user", "content": "Hello!"}]
        rendered = _compile_jinja_template(chat).render(messages=chat_messages, add_generation_prompt=True,
                                                        eos_token="<|im_end|>")
        chat_case = {"messages": chat_messages, "rendered": rendered,
                     "ids": tok.encode(rendered, add_special_tokens=False).ids}
        cases = []
        for i, prompt in enumerate(PROMPTS):
            ids = tok.encode(prompt).ids
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0].float().numpy()
                gen = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
            fname = f"logits{i}.f32"
            logits.astype("<f4").tofile(os.path.join(d, fname))
            cases.append({"prompt": prompt, "ids": ids, "greedy": gen, "logits": fname,
                          "shape": list(logits.shape)})
        json.dump({"family": name, "transformers": __import__("transformers").__version__,
                   "torch": torch.__version__, "cases": cases, "chat": chat_case}, open(os.path.join(d, "expected.json"), "w"),
                  indent=1)
        print(name, sum(p.numel() for p in model.parameters()), "parameters")


if __name__ == "__main__":
    main()
