#!/usr/bin/env node
// Client cache hints under memory pressure: what a client's marks (Anthropic cache_control) are worth when many
// conversations compete for too little device and RAM space.
//
// The workload, the same twice on a fresh `keepwarm serve` each time (once with the marks, once without):
//   - A agent conversations, each with a system prompt of its own (~S tokens), take turns round-robin for R rounds;
//     every turn appends the previous answer and a short user message. With hints, each request marks its system
//     prompt and its last message, as Claude Code does.
//   - Between two agent turns, N one-off requests (~S tokens each, another prompt every time, never marked): title
//     generations, scripts, health checks with a long prompt, whatever else shares the server.
// The server gets 1 slot, P parked sequences and a RAM tier that holds only some of the agents' prefixes
// (--keepwarm-args). Reported per run: the agents' hit rate from their second turn on (prompt tokens reused / prompt
// tokens), the turns whose whole system prompt was reused, the agents' prompt time, and the one-off requests' numbers.
//
// Node 20, no dependencies:
//   node bench/cache-hints.mjs --keepwarm build/keepwarm --model build/test-models/tiny.gguf
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';

const { values: opt } = parseArgs({
    options: {
        keepwarm: { type: 'string', default: 'build/keepwarm' },
        model: { type: 'string', default: 'build/test-models/tiny.gguf' },
        agents: { type: 'string', default: '4' },
        rounds: { type: 'string', default: '6' },
        'one-offs': { type: 'string', default: '2' },
        'system-words': { type: 'string', default: '1500' },
        threads: { type: 'string', default: String(Math.min(os.availableParallelism(), 2)) },
        'keepwarm-args': {
            type: 'string',
            default: '-c 32768 --parallel 1 --cache-parked 2 --cache-ram 40MiB --cache-disk 0 --cache-block 256',
        },
        json: { type: 'string' },
        help: { type: 'boolean', default: false },
    },
});
if (opt.help) {
    console.log('usage: node bench/cache-hints.mjs [--keepwarm BIN] [--model GGUF] [--agents A] [--rounds R] ' +
        '[--one-offs N] [--system-words W] [--threads T] [--keepwarm-args "..."] [--json FILE]');
    process.exit(0);
}
const agents = Number(opt.agents), rounds = Number(opt.rounds), oneOffs = Number(opt['one-offs']);
const systemWords = Number(opt['system-words']);

// Deterministic filler text of `n` words, different per seed.
function words(n, seed) {
    const vocab = ['cache', 'prefix', 'agent', 'tool', 'model', 'turn', 'state', 'block', 'the', 'of', 'and', 'with',
        'file', 'read', 'write', 'edit', 'search', 'test', 'build', 'run'];
    let x = seed >>> 0;
    const out = [];
    for (let i = 0; i < n; i++) {
        x = (Math.imul(x, 1103515245) + 12345) >>> 0;
        out.push(vocab[(x >>> 8) % vocab.length]);
    }
    return out.join(' ');
}

async function freePort() {
    const server = net.createServer();
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address();
    await new Promise((resolve) => server.close(resolve));
    return port;
}

async function startServer() {
    const port = await freePort();
    const cacheDir = fs.mkdtempSync(path.join(os.tmpdir(), 'keepwarm-bench-hints-'));
    const args = ['serve', '-m', opt.model, '--port', String(port), '-t', opt.threads, '--cache-dir', cacheDir,
        ...opt['keepwarm-args'].split(/\s+/).filter(Boolean)];
    const proc = spawn(opt.keepwarm, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    proc.stderr.on('data', (d) => (log = (log + d).slice(-4000)));
    const url = `http://127.0.0.1:${port}`;
    for (const deadline = Date.now() + 120_000; Date.now() < deadline;) {
        try {
            if ((await fetch(`${url}/health`)).ok) return { url, proc, cacheDir };
        } catch {
            // not listening yet
        }
        if (proc.exitCode !== null) break;
        await new Promise((r) => setTimeout(r, 200));
    }
    proc.kill('SIGKILL');
    throw new Error(`keepwarm did not start:\n${log}`);
}

async function stopServer(s) {
    s.proc.kill('SIGTERM');
    await new Promise((r) => s.proc.once('exit', r));
    fs.rmSync(s.cacheDir, { recursive: true, force: true });
}

async function post(url, body) {
    const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body) });
    const json = await res.json();
    if (!res.ok) throw new Error(`${res.status}: ${JSON.stringify(json)}`);
    return json;
}

async function run(marked) {
    const server = await startServer();
    const conversations = Array.from({ length: agents }, (_, a) => ({
        system: `Agent ${a}. ` + words(systemWords, 1000 + a),
        messages: [],
    }));
    const agentTurns = [];
    const oneOffTurns = [];
    let seed = 50_000;
    try {
        for (let round = 0; round < rounds; round++) {
            for (let a = 0; a < agents; a++) {
                const c = conversations[a];
                c.messages.push({ role: 'user', content: `Round ${round}: ` + words(40, seed++) });
                const mark = marked ? { cache_control: { type: 'ephemeral' } } : {};
                const body = {
                    model: 'any',
                    max_tokens: 8,
                    temperature: 0,
                    system: [{ type: 'text', text: c.system, ...mark }],
                    messages: c.messages.map((m, i) => i + 1 === c.messages.length
                        ? { role: m.role, content: [{ type: 'text', text: m.content, ...mark }] }
                        : m),
                };
                const answer = await post(`${server.url}/v1/messages`, body);
                const text = answer.content.filter((b) => b.type === 'text').map((b) => b.text).join('') || '.';
                c.messages.push({ role: 'assistant', content: text });
                const u = answer.usage;
                agentTurns.push({
                    round,
                    prompt: u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens,
                    reused: u.cache_read_input_tokens,
                    prompt_ms: answer.timings?.prompt_ms ?? 0,
                });
                for (let k = 0; k < oneOffs; k++) {
                    const one = await post(`${server.url}/v1/chat/completions`, {
                        model: 'any', max_tokens: 8, temperature: 0,
                        messages: [{ role: 'system', content: words(systemWords, seed++) },
                            { role: 'user', content: 'Summarize.' }],
                    });
                    oneOffTurns.push({ prompt: one.usage.prompt_tokens,
                        reused: one.usage.prompt_tokens_details?.cached_tokens ?? 0,
                        prompt_ms: one.timings?.prompt_ms ?? 0 });
                }
            }
        }
        const cache = await (await fetch(`${server.url}/v1/cache`)).json();
        return { agentTurns, oneOffTurns, cache };
    } finally {
        await stopServer(server);
    }
}

// The system prompt's length in tokens: the first turn of each conversation computed it all (nothing shared).
function summarize(result) {
    const later = result.agentTurns.filter((t) => t.round > 0);
    const sum = (list, key) => list.reduce((s, t) => s + t[key], 0);
    const systemTokens = Math.min(...result.agentTurns.filter((t) => t.round === 0).map((t) => t.prompt)) - 80;
    return {
        agent_hit_rate: sum(later, 'reused') / sum(later, 'prompt'),
        agent_turns_with_system_reused: later.filter((t) => t.reused >= systemTokens).length,
        agent_turns: later.length,
        agent_prompt_ms: sum(later, 'prompt_ms'),
        agent_prompt_tokens: sum(later, 'prompt'),
        one_off_hit_rate: sum(result.oneOffTurns, 'reused') / Math.max(1, sum(result.oneOffTurns, 'prompt')),
        one_off_prompt_ms: sum(result.oneOffTurns, 'prompt_ms'),
        hinted: result.cache.hinted,
        evictions: { device: result.cache.tiers.device.evictions, ram: result.cache.tiers.ram.evictions },
    };
}

const results = {};
for (const [name, marked] of [['with hints', true], ['without hints', false]]) {
    process.stderr.write(`${name}...\n`);
    results[name] = summarize(await run(marked));
}
const w = results['with hints'], wo = results['without hints'];
const pct = (x) => `${(100 * x).toFixed(1)}%`;
const lines = [
    `workload: ${agents} agents x ${rounds} rounds, ${oneOffs} one-off requests between agent turns, ` +
        `system prompts of ${systemWords} words; keepwarm serve ${opt['keepwarm-args']}`,
    '',
    '| | with hints | without hints |',
    '| --- | ---: | ---: |',
    `| agents' hit rate, turns 2+ (reused / prompt tokens) | ${pct(w.agent_hit_rate)} | ${pct(wo.agent_hit_rate)} |`,
    `| agent turns whose system prompt was reused | ${w.agent_turns_with_system_reused} / ${w.agent_turns} | ` +
        `${wo.agent_turns_with_system_reused} / ${wo.agent_turns} |`,
    `| agents' prompt time, turns 2+ | ${(w.agent_prompt_ms / 1000).toFixed(1)} s | ` +
        `${(wo.agent_prompt_ms / 1000).toFixed(1)} s |`,
    `| one-off requests' hit rate | ${pct(w.one_off_hit_rate)} | ${pct(wo.one_off_hit_rate)} |`,
    `| one-off requests' prompt time | ${(w.one_off_prompt_ms / 1000).toFixed(1)} s | ` +
        `${(wo.one_off_prompt_ms / 1000).toFixed(1)} s |`,
    `| evictions (device sequences / RAM entries) | ${w.evictions.device} / ${w.evictions.ram} | ` +
        `${wo.evictions.device} / ${wo.evictions.ram} |`,
    `| marked entries evicted anyway | ${w.hinted.evicted} | ${wo.hinted.evicted} |`,
];
console.log(lines.join('\n'));
if (opt.json) fs.writeFileSync(opt.json, JSON.stringify({ options: opt, results }, null, 2) + '\n');
