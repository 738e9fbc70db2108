#!/usr/bin/env python3
"""Renders the chat templates of tests/models/fixtures/chat_templates with transformers' own
Jinja environment (jinja2 with trim_blocks, lstrip_blocks, loop controls, raise_exception,
tojson) on a set of conversations, and writes what it produced (or the error it raised) to
expected.jsonl, which text/jinja_template.cc must reproduce. Not part of CI:

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install transformers==4.57.1 jinja2==3.1.6
    /tmp/tokvenv/bin/python scripts/make-chat-template-fixtures.py tests/models/fixtures/chat_templates
"""
import json
import os
import sys

from transformers.utils.chat_template_utils import _compile_jinja_template

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there, how are you?"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "  And 3+3?  "}],
    [{"role": "system", "content": "Sys"}, {"role": "user", "content": "u1"},
     {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"},
     {"role": "assistant", "content": "a2"}, {"role": "user", "content": "u3"}],
    [{"role": "user", "content": "Ünïcödé 🙂 日本語\nwith\ttabs and \"quotes\" and 'apostrophes'"}],
    [{"role": "user", "content": "think first"},
     {"role": "assistant", "content": "<think>\nreasoning here\n</think>\n\nThe answer."},
     {"role": "user", "content": "again"}],
    [{"role": "user", "content": "one"}, {"role": "user", "content": "two in a row"}],
    [{"role": "assistant", "content": "I start"}, {"role": "user", "content": "then me"}],
    [{"role": "user", "content": ""}],
]
TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}


def main():
    root = sys.argv[1]
    names = sorted(f[:-len(".jinja")] for f in os.listdir(root) if f.endswith(".jinja"))
    for name in names:
        source = open(os.path.join(root, name + ".jinja"), encoding="utf-8").read()
        template = _compile_jinja_template(source)
        cases = []
        for messages in CONVERSATIONS:
            for add in (False, True):
                extra = [{}]
                if name.startswith("qwen3"):
                    extra = [{}, {"enable_thinking": False}]
                for kwargs in extra:
                    context = {"messages": messages, "add_generation_prompt": add, **TOKENS, **kwargs}
                    try:
                        case = {"context": context, "rendered": template.render(**context)}
                    except Exception as e:  # raise_exception and friends
                        case = {"context": context, "error": str(e)}
                    cases.append(case)
        with open(os.path.join(root, name + ".expected.jsonl"), "w", encoding="utf-8") as f:
            for case in cases:
                f.write(json.dumps(case, ensure_ascii=False) + "\n")
        print(name, len(cases), "renderings,", sum("error" in c for c in cases), "errors")


if __name__ == "__main__":
    main()
