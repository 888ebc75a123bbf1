#!/usr/bin/env python3
"""What publishing KV events costs: keepwarm with and without --kv-events, side by side in one run.

For each repetition, two fresh servers at once, one without events and one with them (a subscriber attached,
draining every message, so the events are built, queued, encoded and sent): one cold prompt of --words words, then
--turns turns that each add the answer and --add-words more words, through POST /v1/completions (temperature 0,
--max-tokens tokens), each turn sent to one server and then the other (the order alternating), so that other work on
the machine falls on both alike. Per warm turn it records the server's timings.setup_ms (request received to
the first model call: parse, render, tokenize, the cache's restore, where the block report is made) and
timings.predicted_per_second (decode speed), and from /metrics the engine thread's CPU time the cache spent on its block
reports (keepwarm_kv_events_report_seconds_total) per request. Prints the median of each per mode, and the median of the per-turn
on/off ratios.

  bench/kv-events-overhead.py --model build/test-models/tiny.gguf

Needs python3-zmq (the subscriber). keepwarm from build/keepwarm.
"""

import argparse
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from importlib import import_module  # noqa: E402

warm_turns = import_module("warm-turns")  # its word list, request and readiness helpers
WORDS, post, wait_ready = warm_turns.WORDS, warm_turns.post, warm_turns.wait_ready


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drain(endpoint, stop, counts):
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.connect(endpoint)
    while not stop.is_set():
        if sub.poll(100):
            sub.recv_multipart()
            counts["messages"] += 1
    sub.close()


def start(events, args):
    port = free_port()
    cmd = [os.path.join(ROOT, "build", "keepwarm"), "serve", "-m", args.model, "-c", str(args.ctx), "-t",
           str(args.threads), "--port", str(port), "--parallel", "1", "--cache-disk", "0", "--cache-block",
           str(args.block)]
    server = {"port": port, "stop": threading.Event(), "counts": {"messages": 0}, "drainer": None}
    if events:
        zmq_port = free_port()
        cmd += ["--kv-events", f"tcp://*:{zmq_port}"]
        server["drainer"] = threading.Thread(target=drain, args=(f"tcp://127.0.0.1:{zmq_port}", server["stop"],
                                                                 server["counts"]))
        server["drainer"].start()
    server["process"] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(port, server["process"])
    return server


def stop(server):
    server["process"].terminate()
    server["process"].wait()
    server["stop"].set()
    if server["drainer"]:
        server["drainer"].join()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--reps", type=int, default=2, help="conversations (a fresh pair of servers each)")
    parser.add_argument("--words", type=int, default=4000, help="the cold prompt (~1 token a word)")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--add-words", type=int, default=25)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--block", type=int, default=64, help="--cache-block: more blocks, more to report")
    parser.add_argument("--ctx", type=int, default=16384)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--pause-ms", type=float, default=0,
                        help="before each request, as an agent's tool runs between turns: the previous answer's "
                             "events are sent and received by then")
    args = parser.parse_args()
    setup = {False: [], True: []}
    decode = {False: [], True: []}
    setup_ratio, decode_ratio, report_per_request = [], [], []
    for rep in range(args.reps):
        servers = {False: start(False, args), True: start(True, args)}
        try:
            rng = random.Random(args.seed + rep)
            text = " ".join(rng.choice(WORDS) for _ in range(args.words))
            for turn in range(args.turns + 1):
                timings, replies = {}, {}
                # Both servers are up; each turn goes to one, then the other, in alternating order, so the machine's
                # drift (other work on it) falls on both alike.
                for events in (False, True) if turn % 2 == 0 else (True, False):
                    time.sleep(args.pause_ms / 1000)
                    reply = post(servers[events]["port"], {"model": "m", "prompt": text, "max_tokens": args.max_tokens,
                                                           "temperature": 0, "ignore_eos": True})
                    timings[events], replies[events] = reply.get("timings", {}), reply
                if replies[False]["choices"][0]["text"] != replies[True]["choices"][0]["text"]:
                    print(f"rep {rep} turn {turn}: the answers differ (each server goes on with the off one's)")
                if turn > 0:
                    for events in (False, True):
                        setup[events].append(timings[events]["setup_ms"])
                        decode[events].append(timings[events]["predicted_per_second"])
                    setup_ratio.append(timings[True]["setup_ms"] / timings[False]["setup_ms"])
                    decode_ratio.append(timings[True]["predicted_per_second"] /
                                        timings[False]["predicted_per_second"])
                text += replies[False]["choices"][0]["text"] + " " + " ".join(
                    rng.choice(WORDS) for _ in range(args.add_words))
            with urllib.request.urlopen(f"http://127.0.0.1:{servers[True]['port']}/metrics", timeout=60) as r:
                metrics = r.read().decode()
            value = lambda name: float(re.search(rf"^{name} (\S+)$", metrics, re.M).group(1))
            requests = value("keepwarm_requests_total")
            report_ms = 1000 * value("keepwarm_kv_events_report_seconds_total") / requests
            report_per_request.append(report_ms)
            print(f"rep {rep}: {servers[True]['counts']['messages']} event messages received; the cache's block "
                  f"reports took {report_ms:.3f} ms of engine CPU time per request ({requests:.0f} requests)", flush=True)
        finally:
            for server in servers.values():
                stop(server)
    med = statistics.median
    print(f"warm-turn setup: off {med(setup[False]):.2f} ms, on {med(setup[True]):.2f} ms; "
          f"on/off per turn: median {med(setup_ratio):.3f} (n={len(setup_ratio)})")
    print(f"block reports (events on): {med(report_per_request):.3f} ms of engine CPU time per request")
    print(f"decode: off {med(decode[False]):.1f} t/s, on {med(decode[True]):.1f} t/s; "
          f"on/off per turn: median {med(decode_ratio):.3f} (n={len(decode_ratio)})")


if __name__ == "__main__":
    main()
