#!/usr/bin/env python3
"""What publishing KV events costs: keepwarm with and without --kv-events, side by side in one run.

For each repetition, a fresh server without events and one with them (a subscriber attached, draining every
message, so the events are built, queued, encoded and sent), alone on the machine in turn: one cold prompt of
--words words, then --turns turns that each add the answer and --add-words more words, through POST /v1/completions
(temperature 0, --max-tokens tokens). Per warm turn it records the server's timings.setup_ms (request received to
the first model call: parse, render, tokenize, the cache's restore, where the block report is made) and
timings.predicted_per_second (decode speed). Prints the median of each per mode, and on/off ratios.

  bench/kv-events-overhead.py --model build/test-models/tiny.gguf --reps 3

Needs python3-zmq (the subscriber). keepwarm from build/keepwarm.
"""

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ["cache", "prefix", "token", "agent", "model", "tool", "request", "system", "slot", "turn", "reuse", "block",
         "disk", "state", "answer", "context", "the", "of", "and", "to", "in", "with", "for", "a", "kernel", "thread"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=1800) as response:
        return json.load(response)


def wait_ready(port, process):
    for _ in range(1200):
        if process.poll() is not None:
            sys.exit(f"the server exited with {process.returncode} before it was ready")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return
        except Exception:
            time.sleep(0.25)
    sys.exit("the server was not ready within 5 minutes")


def drain(endpoint, stop, counts):
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.connect(endpoint)
    while not stop.is_set():
        if sub.poll(100):
            sub.recv_multipart()
            counts["messages"] += 1
    sub.close()


def run(events, args):
    port = free_port()
    cmd = [os.path.join(ROOT, "build", "keepwarm"), "serve", "-m", args.model, "-c", str(args.ctx), "-t",
           str(args.threads), "--port", str(port), "--parallel", "1", "--cache-disk", "0", "--cache-block",
           str(args.block)]
    stop, counts, drainer = threading.Event(), {"messages": 0}, None
    if events:
        zmq_port = free_port()
        cmd += ["--kv-events", f"tcp://*:{zmq_port}"]
        drainer = threading.Thread(target=drain, args=(f"tcp://127.0.0.1:{zmq_port}", stop, counts))
        drainer.start()
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, process)
        rng = random.Random(args.seed)
        text = " ".join(rng.choice(WORDS) for _ in range(args.words))
        setup, decode = [], []
        for turn in range(args.turns + 1):
            reply = post(port, {"model": "m", "prompt": text, "max_tokens": args.max_tokens, "temperature": 0,
                                "ignore_eos": True})
            t = reply.get("timings", {})
            if turn > 0:
                setup.append(t["setup_ms"])
                decode.append(t["predicted_per_second"])
            text += reply["choices"][0]["text"] + " " + " ".join(rng.choice(WORDS) for _ in range(args.add_words))
        return setup, decode, counts["messages"]
    finally:
        process.terminate()
        process.wait()
        stop.set()
        if drainer:
            drainer.join()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--words", type=int, default=8000, help="the cold prompt (~1 token a word)")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--add-words", type=int, default=25)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--block", type=int, default=64, help="--cache-block: more blocks, more to report")
    parser.add_argument("--ctx", type=int, default=16384)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    results = {False: ([], []), True: ([], [])}
    for rep in range(args.reps):
        for events in (False, True) if rep % 2 == 0 else (True, False):
            setup, decode, messages = run(events, args)
            results[events][0].extend(setup)
            results[events][1].extend(decode)
            print(f"rep {rep} events {'on ' if events else 'off'}: setup median {statistics.median(setup):.1f} ms, "
                  f"decode median {statistics.median(decode):.1f} t/s" +
                  (f", {messages} messages received" if events else ""), flush=True)
    off_setup, off_decode = (statistics.median(v) for v in results[False])
    on_setup, on_decode = (statistics.median(v) for v in results[True])
    print(f"warm-turn setup: off {off_setup:.1f} ms, on {on_setup:.1f} ms (on/off {on_setup / off_setup:.3f})")
    print(f"decode: off {off_decode:.1f} t/s, on {on_decode:.1f} t/s (on/off {on_decode / off_decode:.3f})")


if __name__ == "__main__":
    main()
