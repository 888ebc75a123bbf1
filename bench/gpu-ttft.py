#!/usr/bin/env python3
"""Cold and warm time to first token, keepwarm and llama-server side by side on one model (bench/gpu-check.sh).

For each size S (prompt tokens), on each server in turn (one at a time, same model, context, one slot, all layers
on the GPU): a conversation whose first request holds S tokens (cold: nothing of it is cached), then --warm-turns
further turns, each adding the answer and a short user message (warm: S tokens cached). Each size's conversation
starts with its own words, so nothing of one size is reused by the next.

TTFT is the client's wall time of a non-streamed request with max_tokens 1: sending, prefill, the first sampled
token and the response. prompt_n / cache_n / prompt_ms come from the servers' own `timings` (same field names on
both). Prompts are sized with each server's /tokenize. Python standard library only.
"""

import argparse
import json
import os
import random
import shlex
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

WORDS = """time person year way day thing man world life hand part child eye woman place work week case point
government company number group problem fact cache block prefix token model server request client agent tool
function file line value result system context memory layer batch slot queue answer question review update""".split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url, body=None, timeout=600):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


class Server:
    def __init__(self, name, argv, log_path):
        self.name, self.argv, self.log_path = name, argv, log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv + ["--port", str(self.port)], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start-up, see {self.log_path}")
            try:
                if call(self.url + "/health", timeout=2).get("status") == "ok":
                    return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready in 300 s, see {self.log_path}")

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()

    def count(self, text):
        return len(call(self.url + "/tokenize", {"content": text})["tokens"])

    def turn(self, messages):
        body = {"model": "m", "messages": messages, "max_tokens": 1, "temperature": 0}
        start = time.perf_counter()
        r = call(self.url + "/v1/chat/completions", body)
        wall = (time.perf_counter() - start) * 1000
        t = r.get("timings", {})
        return {"ttft_ms": round(wall, 2), "prompt_n": t.get("prompt_n"), "cache_n": t.get("cache_n"),
                "prompt_ms": t.get("prompt_ms"), "answer": r["choices"][0]["message"].get("content") or ""}


def text_of(server, size, seed):
    """Words whose tokens come to about `size`, measured with the server's own tokenizer."""
    rng = random.Random(seed)
    words = [f"Conversation {seed}:"] + [rng.choice(WORDS) for _ in range(size)]  # a word is at least a token
    n = server.count(" ".join(words))
    return " ".join(words[: max(2, len(words) * size // n)])


def run_server(server, sizes, warm_turns):
    # Warm-up: a conversation of its own, long enough to allocate the prefill's buffers (and load the GPU's kernels).
    server.turn([{"role": "user", "content": text_of(server, min(sizes[0], 2048), seed=1)}])
    rows = []
    for i, size in enumerate(sizes):
        system = text_of(server, size - 40, seed=1000 + i)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "Question 1: what next?"}]
        cold = server.turn(messages)
        warm = []
        for k in range(warm_turns):
            messages += [{"role": "assistant", "content": (cold if not warm else warm[-1])["answer"] or "ok"},
                         {"role": "user", "content": f"Question {k + 2}: and after that?"}]
            warm.append(server.turn(messages))
        rows.append({"size": size, "cold": cold, "warm": warm,
                     "warm_ttft_ms": statistics.median(w["ttft_ms"] for w in warm) if warm else None})
        print(f"  {server.name:12} {size:>6} tokens: cold {cold['ttft_ms']:9.1f} ms (prompt_n {cold['prompt_n']}),"
              f" warm {rows[-1]['warm_ttft_ms']:7.1f} ms (prompt_n {warm[-1]['prompt_n'] if warm else '-'},"
              f" cache_n {warm[-1]['cache_n'] if warm else '-'})", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--keepwarm", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--sizes", default="8192,16384,32768,45056")
    ap.add_argument("--warm-turns", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=0, help="context size (default: the largest size + 2048)")
    ap.add_argument("--gpu-layers", default="999")
    ap.add_argument("--work-dir", default=".")
    ap.add_argument("--keepwarm-args", default="", help="more arguments of keepwarm serve (e.g. --cache-block 4096)")
    ap.add_argument("--both-args", default="",
                    help="more arguments of both servers (e.g. --chat-template-file FILE, the same template for both)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    ctx = args.ctx or max(sizes) + 2048
    name = os.path.splitext(os.path.basename(args.model))[0]
    common = ["-m", args.model, "-c", str(ctx), "--parallel", "1", "--n-gpu-layers", args.gpu_layers,
              *shlex.split(args.both_args)]
    servers = {
        "keepwarm": [args.keepwarm, "serve", *common, "--cache-disk", "0", *shlex.split(args.keepwarm_args)],
        "llama-server": [args.llama_server, *common, "--host", "127.0.0.1"],
    }
    results = {"model": name, "ctx": ctx, "sizes": sizes, "keepwarm_args": args.keepwarm_args,
               "both_args": args.both_args, "servers": {}}
    print(f"{name}: context {ctx}, sizes {sizes}", flush=True)
    for label, argv in servers.items():
        log = os.path.join(args.work_dir, f"{name}-{label}.log")
        with Server(label, argv, log) as server:
            results["servers"][label] = run_server(server, sizes, args.warm_turns)
        # What each says it computed on: keepwarm's start-up line, llama.cpp's count of offloaded layers.
        with open(log, errors="replace") as f:
            said = [line.strip() for line in f if "compute:" in line or "offloaded" in line]
        results.setdefault("compute", {})[label] = said
        print(f"  {label}: {' | '.join(said) or 'no compute line in its log'}", flush=True)
    kw, ls = results["servers"]["keepwarm"], results["servers"]["llama-server"]
    results["ratios"] = [{"size": a["size"], "cold": round(b["cold"]["ttft_ms"] / a["cold"]["ttft_ms"], 3),
                          "warm": round(b["warm_ttft_ms"] / a["warm_ttft_ms"], 3) if a["warm"] else None}
                         for a, b in zip(kw, ls)]
    for r in results["ratios"]:
        print(f"  llama-server / keepwarm at {r['size']:>6}: cold {r['cold']:.2f}x, warm {r['warm']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
