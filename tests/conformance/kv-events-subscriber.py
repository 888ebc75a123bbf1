#!/usr/bin/env python3
"""Conformance test of `keepwarm serve --kv-events`: a subscriber written from the wire format that vLLM publishes
and llm-d's endpoint picker decodes (vLLM's vllm/distributed/kv_events.py msgspec structs, llm-d-kv-cache-manager's
pkg/kvcache/kvevents decoder), not from keepwarm's code. Three frames per message (topic kv@<pod>@<model>, an 8-byte
big-endian sequence number, a msgpack [ts, [events...], dp_rank]); events are msgpack arrays tagged with their class
name: ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium],
["BlockRemoved", block_hashes, medium], ["AllBlocksCleared"].

It decodes every frame, rebuilds which token prefixes the server holds on each medium, and checks that index
against the server's own listing (GET /v1/cache/blocks) after a workload that parks, demotes to RAM, evicts from RAM
to disk, restarts on the same disk tier, and serves a late subscriber; sequence numbers must have no gap. A second
server with two tenants must publish none of their blocks. Needs python3-zmq and python3-msgpack (Debian).

    KEEPWARM_BINARY=build/keepwarm KEEPWARM_TEST_MODELS_DIR=build/test-models tests/conformance/kv-events-subscriber.py

With --watch it is a load test's independent witness instead (bench/proxy-load.mjs --kv-events starts one per
upstream): it subscribes to a running server's ENDPOINT, prints {"ready": ...} once a snapshot has put it in step,
counts messages, events and sequence gaps while the load runs (a line {"gap": ...} as each gap happens), and when a
line "stop" (or the end) comes on its standard input it reads on until the stream is quiet, compares its index with
the server's GET /v1/cache/blocks (hash, medium and parent of every block) and prints its verdict as one JSON line.

    tests/conformance/kv-events-subscriber.py --watch tcp://127.0.0.1:5556 --server http://127.0.0.1:8080
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import msgpack
import zmq

BINARY = os.environ.get("KEEPWARM_BINARY", "build/keepwarm")
MODELS = os.environ.get("KEEPWARM_TEST_MODELS_DIR", "build/test-models")
BLOCK = 16
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print(f"FAIL: {what}", flush=True)
    return condition


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_model():
    path = os.path.join(MODELS, "tiny.gguf")
    if not os.path.exists(path):
        os.makedirs(MODELS, exist_ok=True)
        subprocess.run([BINARY, "mkmodel", "--preset", "tiny", "--seed", "1", "-o", path], check=True, timeout=300)
    return path


class Server:
    def __init__(self, args, cache_dir):
        self.proc = subprocess.Popen(
            [BINARY, "serve", "-m", test_model(), "--port", "0", "-t", "1", "--cache-dir", cache_dir, *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output = []
        self.url = None
        found = threading.Event()

        def read():
            for line in self.proc.stdout:
                self.output.append(line)
                m = re.search(r"listening on (http://[^\s\"]+)", line)
                if m and not self.url:
                    self.url = m.group(1)
                    found.set()
            found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(120) or not self.url:
            raise RuntimeError("serve did not start:\n" + "".join(self.output))

    def request(self, method, path, body=None, key=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read().decode()
            return json.loads(text) if r.headers.get("Content-Type", "").startswith("application/json") else text

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


class Subscriber:
    """An index of the server's blocks per medium, rebuilt from the event stream alone."""

    def __init__(self, endpoint, name):
        self.name = name
        self.socket = zmq.Context.instance().socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.socket.connect(endpoint)
        self.held = {}  # medium (lower case, as llm-d's index) -> set of hashes
        self.prefix = {}  # hash -> the token prefix the block ends
        self.expected_seq = None
        self.messages = 0
        self.removed = 0
        self.topics = set()
        self.last_event = None

    def new_process(self):
        """The server restarted: its sequence starts again."""
        self.expected_seq = None

    def pump(self, quiet=0.5, limit=30):
        """Reads messages until none came for `quiet` seconds."""
        deadline = time.time() + limit
        while time.time() < deadline:
            if not self.socket.poll(int(quiet * 1000)):
                return
            self.handle(self.socket.recv_multipart())

    def handle(self, frames):
        check(len(frames) == 3, f"{self.name}: a message has 3 frames, not {len(frames)}")
        topic = frames[0].decode()
        parts = topic.split("@")
        check(len(parts) == 3 and parts[0] == "kv" and parts[1] and parts[2], f"topic kv@<pod>@<model>: {topic}")
        self.topics.add(topic)
        check(len(frames[1]) == 8, "the sequence number is 8 bytes")
        seq = int.from_bytes(frames[1], "big")
        payload = msgpack.unpackb(frames[2], raw=False)
        check(isinstance(payload, list) and len(payload) in (2, 3), f"payload [ts, events, dp_rank]: {payload!r:.80}")
        ts, events = payload[0], payload[1]
        check(isinstance(ts, float) and abs(ts - time.time()) < 600, f"ts is a float, now: {ts}")
        check(isinstance(events, list) and events, "a message carries events")
        if self.expected_seq is None:
            # The first message this subscriber sees from a process: seq 0 (its start), or a snapshot it asked for.
            check(seq == 0 or events[0] == ["AllBlocksCleared"],
                  f"{self.name}: joined at seq {seq} on something other than a snapshot")
        else:
            check(seq == self.expected_seq, f"{self.name}: seq {seq} after {self.expected_seq - 1}: a gap")
        self.expected_seq = seq + 1
        self.messages += 1
        for event in events:
            self.apply(event)
            self.last_event = event[0]

    def apply(self, event):
        tag = event[0]
        if tag == "BlockStored":
            hashes, parent, token_ids, block_size, lora_id, medium = event[1:7]
            check(block_size == BLOCK, f"block_size {block_size}")
            check(lora_id is None, "lora_id nil")
            check(len(token_ids) == block_size * len(hashes), "token_ids: block_size per block")
            check(medium in ("GPU", "CPU", "DISK"), f"medium {medium}")
            prefix = [] if parent is None else self.prefix.get(parent)
            if not check(prefix is not None, f"{self.name}: parent {parent} of a stored block is unknown"):
                prefix = []
            held = self.held.setdefault(medium.lower(), set())
            for i, h in enumerate(hashes):
                check(isinstance(h, int) and 0 <= h < 2**64, "a hash is an unsigned 64-bit integer")
                prefix = prefix + token_ids[i * block_size:(i + 1) * block_size]
                self.prefix[h] = prefix
                check(h not in held, f"{self.name}: block {h} stored twice on {medium}")
                held.add(h)
        elif tag == "BlockRemoved":
            hashes, medium = event[1:3]
            for h in hashes:
                check(h in self.held.get(medium.lower(), set()), f"{self.name}: removed {h} from {medium}, not held")
                self.held.get(medium.lower(), set()).discard(h)
                self.removed += 1
        elif tag == "AllBlocksCleared":
            check(len(event) == 1, "AllBlocksCleared has no fields")
            self.held = {}
        else:
            check(False, f"unknown event {tag}")

    def pairs(self):
        return {(h, m) for m, hs in self.held.items() for h in hs}

    def holds(self, tokens, medium=None):
        """How many whole blocks of `tokens`, from the start, the index holds (on `medium`, or on any)."""
        media = [medium] if medium else list(self.held)
        n = 0
        while (n + 1) * BLOCK <= len(tokens):
            want = tokens[:(n + 1) * BLOCK]
            if not any(self.prefix.get(h) == want for m in media for h in self.held.get(m, ())):
                break
            n += 1
        return n


def listing(server):
    body = server.request("GET", "/v1/cache/blocks")
    check(body["block_size"] == BLOCK, "the listing's block size")
    return {(b["hash"], m.lower()) for b in body["blocks"] for m in b["media"]}


def agree(sub, server, when):
    sub.pump()
    mine, theirs = sub.pairs(), listing(server)
    check(mine == theirs, f"{sub.name} after {when}: index {len(mine)} blocks, server {len(theirs)}; "
                          f"missing {len(theirs - mine)}, extra {len(mine - theirs)}")
    return mine


def prose(seed, words):
    vocab = ("tool file agent model cache token block prefix server request answer system prompt write read check "
             "build test run path tree node disk memory device event route").split()
    out, x = [], seed
    for _ in range(words):
        x = (x * 1103515245 + 12345) % 2**31
        out.append(vocab[x % len(vocab)])
    return " ".join(out)


def complete(server, tokens, key=None):
    # Token ids as the prompt (llama-server's /completion): the subscriber knows exactly what the server cached.
    server.request("POST", "/completion", {"prompt": tokens, "n_predict": 2, "temperature": 0}, key=key)


def tokenize(server, text):
    return server.request("POST", "/tokenize", {"content": text})["tokens"]


class Watcher:
    """The index of one server's blocks, (hash, medium) and each block's parent, kept from its stream alone; every
    break of the contract counted rather than asserted, for a verdict at the end."""

    MEDIA = ("GPU", "CPU", "DISK")

    def __init__(self, endpoint, drop_message=0):
        self.socket = zmq.Context.instance().socket(zmq.SUB)
        self.socket.setsockopt(zmq.RCVHWM, 0)  # ZeroMQ never drops on this side: a gap is the publisher's
        self.socket.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.socket.connect(endpoint)
        self.endpoint = endpoint
        self.media = {}  # hash -> set of media held
        self.parent = {}  # hash -> parent hash or None, while held on some medium
        self.in_step = False  # from the first AllBlocksCleared on
        self.first_seq = self.last_seq = None
        self.counts = dict(messages=0, events=0, blocks_stored=0, blocks_removed=0, cleared=0, gaps=0,
                           lost_messages=0, out_of_order=0, restarts=0, before_snapshot=0, malformed=0,
                           orphan_blocks=0, stored_twice=0, removed_not_held=0)
        self.problems = []  # the first few, in words
        self.drop_message = drop_message  # a test of the test: this many messages after the snapshot, drop one

    def problem(self, counter, what, n=1):
        self.counts[counter] += n
        if len(self.problems) < 10:
            self.problems.append(what)

    def pump(self, quiet):
        """Reads messages until none came for `quiet` seconds."""
        while self.socket.poll(int(quiet * 1000)):
            self.handle(self.socket.recv_multipart())

    def handle(self, frames):
        try:
            topic = frames[0].decode()
            if len(frames) != 3 or len(frames[1]) != 8 or len(topic.split("@")) != 3:
                raise ValueError(f"{len(frames)} frames, topic {topic!r:.60}")
            seq = int.from_bytes(frames[1], "big")
            payload = msgpack.unpackb(frames[2], raw=False)
            if not isinstance(payload, list) or len(payload) not in (2, 3) or not isinstance(payload[1], list):
                raise ValueError(f"payload {payload!r:.60}")
            events = payload[1]
        except Exception as e:  # noqa: BLE001: a message that breaks the format is counted, not fatal
            self.problem("malformed", f"a malformed message: {e}")
            return
        if self.drop_message and self.in_step:
            self.drop_message -= 1
            if self.drop_message == 0:
                return  # as if ZeroMQ had lost it: the next message shows the gap
        if self.last_seq is not None:
            if seq == 0:
                self.problem("restarts", f"seq 0 after {self.last_seq}: the server restarted")
            elif seq > self.last_seq + 1:
                self.problem("gaps", f"seq {seq} after {self.last_seq}: {seq - self.last_seq - 1} messages lost")
                self.counts["lost_messages"] += seq - self.last_seq - 1
                print(json.dumps({"gap": {"after": self.last_seq, "next": seq}}), flush=True)
            elif seq <= self.last_seq:
                self.problem("out_of_order", f"seq {seq} after {self.last_seq}")
        if self.first_seq is None:
            self.first_seq = seq
        self.last_seq = seq
        self.counts["messages"] += 1
        for event in events:
            self.counts["events"] += 1
            self.apply(event)

    def apply(self, event):
        tag = event[0] if isinstance(event, list) and event else None
        if tag == "AllBlocksCleared":
            self.media.clear()
            self.parent.clear()
            self.counts["cleared"] += 1
            if not self.in_step:
                self.in_step = True
                print(json.dumps({"ready": {"seq": self.last_seq}}), flush=True)
            return
        if not self.in_step:
            self.counts["before_snapshot"] += 1  # what came before the snapshot is not this subscriber's business
            return
        if tag == "BlockStored" and len(event) >= 7:
            hashes, parent, token_ids, block_size, _lora_id, medium = event[1:7]
            if medium not in self.MEDIA or len(token_ids) != block_size * len(hashes):
                self.problem("malformed", f"BlockStored with medium {medium!r}, {len(token_ids)} tokens")
                return
            self.counts["blocks_stored"] += len(hashes)
            if parent is not None and parent not in self.media:
                self.problem("orphan_blocks", f"stored {len(hashes)} blocks on {medium} after {parent}, which is not "
                             "held", len(hashes))
            for h in hashes:
                held = self.media.setdefault(h, set())
                if medium in held:
                    self.problem("stored_twice", f"block {h} stored twice on {medium}")
                if not held:
                    self.parent[h] = parent
                held.add(medium)
                parent = h
        elif tag == "BlockRemoved" and len(event) >= 3:
            hashes, medium = event[1:3]
            self.counts["blocks_removed"] += len(hashes)
            for h in hashes:
                held = self.media.get(h)
                if not held or medium not in held:
                    self.problem("removed_not_held", f"removed {h} from {medium}, where it was not held")
                    continue
                held.discard(medium)
                if not held:
                    del self.media[h]
                    del self.parent[h]
        else:
            self.problem("malformed", f"an unknown event {str(event):.60}")

    def compare(self, server_url):
        """This index against the server's listing: {"agree", "blocks", "server_blocks", "missing", "extra", ...}."""
        with urllib.request.urlopen(server_url + "/v1/cache/blocks", timeout=60) as r:
            listing = json.loads(r.read())["blocks"]
        theirs = {(b["hash"], m) for b in listing for m in b["media"]}
        mine = {(h, m) for h, held in self.media.items() for m in held}
        parents = sum(1 for b in listing if b["hash"] in self.parent and self.parent[b["hash"]] != b["parent"])
        return {"agree": mine == theirs and parents == 0, "blocks": len(mine), "server_blocks": len(theirs),
                "missing": len(theirs - mine), "extra": len(mine - theirs), "other_parent": parents}


def server_messages(server_url):
    """The server's own count of the messages it published (keepwarm_kv_events_messages_total)."""
    with urllib.request.urlopen(server_url + "/metrics", timeout=60) as r:
        m = re.search(r"^keepwarm_kv_events_messages_total (\d+)", r.read().decode(), re.M)
    return int(m.group(1)) if m else None


def watch(endpoint, server_url, settle, drop_message):
    w = Watcher(endpoint, drop_message)
    poller = zmq.Poller()
    poller.register(w.socket, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    stopping = False
    while not stopping:
        for what, _ in poller.poll(1000):
            if what is w.socket:
                # Drain what is there before looking at stdin again: the stop line comes after the load's last events.
                while w.socket.poll(0):
                    w.handle(w.socket.recv_multipart())
            else:
                line = sys.stdin.readline()
                stopping = stopping or not line or line.strip() == "stop"
    # The load has stopped: read on until the stream is quiet, then compare. A server that still settles (a demotion
    # after the last request) gets a few more tries; an index that lost an event never converges.
    verdict = None
    for _ in range(5):
        w.pump(settle)
        verdict = w.compare(server_url)
        if verdict["agree"]:
            break
    w.pump(0.2)
    published = server_messages(server_url)
    out = {"endpoint": endpoint, "in_step": w.in_step, "first_seq": w.first_seq, "last_seq": w.last_seq,
           "server_messages": published,
           # Every message the server has published since this subscriber joined came (the last one included).
           "saw_last_message": published is not None and w.last_seq is not None and w.last_seq + 1 == published,
           "index": verdict, "problems": w.problems, **w.counts}
    print(json.dumps({"verdict": out}), flush=True)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--watch", metavar="ENDPOINT", help="watch a running server's stream (see above)")
    parser.add_argument("--server", metavar="URL", help="with --watch: the server's HTTP address")
    parser.add_argument("--settle", type=float, default=1.0, help="with --watch: quiet seconds before comparing")
    parser.add_argument("--drop-message", type=int, default=0, metavar="N",
                        help="with --watch: drop the Nth message after the snapshot (checks that a loss is caught)")
    opts = parser.parse_args()
    if opts.watch:
        if not opts.server:
            parser.error("--watch needs --server")
        return watch(opts.watch, opts.server.rstrip("/"), opts.settle, opts.drop_message)
    return conformance()


def conformance():
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    sub = Subscriber(endpoint, "subscriber")  # connects before the server binds: ZeroMQ retries
    cache_dir = tempfile.mkdtemp(prefix="keepwarm-kv-events-")
    # One slot, one parked conversation, RAM for a few blocks: turns park, demote to RAM, and fall to disk.
    args = ["-c", "1024", "--parallel", "1", "--cache-parked", "1", "--cache-block", str(BLOCK),
            "--cache-ram", "96KiB", "--kv-events", f"tcp://*:{port}", "--kv-events-pod", "pod-a:8000"]
    server = Server(args, cache_dir)
    try:
        agree(sub, server, "start")
        check(sub.topics == {"kv@pod-a:8000@tiny"}, f"topic: {sub.topics}")
        conversations = [tokenize(server, prose(seed, 120)) for seed in range(1, 6)]
        for round_ in range(2):
            for i, tokens in enumerate(conversations):
                complete(server, tokens)
                agree(sub, server, f"conversation {i} round {round_}")
                check(sub.holds(tokens, "gpu") == len(tokens) // BLOCK,
                      f"conversation {i}: its {len(tokens) // BLOCK} blocks on the device, index has "
                      f"{sub.holds(tokens, 'gpu')}")
                conversations[i] = tokens + tokenize(server, " " + prose(100 + i + 10 * round_, 12))[1:]
        print("after the workload: " + ", ".join(f"{m} {len(h)} blocks" for m, h in sorted(sub.held.items())) +
              f"; {sub.removed} removals in {sub.messages} messages", flush=True)
        check(sub.held.get("cpu"), "some blocks were demoted to RAM (CPU)")
        check(sub.held.get("disk"), "some blocks are on disk (DISK)")
        check(sub.removed > 0, "blocks were removed (evicted from the device or RAM)")
        only_lower = {h for h in sub.held.get("disk", ()) if h not in sub.held.get("gpu", ())
                      and h not in sub.held.get("cpu", ())}
        check(only_lower, "some blocks are held on disk alone")

        late = Subscriber(endpoint, "late subscriber")
        late.pump(quiet=1.0)
        check(late.pairs() == listing(server), "a late subscriber catches up from the snapshot")
        agree(sub, server, "the late subscriber's snapshot")

        metrics = server.request("GET", "/metrics")
        for name in ("keepwarm_queue_depth", "keepwarm_slots_busy", "keepwarm_kv_cache_usage_ratio",
                     "keepwarm_kv_cache_block_size", "keepwarm_kv_cache_blocks", "keepwarm_kv_events_messages_total"):
            check(re.search(rf"^{name}(\{{[^}}]*\}})? ", metrics, re.M), f"/metrics has {name}")

        before_restart = sub.pairs()
        server.stop()
        sub.pump()
        late.pump()
        check(sub.last_event == "AllBlocksCleared" and not sub.pairs(), "a stopping server clears its blocks")
        sub.new_process()
        late.new_process()
        server = Server(args, cache_dir)
        after = agree(sub, server, "restart")
        print(f"after the restart: {len(after)} blocks announced", flush=True)
        check(after and all(m == "disk" for _, m in after), "a restarted server announces its disk blocks")
        check({h for h, _ in after} <= {h for h, _ in before_restart},
              "a block has the same hash after the restart as before it")
        check(any(sub.holds(t, "disk") >= len(t) // BLOCK - 1 for t in conversations),
              "a conversation's blocks are on disk after the restart")
        complete(server, conversations[0])
        agree(sub, server, "a turn restored from disk")
        check(sub.holds(conversations[0], "gpu") == len(conversations[0]) // BLOCK, "restored onto the device")
        late.pump()
        check(late.pairs() == listing(server), "the late subscriber follows the restart")
    finally:
        server.stop()

    # Two tenants kept apart: neither's private cache is published.
    keys = os.path.join(cache_dir, "keys")
    with open(keys, "w") as f:
        f.write("alice alice-key-123\nbob bob-key-4567\n")
    os.chmod(keys, 0o600)
    port2 = free_port()
    tsub = Subscriber(f"tcp://127.0.0.1:{port2}", "tenants' subscriber")
    tenants = Server(["-c", "1024", "--cache-block", str(BLOCK), "--api-keys-file", keys,
                      "--kv-events", f"tcp://*:{port2}"], tempfile.mkdtemp(prefix="keepwarm-kv-events-"))
    try:
        req = urllib.request.Request(tenants.url + "/tokenize", data=json.dumps({"content": prose(7, 120)}).encode(),
                                     method="POST", headers={"Authorization": "Bearer alice-key-123"})
        with urllib.request.urlopen(req, timeout=60) as r:
            tokens = json.loads(r.read())["tokens"]
        complete(tenants, tokens, key="alice-key-123")
        complete(tenants, tokens, key="bob-key-4567")
        tsub.pump()
        req = urllib.request.Request(tenants.url + "/v1/cache", headers={"Authorization": "Bearer alice-key-123"})
        with urllib.request.urlopen(req, timeout=60) as r:
            device_tokens = json.loads(r.read())["tiers"]["device"]["tokens"]
        check(device_tokens >= len(tokens), "the tenants' prompts are cached")
        check(not tsub.pairs(), "no private tenant's block is published")
        check(tsub.messages >= 1, "the tenants' server still publishes (its start)")
    finally:
        tenants.stop()

    print(f"kv-events conformance: {sub.messages} messages, {len(failures)} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
