"""vLLM's prefill of one long prompt (benchmarks/prefill_vs_vllm.sh runs it; never in CI).
usage: python vllm_prefill.py MODEL LEN REPS ROUND
Loads the model, prefills one untimed prompt (warm-up), then REPS distinct prompts of LEN random
ids of make-model's byte vocabulary, one output token each; prints a CSV row per prompt."""
import sys
import time

import numpy as np
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt


def main():
    model, length, reps, rnd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    llm = LLM(model=model, dtype="bfloat16", skip_tokenizer_init=True, seed=0,
              max_num_batched_tokens=max(length, 2048))
    allowed = np.array([i for i in range(512) if i not in (256, 257)])  # BOS and EOS never in prompts
    rng = np.random.default_rng(7000 + rnd)
    sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)

    def prompt():
        return [TokensPrompt(prompt_token_ids=allowed[rng.integers(0, len(allowed), length)].tolist())]

    llm.generate(prompt(), sp, use_tqdm=False)  # warm-up
    for _ in range(reps):
        t0 = time.perf_counter()
        llm.generate(prompt(), sp, use_tqdm=False)
        dt = time.perf_counter() - t0
        print(f"vllm,default,{rnd},{dt:.4f},{length / dt:.1f}", flush=True)


if __name__ == "__main__":  # vLLM spawns processes that import this file
    main()
