#!/usr/bin/env python3
"""What rebuilding speculative decoding's history from the disk tier costs a restart (docs/speculative.md, "History").

Fills a fresh --cache-dir with CONVERSATIONS conversations of about TOKENS prompt tokens each (random words, so that
no two share more than the template's start; a short answer each), stops the server (which writes what the device
holds to disk), then starts it again on that folder, with drafting (--spec-type suffix, the default) and without
(--spec-type none), ROUNDS times each (alternating which starts first), and reports for each start the time until /health answers 200 and the
server's own lines: the disk tier it indexed and the history it rebuilt (tokens, conversations, milliseconds).

  bench/spec-history-restart.py --keepwarm build/keepwarm --model build/test-models/tiny.gguf \\
      --conversations 24 --tokens 3800 [--cache-dir DIR] [--extra-args '-ctk q4_0 -ctv q4_0']
With --cache-dir the folder is kept, and a later run (another --keepwarm, say) starts on it without refilling.
"""
import argparse
import json
import os
import random
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

WORDS = ("harbour gull rope tar bell fog water customs baker shutter fisher weather lantern anchor tide sail mast "
         "deck crate barrel net hook salt wind cloud rain storm pier quay dock cargo ship boat oar keel hull "
         "compass chart map star moon sun dawn dusk noon night coast cliff sand stone shell wave foam reef "
         "island lighthouse signal flag whistle horn engine coal steam smoke iron steel copper brass wood plank "
         "nail hammer saw chisel paint brush canvas thread needle cloth wool cotton linen silk velvet button "
         "pocket collar sleeve boot shoe hat cap scarf glove coat cloak").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, cache_dir, extra):
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="keepwarm-spec-history-", suffix=".log", delete=False)
    cmd = [args.keepwarm, "serve", "-m", args.model, "--port", str(port), "-t", str(args.threads), "-np", "1",
           "-c", str(args.tokens + 512), "--cache-dir", cache_dir, *shlex.split(args.extra_args), *extra]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    break
        except Exception:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"server exited: see {log.name}")
        time.sleep(0.01)
    return proc, url, time.monotonic() - started, log.name


def stop(proc):
    proc.terminate()
    proc.wait(timeout=120)


def complete(url, prompt, n):
    body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/completion", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keepwarm", default="build/keepwarm")
    ap.add_argument("--model", required=True)
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=3800, help="about this many prompt tokens a conversation")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-dir", help="fill this folder and keep it (one that holds entries already: not refilled)")
    ap.add_argument("--extra-args", default="", help="more serve flags for every start (e.g. cache types)")
    args = ap.parse_args()

    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="keepwarm-spec-history-")
    os.makedirs(cache_dir, exist_ok=True)
    entries = lambda: [f for f in os.listdir(cache_dir) if f.endswith(".kwkv")]
    rng = random.Random(36)
    try:
        if not entries():
            proc, url, _, _ = start(args, cache_dir, [])
            filled = time.monotonic()
            prompt_tokens = 0
            for _ in range(args.conversations):
                words = " ".join(rng.choice(WORDS) for _ in range(args.tokens))  # ~1 token a word, cut below
                r = complete(url, words[: args.tokens * 6], 32)
                prompt_tokens += r.get("tokens_evaluated", 0)
            stop(proc)
            print(f"filled in {time.monotonic() - filled:.1f} s: {prompt_tokens} prompt tokens")
        size = sum(os.path.getsize(os.path.join(cache_dir, f)) for f in entries())
        print(f"{len(entries())} entries, {size / 2**20:.1f} MiB in {cache_dir}")
        for rnd in range(args.rounds):
            starts = [("suffix", []), ("none", ["--spec-type", "none"])]
            for label, extra in starts if rnd % 2 == 0 else starts[::-1]:  # neither always reads the folder first
                proc, url, ready_s, log = start(args, cache_dir, extra)
                stop(proc)
                text = open(log).read()
                lines = [l.split("  ", 1)[-1] for l in text.splitlines()
                         if re.search(r"disk cache: \d+ blocks|speculative: history", l)]
                print(f"round {rnd + 1} --spec-type {label}: ready in {ready_s * 1000:.0f} ms; " + " | ".join(lines))
                os.unlink(log)
    finally:
        if not args.cache_dir:
            shutil.rmtree(cache_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
