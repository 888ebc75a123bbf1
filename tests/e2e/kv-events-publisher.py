#!/usr/bin/python3
"""A KV-events publisher for the proxy's end-to-end test, written from the documented wire format (vLLM's, as llm-d
reads it; docs/kv-events.md): it binds an XPUB socket on a free port, prints `port N`, then publishes what stdin says,
one JSON line a message: {"seq": N, "events": [["BlockStored", [hashes], parent, [tokens], block_size, null,
"GPU"], ["BlockRemoved", [hashes], "GPU"], ["AllBlocksCleared"]]}. Each new subscription is printed as `subscribed`
(the test answers it with a snapshot, as keepwarm serve does). Needs Debian's python3-zmq and python3-msgpack."""
import json
import sys
import threading
import time

import msgpack
import zmq

ctx = zmq.Context()
pub = ctx.socket(zmq.XPUB)
pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, also a repeated one, is seen
port = pub.bind_to_random_port("tcp://127.0.0.1")
print(f"port {port}", flush=True)
lock = threading.Lock()


def watch_subscriptions():
    while True:
        with lock:
            events = pub.poll(0)
            msg = pub.recv() if events else None
        if msg is None:
            time.sleep(0.01)
            continue
        if msg[:1] == b"\x01":
            print("subscribed", flush=True)


threading.Thread(target=watch_subscriptions, daemon=True).start()

for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    m = json.loads(line)
    payload = msgpack.packb([time.time(), m["events"], 0], use_bin_type=True)
    with lock:
        pub.send_multipart([b"kv@fake@tiny", m["seq"].to_bytes(8, "big"), payload])
    print(f"sent {m['seq']}", flush=True)
