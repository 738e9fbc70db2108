#!/usr/bin/python3
"""Streams one generation from a running `moeserve serve` and prints usage and timing.

    clients/python/example_stream.py --target 127.0.0.1:50051 --prompt "The future of inference is"
"""

import argparse
import sys

import grpc

from moeserve_client import Client


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="127.0.0.1:50051", help="server address HOST:PORT")
    p.add_argument("--prompt", default="The future of inference is", help="prompt text")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens to generate at most")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--seed", type=int, default=None, help="sampling seed")
    p.add_argument("--priority", default="normal", choices=["normal", "fast", "high", "low"])
    p.add_argument("--api-key", default=None, help="sent as 'authorization: Bearer KEY'")
    p.add_argument("--timeout", type=float, default=60, help="deadline in seconds")
    args = p.parse_args()

    with Client(args.target, api_key=args.api_key) as c:
        info = c.model_info()
        print(f"# {info.model}: {info.total_params / 1e6:.1f}M params, {info.active_params / 1e6:.1f}M active, "
              f"{info.backend}", file=sys.stderr)
        try:
            last = None
            for r in c.generate_stream(text=args.prompt, max_tokens=args.max_tokens, temperature=args.temperature,
                                       seed=args.seed, priority=args.priority, timeout=args.timeout):
                sys.stdout.write(r.text)
                sys.stdout.flush()
                last = r
        except grpc.RpcError as e:
            print(f"\nerror: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
        print()
        u, t = last.usage, last.timing
        print(f"# finish={last.finish_reason} prompt={u.prompt_tokens} cached={u.cached_prompt_tokens} "
              f"completion={u.completion_tokens} queue={t.queue_seconds * 1e3:.1f}ms "
              f"ttft={t.time_to_first_token_seconds * 1e3:.1f}ms tpot={t.time_per_output_token_seconds * 1e3:.2f}ms",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
