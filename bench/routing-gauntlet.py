#!/usr/bin/env python3
"""Three keepwarm servers behind `keepwarm proxy`: the gauntlet's prefix hit rate by routing, against one server
with all the memory.

One gauntlet workload (generated once, replayed the same for every mode) goes through `keepwarm proxy` to:
  one-server  one `keepwarm serve` with --servers times the memory of each small one (context, slots, RAM tier)
  events      --servers small servers publishing KV events (--kv-events); the proxy routes by the blocks they hold
  inferred    the same servers without events; the proxy routes by the prompts it has sent each one
  load-only   the same servers; the proxy ignores prefixes (--route-min-blocks too large to match) and sends each
              request to the least loaded one, as a plain load balancer or a Kubernetes Service would
Every mode starts fresh servers (empty caches, no disk tier) and a fresh proxy, so one mode's cache never helps
the next. The hit rate is the prompt tokens the servers reused over the prompt tokens of the agents' requests
(pings left out), as the servers reported them; the table gives each mode's rate over one-server's, and the
prompt tokens computed over the ideal (what a perfect cache of the whole workload would compute).

  bench/routing-gauntlet.py --model /tmp/m/tiny-64k.gguf [--servers 3] [--ctx 32768] [--slots 2]
      [--cache-ram 64MiB] [--threads 1] [--modes one-server,events,inferred,load-only] [--out-dir DIR]
      [-- any option of `keepwarm bench gauntlet`'s generator, e.g. --agents 6 --turns 3]

Results: DIR/routing-gauntlet.json (per mode: the gauntlet's summary, the hit rate, the proxy's routing counters),
the servers', proxy's and gauntlet's logs and reports beside it. keepwarm from build/keepwarm unless --keepwarm.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from importlib import import_module  # noqa: E402

wait_ready = import_module("warm-turns").wait_ready  # a server's /health, or its exit, within 5 minutes
MODES = ("one-server", "events", "inferred", "load-only")
# The generator's defaults here: six agents on a 4K-token system prompt (plus the tool definitions), three user
# turns of two tool rounds each; every cache killer except a restart (the bench restarts only servers it launched
# as a gauntlet target, and these are launched here).
WORKLOAD_DEFAULTS = ["--system-tokens", "4096", "--agents", "6", "--turns", "3", "--tool-rounds", "2",
                     "--answer-tokens", "32", "--tool-result-tokens", "200",
                     "--killers", "cch,request-id,ping,model,num-ctx,cancel,reasoning"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(port):
    """Prometheus text of /metrics as {(name, labels): value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(\{[^}]*\})? ([-0-9.e+]+|NaN)$", line)
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def summed(samples, name):
    return sum(v for (n, _), v in samples.items() if n == name)


def parse_size_mib(text):
    m = re.fullmatch(r"(\d+)\s*(MiB|GiB)?", text)
    if not m:
        sys.exit(f"routing-gauntlet: --cache-ram takes N, NMiB or NGiB, not {text!r}")
    return int(m.group(1)) * (1024 if m.group(2) == "GiB" else 1)


class Mode:
    """The servers and proxy of one mode, started fresh and stopped at the end."""

    def __init__(self, name, args, out_dir):
        self.name, self.args, self.out_dir = name, args, out_dir
        self.processes, self.server_ports = [], []

    def spawn(self, command, log_name):
        log = open(os.path.join(self.out_dir, f"{self.name}-{log_name}.log"), "w")
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process

    def start(self):
        a = self.args
        scale = a.servers if self.name == "one-server" else 1
        count = 1 if self.name == "one-server" else a.servers
        upstreams = []
        for i in range(count):
            port = free_port()
            command = [a.keepwarm, "serve", "-m", a.model, "--port", str(port), "-t", str(a.threads),
                       "-c", str(a.ctx * scale), "--parallel", str(a.slots * scale),
                       "--cache-ram", f"{parse_size_mib(a.cache_ram) * scale}MiB", "--cache-disk", "0",
                       "--cache-dir", os.path.join(self.out_dir, f"{self.name}-cache-{i}")]
            upstream = f"http://127.0.0.1:{port}"
            if self.name == "events":
                events_port = free_port()
                command += ["--kv-events", f"tcp://*:{events_port}", "--kv-events-pod", f"server-{i}"]
                upstream += f",events=tcp://127.0.0.1:{events_port}"
            wait_ready(port, self.spawn(command, f"server-{i}"), f"server {i}")
            self.server_ports.append(port)
            upstreams.append(upstream)
        self.proxy_port = free_port()
        command = [a.keepwarm, "proxy", "--port", str(self.proxy_port),
                   "--policy", os.path.join(ROOT, "etc", "keepwarm-policy.toml")]
        for u in upstreams:
            command += ["--upstream", u]
        if self.name == "load-only":
            command += ["--route-min-blocks", str(1 << 30)]
        wait_ready(self.proxy_port, self.spawn(command, "proxy"), "the proxy")
        if self.name == "events":
            self.wait_in_step(len(upstreams))

    def wait_in_step(self, count):
        """The proxy routes by events only once it holds each server's snapshot."""
        for _ in range(120):
            if summed(metrics(self.proxy_port), "keepwarm_proxy_kv_events_in_step") == count:
                return
            time.sleep(0.5)
        sys.exit("routing-gauntlet: the proxy's event index was not in step with every server within 60 s")

    def stop(self):
        for p in self.processes:
            p.terminate()
        for p in self.processes:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def hit_rate(report):
    """Reused over prompt tokens of the agents' requests that were answered (pings left out)."""
    prompt = reused = 0
    for run in report["runs"]:
        for r in run["requests"]:
            if r["ping"] or not r["ok"]:
                continue
            prompt += r["prompt_tokens"]
            reused += r["reused_tokens"]
    return prompt, reused, (reused / prompt if prompt else None)


def run_mode(name, args, workload, out_dir):
    mode = Mode(name, args, out_dir)
    try:
        mode.start()
        report_path = os.path.join(out_dir, f"gauntlet-{name}.json")
        command = [args.keepwarm, "bench", "gauntlet", "--workload", workload, "-m", args.model,
                   "--target", f"{name}=http://127.0.0.1:{mode.proxy_port}", "--baseline", name,
                   "--json", report_path]
        print(f"routing-gauntlet: {name}: {len(mode.server_ports)} server(s), the gauntlet through the proxy",
              file=sys.stderr, flush=True)
        started = time.monotonic()
        with open(os.path.join(out_dir, f"{name}-gauntlet.log"), "w") as log:
            result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            sys.exit(f"routing-gauntlet: the gauntlet failed for {name} (see {name}-gauntlet.log)")
        wall_s = time.monotonic() - started
        with open(report_path) as f:
            report = json.load(f)
        proxy = metrics(mode.proxy_port)
        prompt, reused, rate = hit_rate(report)
        summary = report["targets"][0]
        return {
            "mode": name, "servers": len(mode.server_ports), "wall_s": round(wall_s, 1),
            "requests": summary["requests"], "failures": summary["failures"],
            "prompt_tokens": prompt, "reused_tokens": reused, "hit_rate": rate,
            "computed_tokens": summary["computed_tokens"], "ideal_tokens": summary["ideal_tokens"],
            "routing": {
                "requests": summed(proxy, "keepwarm_proxy_requests_total"),
                "exact_hits": summed(proxy, "keepwarm_proxy_exact_hits_total"),
                "prefix_hits": summed(proxy, "keepwarm_proxy_prefix_hits_total"),
                "rebalanced": summed(proxy, "keepwarm_proxy_rebalanced_total"),
                "kv_events_resyncs": summed(proxy, "keepwarm_proxy_kv_events_resyncs_total"),
                "per_server_requests": [v for (n, _), v in sorted(proxy.items())
                                        if n == "keepwarm_proxy_requests_total"],
            },
        }
    finally:
        mode.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--keepwarm", default=os.path.join(ROOT, "build", "keepwarm"))
    parser.add_argument("--servers", type=int, default=3, help="small servers (one-server gets their memory)")
    parser.add_argument("--ctx", type=int, default=32768, help="context of each small server")
    parser.add_argument("--slots", type=int, default=2, help="slots of each small server")
    parser.add_argument("--cache-ram", default="64MiB", help="RAM tier of each small server")
    parser.add_argument("--threads", type=int, default=1, help="threads of every server")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out-dir", default="routing-gauntlet")
    args, generator = parser.parse_known_args()
    generator = [g for g in generator if g != "--"]
    modes = args.modes.split(",")
    if "one-server" not in modes or any(m not in MODES for m in modes):
        sys.exit(f"routing-gauntlet: --modes lists some of {', '.join(MODES)}, one-server among them")
    os.makedirs(args.out_dir, exist_ok=True)

    workload = os.path.join(args.out_dir, "workload.jsonl")
    subprocess.run([args.keepwarm, "bench", "gauntlet", "--generate", workload, "-m", args.model,
                    *WORKLOAD_DEFAULTS, *generator], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    results = [run_mode(m, args, workload, args.out_dir) for m in modes]
    reference = next(r for r in results if r["mode"] == "one-server")["hit_rate"]
    print(f"commit {commit}; {args.servers} servers of -c {args.ctx} --parallel {args.slots} --cache-ram "
          f"{args.cache_ram} (one-server: {args.servers}x each), -t {args.threads}, no disk tier")
    print(f"{'mode':<11} {'reqs':>5} {'fail':>4} {'prompt':>8} {'reused':>8} {'computed':>8} {'hit rate':>8} "
          f"{'vs one':>7} {'comp/ideal':>10} {'by events':>9} {'by prefix':>9} {'per server':>16} {'wall s':>7}")
    for r in results:
        r["hit_rate_over_one_server"] = r["hit_rate"] / reference if reference else None
        per_server = "/".join(str(int(n)) for n in r["routing"]["per_server_requests"])
        print(f"{r['mode']:<11} {r['requests']:>5} {r['failures']:>4} {r['prompt_tokens']:>8} "
              f"{r['reused_tokens']:>8} {r['computed_tokens']:>8} {r['hit_rate']:>8.3f} "
              f"{r['hit_rate_over_one_server']:>7.3f} {r['computed_tokens'] / r['ideal_tokens']:>10.2f} "
              f"{int(r['routing']['exact_hits']):>9} "
              f"{int(r['routing']['prefix_hits']):>9} {per_server:>16} {r['wall_s']:>7}")
    with open(os.path.join(args.out_dir, "routing-gauntlet.json"), "w") as f:
        json.dump({"commit": commit, "command": sys.argv, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
