#!/usr/bin/env python3
"""Makes the sentencepiece fixture of tests/models/fixtures/tokenizers/sentencepiece: a small
tokenizer.model trained with the `sentencepiece` package in Llama-2's settings (BPE, byte
fallback, dummy prefix, no normalization), and the ids and texts that package produces for the
strings of the llama fixture, which text/sp_tokenizer.cc (on Debian's libsentencepiece) must
reproduce. Not part of CI:

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install sentencepiece==0.2.1
    /tmp/tokvenv/bin/python scripts/make-sp-fixture.py tests/models/fixtures/tokenizers

Control pieces written in a text ("<s>", "</s>") and "<unk>" become their ids, as Hugging Face's
slow LlamaTokenizer splits them out before calling sentencepiece; the rest is sentencepiece's.
"""
import io
import json
import os
import sys

import sentencepiece as spm


def main():
    root = sys.argv[1]
    texts = [json.loads(line)["text"] for line in open(os.path.join(root, "llama", "expected.jsonl"),
                                                        encoding="utf-8")]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([t for t in texts if t.strip()] * 3), model_writer=model,
        model_type="bpe", vocab_size=600, byte_fallback=True, character_coverage=0.9995,
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=True,
        split_digits=True, allow_whitespace_only_pieces=True, unk_id=0, bos_id=1, eos_id=2,
        pad_id=-1, hard_vocab_limit=False, num_threads=1, seed_sentencepiece_size=100000)
    out_dir = os.path.join(root, "sentencepiece")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.model"), "wb") as f:
        f.write(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    specials = sorted({sp.id_to_piece(i) for i in range(sp.get_piece_size())
                       if sp.is_control(i) or sp.is_unknown(i)}, key=len, reverse=True)

    def encode(text):
        ids, start, pos = [], 0, 0
        while pos < len(text):
            hit = next((s for s in specials if text.startswith(s, pos)), None)
            if hit is None:
                pos += 1
                continue
            if pos > start:
                ids += sp.encode(text[start:pos])
            ids.append(sp.piece_to_id(hit))
            pos += len(hit)
            start = pos
        if start < len(text):
            ids += sp.encode(text[start:])
        return ids

    with open(os.path.join(out_dir, "expected.jsonl"), "w", encoding="utf-8") as f:
        for text in texts:
            ids = encode(text)
            plain = [i for i in ids if not (sp.is_control(i) or sp.is_unknown(i))]
            f.write(json.dumps({"text": text, "ids": ids, "ids_with_special": [sp.bos_id()] + ids,
                                "decoded_plain": sp.decode(plain)}, ensure_ascii=False) + "\n")
    print(len(texts), "strings,", sp.get_piece_size(), "pieces")


if __name__ == "__main__":
    main()
