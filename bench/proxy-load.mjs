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
//        [--proxy-cpus LIST] [--upstream-cpus LIST]
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
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';

const args = {
    keepwarm: 'build/keepwarm', model: '', clients: 64, seconds: 300, warmup: 30, maxTokens: 8, slots: 0, thinkMs: 0,
    threads: 1, json: '', proxyCpus: '', upstreamCpus: '',
};
for (let i = 2; i < process.argv.length; i++) {
    const key = process.argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (!(key in args)) {
        console.error(`proxy-load: unknown option ${process.argv[i]}`);
        process.exit(2);
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
    // Each upstream gets a cache directory of its own, new for this run: nothing from an earlier run (disk tier,
    // prompt index) is reused, and the two do not share one.
    const cacheDirs = ports.map((_, i) => fs.mkdtempSync(path.join(os.tmpdir(), `proxy-load-cache-${i}-`)));
    const upstreams = await Promise.all(ports.map((port, i) => start(`upstream-${i}`, ['serve', '-m', args.model,
        '--port', String(port), '-t', String(args.threads), '-np', String(args.slots), '-c', String(ctx),
        '--cache-dir', cacheDirs[i], '--max-connections-per-address', '0'], args.upstreamCpus)));
    // No rebalancing: a client's proxied requests stay on the upstream its direct ones go to, so that both paths
    // find its prefix in the same cache (a move would cost the proxied request a cold prefill, not proxy time).
    // Every client, the proxy included, connects from 127.0.0.1: the per-address connection limit is off for the run.
    const proxy = await start('proxy', ['proxy', '--port', '0', '--rebalance-margin', '1000000',
        '--max-connections-per-address', '0',
        ...upstreams.flatMap((u) => ['--upstream', u.url])],
        args.proxyCpus);
    const stopAll = () => [proxy, ...upstreams].forEach((p) => p.proc.kill('SIGTERM'));
    process.on('exit', () => {
        stopAll();
        for (const dir of cacheDirs) fs.rmSync(dir, { recursive: true, force: true });
    });

    const results = [];  // { path, ttft, total, t } or { path, error, t }
    const rss = [];  // [seconds, KiB]
    const started = performance.now();
    const elapsed = () => (performance.now() - started) / 1000;
    const sampler = setInterval(() => rss.push([elapsed(), rssKiB(proxy.proc.pid)]), 1000);
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
    if (args.json) fs.writeFileSync(args.json, JSON.stringify({ summary, rss, results }, null, 1));
    stopAll();
    agent.destroy();
}

main().catch((e) => {
    console.error('proxy-load:', e.message);
    process.exit(1);
});
