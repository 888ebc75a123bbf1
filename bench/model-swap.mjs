#!/usr/bin/env node
// A model swap side by side: keepwarm serve and llama-server, both in router mode (--models-dir, --models-max 1), on
// the same two models, threads and context. Two agent conversations, one per model, each with a long system prompt
// (--prefix-tokens), take turns: alpha 1, beta 1, alpha 2, beta 2, ... With room for one loaded model, every turn
// after the first two starts with a swap: the other model is unloaded and this one loaded again. llama-server's child
// comes back with an empty cache and computes the whole prompt; keepwarm's child finds the conversation its last run
// wrote to its disk tier at shutdown. Prints, per turn and server: the time to the first token (load included), the
// prompt tokens, the tokens the server reports as reused (keepwarm: of them, read from its disk tier), and the
// server's prompt_ms (restore and prefill; the time to the first token less it is mostly the model's load); then the
// median time to the first token of the turns after a swap, and their ratio.
//
//   node bench/model-swap.mjs [--models build/test-models/tiny.gguf,build/test-models/tiny-moe.gguf]
//        [--keepwarm build/keepwarm] [--llama-server PATH] [--threads 2] [--ctx 32768] [--prefix-tokens 16384]
//        [--turns 3] [--max-tokens 8] [--servers keepwarm,llama-server]
//
// One server at a time, each in a fresh temporary folder (models dir, and keepwarm's cache dir). Run it on a quiet
// machine: the numbers are the machine's.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, symlinkSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import net from 'node:net';
import { performance } from 'node:perf_hooks';

const args = {
    models: 'build/test-models/tiny.gguf,build/test-models/tiny-moe.gguf', keepwarm: 'build/keepwarm',
    llamaServer: process.env.LLAMA_SERVER ?? '', threads: 2, ctx: 32768, prefixTokens: 16384, turns: 3, maxTokens: 8,
    servers: 'keepwarm,llama-server',
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
const servers = args.servers.split(',');
if (servers.includes('llama-server') && !args.llamaServer) {
    args.llamaServer = execFileSync('bench/build-llama-server.sh', { encoding: 'utf8' }).trim();
}
const modelFiles = args.models.split(',').map((m) => path.resolve(m));
if (modelFiles.length !== 2) throw new Error('--models takes two model files');
const names = ['alpha', 'beta'];

// A system prompt of about `tokens` tokens (a word is about a token in these vocabularies), its own per model.
function systemPrompt(tokens, seed) {
    const vocab = ['read', 'the', 'file', 'before', 'editing', 'it', 'and', 'run', 'tests', 'after', 'each', 'change',
        'tool', 'call', 'returns', 'json', 'with', 'fields', 'path', 'content', 'never', 'guess', 'a', 'name'];
    let x = seed;
    const words = [];
    for (let i = 0; i < tokens; i++) {
        x = (x * 1103515245 + 12345) % 2147483648;
        words.push(vocab[x % vocab.length]);
        if (i % 40 === 39) words.push('.\n');
    }
    return `You are coding agent ${seed}. Rules:\n${words.join(' ')}`;
}

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
    const exited = new Promise((r) => proc.once('exit', r));
    return { name, url, stop: async () => { proc.kill('SIGTERM'); await exited; } };
}

// One streamed turn: the time to the first answer text (a data chunk with content), the usage, the answer.
async function turn(url, model, messages) {
    const t0 = performance.now();
    const r = await fetch(`${url}/v1/chat/completions`, {
        method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model, messages, max_tokens: args.maxTokens, temperature: 0, stream: true,
                               stream_options: { include_usage: true } }),
        signal: AbortSignal.timeout(1_800_000),
    });
    if (r.status !== 200) throw new Error(`${url} ${model}: ${r.status} ${(await r.text()).slice(0, 300)}`);
    let ttft = null;
    let usage = null;
    let timings = null;
    let answer = '';
    let pending = '';
    const decoder = new TextDecoder();
    for await (const piece of r.body) {
        pending += decoder.decode(piece, { stream: true });
        let end;
        while ((end = pending.indexOf('\n')) >= 0) {
            const line = pending.slice(0, end).trim();
            pending = pending.slice(end + 1);
            if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
            const chunk = JSON.parse(line.slice(6));
            const content = chunk.choices?.[0]?.delta?.content;
            if (typeof content === 'string' && content.length > 0) {
                ttft ??= performance.now() - t0;
                answer += content;
            }
            usage = chunk.usage ?? usage;
            timings = chunk.timings ?? timings;
        }
    }
    return { ttft: ttft ?? performance.now() - t0, usage, timings, answer };
}

async function run(server) {
    const conversations = names.map((_, i) => [{ role: 'system', content: systemPrompt(args.prefixTokens, i + 1) }]);
    const rows = [];
    for (let t = 1; t <= args.turns; t++) {
        for (let m = 0; m < names.length; m++) {
            const messages = conversations[m];
            messages.push({ role: 'user', content: `Turn ${t}: list the files you would read first, and why.` });
            const r = await turn(server.url, names[m], messages);
            messages.push({ role: 'assistant', content: r.answer });
            rows.push({ turn: t, model: names[m], ttft: r.ttft, prompt: r.usage?.prompt_tokens,
                        reused: r.usage?.prompt_tokens_details?.cached_tokens ?? 0,
                        fromDisk: r.timings?.cache_disk_n ?? 0, promptMs: r.timings?.prompt_ms ?? NaN });
        }
    }
    return rows;
}

const results = {};
for (const name of servers) {
    const dir = mkdtempSync(path.join(tmpdir(), 'keepwarm-swap-'));
    mkdirSync(path.join(dir, 'models'));
    modelFiles.forEach((f, i) => symlinkSync(f, path.join(dir, 'models', `${names[i]}.gguf`)));
    const common = ['--models-dir', path.join(dir, 'models'), '--models-max', '1', '-c', String(args.ctx), '-t',
        String(args.threads), '--parallel', '1'];
    const server = name === 'keepwarm'
        ? await start(name, args.keepwarm, ['serve', ...common, '--cache-dir', path.join(dir, 'cache')])
        : await start(name, args.llamaServer, common);
    try {
        results[name] = await run(server);
    } finally {
        await server.stop();
        rmSync(dir, { recursive: true, force: true });
    }
}

const median = (xs) => {
    const s = [...xs].sort((a, b) => a - b);
    return s.length ? s[Math.floor(s.length / 2)] : NaN;
};
console.log(`models ${modelFiles.join(', ')}; system prompts of ~${args.prefixTokens} tokens, ${args.turns} turns ` +
            `each, --models-max 1, -c ${args.ctx}, ${args.threads} threads`);
console.log(`${'turn'.padEnd(10)} ${servers.map((s) => `${s}: ttft ms / prompt_ms / prompt / reused (disk)`.padStart(56)).join(' ')}`);
const first = results[servers[0]];
first.forEach((row, i) => {
    const cells = servers.map((s) => {
        const r = results[s][i];
        return `${r.ttft.toFixed(0)} / ${r.promptMs.toFixed(0)} / ${r.prompt} / ${r.reused} (${r.fromDisk})`.padStart(56);
    });
    console.log(`${`${row.model} ${row.turn}`.padEnd(10)} ${cells.join(' ')}`);
});
// Every turn after each model's first follows a swap (with --models-max 1 the other model ran in between).
const afterSwap = Object.fromEntries(servers.map((s) => [s, median(results[s].filter((r) => r.turn > 1).map((r) => r.ttft))]));
for (const s of servers) console.log(`${s}: median time to first token after a swap ${afterSwap[s].toFixed(0)} ms`);
if (afterSwap.keepwarm && afterSwap['llama-server']) {
    console.log(`llama-server / keepwarm: ${(afterSwap['llama-server'] / afterSwap.keepwarm).toFixed(2)}x`);
}
