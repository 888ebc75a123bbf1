#!/usr/bin/env node
// keepwarm proxy under load, side by side: N concurrent streaming clients for S seconds against two `keepwarm serve`
// upstreams, each client sending each request either straight to its upstream or through the proxy, by a coin flip
// (so both paths see the same load at the same moments). Reports protocol errors, time to first
// token (p50/p99) direct and through the proxy and their difference, and the proxy's RSS over time (flat after
// warm-up or not), and the proxy's own account of what it added (its /metrics histograms, scraped when the warm-up
// ends and at the end, so the warm-up's connection openings are left out as they are from the TTFTs).
//
//   node bench/proxy-load.mjs --model tiny.gguf [--keepwarm build/keepwarm] [--clients 64] [--seconds 300]
//        [--warmup 30] [--max-tokens 8] [--slots N] [--threads 1] [--think-ms 0] [--json FILE]
//        [--proxy-cpus LIST] [--upstream-cpus LIST] [--cache-block N] [--kv-events]
//
// --slots is per upstream; the default, as many as there are clients, gives each client a slot of its own whichever
// upstream the proxy sends it to, so that its conversation's prefix stays there and a TTFT is the engine's short prefill plus the wait for the next batch, not a queue behind
// other clients' prompts (which would bury a millisecond of proxy under seconds of engine noise). --think-ms makes
// each client pause between its requests (uniformly 0 to twice that), as an agent does while it runs a tool: with
// the engines not saturated, a TTFT is mostly the short prefill and varies by milliseconds, not seconds.
//
// --proxy-cpus / --upstream-cpus pin the proxy and the upstreams (taskset -c LIST), so that on a small machine the
// proxy does not wait for a core the engines hold; run the clients with `taskset -c` too, on the upstreams' cores.
//
// Each client has a conversation of its own (a system prompt of ~150 tokens unique to it, then one short user turn
// per request), so the proxy routes all its requests to one upstream; the direct requests go to that same upstream
// (learnt from the proxy's x-keepwarm-upstream header). TTFT is measured at the client from sending the request to
// the first SSE chunk carrying content (a role-only chunk does not count), on raw node:http (no SDK in the timing).
//
// --kv-events: the upstreams publish their KV-cache events (`serve --kv-events tcp://*:PORT`, docs/kv-events.md) and
// the proxy routes by them (`--upstream URL,events=tcp://127.0.0.1:PORT`); the run then checks that no event is lost
// under the load (issue 38), and exits 1 if one was. Three witnesses:
// - the proxy's own counters, scraped every second from the moment both upstreams are first in step:
//   keepwarm_proxy_kv_events_resyncs_total stays 0 throughout (the proxy counts a fall out of step; before its first
//   snapshot an upstream was never in step, so a first subscription counts none, and a later snapshot, brought by
//   another subscriber, keeps it in step), keepwarm_proxy_kv_events_in_step stays 1, and
//   keepwarm_proxy_exact_hits_total ends above 0 (events did route); the proxy's index holds as many blocks per
//   medium as the upstream's listing at the end;
// - the upstreams' own: keepwarm_kv_events_resyncs_total{reason="overflow"} stays 0 (no report was dropped);
// - per upstream, an independent subscriber (tests/conformance/kv-events-subscriber.py --watch, written from vLLM's
//   and llm-d's wire format, not keepwarm's code) that counts messages, events and sequence gaps for the whole run
//   and, once the load has stopped and the stream is quiet, compares the index it rebuilt with the upstream's GET
//   /v1/cache/blocks.
// Blocks are --cache-block tokens (64 with --kv-events unless given: the default 256 is more than a client's whole
// prompt, which would leave no whole block to route by); give the same --cache-block to a run without events to
// compare. --python: an interpreter with python3-zmq and python3-msgpack (default /usr/bin/python3, Debian's).
// --drop-message N (a test of the bench): upstream 0's witness drops its Nth message, and the run must say so.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';

const args = {
    keepwarm: 'build/keepwarm', model: '', clients: 64, seconds: 300, warmup: 30, maxTokens: 8, slots: 0, thinkMs: 0,
    threads: 1, json: '', proxyCpus: '', upstreamCpus: '', cacheBlock: 0, kvEvents: false,
    python: fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3', dropMessage: 0,
};
for (let i = 2; i < process.argv.length; i++) {
    const key = process.argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (!(key in args)) {
        console.error(`proxy-load: unknown option ${process.argv[i]}`);
        process.exit(2);
    }
    if (typeof args[key] === 'boolean') {
        args[key] = true;
        continue;
    }
    const value = process.argv[++i];
    args[key] = typeof args[key] === 'number' ? Number(value) : value;
}
if (!args.model) {
    console.error('proxy-load: --model FILE.gguf is required');
    process.exit(2);
}
const log = (...m) => console.error('proxy-load:', ...m);

async function freePort() {
    const server = net.createServer();
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address();
    await new Promise((resolve) => server.close(resolve));
    return port;
}

// Starts a keepwarm process and resolves with its URL once it listens; pinned to `cpus` (taskset's list) if given.
function start(name, argv, cpus = '') {
    const [file, argList] = cpus ? ['taskset', ['-c', cpus, args.keepwarm, ...argv]] : [args.keepwarm, argv];
    const proc = spawn(file, argList, { stdio: ['ignore', 'pipe', 'pipe'] });
    const logFile = fs.createWriteStream(path.join(os.tmpdir(), `proxy-load-${name}.log`));
    let output = '';
    return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`${name} did not start:\n${output}`)), 120_000);
        const onData = (chunk) => {
            logFile.write(chunk);
            if (output.length < 100_000) output += chunk;
            const m = output.match(/listening on (http:\/\/[^\s]+)/);
            if (m && timer) {
                clearTimeout(timer);
                resolve({ url: m[1], proc, name });
            }
        };
        proc.stdout.on('data', onData);
        proc.stderr.on('data', onData);
        proc.on('exit', (code) => reject(new Error(`${name} exited with ${code}:\n${output}`)));
    });
}

// GET url+route as text (JSON parsed when `json`).
function get(url, route, json = false) {
    return new Promise((resolve, reject) => {
        http.get(new URL(route, url), (res) => {
            let body = '';
            res.setEncoding('utf8');
            res.on('data', (c) => { body += c; });
            res.on('end', () => {
                try {
                    resolve(json ? JSON.parse(body) : body);
                } catch (e) {
                    reject(e);
                }
            });
        }).on('error', reject);
    });
}

// A Prometheus text sample's value: `name{labels} value`, the labels matched whole as written ('reason="overflow"').
function sample(text, name, labels = '') {
    const escaped = (name + (labels ? `{${labels}}` : '')).replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    const m = text.match(new RegExp(`^${escaped} (\\S+)$`, 'm'));
    return m ? Number(m[1]) : null;
}

// The independent subscriber of one upstream's events (kv-events-subscriber.py --watch): resolves once a snapshot
// has put it in step; verdict() stops it and resolves with what it found.
async function startWitness(name, endpoint, serverUrl, dropMessage) {
    const script = fileURLToPath(new URL('../tests/conformance/kv-events-subscriber.py', import.meta.url));
    const proc = spawn(args.python, [script, '--watch', endpoint, '--server', serverUrl,
        ...(dropMessage ? ['--drop-message', String(dropMessage)] : [])], { stdio: ['pipe', 'pipe', 'pipe'] });
    const gaps = [];
    let ready, notReady, verdict, buffer = '', stderr = '';
    const readyP = new Promise((resolve, reject) => { ready = resolve; notReady = reject; });
    const verdictP = new Promise((resolve) => { verdict = resolve; });
    proc.stderr.on('data', (c) => { stderr += c; });
    proc.stdout.setEncoding('utf8');
    proc.stdout.on('data', (chunk) => {
        buffer += chunk;
        let cut;
        while ((cut = buffer.indexOf('\n')) >= 0) {
            const line = JSON.parse(buffer.slice(0, cut));
            buffer = buffer.slice(cut + 1);
            if (line.ready) ready(line.ready);
            if (line.gap) {
                gaps.push(line.gap);
                log(`${name}'s witness: a gap in the sequence, ${line.gap.after} then ${line.gap.next}`);
            }
            if (line.verdict) verdict(line.verdict);
        }
    });
    proc.on('exit', (code, signal) => {
        // Settles only what has not settled yet: after its verdict, its exit is no news.
        const why = `${name}'s witness exited with ${code ?? signal}: ${stderr.slice(-2000)}`;
        notReady(new Error(why));
        verdict({ error: why });
    });
    const timeout = (ms, what) => new Promise((_, reject) => setTimeout(() => reject(new Error(what)), ms).unref());
    await Promise.race([readyP, timeout(60_000, `${name}'s witness got no snapshot in 60 s`)]);
    return {
        proc, gaps,
        async verdict() {
            proc.stdin.end('stop\n');
            return Promise.race([verdictP, timeout(120_000, `${name}'s witness gave no verdict in 120 s`)]);
        },
    };
}

function rssKiB(pid) {
    try {
        const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
        return m ? Number(m[1]) : null;
    } catch {
        return null;
    }
}

const agent = new http.Agent({ keepAlive: true, maxSockets: args.clients * 2 });

// One streamed chat request; resolves with { ttft, total, upstream } or { error }.
function request(url, body) {
    return new Promise((resolve) => {
        const t0 = performance.now();
        let ttft = null;
        let buffer = '';
        let done = false;
        const target = new URL('/v1/chat/completions', url);
        const req = http.request(target, {
            method: 'POST', agent, headers: { 'content-type': 'application/json' },
        }, (res) => {
            if (res.statusCode !== 200) {
                res.resume();
                resolve({ error: `HTTP ${res.statusCode}` });
                return;
            }
            res.setEncoding('utf8');
            res.on('data', (chunk) => {
                buffer += chunk;
                let cut;
                while ((cut = buffer.indexOf('\n\n')) >= 0) {
                    const event = buffer.slice(0, cut);
                    buffer = buffer.slice(cut + 2);
                    const data = event.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('');
                    if (data === '[DONE]') {
                        done = true;
                        continue;
                    }
                    // The first token: the first chunk with content (a role-only chunk is not one; the proxy
                    // sends none, since it passes on message deltas).
                    if (ttft === null && data) {
                        try {
                            const delta = JSON.parse(data).choices?.[0]?.delta ?? {};
                            if (delta.content || delta.reasoning_content || delta.tool_calls) {
                                ttft = performance.now() - t0;
                            }
                        } catch {
                            ttft = performance.now() - t0;
                        }
                    }
                }
            });
            res.on('end', () => resolve(done && ttft !== null
                ? { ttft, total: performance.now() - t0, upstream: res.headers['x-keepwarm-upstream'] }
                : { error: 'the stream ended without [DONE]' }));
            res.on('error', (e) => resolve({ error: e.message }));
        });
        req.on('error', (e) => resolve({ error: e.message }));
        req.end(JSON.stringify(body));
    });
}

function percentile(sorted, p) {
    if (sorted.length === 0) return NaN;
    return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

// The proxy's /metrics histogram of what it added to TTFT, per phase: { phase: { le: cumulative count } }.
async function addedLatencyBuckets(url) {
    const text = await new Promise((resolve, reject) => {
        http.get(new URL('/metrics', url), (res) => {
            let body = '';
            res.on('data', (c) => { body += c; });
            res.on('end', () => resolve(body));
        }).on('error', reject);
    });
    const out = {};
    for (const m of text.matchAll(/^keepwarm_proxy_added_latency_seconds_bucket\{phase="(\w+)",le="([^"]+)"\} (\d+)$/gm)) {
        (out[m[1]] ??= {})[m[2]] = Number(m[3]);
    }
    return out;
}

// Percentiles of the requests counted between two scrapes, as the upper bound of the bucket each falls in (ms).
function bucketPercentiles(before, after) {
    const les = Object.keys(after).sort((a, b) => (a === '+Inf') - (b === '+Inf') || Number(a) - Number(b));
    const counts = les.map((le) => after[le] - (before?.[le] ?? 0));
    const n = counts.at(-1);
    const at = (p) => {
        const i = counts.findIndex((c) => c >= Math.ceil(p * n));
        return les[i] === '+Inf' ? Infinity : Number(les[i]) * 1000;
    };
    return n > 0 ? { requests: n, p50_at_most: at(0.5), p99_at_most: at(0.99) } : { requests: 0 };
}

async function main() {
    if (!args.slots) args.slots = args.clients;
    const ctx = args.slots * 2048;
    log(`${args.clients} clients, ${args.seconds} s (${args.warmup} s warm-up), two upstreams of ${args.slots} slots, ` +
        `model ${path.basename(args.model)}` +
        (args.proxyCpus || args.upstreamCpus ? `, proxy on cpus ${args.proxyCpus || 'any'}, upstreams on ` +
            `${args.upstreamCpus || 'any'}` : ''));
    const ports = [await freePort(), await freePort()];
    const eventsPorts = args.kvEvents ? [await freePort(), await freePort()] : [];
    if (args.kvEvents && !args.cacheBlock) args.cacheBlock = 64;
    // Each upstream gets a cache directory of its own, new for this run: nothing from an earlier run (disk tier,
    // prompt index) is reused, and the two do not share one.
    const cacheDirs = ports.map((_, i) => fs.mkdtempSync(path.join(os.tmpdir(), `proxy-load-cache-${i}-`)));
    const upstreams = await Promise.all(ports.map((port, i) => start(`upstream-${i}`, ['serve', '-m', args.model,
        '--port', String(port), '-t', String(args.threads), '-np', String(args.slots), '-c', String(ctx),

        '--cache-dir', cacheDirs[i], '--max-connections-per-address', '0',
        ...(args.cacheBlock ? ['--cache-block', String(args.cacheBlock)] : []),
        ...(args.kvEvents ? ['--kv-events', `tcp://*:${eventsPorts[i]}`] : [])], args.upstreamCpus)));
    const eventsOf = (i) => `tcp://127.0.0.1:${eventsPorts[i]}`;
    const witnesses = args.kvEvents ? await Promise.all(upstreams.map((u, i) =>
        startWitness(`upstream-${i}`, eventsOf(i), u.url, i === 0 ? args.dropMessage : 0))) : [];
    // No rebalancing: a client's proxied requests stay on the upstream its direct ones go to, so that both paths
    // find its prefix in the same cache (a move would cost the proxied request a cold prefill, not proxy time).
    // Every client, the proxy included, connects from 127.0.0.1: the per-address connection limit is off for the run.
    const proxy = await start('proxy', ['proxy', '--port', '0', '--rebalance-margin', '1000000',
        '--max-connections-per-address', '0',
        ...upstreams.flatMap((u, i) => ['--upstream', args.kvEvents ? `${u.url},events=${eventsOf(i)}` : u.url])],
        args.proxyCpus);
    const stopAll = () => [proxy, ...upstreams, ...witnesses].forEach((p) => p.proc.kill('SIGTERM'));
    process.on('exit', () => {
        stopAll();
        for (const dir of cacheDirs) fs.rmSync(dir, { recursive: true, force: true });
    });

    // The KV-event counters, proxy and upstreams: { in_step: [..], resyncs: [..], exact_hits: [..], overflow: [..],
    // snapshots: [..] }, one entry per upstream.
    const kvCounters = async () => {
        const p = await get(proxy.url, '/metrics');
        const per = (name, u) => sample(p, name, `upstream="${u.url}"`);
        const own = await Promise.all(upstreams.map((u) => get(u.url, '/metrics')));
        const c = {
            in_step: upstreams.map((u) => per('keepwarm_proxy_kv_events_in_step', u)),
            resyncs: upstreams.map((u) => per('keepwarm_proxy_kv_events_resyncs_total', u)),
            exact_hits: upstreams.map((u) => per('keepwarm_proxy_exact_hits_total', u)),
            overflow: own.map((t) => sample(t, 'keepwarm_kv_events_resyncs_total', 'reason="overflow"')),
            snapshots: own.map((t) => sample(t, 'keepwarm_kv_events_resyncs_total', 'reason="subscriber"')),
        };
        // A counter that is not there would pass every check below unseen.
        if (Object.values(c).flat().some((v) => v === null)) {
            throw new Error(`a KV-event counter is missing from /metrics: ${JSON.stringify(c)}`);
        }
        return c;
    };
    // From the moment both upstreams are first in step (the proxy's first snapshot of each), nothing may knock it out.
    let kvAtStart = null;
    const kvSamples = [];  // [seconds, counters]
    if (args.kvEvents) {
        const deadline = performance.now() + 60_000;
        for (;;) {
            kvAtStart = await kvCounters();
            if (kvAtStart.in_step.every((v) => v === 1)) break;
            if (performance.now() > deadline) {
                throw new Error(`the proxy was not in step in 60 s: ${JSON.stringify(kvAtStart)}`);
            }
            await new Promise((resolve) => setTimeout(resolve, 200));
        }
        log(`the proxy is in step with both upstreams' KV events (resyncs so far ${kvAtStart.resyncs.join(', ')})`);
    }

    const results = [];  // { path, ttft, total, t } or { path, error, t }
    const rss = [];  // [seconds, KiB]
    const started = performance.now();
    const elapsed = () => (performance.now() - started) / 1000;
    let sampling = false;
    const sampler = setInterval(async () => {
        rss.push([elapsed(), rssKiB(proxy.proc.pid)]);
        if (!args.kvEvents || sampling) return;
        sampling = true;
        try {
            const t = elapsed(), c = await kvCounters();
            kvSamples.push([t, c]);
            c.resyncs.forEach((r, i) => {
                if (r !== kvAtStart.resyncs[i] && r !== kvSamples.at(-2)?.[1].resyncs[i]) {
                    log(`upstream ${i}'s KV events fell out of step at ${t.toFixed(1)} s (proxy resyncs ${r})`);
                }
            });
        } catch (e) {
            log(`scraping the KV-event counters: ${e.message}`);
        } finally {
            sampling = false;
        }
    }, 1000);
    let bucketsAtWarmupEnd = null;
    const warmupTimer = setTimeout(async () => { bucketsAtWarmupEnd = await addedLatencyBuckets(proxy.url); },
        args.warmup * 1000);

    const system = (c) => `You are agent ${c} of the load test. ` +
        Array.from({ length: 12 }, (_, i) => `Rule ${i + 1} for agent ${c}: keep answers short and exact.`).join(' ');
    async function client(c) {
        let home = null;
        // Clients start spread over a second, and each request picks its path by a coin flip: clients that move in
        // step would send all their proxied requests in one wave and all their direct ones in the next.
        await new Promise((resolve) => setTimeout(resolve, Math.random() * 1000));
        for (let turn = 0; elapsed() < args.seconds; turn++) {
            const body = {
                model: 'load', stream: true, max_tokens: args.maxTokens, temperature: 0,
                messages: [{ role: 'system', content: system(c) }, { role: 'user', content: `turn ${turn}` }],
            };
            const viaProxy = home === null || Math.random() < 0.5;
            const t = elapsed();
            const r = await request(viaProxy ? proxy.url : home, body);
            if (viaProxy && r.upstream) home = r.upstream;
            results.push({ path: viaProxy ? 'proxy' : 'direct', t, ...r });
            if (args.thinkMs > 0) await new Promise((resolve) => setTimeout(resolve, Math.random() * 2 * args.thinkMs));
        }
    }
    await Promise.all(Array.from({ length: args.clients }, (_, c) => client(c)));
    clearInterval(sampler);
    clearTimeout(warmupTimer);
    const bucketsAtEnd = await addedLatencyBuckets(proxy.url);
    const ownAfterWarmup = Object.fromEntries(Object.entries(bucketsAtEnd)
        .map(([phase, after]) => [phase, bucketPercentiles(bucketsAtWarmupEnd?.[phase], after)]));
    // The proxy's own account of what it added (receive -> sent upstream, first delta read -> handed to the route).
    const own = await new Promise((resolve) => {
        http.get(new URL('/v1/cache', proxy.url), (res) => {
            let text = '';
            res.on('data', (c) => { text += c; });
            res.on('end', () => resolve(JSON.parse(text).overhead_ms));
        }).on('error', () => resolve(null));
    });

    async function checkKvEvents() {
        const duringRun = await kvCounters();
        // The load has stopped: each witness reads on until its stream is quiet, then compares with its upstream.
        const verdicts = await Promise.all(witnesses.map((w) => w.verdict()));
        const atEnd = await kvCounters();
        const cache = await get(proxy.url, '/v1/cache', true);
        const listings = await Promise.all(upstreams.map((u) => get(u.url, '/v1/cache/blocks', true)));
        const failures = [];
        const perUpstream = upstreams.map((u, i) => {
            const v = verdicts[i];
            const all = [...kvSamples.map(([, c]) => c), duringRun, atEnd];
            const proxyBlocks = cache.upstreams[i].kv_events?.blocks ?? {};
            const serverBlocks = {};
            for (const b of listings[i].blocks) {
                for (const m of b.media) serverBlocks[m.toLowerCase()] = (serverBlocks[m.toLowerCase()] ?? 0) + 1;
            }
            const media = [...new Set([...Object.keys(proxyBlocks), ...Object.keys(serverBlocks)])];
            const proxyAgrees = media.every((m) => (proxyBlocks[m] ?? 0) === (serverBlocks[m] ?? 0));
            const r = {
                upstream: u.url, endpoint: eventsOf(i),
                witness: v,
                proxy: {
                    resyncs_at_first_in_step: kvAtStart.resyncs[i], resyncs_at_end: atEnd.resyncs[i],
                    resyncs_max: Math.max(...all.map((c) => c.resyncs[i])),
                    in_step_at_end: atEnd.in_step[i], in_step_min: Math.min(...all.map((c) => c.in_step[i])),
                    exact_hits: atEnd.exact_hits[i], messages: cache.upstreams[i].kv_events?.messages,
                    events: cache.upstreams[i].kv_events?.events,
                    orphan_blocks: cache.upstreams[i].kv_events?.orphan_blocks,
                    blocks: proxyBlocks, index_agrees: proxyAgrees,
                },
                server: {
                    overflow_resyncs_max: Math.max(...all.map((c) => c.overflow[i])),
                    subscriber_snapshots: atEnd.snapshots[i], blocks: serverBlocks,
                },
            };
            const fail = (what) => failures.push(`upstream ${i}: ${what}`);
            if (v.error) {
                fail(v.error);
            } else {
                if (!(v.messages > 0 && v.events > 0)) fail('its witness received no event');
                if (v.gaps || v.lost_messages) fail(`${v.lost_messages} messages lost in ${v.gaps} gaps`);
                if (!v.saw_last_message) {
                    fail(`the witness's last message is ${v.last_seq}, the server published ${v.server_messages}`);
                }
                if (!v.index?.agree) {
                    fail(`the witness's index disagrees with /v1/cache/blocks: ${JSON.stringify(v.index)}`);
                }
                for (const k of ['restarts', 'out_of_order', 'malformed', 'orphan_blocks', 'stored_twice',
                    'removed_not_held']) {
                    if (v[k]) fail(`the witness counted ${v[k]} ${k.replaceAll('_', ' ')}`);
                }
                if (v.problems?.length) fail(`the witness's first problems: ${v.problems.join('; ')}`);
            }
            if (r.proxy.resyncs_max !== 0) {
                fail(`the proxy resynced (keepwarm_proxy_kv_events_resyncs_total ${r.proxy.resyncs_at_first_in_step} ` +
                    `when first in step, up to ${r.proxy.resyncs_max})`);
            }
            if (r.proxy.in_step_min !== 1) fail('the proxy fell out of step (keepwarm_proxy_kv_events_in_step 0)');
            if (!proxyAgrees) {
                fail(`the proxy's index ${JSON.stringify(proxyBlocks)}, the server's ${JSON.stringify(serverBlocks)}`);
            }
            if (r.server.overflow_resyncs_max !== 0) {
                fail(`the server's queue overflowed ${r.server.overflow_resyncs_max} times`);
            }
            return r;
        });
        const exactHits = atEnd.exact_hits.reduce((a, b) => a + b, 0);
        if (!(exactHits > 0)) {
            failures.push('the proxy routed no request by events (keepwarm_proxy_exact_hits_total 0)');
        }
        const lost = verdicts.reduce((a, v) => a + (v.lost_messages ?? 0), 0);
        return {
            ok: failures.length === 0, lost_messages: lost, exact_hits: exactHits, failures, upstreams: perUpstream,
        };
    }
    const kvEvents = args.kvEvents ? await checkKvEvents() : null;

    const measured = results.filter((r) => r.t >= args.warmup);
    const errors = results.filter((r) => r.error);
    const ttfts = (p) => measured.filter((r) => r.path === p && !r.error).map((r) => r.ttft).sort((a, b) => a - b);
    const direct = ttfts('direct'), proxied = ttfts('proxy');
    const afterWarmup = rss.filter(([s, kib]) => s >= args.warmup && kib !== null);
    // Least-squares slope of RSS over time after warm-up, in KiB per minute.
    const n = afterWarmup.length;
    const mx = afterWarmup.reduce((a, [s]) => a + s, 0) / n, my = afterWarmup.reduce((a, [, k]) => a + k, 0) / n;
    const slope = afterWarmup.reduce((a, [s, k]) => a + (s - mx) * (k - my), 0) /
        Math.max(1e-9, afterWarmup.reduce((a, [s]) => a + (s - mx) ** 2, 0)) * 60;
    const summary = {
        clients: args.clients, seconds: args.seconds, warmup_seconds: args.warmup, slots_per_upstream: args.slots,
        max_tokens: args.maxTokens, model: path.basename(args.model), machine: `${os.cpus().length} CPUs, ${os.cpus()[0].model}`,
        requests: results.length, measured_requests: measured.length, errors: errors.length,
        error_kinds: [...new Set(errors.map((e) => e.error))].slice(0, 5),
        ttft_ms: {
            direct: { n: direct.length, p50: percentile(direct, 50), p99: percentile(direct, 99) },
            proxy: { n: proxied.length, p50: percentile(proxied, 50), p99: percentile(proxied, 99) },
        },
        added_ms: { p50: percentile(proxied, 50) - percentile(direct, 50), p99: percentile(proxied, 99) - percentile(direct, 99) },
        proxy_own_overhead_ms: own,
        proxy_own_after_warmup_ms: ownAfterWarmup,
        cache_block: args.cacheBlock || null,
        kv_events: kvEvents,
        proxy_rss_kib: {
            at_warmup_end: afterWarmup[0]?.[1] ?? null, final: afterWarmup.at(-1)?.[1] ?? null,
            max: Math.max(...afterWarmup.map(([, k]) => k)), slope_kib_per_min: slope,
        },
    };
    const f = (x) => (Number.isFinite(x) ? x.toFixed(2) : '-');
    console.log(`requests ${summary.requests} (${summary.measured_requests} after warm-up), protocol errors ${summary.errors}`);
    console.log('| path | requests | TTFT p50 ms | TTFT p99 ms |\n| --- | ---: | ---: | ---: |');
    console.log(`| direct | ${direct.length} | ${f(summary.ttft_ms.direct.p50)} | ${f(summary.ttft_ms.direct.p99)} |`);
    console.log(`| through the proxy | ${proxied.length} | ${f(summary.ttft_ms.proxy.p50)} | ${f(summary.ttft_ms.proxy.p99)} |`);
    console.log(`| added by the proxy | | ${f(summary.added_ms.p50)} | ${f(summary.added_ms.p99)} |`);
    if (own?.total) {
        console.log(`| the proxy's own account, whole run incl. warm-up (forward + first delta) | ${own.requests} | ` +
            `${f(own.total.p50)} | ${f(own.total.p99)} |`);
    }
    for (const phase of ['forward', 'first_delta', 'total']) {
        const b = ownAfterWarmup[phase];
        if (b?.requests) {
            console.log(`| the proxy's own account after warm-up, ${phase} (bucket bound) | ${b.requests} | ` +
                `<= ${f(b.p50_at_most)} | <= ${f(b.p99_at_most)} |`);
        }
    }
    const r = summary.proxy_rss_kib;
    console.log(`proxy RSS after warm-up ${r.at_warmup_end} KiB, final ${r.final} KiB, max ${r.max} KiB, ` +
        `slope ${f(r.slope_kib_per_min)} KiB/min`);
    if (kvEvents) {
        const yes = (b) => (b ? 'yes' : 'NO');
        for (const [i, u] of kvEvents.upstreams.entries()) {
            const v = u.witness, p = u.proxy;
            console.log(`KV events of upstream ${i}: witness ${v.messages ?? '-'} messages ` +
                `(seq ${v.first_seq}..${v.last_seq} of ${v.server_messages} published), ${v.events ?? '-'} events ` +
                `(${v.blocks_stored} blocks stored, ${v.blocks_removed} removed), gaps ${v.gaps ?? '-'}, ` +
                `index agrees ${yes(v.index?.agree)} (${v.index?.blocks} blocks); proxy ${p.messages} messages, ` +
                `${p.events} events, resyncs ${p.resyncs_at_first_in_step} at first in step -> ${p.resyncs_at_end}, ` +
                `in step ${p.in_step_at_end}, ` +
                `exact hits ${p.exact_hits}, index agrees ${yes(p.index_agrees)}; server overflow resyncs ` +
                `${u.server.overflow_resyncs_max}, snapshots for subscribers ${u.server.subscriber_snapshots}`);
        }
        console.log(kvEvents.ok ? 'lost events: 0' : `lost events: YES (${kvEvents.lost_messages} messages lost ` +
            `by the witnesses): ${kvEvents.failures.join('; ')}`);
    }
    if (args.json) fs.writeFileSync(args.json, JSON.stringify({ summary, rss, results }, null, 1));
    stopAll();
    agent.destroy();
    if (kvEvents && !kvEvents.ok) process.exitCode = 1;
}

main().catch((e) => {
    console.error('proxy-load:', e.message);
    process.exit(1);
});
