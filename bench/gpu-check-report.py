#!/usr/bin/env python3
"""The table of bench/gpu-check.sh: reads gpu-check.json and the per-step JSON files in DIR, prints Markdown."""

import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def print_gauntlet(family, gauntlet):
    """The gauntlet's table for one family's model (bench-FAMILY.gguf), if that step ran."""
    if not gauntlet:
        return
    print(f"\n### gauntlet on bench-{family} (shortened: see gpu-check.sh)\n")
    print("| target | requests (failed) | computed | ideal | computed / ideal | prefill s | cold TTFT ms | "
          "warm p50 / p95 ms |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    fmt = lambda v, f: "-" if v is None else format(v, f)
    for t in gauntlet["targets"]:
        print(f"| {t['target']} | {t['requests']} ({t['failures']}) | {t['computed_tokens']:,} | "
              f"{t['ideal_tokens']:,} | {fmt(t['computed_over_ideal'], '.3f')} | {t['prefill_ms'] / 1000:,.1f} | "
              f"{fmt(t['cold_ttft_ms'], ',.0f')} | {fmt(t['warm_ttft_p50_ms'], ',.0f')} / "
              f"{fmt(t['warm_ttft_p95_ms'], ',.0f')} |")


def main(folder):
    check = load(os.path.join(folder, "gpu-check.json")) or {}
    print("## keepwarm on the GPU\n")
    for line in check.get("machine", []):
        print(f"- {line}")
    print(f"- keepwarm compute: {check.get('compute', '?')}\n")
    print("| step | status | seconds |\n| --- | --- | ---: |")
    for name, value in check.items():
        if isinstance(value, dict) and "status" in value:
            print(f"| {name} | {value['status']} | {value.get('seconds', 0):.0f} |")
    for name in sorted(os.listdir(folder)):
        if not (name.startswith("ttft-") and name.endswith(".json")):
            continue
        r = load(os.path.join(folder, name))
        if not r or "ratios" not in r:
            continue
        kw, ls = r["servers"]["keepwarm"], r["servers"]["llama-server"]
        extra = f", keepwarm {r['keepwarm_args']}" if r.get("keepwarm_args") else ""
        print(f"\n### TTFT on {r['model']} (context {r['ctx']}, one slot, all layers on the GPU{extra})\n")
        print("| tokens | cold keepwarm ms | cold llama-server ms | cold ratio | warm keepwarm ms | "
              "warm llama-server ms | warm ratio | warm prompt_n keepwarm / llama-server |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for a, b, q in zip(kw, ls, r["ratios"]):
            print(f"| {a['size']:,} | {a['cold']['ttft_ms']:,.1f} | {b['cold']['ttft_ms']:,.1f} | {q['cold']:.2f}x | "
                  f"{a['warm_ttft_ms']:,.1f} | {b['warm_ttft_ms']:,.1f} | {q['warm']:.2f}x | "
                  f"{a['warm'][-1]['prompt_n']} / {b['warm'][-1]['prompt_n']} |")
        print("\nratio: llama-server's time / keepwarm's (above 1: keepwarm is faster)")
    depth = load(os.path.join(folder, "depth-8b.json"))
    if depth:
        print(f"\n### bench depth, 8B-class q4_0 ({depth['model'].get('desc', '')})\n")
        print("| KV | depth | prefill tokens/s | decode tokens/s |\n| --- | ---: | ---: | ---: |")
        for r in depth["results"]:
            print(f"| {r['kv']} | {r['depth']:,} | {r['pp_tps']:,.0f} | {r['tg_tps']:,.1f} |")
    for name in ("spec-bench-dense.json", "spec-8b.json"):
        spec = load(os.path.join(folder, name))
        if not spec or "off" not in spec:
            continue
        print(f"\n### speculative decoding, replayed trajectories ({os.path.basename(spec['model'])}; the outputs are "
              "recorded, not this model's)\n")
        print("| drafting | answer tokens | decode tokens/s | tokens/step | drafted | accepted | turn s mean |\n"
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for side in (spec["off"], spec["on"]):
            print(f"| {side['mode']} | {side['answer_tokens']} | {side['decode_tokens_per_second']:.1f} | "
                  f"{side['tokens_per_step']:.3f} | {side['draft_tokens']} | {side['draft_accepted']} | "
                  f"{side['turn_seconds_mean']:.2f} |")
        print(f"\ndecode tokens/s on / off: {spec['decode_speedup']:.3f}x")
    for family in ("dense", "hybrid", "moe", "hybrid-moe", "swa", "gpt-oss"):
        print_gauntlet(family, load(os.path.join(folder, f"gauntlet-bench-{family}.json")))
    moe = load(os.path.join(folder, "moe-offload.json"))
    if moe:
        print(f"\n### Experts in host memory: {moe['model']} ({moe['moe_layers']} MoE blocks, {moe['n_expert']} experts, "
              f"{moe['n_expert_used']} used; host-to-device {moe['h2d_gbps']} GB/s)\n")
        print("| --n-cpu-moe | GPU memory MiB keepwarm / llama-server | prefill tok/s keepwarm / llama-server | "
              "decode tok/s keepwarm / llama-server | expert cache in the same memory: slots/layer, hit %, "
              "MB/token, predicted decode tok/s |\n| ---: | ---: | ---: | ---: | --- |")
        for r in moe["splits"]:
            kw, ls, p = r.get("keepwarm", {}), r.get("llama-server", {}), r.get("predicted_cache")
            pred = (f"{p['slots']}, {p['hit_rate'] * 100:.1f} %, {p['bytes_per_token'] / 1e6:,.1f}, "
                    f"{p['decode_tps']:,.1f}") if p else "-"
            print(f"| {r['n_cpu_moe']} | {kw.get('gpu_memory_mib')} / {ls.get('gpu_memory_mib')} | "
                  f"{kw.get('prefill_tps')} / {ls.get('prefill_tps')} | {kw.get('decode_tps')} / "
                  f"{ls.get('decode_tps')} | {pred} |")
        print("\npredicted: the all-on-GPU decode time plus the simulation's bytes per token over the measured bus "
              "(bench/gpu-moe.py)")

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gpu-check")
