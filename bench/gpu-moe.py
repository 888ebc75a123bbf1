#!/usr/bin/env python3
"""A mixture-of-experts model whose experts do not all fit in GPU memory, on the GPU (bench/gpu-check.sh).

llama.cpp's own answer is a static split: `--n-cpu-moe N` keeps the expert weights of the first N blocks in host
memory, where the CPU computes them (prefill batches copy them to the GPU instead, when that is faster). For each N in
--splits, keepwarm and the pinned llama-server in turn (same model, context and flags) serve one conversation: a cold
prompt of --prompt-tokens (prefill tokens/s) and an answer of --gen tokens with ignore_eos (decode tokens/s), from the
servers' own `timings`, and the GPU memory in use (nvidia-smi) while each runs.

Against it, the prediction of the expert-cache simulation (`keepwarm bench experts --json`, docs/bench-experts.md):
the same GPU memory spent on a per-layer cache of S = n_expert x (blocks on the GPU / blocks) experts, the others
copied over the bus when a token needs them. Predicted decode time per token = the all-on-GPU decode time (N = 0,
measured) + the simulation's bytes moved per token at S / the host-to-device bandwidth (measured here with the CUDA
runtime: pinned memory, 1 GiB copies). The trace comes from the same model, so with random weights it routes by
noise (hit rate about S / n_expert): the prediction checks the arithmetic, a real model's skewed routing does better.
Python standard library only (ctypes for the bandwidth).
"""

import argparse
import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from importlib import import_module  # noqa: E402

ttft = import_module("gpu-ttft")  # its Server and call


def h2d_bandwidth_gbps(size=1 << 30, repeats=5):
    """Host-to-device copy rate of pinned memory, in GB/s, with libcudart (None where it cannot be loaded)."""
    for name in ("libcudart.so.13", "libcudart.so.12", "/usr/local/cuda/lib64/libcudart.so", "libcudart.so"):
        try:
            rt = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return None
    host, dev = ctypes.c_void_p(), ctypes.c_void_p()
    if rt.cudaMallocHost(ctypes.byref(host), ctypes.c_size_t(size)) or rt.cudaMalloc(ctypes.byref(dev),
                                                                                    ctypes.c_size_t(size)):
        return None
    ctypes.memset(host, 1, size)
    rt.cudaMemcpy(dev, host, ctypes.c_size_t(size), 1)  # warm-up; 1: cudaMemcpyHostToDevice
    rt.cudaDeviceSynchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        rt.cudaMemcpy(dev, host, ctypes.c_size_t(size), 1)
    rt.cudaDeviceSynchronize()
    seconds = time.perf_counter() - start
    rt.cudaFree(dev)
    rt.cudaFreeHost(host)
    return round(size * repeats / seconds / 1e9, 2)


def gpu_memory_used_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def measure(server, prompt_tokens, gen):
    text = ttft.text_of(server, prompt_tokens, seed=7)
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": gen, "temperature": 0,
            "ignore_eos": True}
    r = ttft.call(server.url + "/v1/chat/completions", body)
    t = r.get("timings", {})
    pp = t["prompt_n"] / t["prompt_ms"] * 1000 if t.get("prompt_ms") else None
    tg = t["predicted_n"] / t["predicted_ms"] * 1000 if t.get("predicted_ms") else None
    return {"prompt_n": t.get("prompt_n"), "prefill_tps": round(pp, 1) if pp else None,
            "predicted_n": t.get("predicted_n"), "decode_tps": round(tg, 2) if tg else None,
            "gpu_memory_mib": gpu_memory_used_mib()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--keepwarm", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--experts-json", required=True, help="keepwarm bench experts --json of the same model")
    ap.add_argument("--splits", default="0,8,16", help="values of --n-cpu-moe")
    ap.add_argument("--prompt-tokens", type=int, default=4096)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--work-dir", default=".")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    splits = [int(s) for s in args.splits.split(",")]
    with open(args.experts_json) as f:
        experts = json.load(f)
    n_expert, layers = experts["n_expert"], experts["moe_layers"]
    name = os.path.splitext(os.path.basename(args.model))[0]
    results = {"model": name, "n_expert": n_expert, "n_expert_used": experts["n_expert_used"], "moe_layers": layers,
               "h2d_gbps": h2d_bandwidth_gbps(), "splits": []}
    print(f"{name}: {layers} MoE blocks of {n_expert} experts ({experts['n_expert_used']} used), host-to-device "
          f"{results['h2d_gbps']} GB/s", flush=True)
    ctx = args.prompt_tokens + args.gen + 1024
    for n in splits:
        row = {"n_cpu_moe": n}
        common = ["-m", args.model, "-c", str(ctx), "--parallel", "1", "--n-gpu-layers", "999", "--n-cpu-moe", str(n)]
        for label, argv in {"keepwarm": [args.keepwarm, "serve", *common, "--cache-disk", "0"],
                            "llama-server": [args.llama_server, *common, "--host", "127.0.0.1"]}.items():
            log = os.path.join(args.work_dir, f"{name}-moe{n}-{label}.log")
            with ttft.Server(label, argv, log) as server:
                measure(server, 256, 8)  # warm-up: buffers and kernels
                row[label] = measure(server, args.prompt_tokens, args.gen)
            print(f"  --n-cpu-moe {n:>3} {label:12}: prefill {row[label]['prefill_tps']} tokens/s, decode "
                  f"{row[label]['decode_tps']} tokens/s, GPU memory {row[label]['gpu_memory_mib']} MiB", flush=True)
        results["splits"].append(row)

    # The same GPU memory as an expert cache: S slots per layer, the misses copied over the bus.
    base = next((r for r in results["splits"] if r["n_cpu_moe"] == 0), None)
    sim = {r["slots"]: r for r in experts["results"] if r["policy"] == "lru"}
    for row in results["splits"]:
        slots = round(n_expert * (layers - min(row["n_cpu_moe"], layers)) / layers)
        # No slot at all: every expert of every token crosses the bus (the simulation's uncached figure).
        s = sim.get(slots) if slots > 0 else {"hit_rate": 0.0, "bytes_per_token": experts["uncached"]["bytes_per_token"]}
        row["cache_slots"] = slots
        if not (base and s and results["h2d_gbps"] and base["keepwarm"]["decode_tps"]):
            continue
        per_token_s = 1 / base["keepwarm"]["decode_tps"] + s["bytes_per_token"] / (results["h2d_gbps"] * 1e9)
        row["predicted_cache"] = {"slots": slots, "hit_rate": round(s["hit_rate"], 4),
                                  "bytes_per_token": round(s["bytes_per_token"]), "decode_tps": round(1 / per_token_s, 2)}
        print(f"  --n-cpu-moe {row['n_cpu_moe']:>3}: an expert cache of {slots} slots/layer in the same memory: hit "
              f"{s['hit_rate'] * 100:.1f} %, {s['bytes_per_token'] / 1e6:.1f} MB/token over the bus, predicted decode "
              f"{row['predicted_cache']['decode_tps']} tokens/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
