#!/usr/bin/env python3
# What a hybrid model's recurrent-state snapshots (serve --spec-rollback-tokens, docs/speculative.md#hybrid-models)
# cost a decode step: tokens/s of 256-token answers at temperature 1 on two servers side by side, one with the
# snapshots (the default) and drafting off per request (speculative.n_max 0), one with --spec-rollback-tokens 0; and
# the first server with drafting on (its drafts are mostly wrong at temperature 1). The servers take turns.
#   python3 bench/hybrid-snapshot-decode.py build/keepwarm MODEL.gguf [REPS]
import json, subprocess, sys, time, urllib.request, statistics
kw, model = sys.argv[1], sys.argv[2]
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
def start(port, extra):
    p = subprocess.Popen([kw, 'serve', '-m', model, '--port', str(port), '-c', '8192', '--parallel', '1', '-t', '2'] + extra,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            urllib.request.urlopen(f'http://127.0.0.1:{port}/health', timeout=1); return p
        except Exception: time.sleep(0.2)
    raise SystemExit('no server')
def run(port, i, nmax):
    body = {'prompt': f'Tell me about the number {i} and everything after it.', 'n_predict': 256, 'temperature': 1.0,
            'seed': 1000 + i, 'ignore_eos': True, 'cache_prompt': False, 'speculative.n_max': nmax}
    r = urllib.request.urlopen(urllib.request.Request(f'http://127.0.0.1:{port}/completion', json.dumps(body).encode(),
                                                      {'Content-Type': 'application/json'}), timeout=600)
    t = json.load(r)['timings']
    return t['predicted_per_second'], t.get('draft_n', 0)
servers = {'snapshots (default), n_max 0': (18081, [], 0), 'no snapshots (--spec-rollback-tokens 0)': (18082, ['--spec-rollback-tokens', '0'], 0),
           'snapshots, drafting on (temp 1)': (18081, [], -1)}
procs = [start(18081, ['--cache-disk', '0']), start(18082, ['--spec-rollback-tokens', '0', '--cache-disk', '0'])]
res = {k: [] for k in servers}
try:
    for i in range(reps):
        for name, (port, _, nmax) in servers.items():
            tps, dn = run(port, i, nmax if nmax >= 0 else 16)
            res[name].append(tps)
    for name, v in res.items():
        print(f'{name}: median {statistics.median(v):.1f} tok/s ({min(v):.1f}-{max(v):.1f}), {len(v)} runs')
finally:
    for p in procs: p.terminate()
