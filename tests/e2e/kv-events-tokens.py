#!/usr/bin/python3
"""Prints the token runs a `keepwarm serve --kv-events` endpoint publishes, for the render routes' end-to-end test,
decoded from the documented wire format (docs/kv-events.md), not from keepwarm's code: it subscribes to the endpoint
given as its argument and prints one JSON line per event, `{"stored": [hashes], "parent": hash|null, "tokens":
[ids]}` for BlockStored and `{"cleared": true}` for AllBlocksCleared (hashes as decimal strings: they are 64-bit).
Needs Debian's python3-zmq and python3-msgpack."""
import json
import sys

import msgpack
import zmq


def key(h):
    return None if h is None else str(int.from_bytes(h, "big") if isinstance(h, bytes) else h)


sub = zmq.Context().socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.connect(sys.argv[1])
while True:
    _topic, _seq, payload = sub.recv_multipart()
    _ts, events = msgpack.unpackb(payload, raw=False)[:2]
    for event in events:
        if event[0] == "BlockStored":
            print(json.dumps({"stored": [key(h) for h in event[1]], "parent": key(event[2]), "tokens": event[3]}))
        elif event[0] == "AllBlocksCleared":
            print(json.dumps({"cleared": True}))
    sys.stdout.flush()
