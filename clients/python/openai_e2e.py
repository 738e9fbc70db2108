#!/usr/bin/env python3
"""The official `openai` Python SDK, unchanged, against moeserve's OpenAI-compatible HTTP API:
a streamed chat completion, a completion with usage, and a bad request that comes back as the
SDK's BadRequestError naming the parameter. Prints one "... ok" line per check; exits non-zero
on the first failure.

    .venv/bin/python clients/python/openai_e2e.py --base-url http://127.0.0.1:8000/v1 --model moeserve-small
"""
import argparse
import sys

import openai


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default="none")
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key)

    stream = client.chat.completions.create(
        model=args.model, messages=[{"role": "user", "content": "Hello"}], max_tokens=12, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert finish == "length", finish
    assert usage is not None and usage.completion_tokens == 12, usage
    whole = client.chat.completions.create(
        model=args.model, messages=[{"role": "user", "content": "Hello"}], max_tokens=12, temperature=0,
        extra_body={"ignore_eos": True})
    assert whole.choices[0].message.content == text, (whole.choices[0].message.content, text)
    print("chat stream ok:", repr(text))

    completion = client.completions.create(model=args.model, prompt="Once upon a time", max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert completion.usage.completion_tokens == 8, completion.usage
    assert completion.usage.prompt_tokens == 17, completion.usage  # BOS + 16 bytes
    assert completion.choices[0].finish_reason == "length"
    print("completion ok:", repr(completion.choices[0].text))

    try:
        client.completions.create(model=args.model, prompt="x", max_tokens=2, temperature=-1)
    except openai.BadRequestError as e:
        assert "temperature" in str(e), e
        print("bad request ok:", e.status_code)
    else:
        sys.exit("a negative temperature was accepted")


if __name__ == "__main__":
    main()
