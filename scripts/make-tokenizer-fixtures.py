#!/usr/bin/env python3
"""Makes the tokenizer.json fixtures of tests/models/fixtures/tokenizers with the Hugging Face
`tokenizers` package (the reference implementation), and the ids and texts it produces for
thousands of strings, which text/hf_tokenizer.cc must reproduce exactly. Not part of CI:

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers==0.22.1
    /tmp/tokvenv/bin/python scripts/make-tokenizer-fixtures.py tests/models/fixtures/tokenizers

Four small tokenizers, trained here on a mixed corpus, each in the form a model family ships:
  gpt2:      byte-level BPE, the GPT-2 pre-tokenizer regex (ByteLevel with use_regex)
  qwen:      byte-level BPE, Qwen2's Split regex then ByteLevel, ChatML special tokens
  llama:     Llama-2 style: normalizer Prepend("▁") + Replace(" ", "▁"), BPE with byte fallback,
             decoder Replace + ByteFallback + Fuse + Strip
  mistral:   Metaspace pre-tokenizer (prepend_scheme "first"), BPE with byte fallback
Each line of expected.jsonl: the text, its ids without and with the post-processor's special
tokens, the decoding of the former, and the decoding of the latter skipping special tokens.
"""
import json
import os
import random
import sys

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ("the of and to in is was for on that with as by at from his her it an are were which be this had not "
         "but they have one all their there been has when who will more no if out so said what up its about into "
         "than them can only other new some could time these two may then do first any my now such like our over "
         "man me even most made after also did many before must through back years where much your way well down "
         "should because each just those people how too little state good very make world still own see men work "
         "long get here between both life being under never day same another know while last might us great old "
         "year off come since against go came right used take three").split()
UNICODE = ["café", "naïve", "Ünïcödé", "日本語のテキスト", "中文字符", "한국어", "Ελληνικά", "русский текст", "עברית",
           "العربية", "हिन्दी", "ไทย", "🙂", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "∑∫√∞", "€£¥", "\u00a0", "\u200b", "ﬁ", "Å",
           "e\u0301"]
PUNCT = list(".,;:!?\"'()[]{}<>/\\|@#$%^&*-_+=~`") + ["...", "--", "'s", "'t", "'re", "'ll", "n't"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\r\n", "    ", "\t\t"]


def random_text(rng, n_tokens):
    parts = []
    for _ in range(n_tokens):
        r = rng.random()
        if r < 0.55:
            w = rng.choice(WORDS)
            parts.append(w.capitalize() if rng.random() < 0.1 else (w.upper() if rng.random() < 0.03 else w))
        elif r < 0.65:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 7))))
        elif r < 0.75:
            parts.append(rng.choice(UNICODE))
        elif r < 0.87:
            parts.append(rng.choice(PUNCT))
        else:
            parts.append(rng.choice(SPACES))
        if rng.random() < 0.7:
            parts.append(" ")
    return "".join(parts)


def corpus(rng, n):
    return [random_text(rng, rng.randint(5, 60)) for _ in range(n)]


def train_byte_level(texts, pre_tokenizer, specials, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def with_byte_fallback(tok, unk="<unk>"):
    """Adds the 256 <0xNN> tokens and turns byte fallback on (as Llama's tokenizer.json has)."""
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    for b in range(256):
        name = "<0x%02X>" % b
        if name not in vocab:
            vocab[name] = len(vocab)
    j["model"]["byte_fallback"] = True
    j["model"]["unk_token"] = unk
    j["model"]["fuse_unk"] = True
    return Tokenizer.from_str(json.dumps(j))


def train_sentencepiece_like(texts, specials, vocab_size, metaspace):
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return with_byte_fallback(tok)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/models/fixtures/tokenizers"
    rng = random.Random(2026)
    train = corpus(rng, 3000)
    gpt2 = train_byte_level(train, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                            ["<|endoftext|>"], 1200)
    qwen = train_byte_level(train, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], 1200)
    llama = train_sentencepiece_like(train, ["<unk>", "<s>", "</s>"], 1000, metaspace=False)
    mistral = train_sentencepiece_like(train, ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], 1000, metaspace=True)
    # A non-special added token too: matched in text, decoded as itself.
    qwen.add_tokens([tokenizers.AddedToken("<tool_call>", special=False)])
    # Llama-2 style BOS by the post-processor; GPT-2 and Qwen ship a ByteLevel one (offsets only).
    from tokenizers import processors
    llama.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                         special_tokens=[("<s>", 1)])
    gpt2.post_processor = processors.ByteLevel(trim_offsets=True)
    qwen.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False),
                                               processors.TemplateProcessing(single="$A", pair="$A $B",
                                                                             special_tokens=[])])

    test_rng = random.Random(7)
    tests = corpus(test_rng, 1500)
    specials = {"gpt2": ["<|endoftext|>"], "qwen": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>"],
                "llama": ["<s>", "</s>"], "mistral": ["<s>", "[INST]", "[/INST]", "</s>"]}
    edge = ["", " ", "  ", "\n", "a", " a", "  a", "a  ", "\t\tx", "🙂🙂", "x\u200by", "1234567890", "e\u0301",
            "don't", "I'LL", "a\r\nb", "    indented", "end   "]
    for name, tok in [("gpt2", gpt2), ("qwen", qwen), ("llama", llama), ("mistral", mistral)]:
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        texts = edge + tests[:]
        # Special tokens inside text, which must match whole.
        for i in range(200):
            a, b = random_text(test_rng, 5), random_text(test_rng, 5)
            texts.append(a + test_rng.choice(specials[name]) + b)
        with open(os.path.join(d, "expected.jsonl"), "w") as f:
            for t in texts:
                ids = tok.encode(t, add_special_tokens=False).ids
                with_special = tok.encode(t, add_special_tokens=True).ids
                f.write(json.dumps({"text": t, "ids": ids, "ids_with_special": with_special,
                                    "decoded": tok.decode(ids, skip_special_tokens=False),
                                    "decoded_skip_special": tok.decode(with_special, skip_special_tokens=True)},
                                   ensure_ascii=False) + "\n")
        print(name, len(texts), "strings,", tok.get_vocab_size(), "tokens")
    print("tokenizers", tokenizers.__version__)


if __name__ == "__main__":
    main()
