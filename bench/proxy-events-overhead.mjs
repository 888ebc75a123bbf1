#!/usr/bin/env node
// What routing by KV events costs the proxy per request: two `keepwarm serve --kv-events` upstreams, two proxies in
// front of both (one subscribed to their events, one inferring), and the same conversations sent one turn at a time
// through each (each proxy with conversations of its own, so neither finds the other's prefixes). Reports each proxy's
// own account of what it added to the time to first token (GET /v1/cache overhead_ms: `forward` holds the routing,
// and with events the prompt's /apply-template and /tokenize calls), where its requests went, and the prompt tokens
// the upstreams reused for them.
//
//   node bench/proxy-events-overhead.mjs --model tiny.gguf [--keepwarm build/keepwarm] [--serve BINARY]
//        [--conversations 6] [--turns 4] [--threads 1]
//
// --serve: the binary the upstreams run (default: --keepwarm's).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

const args = { keepwarm: 'build/keepwarm', serve: '', model: '', conversations: 6, turns: 4, threads: 1 };
for (let i = 2; i < process.argv.length; i++) {
    const key = process.argv[i].replace(/^--/, '');
    if (!(key in args)) {
        console.error(`proxy-events-overhead: unknown option ${process.argv[i]}`);
        process.exit(2);
    }
    const value = process.argv[++i];
    args[key] = typeof args[key] === 'number' ? Number(value) : value;
}
if (!args.model) {
    console.error('proxy-events-overhead: --model FILE.gguf is required');
    process.exit(2);
}

const freePort = () =>
    new Promise((resolve) => {
        const s = net.createServer().listen(0, '127.0.0.1', () => {
            const { port } = s.address();
            s.close(() => resolve(port));
        });
    });
const children = [];
process.on('exit', () => children.forEach((c) => c.kill()));
async function start(argv) {
    const child = spawn(argv[0] === 'serve' && args.serve ? args.serve : args.keepwarm, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(child);
    let out = '';
    return new Promise((resolve, reject) => {
        const seen = (d) => {
            out += d;
            const m = out.match(/listening on (http:\/\/[^\s"]+)/);
            if (m) resolve(m[1]);
        };
        child.stdout.on('data', seen);
        child.stderr.on('data', seen);
        child.on('exit', (code) => reject(new Error(`${argv[0]} exited with ${code}:\n${out}`)));
    });
}
const get = async (url) => (await fetch(url)).json();

const upstreams = [];
for (let i = 0; i < 2; i++) {
    const events = await freePort();
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keepwarm-events-bench-'));
    const url = await start(['serve', '-m', args.model, '--port', '0', '-t', String(args.threads), '-c', '16384',
        '-np', '4', '--cache-dir', dir, '--cache-block', '16', '--kv-events', `tcp://*:${events}`]);
    upstreams.push({ url, events });
}
const byEvents = await start(['proxy', '--port', '0', '--no-policy',
    ...upstreams.flatMap((u) => ['--upstream', `${u.url},events=tcp://127.0.0.1:${u.events}`])]);
const inferring = await start(['proxy', '--port', '0', '--no-policy', ...upstreams.flatMap((u) => ['--upstream', u.url])]);
for (let i = 0; i < 600; i++) {
    const kv = (await get(`${byEvents}/v1/cache`)).upstreams.map((u) => u.kv_events);
    if (kv.every((k) => k.in_step)) break;
    await new Promise((r) => setTimeout(r, 100));
}

const totals = new Map();
async function turn(proxy, messages) {
    const r = await fetch(`${proxy}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', messages, max_tokens: 4, temperature: 0 }),
    });
    const body = await r.json();
    const t = totals.get(proxy) ?? { requests: 0, prompt: 0, cached: 0 };
    t.requests++;
    t.prompt += body.usage?.prompt_tokens ?? 0;
    t.cached += body.usage?.prompt_tokens_details?.cached_tokens ?? 0;
    totals.set(proxy, t);
    messages.push({ role: 'assistant', content: body.choices?.[0]?.message?.content ?? '' });
}
const conversations = (tag) =>
    Array.from({ length: args.conversations }, (_, c) => [
        { role: 'system', content: `${tag} conversation ${c}: you review the ${tag}-${c} changes, briefly. `.repeat(8) },
    ]);
const sets = { [byEvents]: conversations('kestrel'), [inferring]: conversations('plover') };
for (let t = 0; t < args.turns; t++) {
    for (let c = 0; c < args.conversations; c++) {
        for (const proxy of [byEvents, inferring]) {
            sets[proxy][c].push({ role: 'user', content: `turn ${t}: what about file ${c * 10 + t}?` });
            await turn(proxy, sets[proxy][c]);
        }
    }
}
const report = {};
for (const [name, proxy] of [['events', byEvents], ['inferred', inferring]]) {
    const cache = await get(`${proxy}/v1/cache`);
    report[name] = {
        ...totals.get(proxy),
        forward_ms: cache.overhead_ms.forward,
        total_ms: cache.overhead_ms.total,
        upstreams: cache.upstreams.map((u) => ({
            requests: u.requests,
            prefix_hits: u.prefix_hits,
            exact_hits: u.kv_events?.exact_hits ?? null,
        })),
    };
}
console.log(JSON.stringify({ ...args, report }, null, 2));
process.exit(0);
