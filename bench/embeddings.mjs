#!/usr/bin/env node
// Embeddings side by side: keepwarm serve and llama-server --embeddings (the pinned build) on the same model, the same
// threads and the same inputs, one server at a time. Two workloads, each repeated:
//   batch:      one POST /v1/embeddings with --inputs inputs (64) of about --words words each;
//   concurrent: --inputs requests of one input each, sent at once (what many clients do; keepwarm batches inputs of
//               every waiting request into one llama_decode, llama-server one input per slot).
// Prints the median and best wall time of each workload on each server, and the tokens computed.
//
//   node bench/embeddings.mjs [--model build/test-models/tiny-embed.gguf] [--keepwarm build/keepwarm]
//        [--llama-server PATH] [--threads 2] [--inputs 64] [--words 100] [--repeats 5] [--ctx 2048] [--parallel 4]
//        [--keepwarm-args "--ubatch-size 256"]
//
// --ctx is the tokens one input may have on both (keepwarm -c; llama-server -b, -ub and each slot's context);
// --parallel is llama-server's slots (its default 4). Run it on a quiet machine: the numbers are the machine's.
import { spawn, execFileSync } from 'node:child_process';
import net from 'node:net';
import { performance } from 'node:perf_hooks';

const args = {
    model: 'build/test-models/tiny-embed.gguf', keepwarm: 'build/keepwarm', llamaServer: process.env.LLAMA_SERVER ?? '',
    threads: 2, inputs: 64, words: 100, repeats: 5, ctx: 2048, parallel: 4, keepwarmArgs: '',
};
for (let i = 2; i < process.argv.length; i++) {
    const key = process.argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (!(key in args)) {
        console.error(`unknown option ${process.argv[i]}`);
        process.exit(2);
    }
    const value = process.argv[++i];
    args[key] = typeof args[key] === 'number' ? Number(value) : value;
}
if (!args.llamaServer) args.llamaServer = execFileSync('bench/build-llama-server.sh', { encoding: 'utf8' }).trim();

// Deterministic texts of about `n` words, each input its own.
function text(n, seed) {
    const vocab = ['cache', 'prefix', 'agent', 'tool', 'model', 'turn', 'state', 'block', 'the', 'of', 'and', 'with',
        'vector', 'search', 'document', 'query', 'embedding', 'retrieval'];
    let x = seed;
    const out = [];
    for (let i = 0; i < n; i++) {
        x = (x * 1103515245 + 12345) % 2147483648;
        out.push(vocab[x % vocab.length]);
    }
    return out.join(' ');
}
const inputs = Array.from({ length: args.inputs }, (_, i) => text(args.words, i + 1));

async function freePort() {
    const s = net.createServer();
    await new Promise((r) => s.listen(0, '127.0.0.1', r));
    const { port } = s.address();
    await new Promise((r) => s.close(r));
    return port;
}

async function start(name, command, argv) {
    const port = await freePort();
    const proc = spawn(command, [...argv, '--port', String(port)], { stdio: 'ignore' });
    const url = `http://127.0.0.1:${port}`;
    const deadline = Date.now() + 120_000;
    for (;;) {
        try {
            if ((await fetch(`${url}/health`)).status === 200) break;
        } catch {}
        if (Date.now() > deadline || proc.exitCode !== null) throw new Error(`${name} did not start`);
        await new Promise((r) => setTimeout(r, 100));
    }
    return { name, url, stop: () => proc.kill('SIGTERM') };
}

async function embed(url, input) {
    const r = await fetch(`${url}/v1/embeddings`, {
        method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ input, encoding_format: 'float' }),
    });
    const body = await r.json();
    if (r.status !== 200) throw new Error(`${url}: ${r.status} ${JSON.stringify(body).slice(0, 300)}`);
    return body.usage.prompt_tokens;
}

const workloads = {
    batch: async (url) => embed(url, inputs),
    concurrent: async (url) => (await Promise.all(inputs.map((s) => embed(url, s)))).reduce((a, b) => a + b, 0),
};

async function measure(server) {
    const result = {};
    await embed(server.url, inputs.slice(0, 4)); // warm-up: first allocations and page faults
    for (const [name, run] of Object.entries(workloads)) {
        const times = [];
        let tokens = 0;
        for (let i = 0; i < args.repeats; i++) {
            const t0 = performance.now();
            tokens = await run(server.url);
            times.push(performance.now() - t0);
        }
        times.sort((a, b) => a - b);
        result[name] = { median: times[Math.floor(times.length / 2)], best: times[0], tokens };
    }
    return result;
}

const servers = [
    // No per-address connection limit: the concurrent workload is --inputs clients on one address.
    ['keepwarm', args.keepwarm, ['serve', '-m', args.model, '-t', String(args.threads), '-c', String(args.ctx),
        '--cache-disk', '0', '--max-connections-per-address', '0', ...args.keepwarmArgs.split(' ').filter(Boolean)]],
    ['llama-server', args.llamaServer, ['-m', args.model, '--embeddings', '-t', String(args.threads), '-tb',
        String(args.threads), '-b', String(args.ctx), '-ub', String(args.ctx), '-np', String(args.parallel), '-c',
        String(args.ctx * args.parallel)]],
];
const results = {};
for (const [name, command, argv] of servers) {
    const server = await start(name, command, argv);
    try {
        results[name] = await measure(server);
    } finally {
        server.stop();
    }
}

console.log(`${args.model}: ${args.inputs} inputs of ~${args.words} words, ${args.threads} threads, ` +
            `${args.repeats} repeats (median / best, ms)`);
console.log(`${'workload'.padEnd(12)} ${'tokens'.padStart(7)} ${'keepwarm'.padStart(20)} ${'llama-server'.padStart(20)}` +
            `  ratio`);
for (const name of Object.keys(workloads)) {
    const k = results.keepwarm[name];
    const l = results['llama-server'][name];
    const cell = (r) => `${r.median.toFixed(1)} / ${r.best.toFixed(1)}`.padStart(20);
    console.log(`${name.padEnd(12)} ${String(k.tokens).padStart(7)} ${cell(k)} ${cell(l)}  ` +
                `${(l.median / k.median).toFixed(2)}x`);
    if (k.tokens !== l.tokens) console.log(`  (token counts differ: llama-server computed ${l.tokens})`);
}
