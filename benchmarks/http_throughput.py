#!/usr/bin/env python3
"""Serve throughput over the OpenAI HTTP API: N streaming completions at concurrency C against
a running `moeserve serve --http-listen`, each of P prompt bytes and O output tokens (EOS
ignored). Prints one JSON line: output tokens/s, requests/s, median and p90 time to first token.
Standard library only.

  benchmarks/http_throughput.py --url http://127.0.0.1:8000 [--concurrency 8] [--requests 64]
      [--prompt 128] [--output 64] [--model NAME]
"""
import argparse, http.client, json, statistics, threading, time, urllib.parse


def one(url, model, prompt, output):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": output, "ignore_eos": True,
                       "stream": True, "temperature": 0})
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]!r}")
    first, chunks = None, 0
    for line in r:
        if not line.startswith(b"data: "):
            continue
        if line.strip() == b"data: [DONE]":
            break
        if first is None:
            first = time.perf_counter() - start
        chunks += 1
    conn.close()
    return first or 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--model", default="")
    a = ap.parse_args()
    prompt = ("abcdefghij" * (a.prompt // 10 + 1))[: a.prompt - 1]  # + BOS: P tokens, byte tokenizer
    left = list(range(a.requests))
    lock = threading.Lock()
    ttfts, errors = [], []

    def worker():
        while True:
            with lock:
                if not left:
                    return
                left.pop()
            try:
                t = one(a.url, a.model, prompt, a.output)
                with lock:
                    ttfts.append(t)
            except Exception as e:  # noqa: BLE001 - reported, not raised
                with lock:
                    errors.append(str(e))

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    ttfts.sort()
    print(json.dumps({"concurrency": a.concurrency, "requests": a.requests, "errors": len(errors),
                      "seconds": elapsed, "output_tok_s": len(ttfts) * a.output / elapsed,
                      "requests_s": len(ttfts) / elapsed,
                      "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
                      "ttft_p90_s": ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else None}))


if __name__ == "__main__":
    main()
