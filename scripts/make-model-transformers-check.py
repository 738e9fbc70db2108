#!/usr/bin/env python3
"""Loads directories written by `moeserve make-model --family F` in Hugging Face transformers
and prints its greedy continuation of a fixed prompt, the expected values of
E2eToolsTest.MakeModelWritesEveryFamilyAsTransformersReadsIt. Not part of CI (needs torch):

    for f in mixtral qwen2_moe qwen3_moe olmoe deepseek_v3 deepseek_v2 glm4_moe; do
      build/tools/moeserve make-model --preset tiny --family $f --dtype f32 --seed 3 --out /tmp/mf_$f
    done
    for f in deepseek_v3 qwen3_moe; do
      build/tools/moeserve make-model --preset tiny --family $f --dtype f32 --seed 3 \
          --quantization fp8 --out /tmp/mf_${f}_fp8
    done
    /tmp/hfvenv/bin/python scripts/make-model-transformers-check.py /tmp/mf_*

The DeepSeek and GLM directories need transformers 5 (5.19 was used) and, for FP8, accelerate.
"""
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

for path in sys.argv[1:]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([[256, 72, 101, 108, 108, 111, 32, 119]])
    out = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)[0, 8:].tolist()
    tok = AutoTokenizer.from_pretrained(path)
    print(path, type(model).__name__, ",".join(map(str, out)), tok("Hello")["input_ids"])
