#!/usr/bin/env python3
"""Does llama-server's prompt cache change the answer too? Compares the first sampled position's top probabilities of
one prompt computed in one batch (cache off) with the same prompt computed as a cached prefix plus a short suffix
(cache on, the prefix sent first), as keepwarm's test-reuse-exactness does with its own engine.
Usage: reuse-exactness-llama-server.py LLAMA_SERVER MODEL.gguf  (bench/build-llama-server.sh prints the first)."""
import json, random, socket, subprocess, sys, time, urllib.request

server, model = sys.argv[1], sys.argv[2]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
proc = subprocess.Popen([server, "-m", model, "--port", str(port), "-c", "4096", "-b", "2048", "-ub", "512", "-t", "1",
                         "-np", "1", "--no-warmup"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


try:
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    break
        except Exception:
            time.sleep(0.1)
    rng = random.Random(11)
    vocab = "cache prefix token agent model tool request system slot turn reuse block disk state answer".split()
    text = " ".join(rng.choice(vocab) for _ in range(300))
    tokens = post("/tokenize", {"content": text})["tokens"]
    cut = (len(tokens) - 1) // 64 * 64
    ask = {"n_predict": 1, "temperature": 0, "n_probs": 8, "post_sampling_probs": False}

    def first_probs(result):
        return [(p["id"], p["logprob"]) for p in result["completion_probabilities"][0]["top_logprobs"]]

    one_batch = first_probs(post("/completion", {"prompt": tokens, "cache_prompt": False, **ask}))
    post("/completion", {"prompt": tokens[:cut], "cache_prompt": True, **ask})
    split = post("/completion", {"prompt": tokens, "cache_prompt": True, **ask})
    cached = split.get("timings", {}).get("cache_n", "?")
    split = first_probs(split)
    worst = max(abs(a[1] - b[1]) for a, b in zip(one_batch, split))
    print(f"prompt {len(tokens)} tokens, {cached} from llama-server's cache: top-8 logprobs differ by up to {worst:.3g}"
          f" ({'same' if one_batch == split else 'DIFFERENT'}; same top token: {one_batch[0][0] == split[0][0]})")
finally:
    proc.terminate()
    proc.wait()
