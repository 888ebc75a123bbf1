#!/usr/bin/env python3
"""Warm turns deep in a conversation, keepwarm and the pinned llama-server side by side.

An agent's turn adds a few dozen tokens (a tool result, a user message) to a prompt tens of thousands of tokens
long. Both servers reuse the cached prefix; what is left is the time of those few new tokens, attending over the
whole prefix. For each server in turn (a fresh process each, alone on the machine): one cold prompt of --words
words, then --turns turns that each add the answer and --add-words more words, through POST /v1/completions
(max_tokens 4, temperature 0). Prints the server-reported prompt tokens computed (timings.prompt_n) and prompt time
(timings.prompt_ms) of every turn, and the median of the warm turns per server.

  bench/warm-turns.py --model tiny-64k.gguf --servers keepwarm,keepwarm-pad-off,llama-server

keepwarm-pad-off is keepwarm with --pad-to-tile off; llama-server-swa-full is llama-server with --swa-full (for
sliding-window models). The llama-server binary comes from bench/build-llama-server.sh
(its path printed on stdout); keepwarm from build/keepwarm. Python standard library only.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ["cache", "prefix", "token", "agent", "model", "tool", "request", "system", "slot", "turn", "reuse", "block",
         "disk", "state", "answer", "context", "the", "of", "and", "to", "in", "with", "for", "a", "kernel", "thread"]


def post(port, body, timeout=1800):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def wait_ready(port, process, what="the server"):
    for _ in range(1200):
        if process.poll() is not None:
            sys.exit(f"{what} exited with {process.returncode} before it was ready")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return
        except Exception:
            time.sleep(0.25)
    sys.exit(f"{what} was not ready within 5 minutes")


def command(server, args, llama_server):
    common = ["-m", args.model, "-c", str(args.ctx), "-t", str(args.threads), "--port", str(args.port)]
    if server == "llama-server":
        return [llama_server, *common, "-np", str(args.parallel)]
    if server == "llama-server-swa-full":  # sliding-window models: keep every position's KV, as keepwarm does
        return [llama_server, *common, "-np", str(args.parallel), "--swa-full"]
    keepwarm = [os.path.join(ROOT, "build", "keepwarm"), "serve", *common, "--parallel", str(args.parallel),
                "--cache-disk", "0"]
    if server == "keepwarm-pad-off":
        return [*keepwarm, "--pad-to-tile", "off"]
    if server == "keepwarm":
        return keepwarm
    sys.exit(f"unknown server {server} (keepwarm, keepwarm-pad-off, llama-server, llama-server-swa-full)")


def run(server, args, llama_server):
    log = open(os.path.join(args.work_dir, f"warm-turns-{server}.log"), "w")
    process = subprocess.Popen(command(server, args, llama_server), stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_ready(args.port, process)
        rng = random.Random(args.seed)
        first = [rng.choice(WORDS) for _ in range(args.words)]
        text = " ".join(first)
        warm = []
        for turn in range(args.turns + 1):
            reply = post(args.port, {"model": "m", "prompt": text, "max_tokens": 4, "temperature": 0})
            timings = reply.get("timings", {})
            computed, ms = timings.get("prompt_n"), timings.get("prompt_ms")
            print(f"{server} turn {turn}: computed {computed} prompt tokens in {ms:.0f} ms", flush=True)
            if turn > 0:
                warm.append(ms)
            text += reply["choices"][0]["text"] + " " + " ".join(rng.choice(WORDS) for _ in range(args.add_words))
        if args.branch_words > 0:
            # An edit inside the conversation: its first branch_words words, then other text. A server that kept only
            # the last window of a sliding-window model's KV recomputes it all.
            branch = " ".join(first[:args.branch_words]) + " zebra " + " ".join(
                rng.choice(WORDS) for _ in range(args.add_words))
            reply = post(args.port, {"model": "m", "prompt": branch, "max_tokens": 4, "temperature": 0})
            timings = reply.get("timings", {})
            print(f"{server} branch after {args.branch_words} words: computed {timings.get('prompt_n')} prompt "
                  f"tokens in {timings.get('prompt_ms'):.0f} ms", flush=True)
        return warm
    finally:
        process.terminate()
        process.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--servers", default="keepwarm,keepwarm-pad-off,llama-server")
    parser.add_argument("--words", type=int, default=16000, help="the cold prompt (~1 token a word)")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--add-words", type=int, default=25, help="words each warm turn adds")
    parser.add_argument("--branch-words", type=int, default=0,
                        help="then a prompt of the cold prompt's first N words and new text (0: none)")
    parser.add_argument("--ctx", type=int, default=65536)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--port", type=int, default=18091)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--work-dir", default="/tmp", help="where the servers' logs go")
    args = parser.parse_args()
    servers = args.servers.split(",")
    llama_server = None
    if "llama-server" in servers:
        llama_server = subprocess.run([os.path.join(ROOT, "bench", "build-llama-server.sh")], check=True,
                                      stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]
    results = {server: run(server, args, llama_server) for server in servers}
    for server, warm in results.items():
        print(f"{server}: warm turns' prompt time median {statistics.median(warm):.0f} ms "
              f"(range {min(warm):.0f}-{max(warm):.0f})")


if __name__ == "__main__":
    main()
