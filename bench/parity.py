#!/usr/bin/env python3
"""Side-by-side throughput of keepwarm and the pinned llama-bench on the same llama.cpp libraries.

Run through bench/parity.sh, which builds llama-bench (bench/build-llama-bench.sh), finds keepwarm and
generates the model. Python standard library only.

Both sides get the same model, threads, KV cache types, n_batch 2048, n_ubatch 512 and flash attention
"auto" (llama-bench's defaults, passed explicitly to both). Runs alternate: per rep and test, one
llama-bench -r 1 run (after its own warm-up) right next to one keepwarm request, llama-bench first on even reps and
keepwarm first on odd ones, so drift in machine load hits both sides alike; each rep gives a ratio.

  prefill: llama-bench pp<P> (one batch of P random tokens into an empty KV cache) vs keepwarm
           POST /v1/completions with a P-token prompt, max_tokens 1: timings.prompt_per_second. Each request
           starts with a different word so that nothing is reused from the slot's cached prefix (checked:
           cache_n must be 0 and prompt_n must be P).
  decode:  llama-bench tg<N> (N single-token decodes) vs keepwarm with a short prompt, max_tokens N,
           ignore_eos: timings.predicted_per_second (= predicted_n / predicted_ms). keepwarm's predicted_ms
           runs from the first generated token to the last, which spans predicted_n - 1 decodes, so the
           results also give decode steps/s = (predicted_n - 1) / predicted_ms, the like-for-like number.

--spec-traffic (speculative decoding on ordinary traffic, issue 36): instead of llama-bench, four servers side by
side on the same model and settings: keepwarm with its default drafting, keepwarm --spec-type none, llama-server
(which does not draft by default) and llama-server --spec-type ngram-mod. Each gets the same prompts (--prompts of
them, a distinct lead word each, so no prompt is cached) and decodes the random model's own answer: max_tokens N,
ignore_eos, temperature 0, where drafts are almost never right. Per prompt the four take turns in an order that
rotates, so drift in machine load hits all alike. Decode tokens/s = (predicted_n - 1) / predicted_ms: the tokens
after the first (which comes from the prefill), the like-for-like number. Also the drafts (timings.draft_n,
draft_n_accepted). The goal it serves: keepwarm drafting within 3% of keepwarm not drafting, and no worse than
llama-server with or without ngram-mod.
"""

import argparse
import datetime
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

# Distinct first words: a request never shares its first token with an earlier one, so keepwarm's prefix
# cache cannot skip any of its prompt.
LEAD_WORDS = """Apple Bridge Candle Desert Engine Forest Garden Harbor Island Jungle Kettle Ladder Meadow Needle
Orchard Pepper Quarry River Saddle Tunnel Valley Window Yellow Zephyr Anchor Basket Castle Dragon Empire Falcon
Glacier Hammer Insect Jacket Kitten Lantern Marble Napkin Oyster Pirate Rabbit Silver Thunder Umbrella Violin
Walnut Bottle Canyon Dolphin Feather Goblet Helmet Igloo Jigsaw Koala Lemon Mirror Nectar Otter Parrot Quiver
Rocket Sunset Tiger Unicorn Vessel Wizard Yogurt Zebra""".split()
FILLER = """the quick brown fox jumps over the lazy dog while a small bird sings in the tall green tree near
the old stone house by the river and the children play in the warm summer light until the sun goes down
behind the distant hills""".split()


def log(msg):
    print(f"parity: {msg}", file=sys.stderr, flush=True)


def physical_cores():
    """Physical cores, like llama.cpp's default thread count (common_cpu_get_num_math)."""
    try:
        pairs, phys, core = set(), None, None
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                elif not line.strip():
                    if core is not None:
                        pairs.add((phys, core))
                    phys = core = None
        if core is not None:
            pairs.add((phys, core))
        if pairs:
            return len(pairs)
    except OSError:
        pass
    return os.cpu_count() or 1


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------------------------
# llama-bench


def run_llama_bench(args, kv, test):
    """One llama-bench run (-r 1, after its own warm-up) of just pp (test "pp") or just tg (test "tg")."""
    n_prompt, n_gen = (args.n_prompt, 0) if test == "pp" else (0, args.n_gen)
    cmd = [args.llama_bench, "-m", args.model, "-p", str(n_prompt), "-n", str(n_gen),
           "-t", str(args.threads), "-ctk", kv, "-ctv", kv, "-b", str(args.batch), "-ub", str(args.ubatch),
           "-fa", "auto", "-r", "1", "-o", "json"]
    t0 = time.time()
    # cwd=/ : ggml's loader also scans the cwd for backends; keep it to the binary's own lib/ directory.
    p = subprocess.run(cmd, capture_output=True, text=True, cwd="/")
    if p.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-4000:]}")
    rows = json.loads(p.stdout)
    out = {"cmd": cmd, "wall_s": round(time.time() - t0, 2),
           "backend": next((l.split(" from ")[-1] for l in p.stderr.splitlines() if "loaded CPU backend" in l), None)}
    for r in rows:
        if r["n_prompt"] > 0 and r["n_gen"] == 0:
            out["pp"] = r["avg_ts"]
        elif r["n_gen"] > 0 and r["n_prompt"] == 0:
            out["tg"] = r["avg_ts"]
        out["build_commit"] = r.get("build_commit")
        out["model_type"] = r.get("model_type")
        out["flash_attn"] = r.get("flash_attn")
    return out


# ---------------------------------------------------------------------------------------------------------------
# keepwarm



def stop_process(proc):
    """SIGTERM, then SIGKILL after 30 s: a server started by this bench, if it still runs."""
    if proc and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

class KeepwarmServer:
    def __init__(self, args, kv):
        self.cmd = [args.keepwarm, "serve", "-m", args.model, "--host", "127.0.0.1", "--port", "0",
                    "-t", str(args.threads), "-c", str(args.ctx), "-np", "1", "-b", str(args.batch),
                    "-ub", str(args.ubatch), "-ctk", kv, "-ctv", kv]
        self.proc = None
        self.url = None
        self.banner = []

    def __enter__(self):
        log("starting: " + " ".join(self.cmd))
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     cwd="/")
        deadline = time.time() + 300
        found = threading.Event()

        def pump():
            for line in self.proc.stdout:
                if not found.is_set():
                    self.banner.append(line.rstrip())
                    m = re.search(r"listening on (http://\S+)", line)
                    if m:
                        self.url = m.group(1).rstrip("/")
                        found.set()
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        while not found.wait(0.2):
            if time.time() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError("keepwarm serve did not print 'listening on' within 300 s")
        if not self.url:
            self.proc.wait(timeout=10)
            raise RuntimeError(f"keepwarm serve exited ({self.proc.returncode}):\n" + "\n".join(self.banner[-30:]))
        return self

    def __exit__(self, *exc):
        stop_process(self.proc)

    def post(self, path, body, timeout=600):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"POST {path} -> HTTP {e.code}: {e.read().decode(errors='replace')[:2000]}") from None


def rate(n, ms):
    return n * 1000.0 / ms if ms and ms > 0 else None


class KeepwarmBench:
    def __init__(self, server, args):
        self.s = server
        self.args = args
        self.lead = 0
        self.n_filler = args.n_prompt  # words; corrected after each request from the prompt's token count
        self.ignore_eos = True
        self.warnings = []
        self.bos_shared = False

    def screen_leads(self):
        """Keeps the lead words that tokenize to the most common length (usually one token) at the start of a
        prompt, so that every measured prompt has the same length. Each probe is a tiny prompt (the word alone)."""
        counts = {}
        for w in LEAD_WORDS:
            _, t, _ = self.complete(w, 1)
            counts[w] = t.get("prompt_n", 0) + t.get("cache_n", 0)
        modal = statistics.mode(counts.values())
        # The slot now caches the last probe: never start a measured prompt with that word.
        self.leads = [w for w in LEAD_WORDS[:-1] if counts[w] == modal]
        self.n_filler = max(1, self.args.n_prompt - modal)  # first guess: one token per filler word
        log(f"{len(self.leads)} of {len(LEAD_WORDS)} lead words are {modal} token(s) long at the start of a prompt")

    def next_lead(self):
        leads = getattr(self, "leads", None) or LEAD_WORDS
        # Suffixed after the first round ("Apple2"), which may change the length: prefill() then corrects it.
        w = leads[self.lead % len(leads)] + ("" if self.lead < len(leads) else str(self.lead // len(leads) + 1))
        self.lead += 1
        return w

    def prompt(self, n_words):
        return self.next_lead() + " " + " ".join(FILLER[i % len(FILLER)] for i in range(n_words))

    def complete(self, prompt, max_tokens, ignore_eos=False):
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        if ignore_eos and self.ignore_eos:
            body["ignore_eos"] = True
        t0 = time.time()
        try:
            r = self.s.post("/v1/completions", body)
        except RuntimeError as e:
            if "ignore_eos" in body and "ignore_eos" in str(e):
                self.ignore_eos = False
                self.warnings.append(f"server rejected ignore_eos ({e}); decoding without it")
                log(self.warnings[-1])
                return self.complete(prompt, max_tokens)
            raise
        wall_ms = (time.time() - t0) * 1000
        t = r.get("timings")
        if not t:
            raise RuntimeError(f"response has no 'timings' object: {json.dumps(r)[:500]}")
        return r, t, wall_ms

    def prefill(self, attempts=6):
        """One measured prefill of exactly n_prompt new tokens (retries with a corrected length)."""
        target = self.args.n_prompt
        for _ in range(attempts):
            r, t, wall_ms = self.complete(self.prompt(self.n_filler), 1)
            n = t.get("prompt_n", 0)
            cache_n = t.get("cache_n", 0)
            total = n + cache_n
            if total != target:  # filler words are one token each with most vocabularies: fix the count
                self.n_filler = max(1, self.n_filler + (target - total))
            # cache_n 1: a BOS token shared with the previous prompt (vocabularies that add one); nothing else may
            # be reused.
            if total == target and cache_n <= (1 if self.bos_shared else 0):
                return {"prompt_n": n, "cache_n": cache_n, "prompt_ms": t.get("prompt_ms"),
                        "tps": t.get("prompt_per_second") or rate(n, t.get("prompt_ms")),
                        "wall_ms": round(wall_ms, 1)}
            log(f"prefill prompt gave prompt_n={n} cache_n={cache_n} (want {target} in all, none reused); "
                f"adjusting and retrying")
        raise RuntimeError(f"could not make a prompt of exactly {target} new tokens (last: prompt_n={n}, "
                           f"cache_n={cache_n})")

    def decode(self):
        target = self.args.n_gen
        r, t, wall_ms = self.complete(self.next_lead() + " once upon a time", target, ignore_eos=True)
        n, ms = t.get("predicted_n", 0), t.get("predicted_ms")
        if n < target:
            self.warnings.append(f"decode stopped after {n} of {target} tokens "
                                 f"(finish_reason {r.get('choices', [{}])[0].get('finish_reason')})")
            log(self.warnings[-1])
        return {"predicted_n": n, "predicted_ms": ms,
                "tps": t.get("predicted_per_second") or rate(n, ms),
                "steps_tps": rate(n - 1, ms) if n > 1 else None,
                "wall_ms": round(wall_ms, 1)}


# ---------------------------------------------------------------------------------------------------------------
# --spec-traffic: drafting on ordinary traffic, keepwarm and llama-server side by side

SPEC_SERVERS = ("keepwarm", "keepwarm-spec-none", "llama-server", "llama-server-ngram-mod")
# With --spec-draft-model FILE: both servers drafting with that draft model (-md).
DRAFT_MODEL_SERVERS = ("keepwarm-draft-model", "llama-server-draft-model")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spec_server_cmd(name, args, port):
    common = ["-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads), "-c",
              str(args.ctx), "-np", "1", "-b", str(args.batch), "-ub", str(args.ubatch), "-ctk", args.spec_kv, "-ctv",
              args.spec_kv]
    if name.startswith("keepwarm"):
        cmd = [args.keepwarm, "serve", *common, "--cache-disk", "0"]
        if name == "keepwarm-draft-model":
            return cmd + ["-md", args.spec_draft_model]
        return cmd + (["--spec-type", "none"] if name == "keepwarm-spec-none" else [])
    cmd = [args.llama_server, *common, "-fa", "auto"]
    if name == "llama-server-draft-model":
        return cmd + ["-md", args.spec_draft_model]
    return cmd + (["--spec-type", "ngram-mod"] if name == "llama-server-ngram-mod" else [])


class SpecServer:
    """One server process on a port of its own, ready once /health answers 200."""

    def __init__(self, name, args, work_dir):
        self.name = name
        self.port = free_port()
        self.cmd = spec_server_cmd(name, args, self.port)
        self.log_path = os.path.join(work_dir, f"spec-traffic-{name}.log")
        self.proc = None

    def __enter__(self):
        log(f"starting {self.name}: " + " ".join(self.cmd))
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd="/")
        deadline = time.time() + 300
        while True:
            if self.proc.poll() is not None:
                with open(self.log_path) as f:
                    tail = f.read()[-3000:]
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) before it was ready:\n{tail}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            if time.time() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError(f"{self.name} was not ready within 300 s (log: {self.log_path})")
            time.sleep(0.25)

    def __exit__(self, *exc):
        stop_process(self.proc)
        self.log.close()

    def decode(self, prompt, n_gen, temperature=0.0):
        # Seeded, so that each server samples the same way at a temperature above 0.
        body = {"prompt": prompt, "max_tokens": n_gen, "temperature": temperature, "seed": 7, "ignore_eos": True}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=1800) as r:
                reply = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{self.name}: HTTP {e.code}: {e.read().decode(errors='replace')[:2000]}") from None
        t = reply.get("timings") or {}
        return {"predicted_n": t.get("predicted_n", 0), "predicted_ms": t.get("predicted_ms") or 0,
                "draft_n": t.get("draft_n", 0), "draft_n_accepted": t.get("draft_n_accepted", 0)}


def spec_traffic(args):
    """Decode tokens/s of the four servers on the same prompts; returns the results object."""
    work_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(work_dir, exist_ok=True)
    prompts = [LEAD_WORDS[i % len(LEAD_WORDS)] + ("" if i < len(LEAD_WORDS) else str(i // len(LEAD_WORDS) + 1)) +
               " " + " ".join(FILLER[(i + j) % len(FILLER)] for j in range(args.spec_prompt_words))
               for i in range(args.spec_prompts + 1)]
    results = {
        "mode": "spec-traffic",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "physical_cores": physical_cores(),
                    "loadavg_start": loadavg()},
        "model": args.model,
        "settings": {"threads": args.threads, "n_gen": args.n_gen, "prompts": args.spec_prompts, "kv": args.spec_kv,
                     "ctx": args.ctx, "n_batch": args.batch, "n_ubatch": args.ubatch},
        "servers": {},
    }
    names = [n.strip() for n in args.spec_servers.split(",") if n.strip()]
    known = SPEC_SERVERS + (DRAFT_MODEL_SERVERS if args.spec_draft_model else ())
    for n in names:
        if n not in known:
            raise SystemExit(f"parity: unknown server {n} (--spec-servers: {', '.join(known)}; the draft-model ones "
                             "need --spec-draft-model)")
    samples = {name: [] for name in names}
    failed = {}  # a server that answered an error: recorded with it, and out of the later prompts

    def decode(s, *a):
        if s.name in failed:
            return None
        try:
            return s.decode(*a)
        except RuntimeError as e:
            failed[s.name] = str(e)[:500]
            log(f"{s.name} failed and sits out the rest of the run: {failed[s.name]}")
            return None

    servers = []
    try:
        for name in names:
            servers.append(SpecServer(name, args, work_dir).__enter__())
        for s in servers:
            decode(s, prompts[-1], 8)  # warm-up, on a prompt the measured ones do not share
        for i, prompt in enumerate(prompts[:-1]):
            order = servers[i % len(servers):] + servers[:i % len(servers)]
            line = []
            for s in order:
                r = decode(s, prompt, args.n_gen, args.spec_temperature)
                if r is None:
                    continue
                samples[s.name].append((i, r))
                line.append(f"{s.name} {rate(r['predicted_n'] - 1, r['predicted_ms']) or 0:.1f}")
            log(f"prompt {i + 1}/{args.spec_prompts}: decode tokens/s " + ", ".join(line))
    finally:
        for s in reversed(servers):
            s.__exit__(None, None, None)
    results["machine"]["loadavg_end"] = loadavg()
    for s in servers:
        results["servers"][s.name] = {"cmd": s.cmd, "failed": failed.get(s.name)}
    for name, indexed in samples.items():
        rs = [r for _, r in indexed]
        tokens = sum(max(r["predicted_n"] - 1, 0) for r in rs)
        ms = sum(r["predicted_ms"] for r in rs)
        per_prompt = [rate(r["predicted_n"] - 1, r["predicted_ms"]) for r in rs if r["predicted_n"] > 1]
        results["servers"][name].update({
            "decode_tokens": tokens, "decode_ms": round(ms, 1), "decode_tokens_per_second": rate(tokens, ms),
            "median_of_prompts": statistics.median(per_prompt) if per_prompt else None,
            "draft_n": sum(r["draft_n"] for r in rs), "draft_n_accepted": sum(r["draft_n_accepted"] for r in rs),
            "samples": [round(x, 2) for x in per_prompt]})

    def ratio(a, b):
        # The median of per-prompt ratios: each pair ran next to each other.
        ys = dict(samples[b])
        pairs = [rate(x["predicted_n"] - 1, x["predicted_ms"]) / rate(y["predicted_n"] - 1, y["predicted_ms"])
                 for i, x in samples[a] for y in [ys.get(i)]
                 if y and x["predicted_n"] > 1 and y["predicted_n"] > 1 and x["predicted_ms"] and y["predicted_ms"]]
        return statistics.median(pairs) if pairs else None

    comparisons = [("keepwarm", "keepwarm-spec-none", 0.97), ("keepwarm", "llama-server", 1.0),
                   ("keepwarm", "llama-server-ngram-mod", 1.0), ("keepwarm-spec-none", "llama-server", None),
                   ("llama-server-ngram-mod", "llama-server", None),
                   ("keepwarm-draft-model", "keepwarm-spec-none", None),
                   ("keepwarm-draft-model", "llama-server-draft-model", None),
                   ("llama-server-draft-model", "llama-server", None)]
    results["ratios"] = [{"numerator": a, "denominator": b, "median_of_prompts": ratio(a, b), "goal": goal}
                         for a, b, goal in comparisons if a in samples and b in samples]

    def f(x, d=1):
        return "-" if x is None else f"{x:.{d}f}"

    lines = ["| server | decode tokens/s | median of prompts | draft_n | accepted |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name in names:
        r = results["servers"][name]
        lines.append(f"| {name} | {f(r['decode_tokens_per_second'], 2)} | {f(r['median_of_prompts'], 2)} | "
                     f"{r['draft_n']} | {r['draft_n_accepted']} |")
    lines += [f"| {name}: failed after {len(samples[name])} prompts | {failed[name][:200]} | | | |"
              for name in names if name in failed]
    lines += ["", "| ratio | median of per-prompt ratios | goal |", "| --- | ---: | --- |"]
    for r in results["ratios"]:
        goal = "-" if r["goal"] is None else f">= {r['goal']:.2f}"
        met = "" if r["goal"] is None or r["median_of_prompts"] is None else (
            " (met)" if r["median_of_prompts"] >= r["goal"] else " (NOT met)")
        lines.append(f"| {r['numerator']} / {r['denominator']} | {f(r['median_of_prompts'], 3)} | {goal}{met} |")
    results["table_md"] = "\n".join(lines)
    notes = [
        f"Model {os.path.basename(args.model)}, {args.threads} threads, KV {args.spec_kv}, {args.spec_prompts} prompts "
        f"of ~{args.spec_prompt_words} words, {args.n_gen} tokens each (ignore_eos, temperature {args.spec_temperature:g}"
        f"{': the random model' + chr(39) + 's own greedy answers' if args.spec_temperature == 0 else ', seed 7: noise the drafts cannot guess'}), one slot per server, the four taking turns per prompt in a rotating order.",
        f"Machine: {results['machine']['cpu']}, {results['machine']['logical_cpus']} CPUs, load average "
        f"{results['machine']['loadavg_start']} -> {results['machine']['loadavg_end']}.",
        "decode tokens/s = (predicted_n - 1) / predicted_ms summed over the prompts; ratios are medians of "
        "per-prompt ratios.",
    ] + [f"{name}: `" + " ".join(results["servers"][name]["cmd"]) + "`" for name in names]
    return results, notes


# ---------------------------------------------------------------------------------------------------------------


def summarize(lb, kw):
    med = lambda xs: statistics.median(xs) if xs else None
    ratios = [k / l for l, k in zip(lb, kw) if l and k]
    best_lb, best_kw = max(filter(None, lb), default=None), max(filter(None, kw), default=None)
    return {"llama_bench": med(lb), "keepwarm": med(kw), "ratio_median_of_pairs": med(ratios),
            "llama_bench_best": best_lb, "keepwarm_best": best_kw,
            "ratio_of_best": best_kw / best_lb if best_lb and best_kw else None,
            "ratio_pairs": [round(x, 4) for x in ratios],
            "llama_bench_samples": [round(x, 2) for x in lb], "keepwarm_samples": [round(x, 2) for x in kw]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bench", help="llama-bench binary (not needed with --spec-traffic)")
    ap.add_argument("--spec-traffic", action="store_true",
                    help="decode tokens/s of keepwarm with and without drafting and llama-server with and without "
                         "--spec-type ngram-mod on the random model's own answers (see above)")
    ap.add_argument("--llama-server", help="llama-server binary (--spec-traffic)")
    ap.add_argument("--spec-prompts", type=int, default=8, help="--spec-traffic: prompts, each decoded by all four")
    ap.add_argument("--spec-prompt-words", type=int, default=200, help="--spec-traffic: words per prompt")
    ap.add_argument("--spec-temperature", type=float, default=0.0,
                    help="--spec-traffic: sampling temperature (0: greedy answers, which a random model repeats; 1: "
                    "noise, where drafts are never right)")
    ap.add_argument("--spec-kv", default="f16", help="--spec-traffic: the KV cache type of all four")
    ap.add_argument("--spec-draft-model",
                    help="--spec-traffic: a draft model (GGUF) for the servers keepwarm-draft-model and "
                         "llama-server-draft-model (-md), named in --spec-servers")
    ap.add_argument("--spec-servers", default=",".join(SPEC_SERVERS),
                    help="--spec-traffic: which of the four, comma separated (default: all)")
    ap.add_argument("--keepwarm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=physical_cores())
    ap.add_argument("--kv", default="f16,q8_0", help="KV cache types to compare, comma separated (K and V alike)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2048, help="n_batch (llama-bench default 2048)")
    ap.add_argument("--ubatch", type=int, default=512, help="n_ubatch (llama-bench default 512)")
    ap.add_argument("--ctx", type=int, default=4096, help="keepwarm --ctx-size")
    ap.add_argument("--out", required=True, help="JSON results file (a .md table is written next to it)")
    args = ap.parse_args()
    if args.spec_traffic:
        if not args.llama_server:
            ap.error("--spec-traffic needs --llama-server")
        args.llama_server = os.path.abspath(args.llama_server)
        args.keepwarm = os.path.abspath(args.keepwarm)
        args.model = os.path.abspath(args.model)
        if args.spec_draft_model:
            args.spec_draft_model = os.path.abspath(args.spec_draft_model)
        results, notes = spec_traffic(args)
        with open(args.out, "w") as fo:
            json.dump(results, fo, indent=2)
        md = os.path.splitext(args.out)[0] + ".md"
        with open(md, "w") as fo:
            fo.write(results["table_md"] + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
        print(results["table_md"])
        print()
        for n in notes:
            print(n)
        print(f"\nresults: {args.out} (and {md})")
        return
    if not args.llama_bench:
        ap.error("--llama-bench is required (or --spec-traffic)")
    args.llama_bench = os.path.abspath(args.llama_bench)
    args.keepwarm = os.path.abspath(args.keepwarm)
    args.model = os.path.abspath(args.model)

    results = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "physical_cores": physical_cores(),
                    "loadavg_start": loadavg()},
        "model": args.model, "model_bytes": os.path.getsize(args.model),
        "settings": {"threads": args.threads, "n_prompt": args.n_prompt, "n_gen": args.n_gen, "n_batch": args.batch,
                     "n_ubatch": args.ubatch, "flash_attn": "auto", "reps": args.reps, "keepwarm_ctx": args.ctx,
                     "keepwarm_parallel": 1},
        "runs": [],
        "warnings": [],
    }
    rows = []
    for kv in [k.strip() for k in args.kv.split(",") if k.strip()]:
        run = {"kv": kv, "reps": []}
        with KeepwarmServer(args, kv) as server:
            run["keepwarm_cmd"] = server.cmd
            run["keepwarm_banner"] = server.banner
            kb = KeepwarmBench(server, args)
            # Warm-up (llama-bench warms up inside each run too); also finds the prompt length in words.
            log(f"[{kv}] keepwarm warm-up")
            kb.screen_leads()
            # One-letter prompts with different letters share nothing but a BOS token, if the vocabulary adds one.
            kb.bos_shared = kb.complete("Q", 1)[1].get("cache_n", 0) == 1 and \
                kb.complete("M", 1)[1].get("cache_n", 0) == 1
            kb.prefill()
            kb.decode()
            # Each keepwarm measurement sits right next to the llama-bench run of the same test, and the order
            # flips every rep (llama-bench first, then keepwarm first) so a trend in machine load cancels out.
            for rep in range(args.reps):
                lb_first = rep % 2 == 0
                rec = {"order": "llama-bench first" if lb_first else "keepwarm first", "llama_bench": {}}
                for test in ("pp", "tg"):
                    for side in (("lb", "kw") if lb_first else ("kw", "lb")):
                        if side == "lb":
                            r = run_llama_bench(args, kv, test)
                            rec["llama_bench"][test] = r.pop(test, None)
                            rec["llama_bench"].setdefault("runs", []).append(r)
                        elif test == "pp":
                            rec["keepwarm_prefill"] = kb.prefill()
                        else:
                            rec["keepwarm_decode"] = kb.decode()
                rec["loadavg"] = loadavg()
                lb, pp, tg = rec["llama_bench"], rec["keepwarm_prefill"], rec["keepwarm_decode"]
                log(f"[{kv}] rep {rep + 1}/{args.reps}: pp llama-bench {lb['pp']:.1f} keepwarm {pp['tps']:.1f} t/s; "
                    f"tg llama-bench {lb['tg']:.1f} keepwarm {tg['tps']:.1f} t/s (load {rec['loadavg']})")
                run["reps"].append(rec)
            results["warnings"] += [f"[{kv}] {w}" for w in kb.warnings]
        reps = run["reps"]
        run["llama_bench_cmds"] = [r["cmd"] for r in reps[0]["llama_bench"]["runs"]] if reps else []
        run["pp"] = summarize([r["llama_bench"].get("pp") for r in reps], [r["keepwarm_prefill"]["tps"] for r in reps])
        run["tg"] = summarize([r["llama_bench"].get("tg") for r in reps], [r["keepwarm_decode"]["tps"] for r in reps])
        run["tg_steps"] = summarize([r["llama_bench"].get("tg") for r in reps],
                                    [r["keepwarm_decode"]["steps_tps"] for r in reps])
        results["runs"].append(run)
        P, N = args.n_prompt, args.n_gen
        rows.append((f"pp{P}", kv, run["pp"]))
        rows.append((f"tg{N}", kv, run["tg"]))
        rows.append((f"tg{N} steps", kv, run["tg_steps"]))
    results["machine"]["loadavg_end"] = loadavg()
    first = results["runs"][0]["reps"][0]["llama_bench"]["runs"][0] if results["runs"] and results["runs"][0]["reps"] else {}
    results["llama_bench_build"] = first.get("build_commit")
    results["cpu_backend"] = first.get("backend")
    results["model_type"] = first.get("model_type")

    def f(x, d=1):
        return "-" if x is None else f"{x:.{d}f}"

    head = ("| test | KV | llama-bench t/s | keepwarm t/s | ratio (median of pairs) | per-rep ratios "
            "| best llama-bench | best keepwarm | ratio of bests |")
    lines = [head, "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for test, kv, s in rows:
        lines.append(f"| {test} | {kv} | {f(s['llama_bench'])} | {f(s['keepwarm'])} | "
                     f"{f(s['ratio_median_of_pairs'], 3)} | {', '.join(f'{x:.3f}' for x in s['ratio_pairs'])} | "
                     f"{f(s['llama_bench_best'])} | {f(s['keepwarm_best'])} | {f(s['ratio_of_best'], 3)} |")
    st = results["settings"]
    notes = [
        f"Model {os.path.basename(args.model)} ({results.get('model_type')}), {st['threads']} threads, "
        f"n_batch {st['n_batch']}, n_ubatch {st['n_ubatch']}, flash attention auto, {st['reps']} alternating reps "
        f"(t/s columns: medians; ratio: median of the per-rep keepwarm/llama-bench ratios; the best-of columns "
        f"are the least disturbed runs on a shared machine).",
        f"Machine: {results['machine']['cpu']}, {results['machine']['logical_cpus']} CPUs, load average "
        f"{results['machine']['loadavg_start']} -> {results['machine']['loadavg_end']}; CPU backend "
        f"{os.path.basename(results.get('cpu_backend') or '?')}; llama.cpp build {results.get('llama_bench_build')}.",
        "keepwarm tg = timings.predicted_per_second (predicted_n / predicted_ms); 'tg steps' = (predicted_n - 1) / "
        "predicted_ms, the decodes actually inside predicted_ms, comparable to llama-bench's tg.",
    ]
    if results["runs"]:
        r0 = results["runs"][0]
        for c in r0["llama_bench_cmds"]:
            notes.append("llama-bench: `" + " ".join(c) + "`")
        notes.append("keepwarm: `" + " ".join(r0["keepwarm_cmd"]) + "`")
    results["table_md"] = "\n".join(lines)

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fo:
        json.dump(results, fo, indent=2)
    md = os.path.splitext(args.out)[0] + ".md"
    with open(md, "w") as fo:
        fo.write(results["table_md"] + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
        for w in results["warnings"]:
            fo.write(f"- WARNING: {w}\n")
    print(results["table_md"])
    print()
    for n in notes:
        print(n)
    for w in results["warnings"]:
        print("WARNING:", w)
    print(f"\nresults: {args.out} (and {md})")


if __name__ == "__main__":
    main()
