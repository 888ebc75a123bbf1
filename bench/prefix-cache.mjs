#!/usr/bin/env node
// Prefix-cache benchmarks: keepwarm and llama-server side by side on the same generated model, context size, slots
// and threads, one server at a time (each benchmark starts a fresh server, runs, stops it, then the next server).
//
//   a  warm/cold TTFT: a 20-token user message after N cached tokens (cold: the conversation's first request;
//      warm: the next turn, which appends the assistant's answer and 20 new tokens).
//   b  memory: 8 conversations sharing one system prompt, round-robin, 6 turns each, on 2 slots; RSS after each
//      request (max, final), and (RSS growth over the loaded + warmed-up server) / (KV bytes of the unique tokens).
//   c  restart (keepwarm only): cold prefill of a prompt, SIGTERM, restart on the same cache directory, the same
//      conversation + 20 new tokens: TTFT after restart / cold TTFT.
//   d  hybrid model: a prompt, then the same prompt with a change inside the last user message: tokens recomputed.
//   e  overhead: warm turns with ~6 new tokens after N cached tokens: wall TTFT - server-reported prompt_ms, and
//      keepwarm's timings.setup_ms; median of several repetitions. The client floor: the same last request against
//      a Node server that answers at once (the client's and the loopback's share).
//   f  stalls: one client streams a long answer while another sends a cold N-token prompt; the gaps between the
//      stream's tokens while that prompt is prefilled (longest, percentiles), and the prompt's TTFT beside its TTFT
//      alone.
//   g  a long streamed answer (8K tokens, every token forced to the same word so that characters count tokens),
//      without and with tools in the request (with tools twice: while the first answer stays cached, and on a
//      restarted server): tokens/s over its first and its last tenth, and their ratio.
//   h  cold prefill with parked conversations: a fresh server per case, P earlier conversations of --parked-tokens
//      each, then a cold prompt of N tokens (--sizes); its TTFT. The servers take turns case by case (--reps-h
//      times, the order swapped every repetition), so that the machine's slow spells fall on both.
//
// Node 20, no dependencies. Run `node bench/prefix-cache.mjs --help` for the flags; bench/prefix-cache.sh finds the
// binaries and models and calls this.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';

// ---------------------------------------------------------------------------------------------------------------
// Options

const HELP = `usage: node bench/prefix-cache.mjs --keepwarm BIN --llama-server BIN --model M.gguf [options]

  --keepwarm BIN            keepwarm binary (serve, inspect)
  --llama-server BIN        llama-server binary
  --model FILE              dense model for a, b, c, e
  --hybrid-model FILE       hybrid (qwen35) model for d
  --servers LIST            keepwarm,llama-server (order they run in; either alone works)
  --only LIST               benchmarks to run: a,b,c,d,e,f,g,h (default a,b,c,d,e)
  --threads N               -t for both servers (default: nproc)
  --parallel N              slots for a, c, d, e (default 2); b always uses --b-slots (default 2)
  --sizes LIST              cached tokens for a (default 16384,32768)
  --overhead-sizes LIST     cached tokens for e (default 8192,16384,38912)
  --shared-size N           shared system prompt for b (default 16384)
  --conversations N         b: conversations (default 8)
  --turns N                 b: turns per conversation (default 6)
  --turn-tokens N           b: tokens of each user message (default 256)
  --b-slots N               b: slots (default 2)
  --restart-size N          c: prompt tokens (default 32768)
  --hybrid-size N           d: prompt tokens (default 16384)
  --hybrid-user-tokens N    d: tokens of the last user message, edited in its middle (default 1024)
  --new-tokens N            a, c: tokens of the new user message (default 20)
  --overhead-new-tokens N   e: tokens of the new user message (default 6)
  --stall-size N            f: tokens of the prompt prefilled beside the stream (default 12288)
  --reps-f N                f: repetitions (default 3)
  --reps-h N                h: repetitions of each case, servers taking turns (default 1)
  --answer-tokens N         g: tokens of the streamed answer (default 8192)
  --parked-counts LIST      h: earlier conversations before the cold prompt (default 0,1,4)
  --parked-tokens N         h: tokens of each earlier conversation (default 8192)
  --reps N                  a: conversations per size, e: warm turns per size (default 3 for a, 7 for e)
  --reps-a N / --reps-e N   the same, per benchmark
  --max-tokens N            tokens generated per request (default 8, ignore_eos)
  --margin N                context tokens per slot over the largest prompt (default 2048)
  --kv TYPE                 KV type whose bytes/token b divides by (default f16; servers run their default, f16)
  --keepwarm-args "..."     extra arguments for keepwarm serve (split on spaces), e.g. "--cache-ram 8GiB"
  --llama-server-args "..." extra arguments for llama-server
  --restart-args "..."      c: extra keepwarm arguments; {dir} becomes a fresh cache directory
                            (default "--cache-dir {dir}")
  --seed N                  text generator seed (default 1)
  --start-timeout S         seconds for a server to load and answer /health (default 600)
  --keep-alive              requests reuse their connections (as agents do) instead of one connection each
  --request-timeout S       seconds for one request (default 3600)
  --out FILE.json           results (a .md with the README table is written next to it)
  --log-dir DIR             server logs (default: next to --out)
`;

function parseArgs(argv) {
    const o = {
        servers: ['keepwarm', 'llama-server'],
        only: ['a', 'b', 'c', 'd', 'e'],
        threads: os.cpus().length,
        parallel: 2,
        sizes: [16384, 32768],
        overheadSizes: [8192, 16384, 38912],
        sharedSize: 16384,
        conversations: 8,
        turns: 6,
        turnTokens: 256,
        bSlots: 2,
        restartSize: 32768,
        hybridSize: 16384,
        hybridUserTokens: 1024,
        newTokens: 20,
        overheadNewTokens: 6,
        repsA: 3,
        repsE: 7,
        repsF: 3,
        repsH: 1,
        stallSize: 12288,
        streamTokens: 4096,
        answerTokens: 8192,
        parkedCounts: [0, 1, 4],
        parkedTokens: 8192,
        maxTokens: 8,
        margin: 2048,
        kv: 'f16',
        keepwarmArgs: [],
        llamaServerArgs: [],
        restartArgs: ['--cache-dir', '{dir}'],
        seed: 1,
        startTimeout: 600,
        keepAlive: false,
        requestTimeout: 3600,
    };
    const list = (v) => v.split(',').map((s) => s.trim()).filter(Boolean);
    const ints = (v) => list(v).map((s) => parseSize(s));
    const words = (v) => v.split(/\s+/).filter(Boolean);
    const set = {};
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i];
        const v = () => {
            if (i + 1 >= argv.length) fail(`${a} needs a value`);
            return argv[++i];
        };
        switch (a) {
            case '-h': case '--help': process.stdout.write(HELP); process.exit(0);
            case '--keepwarm': o.keepwarm = v(); break;
            case '--llama-server': o.llamaServer = v(); break;
            case '--model': o.model = v(); break;
            case '--hybrid-model': o.hybridModel = v(); break;
            case '--servers': o.servers = list(v()); break;
            case '--only': o.only = list(v()); break;
            case '--threads': o.threads = parseSize(v()); break;
            case '--parallel': o.parallel = parseSize(v()); break;
            case '--sizes': o.sizes = ints(v()); set.sizes = true; break;
            case '--overhead-sizes': o.overheadSizes = ints(v()); set.overheadSizes = true; break;
            case '--shared-size': o.sharedSize = parseSize(v()); set.sharedSize = true; break;
            case '--conversations': o.conversations = parseSize(v()); break;
            case '--turns': o.turns = parseSize(v()); break;
            case '--turn-tokens': o.turnTokens = parseSize(v()); break;
            case '--b-slots': o.bSlots = parseSize(v()); break;
            case '--restart-size': o.restartSize = parseSize(v()); set.restartSize = true; break;
            case '--hybrid-size': o.hybridSize = parseSize(v()); set.hybridSize = true; break;
            case '--hybrid-user-tokens': o.hybridUserTokens = parseSize(v()); break;
            case '--new-tokens': o.newTokens = parseSize(v()); break;
            case '--overhead-new-tokens': o.overheadNewTokens = parseSize(v()); break;
            case '--reps': o.repsA = o.repsE = parseSize(v()); break;
            case '--reps-a': o.repsA = parseSize(v()); break;
            case '--reps-e': o.repsE = parseSize(v()); break;
            case '--reps-f': o.repsF = parseSize(v()); break;
            case '--reps-h': o.repsH = parseSize(v()); break;
            case '--answer-tokens': o.answerTokens = parseSize(v()); break;
            case '--parked-counts': o.parkedCounts = ints(v()); break;
            case '--parked-tokens': o.parkedTokens = parseSize(v()); break;
            case '--stall-size': o.stallSize = parseSize(v()); set.stallSize = true; break;
            case '--max-tokens': o.maxTokens = parseSize(v()); break;
            case '--margin': o.margin = parseSize(v()); break;
            case '--kv': o.kv = v(); break;
            case '--keepwarm-args': o.keepwarmArgs = words(v()); break;
            case '--llama-server-args': o.llamaServerArgs = words(v()); break;
            case '--restart-args': o.restartArgs = words(v()); break;
            case '--seed': o.seed = parseSize(v()); break;
            case '--start-timeout': o.startTimeout = Number(v()); break;
            case '--keep-alive': o.keepAlive = true; break;
            case '--request-timeout': o.requestTimeout = Number(v()); break;
            case '--out': o.out = v(); break;
            case '--log-dir': o.logDir = v(); break;
            default: fail(`unknown option ${a} (see --help)`);
        }
    }
    // --sizes alone scales everything (smoke tests): e uses the same sizes, b and d the smallest, c the largest.
    if (set.sizes) {
        if (!set.overheadSizes) o.overheadSizes = o.sizes;
        const min = Math.min(...o.sizes), max = Math.max(...o.sizes);
        if (!set.sharedSize) o.sharedSize = min;
        if (!set.hybridSize) o.hybridSize = min;
        if (!set.restartSize) o.restartSize = max;
        if (!set.stallSize) o.stallSize = min;
        o.hybridUserTokens = Math.min(o.hybridUserTokens, Math.floor(o.hybridSize / 4));
    }
    for (const b of o.only) if (!'abcdefgh'.includes(b) || b.length !== 1) fail(`unknown benchmark '${b}' in --only`);
    for (const s of o.servers) if (!['keepwarm', 'llama-server'].includes(s)) fail(`unknown server '${s}'`);
    if (!o.keepwarm) fail('--keepwarm is required (for inspect, and to serve unless --servers excludes it)');
    if (o.servers.includes('llama-server') && !o.llamaServer) fail('--llama-server is required');
    if (!o.model && o.only.some((b) => 'abcefgh'.includes(b))) fail('--model is required');
    if (!o.hybridModel && o.only.includes('d')) fail('--hybrid-model is required for d');
    if (!o.out) o.out = path.resolve(`prefix-cache-${stamp()}.json`);
    o.out = path.resolve(o.out);
    o.logDir = path.resolve(o.logDir ?? o.out.replace(/\.json$/, '') + '-logs');
    return o;
}

function parseSize(s) {
    const m = String(s).trim().match(/^(\d+(?:\.\d+)?)([kK])?$/);
    if (!m) fail(`not a number: ${s}`);
    return Math.round(Number(m[1]) * (m[2] ? 1024 : 1));
}

function fail(msg) {
    console.error(`prefix-cache: ${msg}`);
    process.exit(2);
}

function stamp() {
    const d = new Date();
    const p = (n) => String(n).padStart(2, '0');
    return `${d.getFullYear()}${p(d.getMonth() + 1)}${p(d.getDate())}-${p(d.getHours())}${p(d.getMinutes())}${p(d.getSeconds())}`;
}

const log = (...a) => console.error('prefix-cache:', ...a);

// ---------------------------------------------------------------------------------------------------------------
// Deterministic synthetic text: English-like prose, code snippets, JSON tool definitions.

function rng(seed) {
    let a = (seed >>> 0) ^ 0x9e3779b9;
    return () => {
        a = (a + 0x6d2b79f5) >>> 0;
        let t = a;
        t = Math.imul(t ^ (t >>> 15), t | 1);
        t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
}

const WORDS = `the of and to in is that for it as with was on be by this are from or at an have not which but all
they their can has more one will there been would when were also into other some what its only time these may first
any new then two than like use used such each well where most over after file function value request response cache
server client model token prompt context memory thread process build test error result output input record index
table query field method class module package service handler config option default string number object array
return update change create delete write read parse format check verify measure report message event stream buffer
queue worker task job schedule session user agent tool call system network socket port header body status code path
directory layer block tensor weight batch sequence position length size limit count total average median latency
throughput budget policy rule state machine graph node edge tree branch leaf root prefix suffix match search sort merge
split join filter map reduce collect load save store fetch send receive open close start stop reset retry timeout
because while before during between without within against across along around behind below beside beyond toward
careful quick simple clear small large long short early late recent stable exact rough plain strict loose local remote
shared private public internal external primary secondary optional required missing partial complete correct invalid
engineer operator developer reviewer maintainer customer team project release version branch commit patch issue
document section paragraph example note warning summary detail reason decision question answer problem solution
always never often sometimes usually rarely again already still even just almost exactly nearly roughly mostly`.split(/\s+/);

const IDENTS = `cache_entry prefix_len slot_id kv_cells token_ids request_id max_tokens n_past seq_id batch_size
ubatch_len block_hash tier_bytes ram_budget disk_path load_state save_state evict_lru pin_count ref_count hit_rate
miss_count lookup_key node_children leaf_tokens chunk_size stream_pos write_offset read_offset header_len body_len
retry_after deadline_ms start_time end_time elapsed_ms queue_depth worker_id task_kind tool_name arg_list`.split(/\s+/);

// A seed derived from several numbers (benchmark, size, repetition, role), so that no two texts share a stream.
function mix(...xs) {
    let h = 0x811c9dc5;
    for (const x of xs) {
        h = Math.imul(h ^ (x >>> 0), 0x01000193);
        h = Math.imul(h ^ Math.floor(x / 4294967296), 0x01000193);
        h ^= h >>> 13;
    }
    return h >>> 0;
}

function pick(r, arr) {
    return arr[Math.floor(r() * arr.length)];
}

function sentence(r) {
    const n = 6 + Math.floor(r() * 14);
    const w = [];
    for (let i = 0; i < n; i++) w.push(pick(r, WORDS));
    if (r() < 0.3) w.splice(1 + Math.floor(r() * (n - 1)), 0, `\`${pick(r, IDENTS)}\``);
    if (r() < 0.15) w.push(String(Math.floor(r() * 10000)));
    const s = w.join(' ');
    return s[0].toUpperCase() + s.slice(1) + pick(r, ['.', '.', '.', '?', ':', ';', '!']);
}

function paragraph(r) {
    const n = 2 + Math.floor(r() * 5);
    const s = [];
    for (let i = 0; i < n; i++) s.push(sentence(r));
    return s.join(' ');
}

function codeSnippet(r) {
    const f = pick(r, IDENTS), a = pick(r, IDENTS), b = pick(r, IDENTS), c = pick(r, IDENTS);
    const k = Math.floor(r() * 64) + 1;
    const lang = pick(r, ['python', 'cpp', 'js']);
    if (lang === 'python') {
        return '```python\n' +
            `def ${f}(${a}, ${b}=None):\n` +
            `    """${sentence(r)}"""\n` +
            `    if ${b} is None:\n        ${b} = {}\n` +
            `    for i, ${c} in enumerate(${a}):\n` +
            `        if i % ${k} == 0:\n            ${b}[${c}] = ${b}.get(${c}, 0) + 1\n` +
            `    return sorted(${b}.items(), key=lambda kv: -kv[1])[:${k}]\n` + '```';
    }
    if (lang === 'cpp') {
        return '```cpp\n' +
            `// ${sentence(r)}\n` +
            `std::vector<int32_t> ${f}(const std::vector<int32_t>& ${a}, size_t ${b}) {\n` +
            `    std::vector<int32_t> ${c};\n    ${c}.reserve(${a}.size());\n` +
            `    for (size_t i = 0; i < ${a}.size() && i < ${b}; ++i) {\n` +
            `        if (${a}[i] % ${k} != 0) ${c}.push_back(${a}[i] * ${k});\n    }\n` +
            `    return ${c};\n}\n` + '```';
    }
    return '```js\n' +
        `// ${sentence(r)}\n` +
        `export async function ${f.replace(/_(\w)/g, (_, x) => x.toUpperCase())}(${a}, { ${b} = ${k} } = {}) {\n` +
        `    const ${c} = new Map();\n` +
        `    for (const item of ${a}) {\n        if (${c}.size >= ${b}) break;\n` +
        `        ${c}.set(item.id, { ...item, seen: Date.now() });\n    }\n` +
        `    return [...${c}.values()];\n}\n` + '```';
}

function toolDefinition(r) {
    const name = pick(r, IDENTS).replace(/_/g, '-') + '-' + pick(r, WORDS);
    const props = {};
    const required = [];
    const n = 1 + Math.floor(r() * 4);
    for (let i = 0; i < n; i++) {
        const p = pick(r, IDENTS);
        const type = pick(r, ['string', 'integer', 'boolean', 'array']);
        props[p] = { type, description: sentence(r) };
        if (type === 'array') props[p].items = { type: 'string' };
        if (type === 'string' && r() < 0.3) props[p].enum = [pick(r, WORDS), pick(r, WORDS), pick(r, WORDS)];
        if (r() < 0.6) required.push(p);
    }
    return JSON.stringify({
        type: 'function',
        function: { name, description: paragraph(r), parameters: { type: 'object', properties: props, required } },
    }, null, 2);
}

// A document of about `chars` characters: headings, prose, lists, code and tool definitions, like an agent's
// instructions and files.
function document(seed, chars) {
    const r = rng(seed);
    const parts = [];
    let len = 0;
    let section = 1;
    while (len < chars) {
        const x = r();
        let p;
        if (x < 0.08) p = `## ${section++}. ${sentence(r).replace(/[.?:;!]$/, '')}`;
        else if (x < 0.55) p = paragraph(r);
        else if (x < 0.7) p = Array.from({ length: 2 + Math.floor(r() * 4) }, () => `- ${sentence(r)}`).join('\n');
        else if (x < 0.87) p = codeSnippet(r);
        else p = 'Tool definition:\n```json\n' + toolDefinition(r) + '\n```';
        parts.push(p);
        len += p.length + 2;
    }
    return parts.join('\n\n');
}

// Texts of an exact token count (by the server's tokenizer), cut at a token boundary and detokenized. Built once per
// (model, seed, size) on whichever server is up, and reused unchanged for the other server.
class TextFactory {
    constructor() {
        this.cache = new Map();
        this.charsPerToken = new Map();
    }

    async text(server, seed, nTokens) {
        const key = `${server.model}|${seed}|${nTokens}`;
        if (this.cache.has(key)) return this.cache.get(key);
        let cpt = this.charsPerToken.get(server.model) ?? 4;
        let chars = Math.ceil(nTokens * cpt * 1.1) + 64;
        for (;;) {
            const doc = document(seed, chars);
            const tokens = (await server.post('/tokenize', { content: doc, add_special: false })).tokens;
            if (tokens.length > 0) this.charsPerToken.set(server.model, (cpt = doc.length / tokens.length));
            if (tokens.length >= nTokens) {
                const ids = tokens.slice(0, nTokens).map((t) => (typeof t === 'number' ? t : t.id));
                let { content } = await server.post('/detokenize', { tokens: ids });
                content = content.replace(/\uFFFD+$/, '').trimEnd();
                this.cache.set(key, content);
                return content;
            }
            chars = Math.ceil(chars * 1.3 * (nTokens / Math.max(1, tokens.length)));
        }
    }

    async count(server, text) {
        return (await server.post('/tokenize', { content: text, add_special: false })).tokens.length;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Servers

async function freePort() {
    return new Promise((resolve, reject) => {
        const s = net.createServer();
        s.on('error', reject);
        s.listen(0, '127.0.0.1', () => {
            const { port } = s.address();
            s.close(() => resolve(port));
        });
    });
}

const running = new Set();
for (const sig of ['SIGINT', 'SIGTERM']) {
    process.on(sig, () => {
        for (const s of running) s.kill();
        process.exit(130);
    });
}
process.on('exit', () => {
    for (const s of running) s.kill();
});

class ServerError extends Error {}

class Server {
    constructor(kind, { bin, model, ctx, parallel, threads, extra, logFile, opts }) {
        this.kind = kind;
        this.model = model;
        this.opts = opts;
        this.logFile = logFile;
        this.bin = bin;
        this.baseArgs = kind === 'keepwarm'
            ? ['serve', '--model', model, '--ctx-size', String(ctx), '--parallel', String(parallel),
                '--threads', String(threads)]
            : ['-m', model, '-c', String(ctx), '-np', String(parallel), '-t', String(threads)];
        this.extra = extra;
        this.ctx = ctx;
        this.parallel = parallel;
    }

    commandLine() {
        return [this.bin, ...this.baseArgs, '--port', 'PORT', ...this.extra].map((a) => shellQuote(shortPath(a))).join(' ');
    }

    async start() {
        this.port = await freePort();
        this.url = `http://127.0.0.1:${this.port}`;
        const args = [...this.baseArgs, '--host', '127.0.0.1', '--port', String(this.port), ...this.extra];
        fs.mkdirSync(path.dirname(this.logFile), { recursive: true });
        const out = fs.openSync(this.logFile, 'a');
        fs.writeSync(out, `\n===== ${new Date().toISOString()} ${[this.bin, ...args].map(shellQuote).join(' ')}\n`);
        const t0 = performance.now();
        this.proc = spawn(this.bin, args, { stdio: ['ignore', out, out] });
        fs.closeSync(out);
        this.exited = new Promise((resolve) => this.proc.on('exit', (code, signal) => resolve(signal ?? code)));
        this.exitCode = undefined;
        this.exited.then((c) => {
            this.exitCode = c;
            running.delete(this);
        });
        running.add(this);
        const deadline = t0 + this.opts.startTimeout * 1000;
        for (;;) {
            if (this.exitCode !== undefined) {
                throw new ServerError(`${this.kind} exited (${this.exitCode}) while starting:\n${this.logTail()}`);
            }
            if (performance.now() > deadline) {
                this.kill();
                throw new ServerError(`${this.kind} not ready after ${this.opts.startTimeout} s:\n${this.logTail()}`);
            }
            try {
                const r = await request(this.url, 'GET', '/health', null, { timeoutMs: 2000 });
                if (r.status === 200) break;
            } catch {
                // not listening yet
            }
            await sleep(100);
        }
        this.loadMs = performance.now() - t0;
        return this;
    }

    logTail(n = 25) {
        try {
            const lines = fs.readFileSync(this.logFile, 'utf8').split('\n');
            return lines.slice(-n).map((l) => `    | ${l}`).join('\n');
        } catch {
            return '    (no log)';
        }
    }

    kill() {
        if (this.proc && this.exitCode === undefined) this.proc.kill('SIGKILL');
    }

    async stop() {
        if (!this.proc || this.exitCode !== undefined) return this.exitCode;
        const t0 = performance.now();
        this.proc.kill('SIGTERM');
        const timer = setTimeout(() => {
            log(`${this.kind} did not exit 30 s after SIGTERM; killing it`);
            this.proc.kill('SIGKILL');
        }, 30_000);
        const code = await this.exited;
        clearTimeout(timer);
        this.stopMs = performance.now() - t0;
        return code;
    }

    memory() {
        try {
            const status = fs.readFileSync(`/proc/${this.proc.pid}/status`, 'utf8');
            const kib = (k) => Number((status.match(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm')) ?? [])[1] ?? NaN) * 1024;
            return { rss: kib('VmRSS'), anon: kib('RssAnon'), file: kib('RssFile'), hwm: kib('VmHWM') };
        } catch {
            return { rss: NaN, anon: NaN, file: NaN, hwm: NaN };
        }
    }

    async post(route, body) {
        const r = await request(this.url, 'POST', route, body, { timeoutMs: 600_000 });
        if (r.status !== 200) throw new ServerError(`${this.kind} ${route}: HTTP ${r.status}: ${r.body.slice(0, 500)}`);
        return JSON.parse(r.body);
    }

    // One streamed chat completion. TTFT is the time to the first SSE event (both servers send their first chunk
    // when the first token is sampled); timings and usage come from the final chunks.
    chatBody(messages, { maxTokens = this.opts.maxTokens, extra = {} } = {}) {
        return {
            ...extra,
            model: 'bench',
            messages,
            max_tokens: maxTokens,
            temperature: 0,
            seed: 1,
            ignore_eos: true,
            stream: true,
            stream_options: { include_usage: true },
        };
    }

    async chat(messages, { maxTokens = this.opts.maxTokens, onContent, signal, extra = {} } = {}) {
        const body = this.chatBody(messages, { maxTokens, extra });
        const res = await streamChat(this.url, body, this.opts.requestTimeout * 1000,
            { onContent, signal, agent: this.opts.keepAlive ? keepAliveAgent : false });
        if (this.exitCode !== undefined) throw new ServerError(`${this.kind} exited (${this.exitCode}):\n${this.logTail()}`);
        const mem = this.memory();
        const t = res.timings ?? {};
        return {
            ttft_ms: res.ttft_ms,
            total_ms: res.total_ms,
            aborted: res.aborted ?? false,
            prompt_tokens: res.usage?.prompt_tokens ?? (t.cache_n ?? 0) + (t.prompt_n ?? 0),
            completion_tokens: res.usage?.completion_tokens ?? t.predicted_n,
            cache_n: t.cache_n,
            prompt_n: t.prompt_n,
            prompt_ms: t.prompt_ms,
            setup_ms: typeof t.setup_ms === 'number' ? t.setup_ms : undefined,
            timings: res.timings,
            content: res.content,
            rss: mem.rss,
            rss_anon: mem.anon,
        };
    }
}

// Paths as a reader would type them: relative to the current directory when under it, else with ~ for $HOME.
function shortPath(a) {
    if (typeof a !== 'string' || !a.startsWith('/')) return a;
    const cwd = process.cwd() + '/';
    if (a.startsWith(cwd)) return a.slice(cwd.length);
    const home = os.homedir() + '/';
    return a.startsWith(home) ? '~/' + a.slice(home.length) : a;
}

function shellQuote(s) {
    return /^[\w@%+=:,./~-]+$/.test(s) ? s : `'${String(s).replace(/'/g, `'\\''`)}'`;
}

function sleep(ms) {
    return new Promise((r) => setTimeout(r, ms));
}

function request(base, method, route, body, { timeoutMs }) {
    return new Promise((resolve, reject) => {
        const data = body == null ? null : Buffer.from(JSON.stringify(body));
        const req = http.request(`${base}${route}`, {
            method,
            agent: false,
            headers: data ? { 'Content-Type': 'application/json', 'Content-Length': data.length } : {},
        }, (res) => {
            let text = '';
            res.setEncoding('utf8');
            res.on('data', (d) => (text += d));
            res.on('end', () => resolve({ status: res.statusCode, body: text }));
            res.on('error', reject);
        });
        req.setTimeout(timeoutMs, () => req.destroy(new Error(`${method} ${route}: no answer in ${timeoutMs} ms`)));
        req.on('error', reject);
        req.end(data);
    });
}

// A streamed chat completion. `onContent(ms, text)` is called at each event that carries content or reasoning (ms:
// since the request was sent); `signal` ends the request early, which resolves with what had arrived (aborted: true).
// With --keep-alive, the agent whose connections every streamed request reuses.
const keepAliveAgent = new http.Agent({ keepAlive: true });

// A kept-alive connection the server closed after its last answer fails the next request before any byte comes
// back; like the SDKs agents use, the request is sent again on a new connection, and its times count from the first
// try.
async function streamChat(base, body, timeoutMs, options = {}) {
    const t0 = performance.now();
    try {
        return await streamChatOnce(base, body, timeoutMs, options, t0);
    } catch (e) {
        if (!e.reusedSocket) throw e;
        return streamChatOnce(base, body, timeoutMs, options, t0);
    }
}

function streamChatOnce(base, body, timeoutMs, { onContent, signal, agent = false }, t0) {
    return new Promise((resolve, reject) => {
        const data = Buffer.from(JSON.stringify(body));
        let ttft;
        let buf = '';
        let content = '';
        let timings;
        let usage;
        let errorEvent;
        let done = false;
        const timer = setTimeout(() => req.destroy(new Error(`request timed out after ${timeoutMs / 1000} s`)), timeoutMs);
        const req = http.request(`${base}/v1/chat/completions`, {
            method: 'POST',
            agent,
            headers: { 'Content-Type': 'application/json', 'Content-Length': data.length },
        }, (res) => {
            res.setEncoding('utf8');
            if (res.statusCode !== 200) {
                let text = '';
                res.on('data', (d) => (text += d));
                res.on('end', () => {
                    clearTimeout(timer);
                    reject(new ServerError(`HTTP ${res.statusCode}: ${text.slice(0, 1000)}`));
                });
                return;
            }
            res.on('data', (chunk) => {
                buf += chunk;
                let i;
                while ((i = buf.indexOf('\n\n')) >= 0) {
                    const event = buf.slice(0, i);
                    buf = buf.slice(i + 2);
                    for (const line of event.split('\n')) {
                        if (!line.startsWith('data:')) continue;
                        const payload = line.slice(5).trim();
                        if (payload === '[DONE]') {
                            done = true;
                            continue;
                        }
                        if (ttft === undefined) ttft = performance.now() - t0;
                        let j;
                        try {
                            j = JSON.parse(payload);
                        } catch {
                            continue;
                        }
                        if (j.error) errorEvent = j.error;
                        if (j.timings) timings = j.timings;
                        if (j.usage) usage = j.usage;
                        const d = j.choices?.[0]?.delta;
                        if (d?.content) content += d.content;
                        // A thinking model (the Qwen3.5 template opens the answer with <think>) streams its tokens
                        // as reasoning: they are the stream's tokens all the same.
                        const text = (d?.reasoning_content ?? '') + (d?.content ?? '');
                        if (text) onContent?.(performance.now() - t0, text);
                    }
                }
            });
            res.on('end', () => {
                clearTimeout(timer);
                const total = performance.now() - t0;
                if (errorEvent) return reject(new ServerError(`error event: ${JSON.stringify(errorEvent)}`));
                if (!done && !timings) return reject(new ServerError('stream ended without [DONE] or timings'));
                resolve({ ttft_ms: ttft, total_ms: total, content, timings, usage });
            });
            res.on('error', (e) => {
                clearTimeout(timer);
                reject(e);
            });
        });
        req.on('error', (e) => {
            clearTimeout(timer);
            if (signal?.aborted) {
                resolve({ aborted: true, ttft_ms: ttft, total_ms: performance.now() - t0, content });
            } else {
                e.reusedSocket = req.reusedSocket && ttft === undefined && !done;
                reject(e);
            }
        });
        signal?.addEventListener('abort', () => req.destroy(new Error('aborted')));
        req.end(data);
    });
}

// The client's own share of "TTFT - prompt_ms" (e): a server in another Node process that reads the request and
// answers at once with one SSE event, so that the same client, body size and connection handling give the time
// that is not the server's.
class NullServer {
    async start() {
        const script = `
            const http = require('node:http');
            const srv = http.createServer((req, res) => {
                req.on('data', () => {});
                req.on('end', () => {
                    res.writeHead(200, { 'Content-Type': 'text/event-stream' });
                    res.end('data: {"choices":[{"delta":{"content":"x"}}],"timings":{}}\\n\\ndata: [DONE]\\n\\n');
                });
            });
            srv.listen(0, '127.0.0.1', () => console.log(srv.address().port));`;
        this.proc = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
        const port = await new Promise((resolve, reject) => {
            this.proc.stdout.once('data', (d) => resolve(Number(String(d).trim())));
            this.proc.once('exit', (code) => reject(new Error(`null server exited (${code})`)));
        });
        this.url = `http://127.0.0.1:${port}`;
        return this;
    }

    // Median TTFT of `reps` streamed requests with this body.
    async ttft(body, reps, agent = false) {
        const times = [];
        for (let r = 0; r < reps; r++) times.push((await streamChat(this.url, body, 60_000, { agent })).ttft_ms);
        return median(times);
    }

    stop() {
        this.proc?.kill();
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Benchmarks. Each takes a started server and returns its records; the driver starts and stops the servers.

// (e) at `n` cached tokens: a conversation primed with a cold request, then warm turns of a few new tokens.
async function overheadAt(server, o, texts, n, floor) {
    const seed = mix(o.seed, 0xe, n);
    const sys = await systemPrompt(server, texts, seed, n);
    const u1 = await texts.text(server, mix(seed, 1), o.newTokens);
    const msgs = [{ role: 'system', content: sys }, { role: 'user', content: u1 }];
    const prime = await server.chat(msgs);
    log(`  e ${server.kind} ${n} prime: ${brief(prime)}`);
    const reps = [];
    let last;
    for (let r = 0; r < o.repsE; r++) {
        const u = await texts.text(server, mix(seed, 10, r), o.overheadNewTokens);
        last = [...msgs, { role: 'assistant', content: prime.content }, { role: 'user', content: u }];
        const rec = await server.chat(last);
        log(`  e ${server.kind} ${n} rep ${r}: ${brief(rec)}`);
        reps.push({ ...strip(rec), overhead_ms: rec.ttft_ms - rec.prompt_ms });
    }
    // The last turn's body against the null server: the client's and the loopback's share of TTFT - prompt_ms.
    const clientFloor = await floor.ttft(server.chatBody(last), o.repsE, o.keepAlive ? keepAliveAgent : false);
    log(`  e ${server.kind} ${n} client floor: ${fmt(clientFloor, 1)} ms`);
    return {
        size: n,
        cached_median: median(reps.map((x) => x.cache_n)),
        computed_median: median(reps.map((x) => x.prompt_n)),
        ttft_median_ms: median(reps.map((x) => x.ttft_ms)),
        prompt_ms_median: median(reps.map((x) => x.prompt_ms)),
        overhead_median_ms: median(reps.map((x) => x.overhead_ms)),
        setup_median_ms: median(reps.map((x) => x.setup_ms)),
        client_floor_ms: clientFloor,
        prime: strip(prime),
        reps,
    };
}

const median = (xs) => {
    const v = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
    if (!v.length) return NaN;
    const m = Math.floor(v.length / 2);
    return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
};

const percentile = (xs, p) => {
    const v = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
    return v.length ? v[Math.min(v.length - 1, Math.floor((p / 100) * v.length))] : NaN;
};

const SYSTEM_HEAD = 'You are a coding agent working in a large repository. Follow the instructions, use the tools, and ' +
    'answer concisely.\n\n';

async function warmUp(server) {
    await server.chat([{ role: 'user', content: 'Say hello.' }], { maxTokens: 2 });
}

// System prompt of about n tokens in all: a first line that differs per seed (so that a cold request shares no
// prefix at all with earlier ones), the common head, and a generated document.
async function systemPrompt(server, texts, seed, n) {
    const r = rng(seed ^ 0x5bd1e995);
    const project = `Project ${pick(r, IDENTS)} ${pick(r, WORDS)} ${Math.floor(r() * 1e6)}.\n`;
    return project + SYSTEM_HEAD + (await texts.text(server, seed, Math.max(16, n - 40)));
}

function brief(rec) {
    return `prompt ${rec.prompt_tokens} (cached ${rec.cache_n}, computed ${rec.prompt_n}), TTFT ${fmt(rec.ttft_ms)} ms, ` +
        `prompt_ms ${fmt(rec.prompt_ms)}` + (rec.setup_ms !== undefined ? `, setup_ms ${fmt(rec.setup_ms)}` : '');
}

const benchmarks = {
    a: {
        title: 'warm-turn TTFT / cold TTFT',
        ctx: (o) => o.parallel * (Math.max(...o.sizes) + 2 * o.newTokens + 64 + o.maxTokens + o.margin),
        servers: (o) => o.servers,
        model: (o) => o.model,
        async run(server, o, texts) {
            const out = [];
            for (const n of o.sizes) {
                for (let r = 0; r < o.repsA; r++) {
                    const seed = mix(o.seed, 0xa, n, r);
                    const sys = await systemPrompt(server, texts, seed, n);
                    const u1 = await texts.text(server, mix(seed, 1), o.newTokens);
                    const u2 = await texts.text(server, mix(seed, 2), o.newTokens);
                    const msgs = [{ role: 'system', content: sys }, { role: 'user', content: u1 }];
                    const cold = await server.chat(msgs);
                    log(`  a ${server.kind} ${n} rep ${r} cold: ${brief(cold)}`);
                    const warm = await server.chat([...msgs, { role: 'assistant', content: cold.content },
                        { role: 'user', content: u2 }]);
                    log(`  a ${server.kind} ${n} rep ${r} warm: ${brief(warm)}`);
                    out.push({ size: n, rep: r, cold: strip(cold), warm: strip(warm), ratio: warm.ttft_ms / cold.ttft_ms });
                }
            }
            return out;
        },
    },
    b: {
        title: 'shared system prompt, interleaved conversations: memory',
        ctx: (o) => o.bSlots * (o.sharedSize + o.turns * (o.turnTokens + o.maxTokens + 32) + o.margin),
        parallel: (o) => o.bSlots,
        servers: (o) => o.servers,
        model: (o) => o.model,
        async run(server, o, texts) {
            const base = server.memory();
            const seed = mix(o.seed, 0xb);
            const sys = await systemPrompt(server, texts, seed, o.sharedSize);
            const sharedTokens = await texts.count(server, sys);
            const convs = [];
            for (let c = 0; c < o.conversations; c++) convs.push([{ role: 'system', content: sys }]);
            const users = [];
            for (let t = 0; t < o.turns; t++) {
                users.push([]);
                for (let c = 0; c < o.conversations; c++) users[t].push(await texts.text(server, mix(seed, c, t), o.turnTokens));
            }
            const reqs = [];
            let maxRss = base.rss, maxAnon = base.anon;
            const last = new Array(o.conversations);
            for (let t = 0; t < o.turns; t++) {
                for (let c = 0; c < o.conversations; c++) {
                    convs[c].push({ role: 'user', content: users[t][c] });
                    const rec = await server.chat(convs[c]);
                    convs[c].push({ role: 'assistant', content: rec.content });
                    maxRss = Math.max(maxRss, rec.rss);
                    maxAnon = Math.max(maxAnon, rec.rss_anon);
                    last[c] = rec;
                    reqs.push({ turn: t, conversation: c, ...strip(rec) });
                    log(`  b ${server.kind} turn ${t} conv ${c}: ${brief(rec)}, RSS ${mib(rec.rss)} MiB`);
                }
            }
            const fin = server.memory();
            const unique = sharedTokens + last.reduce((s, r) => s + r.prompt_tokens + r.completion_tokens - sharedTokens, 0);
            const kvBytes = unique * o.kvBytesPerToken;
            return [{
                shared_tokens: sharedTokens,
                unique_tokens: unique,
                kv_bytes_per_token: o.kvBytesPerToken,
                unique_kv_bytes: kvBytes,
                rss_base: base.rss,
                rss_anon_base: base.anon,
                rss_max: maxRss,
                rss_final: fin.rss,
                rss_anon_max: maxAnon,
                rss_anon_final: fin.anon,
                ratio_final: (fin.rss - base.rss) / kvBytes,
                ratio_max: (maxRss - base.rss) / kvBytes,
                ratio_anon_final: (fin.anon - base.anon) / kvBytes,
                computed_tokens: reqs.reduce((s, r) => s + (r.prompt_n ?? 0), 0),
                prompt_tokens: reqs.reduce((s, r) => s + (r.prompt_tokens ?? 0), 0),
                ttft_median_ms: median(reqs.map((r) => r.ttft_ms)),
                ttft_total_ms: reqs.reduce((s, r) => s + r.ttft_ms, 0),
                requests: reqs,
            }];
        },
    },
    c: {
        title: 'TTFT after a restart / cold TTFT (keepwarm)',
        ctx: (o) => o.parallel * (o.restartSize + 2 * o.newTokens + 64 + o.maxTokens + o.margin),
        servers: (o) => o.servers.filter((s) => s === 'keepwarm'),
        model: (o) => o.model,
        custom: true,
        async run(_server, o, texts, make) {
            const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keepwarm-bench-cache-'));
            const extra = o.restartArgs.map((a) => a.replaceAll('{dir}', dir));
            try {
                let server;
                try {
                    server = await make(extra).start();
                } catch (e) {
                    if (e instanceof ServerError && /not expected|unknown|unrecognized|invalid|extraneous|requires/i.test(e.message)) {
                        const why = e.message.split('\n').map((l) => l.replace(/^\s*\|\s?/, '').trim())
                            .find((l) => /not expected|unknown|unrecognized|invalid|extraneous|requires/i.test(l) && !/ exited /.test(l));
                        return [{ skipped: `keepwarm rejected \`${o.restartArgs.join(' ')}\` (${why ?? 'see its log'})` }];
                    }
                    throw e;
                }
                let cold, restarted, warmSame;
                const seed = mix(o.seed, 0xc);
                try {
                    await warmUp(server);
                    const sys = await systemPrompt(server, texts, seed, o.restartSize);
                    const u1 = await texts.text(server, mix(seed, 1), o.newTokens);
                    const u2 = await texts.text(server, mix(seed, 2), o.newTokens);
                    const msgs = [{ role: 'system', content: sys }, { role: 'user', content: u1 }];
                    cold = await server.chat(msgs);
                    log(`  c cold: ${brief(cold)}`);
                    const next = [...msgs, { role: 'assistant', content: cold.content }, { role: 'user', content: u2 }];
                    await server.stop();
                    const stopMs = server.stopMs;
                    server = await make(extra).start();
                    const loadMs = server.loadMs;
                    await warmUp(server);
                    restarted = await server.chat(next);
                    log(`  c after restart: ${brief(restarted)}`);
                    return [{
                        size: o.restartSize, cache_dir_bytes: dirBytes(dir), stop_ms: stopMs, restart_load_ms: loadMs,
                        cold: strip(cold), restarted: strip(restarted), ratio: restarted.ttft_ms / cold.ttft_ms,
                        command: server.commandLine(),
                    }];
                } finally {
                    await server.stop();
                }
            } finally {
                fs.rmSync(dir, { recursive: true, force: true });
            }
        },
    },
    d: {
        title: 'hybrid model: tokens recomputed after an edit inside the last user message',
        ctx: (o) => o.parallel * (o.hybridSize + 64 + o.maxTokens + o.margin),
        servers: (o) => o.servers,
        model: (o) => o.hybridModel,
        async run(server, o, texts) {
            const seed = mix(o.seed, 0xd);
            const userTokens = Math.min(o.hybridUserTokens, Math.floor(o.hybridSize / 2));
            const sys = await systemPrompt(server, texts, seed, o.hybridSize - userTokens);
            const user = await texts.text(server, mix(seed, 1), userTokens);
            // The edit: a word inserted at the first space after the middle of the user message.
            let at = user.indexOf(' ', Math.floor(user.length / 2));
            if (at < 0) at = Math.floor(user.length / 2);
            const edited = user.slice(0, at) + ' carefully' + user.slice(at);
            const tail = await texts.count(server, edited.slice(at));
            const first = await server.chat([{ role: 'system', content: sys }, { role: 'user', content: user }]);
            log(`  d ${server.kind} first: ${brief(first)}`);
            const second = await server.chat([{ role: 'system', content: sys }, { role: 'user', content: edited }]);
            log(`  d ${server.kind} edited: ${brief(second)}`);
            return [{ size: o.hybridSize, user_tokens: userTokens, tokens_after_edit: tail, first: strip(first), edited: strip(second) }];
        },
    },
    e: {
        title: 'overhead: wall TTFT - prompt_ms on warm turns',
        ctx: (o) => o.parallel * (Math.max(...o.overheadSizes) + o.newTokens + o.overheadNewTokens + 64 + o.maxTokens + o.margin),
        servers: (o) => o.servers,
        model: (o) => o.model,
        async run(server, o, texts) {
            const out = [];
            const floor = await new NullServer().start();
            try {
                for (const n of o.overheadSizes) out.push(await overheadAt(server, o, texts, n, floor));
            } finally {
                floor.stop();
            }
            return out;
        },
    },
    f: {
        title: 'stalls: gaps between a stream\'s tokens while another client\'s cold prompt is prefilled',
        ctx: (o) => o.parallel * (Math.max(o.stallSize, o.streamTokens + 256) + 64 + o.maxTokens + o.margin),
        servers: (o) => o.servers,
        model: (o) => o.model,
        async run(server, o, texts) {
            const out = [];
            const story = [{ role: 'user', content: 'Write a very long story about a lighthouse keeper.' }];
            for (let r = 0; r < o.repsF; r++) {
                const seed = mix(o.seed, 0xf, r);
                const prompt = (tag) => systemPrompt(server, texts, mix(seed, tag), o.stallSize)
                    .then((sys) => [{ role: 'system', content: sys }, { role: 'user', content: 'Summarize.' }]);
                // The same prompt size alone first (another text, so that the prompt below is cold too).
                const alone = await server.chat(await prompt(1));
                log(`  f ${server.kind} rep ${r} alone: ${brief(alone)}`);
                const beside = await prompt(2);

                const arrivals = [];
                const abort = new AbortController();
                const streamStarted = performance.now();
                const stream = server.chat(story, {
                    maxTokens: o.streamTokens,
                    onContent: () => arrivals.push(performance.now()),
                    signal: abort.signal,
                });
                while (arrivals.length < 16 && performance.now() - streamStarted < 60_000) await sleep(20);
                const sent = performance.now();
                const prefill = await server.chat(beside);
                const firstToken = sent + prefill.ttft_ms;
                await sleep(200);
                abort.abort();
                await stream;
                // Gaps that end while the prompt was being prefilled (its TTFT), the first one counted from when it
                // was sent.
                const gaps = [];
                let previous = sent;
                for (const t of arrivals) {
                    if (t <= sent) continue;
                    if (t > firstToken) {
                        gaps.push(t - previous);  // the gap the prefill's end closed
                        break;
                    }
                    gaps.push(t - previous);
                    previous = t;
                }
                const longest = gaps.indexOf(Math.max(...gaps));
                const rec = {
                    size: o.stallSize, rep: r, alone: strip(alone), beside: strip(prefill),
                    gap_max_at_ms: gaps.slice(0, longest).reduce((a, b) => a + b, 0),  // since the prompt was sent
                    ttft_ratio: prefill.ttft_ms / alone.ttft_ms, stream_tokens_during: gaps.length,
                    gap_max_ms: Math.max(...gaps), gap_p50_ms: percentile(gaps, 50), gap_p90_ms: percentile(gaps, 90),
                    gap_p99_ms: percentile(gaps, 99),
                };
                log(`  f ${server.kind} rep ${r} beside a stream: ${brief(prefill)}; stream: ${gaps.length} tokens, ` +
                    `longest gap ${fmt(rec.gap_max_ms)} ms (ending ${fmt(rec.gap_max_at_ms + rec.gap_max_ms)} ms after ` +
                    `the prompt was sent), p50 ${fmt(rec.gap_p50_ms)}, p90 ${fmt(rec.gap_p90_ms)}`);
                out.push(rec);
            }
            return out;
        },
    },
    h: {
        title: 'cold prefill with parked conversations: TTFT',
        ctx: (o) => o.parallel * (Math.max(...o.sizes, o.parkedTokens) + 64 + o.maxTokens + o.margin),
        servers: (o) => o.servers,
        model: (o) => o.model,
        paired: true,
        // makers: kind -> (extra args) -> Server. Returns kind -> records.
        async run(o, texts, makers) {
            const kinds = Object.keys(makers);
            const out = Object.fromEntries(kinds.map((k) => [k, []]));
            for (const n of o.sizes) {
                for (const parked of o.parkedCounts) {
                    for (let rep = 0; rep < o.repsH; rep++) {
                        for (const kind of rep % 2 ? [...kinds].reverse() : kinds) {
                            // keepwarm: a fresh disk tier, or an earlier run's prompts (same seed) would not be cold.
                            const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keepwarm-bench-cache-'));
                            const server = await makers[kind](kind === 'keepwarm' ? ['--cache-dir', dir] : []).start();
                            try {
                                await warmUp(server);
                                for (let p = 0; p < parked; p++) {
                                    const sys = await systemPrompt(server, texts, mix(o.seed, 0x4, n, p), o.parkedTokens);
                                    await server.chat([{ role: 'system', content: sys }, { role: 'user', content: 'Go on.' }]);
                                }
                                const sys = await systemPrompt(server, texts, mix(o.seed, 0x8, n), n);
                                const cold = await server.chat([{ role: 'system', content: sys }, { role: 'user', content: 'Go on.' }]);
                                log(`  h ${kind} ${n} after ${parked} parked, rep ${rep}: ${brief(cold)}`);
                                out[kind].push({ size: n, parked, rep, cold: strip(cold), command: server.commandLine() });
                            } finally {
                                await server.stop();
                                fs.rmSync(dir, { recursive: true, force: true });
                            }
                        }
                    }
                }
            }
            return out;
        },
    },
    g: {
        title: 'a long streamed answer: tokens/s over its first and its last tenth',
        ctx: (o) => o.parallel * (o.answerTokens + 1024 + o.margin),
        servers: (o) => o.servers,
        model: (o) => o.model,
        async run(server, o) {
            const out = [];
            const tools = ['read_file', 'write_file', 'run_command'].map((name) => ({
                type: 'function',
                function: {
                    name,
                    description: `The ${name.replace('_', ' ')} tool of a coding agent.`,
                    parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
                },
            }));
            // Every token the same word: then characters count tokens, and the random model's output cannot wander
            // into a tool call's markup.
            const [word] = (await server.post('/tokenize', { content: ' the', add_special: false })).tokens;
            // Without tools, then with tools while the first answer's conversation stays cached (keepwarm parks it
            // on the device, in the same KV cells pool; llama-server keeps it in its other slot), then with tools
            // again on a restarted server: the last two tell the cached conversation's cost from the tools'.
            const cases = [{ withTools: false, after: 'fresh' }, { withTools: true, after: 'answer cached' },
                { withTools: true, after: 'restarted', restart: true }];
            for (const { withTools, after, restart } of cases) {
                if (restart) {
                    await server.stop();
                    await server.start();
                    await warmUp(server);
                }
                const arrivals = [];  // [ms, content characters so far]
                let chars = 0;
                const rec = await server.chat([{ role: 'user', content: 'Write the whole file, a long one.' }], {
                    maxTokens: o.answerTokens,
                    extra: { logit_bias: { [word]: 100 }, ...(withTools ? { tools, tool_choice: 'auto' } : {}) },
                    onContent: (ms, text) => arrivals.push([ms, (chars += text.length)]),
                });
                // The time the answer took to go from a fraction `from` to `to` of its characters, as tokens/s.
                const at = (fraction) => arrivals.find(([, c]) => c >= fraction * chars)?.[0] ?? NaN;
                const rate = (from, to) => ((to - from) * rec.completion_tokens) / ((at(to) - at(from)) / 1000);
                const r = {
                    tools: withTools, after, completion_tokens: rec.completion_tokens, content_chars: chars,
                    events: arrivals.length, start_tps: rate(0, 0.1), end_tps: rate(0.9, 1),
                    server_tps: rec.timings?.predicted_per_second,
                };
                r.end_over_start = r.end_tps / r.start_tps;
                log(`  g ${server.kind} ${withTools ? 'with' : 'without'} tools (${after}): ${r.completion_tokens} tokens, ` +
                    `${chars} characters in ${r.events} events; ${fmt(r.start_tps, 1)} tokens/s over the first ` +
                    `tenth, ${fmt(r.end_tps, 1)} over the last (${ratio(r.end_over_start)})`);
                out.push(r);
            }
            return out;
        },
    },
};

function strip(rec) {
    const { content, ...rest } = rec;
    return { ...rest, content_chars: content?.length ?? 0 };
}

function dirBytes(dir) {
    let total = 0;
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
        const p = path.join(dir, e.name);
        if (e.isDirectory()) total += dirBytes(p);
        else if (e.isFile()) total += fs.statSync(p).size;
    }
    return total;
}

// ---------------------------------------------------------------------------------------------------------------
// Reporting

function fmt(x, d = 0) {
    if (x === undefined || x === null || Number.isNaN(x)) return '-';
    if (typeof x !== 'number') return String(x);
    return x.toFixed(d);
}
const mib = (b) => fmt(b / 1048576, 0);
const ratio = (x) => fmt(x, 3);

function table(headers, rows) {
    const w = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => String(r[i]).length)));
    const line = (cells) => cells.map((c, i) => String(c).padStart(w[i])).join('  ');
    return [line(headers), line(w.map((n) => '-'.repeat(n))), ...rows.map(line)].join('\n');
}

function mdTable(headers, rows) {
    return [`| ${headers.join(' | ')} |`, `| ${headers.map((_, i) => (i === 0 ? '---' : '---:')).join(' | ')} |`,
        ...rows.map((r) => `| ${r.map((c) => String(c).replace(/\|/g, '\\|')).join(' | ')} |`)].join('\n');
}

// Rows per benchmark: [headers, rows] built from results[bench][server] = records or {error}.
function views(results, o) {
    const out = [];
    // Failed or skipped servers get a short row; the reason is printed under the table (notes).
    const notes = {};
    const each = (b, f) => {
        const rows = [];
        for (const [server, recs] of Object.entries(results[b] ?? {})) {
            if (recs.error) {
                rows.push([server, 'FAILED (see below)']);
                const lines = recs.error.split('\n').filter((l) => l.trim());
                const logLine = lines.filter((l) => /^\s*\|/.test(l) && !/=====/.test(l)).pop()?.replace(/^\s*\|\s?/, '');
                (notes[b] ??= []).push(`${server} failed: ${lines[0] ?? ''}${logLine ? ` (log: ${logLine.trim()})` : ''}`);
            } else if (recs[0]?.skipped) {
                rows.push([server, 'skipped (see below)']);
                (notes[b] ??= []).push(`${server} skipped: ${recs[0].skipped}`);
            } else {
                rows.push(...f(server, recs));
            }
        }
        return rows;
    };
    if (results.a) {
        out.push(['a', benchmarks.a.title, ['server', 'cached tokens', 'cold TTFT ms', 'warm TTFT ms', 'warm computed',
            'warm/cold (median)', 'per rep'],
        each('a', (server, recs) => o.sizes.map((n) => {
            const r = recs.filter((x) => x.size === n);
            return [server, fmt(median(r.map((x) => x.warm.cache_n))), fmt(median(r.map((x) => x.cold.ttft_ms))),
                fmt(median(r.map((x) => x.warm.ttft_ms))), fmt(median(r.map((x) => x.warm.prompt_n))),
                ratio(median(r.map((x) => x.ratio))), r.map((x) => ratio(x.ratio)).join(', ')];
        }))]);
    }
    if (results.b) {
        out.push(['b', benchmarks.b.title, ['server', 'unique tokens', 'unique KV MiB', 'RSS base MiB', 'RSS max MiB',
            'RSS final MiB', '(final-base)/KV', '(max-base)/KV', 'anon (final-base)/KV', 'computed / prompt tokens',
            'median TTFT ms'],
        each('b', (server, [r]) => [[server, r.unique_tokens, mib(r.unique_kv_bytes), mib(r.rss_base), mib(r.rss_max),
            mib(r.rss_final), ratio(r.ratio_final), ratio(r.ratio_max), ratio(r.ratio_anon_final),
            `${r.computed_tokens} / ${r.prompt_tokens}`, fmt(r.ttft_median_ms)]])]);
    }
    if (results.c) {
        out.push(['c', benchmarks.c.title, ['server', 'prompt tokens', 'cold TTFT ms', 'restart TTFT ms',
            'restart cached / computed', 'restart/cold', 'cache dir MiB', 'other timings after restart'],
        each('c', (server, [r]) => [[server, r.cold.prompt_tokens, fmt(r.cold.ttft_ms), fmt(r.restarted.ttft_ms),
            `${r.restarted.cache_n} / ${r.restarted.prompt_n}`, ratio(r.ratio), mib(r.cache_dir_bytes),
            extraTimings(r.restarted.timings)]])]);
    }
    if (results.d) {
        out.push(['d', benchmarks.d.title, ['server', 'prompt tokens', 'tokens after the edit', 'recomputed (prompt_n)',
            'reused (cache_n)', 'first TTFT ms', 'edited TTFT ms', 'edited/first', 'other timings (edited)'],
        each('d', (server, [r]) => [[server, r.edited.prompt_tokens, r.tokens_after_edit, r.edited.prompt_n,
            r.edited.cache_n, fmt(r.first.ttft_ms), fmt(r.edited.ttft_ms), ratio(r.edited.ttft_ms / r.first.ttft_ms),
            extraTimings(r.edited.timings)]])]);
    }
    if (results.e) {
        out.push(['e', benchmarks.e.title, ['server', 'cached tokens', 'computed', 'TTFT ms', 'prompt_ms',
            'TTFT - prompt_ms', 'setup_ms', 'client floor ms'],
        each('e', (server, recs) => recs.map((r) => [server, fmt(r.cached_median), fmt(r.computed_median),
            fmt(r.ttft_median_ms, 1), fmt(r.prompt_ms_median, 1), fmt(r.overhead_median_ms, 1),
            fmt(r.setup_median_ms, 1), fmt(r.client_floor_ms, 1)]))]);
    }
    if (results.f) {
        out.push(['f', benchmarks.f.title, ['server', 'prompt tokens', 'TTFT alone ms', 'TTFT beside a stream ms',
            'beside/alone', 'stream tokens during the prefill', 'longest gap ms', 'gap p50 ms', 'gap p90 ms',
            'gap p99 ms'],
        each('f', (server, recs) => [[server, fmt(median(recs.map((x) => x.beside.prompt_tokens))),
            fmt(median(recs.map((x) => x.alone.ttft_ms))), fmt(median(recs.map((x) => x.beside.ttft_ms))),
            ratio(median(recs.map((x) => x.ttft_ratio))), fmt(median(recs.map((x) => x.stream_tokens_during))),
            `${fmt(Math.max(...recs.map((x) => x.gap_max_ms)))} (max of ${recs.length})`,
            fmt(median(recs.map((x) => x.gap_p50_ms))), fmt(median(recs.map((x) => x.gap_p90_ms))),
            fmt(median(recs.map((x) => x.gap_p99_ms)))]])]);
    }
    if (results.h) {
        // The median of the repetitions, and their range when there are several.
        const ttft = (recs) => {
            const t = recs.map((r) => r.cold.ttft_ms);
            return t.length > 1 ? `${fmt(median(t))} (${fmt(Math.min(...t))}-${fmt(Math.max(...t))})` : fmt(t[0]);
        };
        out.push(['h', benchmarks.h.title, ['server', 'prompt tokens', ...o.parkedCounts.map((p) => `TTFT ms, ${p} parked`)],
        each('h', (server, recs) => o.sizes.map((n) => [server, fmt(median(recs.filter((r) => r.size === n)
            .map((r) => r.cold.prompt_tokens))), ...o.parkedCounts.map((p) => ttft(recs.filter((r) => r.size === n &&
            r.parked === p)))]))]);
    }
    if (results.g) {
        out.push(['g', benchmarks.g.title, ['server', 'tools', 'server state', 'tokens', 'SSE events',
            'tokens/s, first tenth', 'tokens/s, last tenth', 'last/first', 'server tokens/s'],
        each('g', (server, recs) => recs.map((r) => [server, r.tools ? 'yes' : 'no', r.after ?? '',
            r.completion_tokens, r.events,
            fmt(r.start_tps, 1), fmt(r.end_tps, 1), ratio(r.end_over_start), fmt(r.server_tps, 1)]))]);
    }
    for (const v of out) {
        v.push(notes[v[0]] ?? []);
        const width = v[2].length;
        for (const row of v[3]) while (row.length < width) row.push('');
    }
    return out;
}

// Fields of a server's timings beyond llama-server's (keepwarm's per-tier reuse and the like), as "key=value".
const STANDARD_TIMINGS = new Set(['cache_n', 'prompt_n', 'prompt_ms', 'prompt_per_token_ms', 'prompt_per_second',
    'predicted_n', 'predicted_ms', 'predicted_per_token_ms', 'predicted_per_second', 'setup_ms']);
function extraTimings(t) {
    if (!t) return '';
    return Object.entries(t).filter(([k, v]) => !STANDARD_TIMINGS.has(k) && (typeof v !== 'object' || v === null))
        .map(([k, v]) => `${k}=${typeof v === 'number' ? +v.toFixed(1) : JSON.stringify(v)}`).join(' ');
}

function machine() {
    let cpu = 'unknown';
    try {
        cpu = (fs.readFileSync('/proc/cpuinfo', 'utf8').match(/^model name\s*:\s*(.+)$/m) ?? [])[1] ?? cpu;
    } catch {}
    let git = 'unknown';
    try {
        git = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: path.dirname(new URL(import.meta.url).pathname) })
            .toString().trim();
        const dirty = execFileSync('git', ['status', '--porcelain', '--untracked-files=no'],
            { cwd: path.dirname(new URL(import.meta.url).pathname) }).toString().trim();
        if (dirty) git += ' (with uncommitted changes)';
    } catch {}
    return { nproc: os.cpus().length, cpu, git, memory_gib: +(os.totalmem() / 2 ** 30).toFixed(1), loadavg: os.loadavg() };
}

function inspect(keepwarm, model) {
    const json = JSON.parse(execFileSync(keepwarm, ['inspect', '--json', model]).toString());
    const text = execFileSync(keepwarm, ['inspect', model]).toString();
    return { json, text };
}

function shape(j) {
    return `${j.architecture}, ${j.layers} layers (${j.layer_summary}), width ${j.embedding_length}, ${j.heads} heads, ` +
        `${j.kv_heads} KV heads of ${j.head_size_k}, ${j.weight_type} weights, ${(j.parameters / 1e6).toFixed(0)} M ` +
        `parameters, KV ${fmt(j.kv_bytes_per_token.f16 / 1024, 1)} KiB/token at f16`;
}

// ---------------------------------------------------------------------------------------------------------------
// Driver

async function main() {
    const o = parseArgs(process.argv.slice(2));
    const argvLine = ['node', path.relative(process.cwd(), process.argv[1]), ...process.argv.slice(2)].map(shellQuote).join(' ');
    const models = {};
    if (o.model) models.dense = inspect(o.keepwarm, o.model);
    if (o.hybridModel && o.only.includes('d')) models.hybrid = inspect(o.keepwarm, o.hybridModel);
    if (models.dense) {
        o.kvBytesPerToken = models.dense.json.kv_bytes_per_token[o.kv];
        if (!o.kvBytesPerToken) fail(`keepwarm inspect gives no KV bytes per token for '${o.kv}'`);
    }
    const meta = {
        date: new Date().toISOString(),
        command: process.env.PREFIX_CACHE_COMMAND ?? argvLine,
        machine: machine(),
        models: Object.fromEntries(Object.entries(models).map(([k, v]) => [k, { path: k === 'dense' ? o.model : o.hybridModel, ...v.json }])),
        options: { ...o, keepwarm: undefined, llamaServer: undefined },
        binaries: { keepwarm: o.keepwarm, 'llama-server': o.llamaServer },
        server_commands: {},
    };
    log(`machine: ${meta.machine.nproc} CPUs, ${meta.machine.cpu}, load ${meta.machine.loadavg.map((x) => x.toFixed(2)).join(' ')}`);
    const texts = new TextFactory();
    const results = {};
    fs.mkdirSync(o.logDir, { recursive: true });

    for (const b of 'abcdefgh') {
        if (!o.only.includes(b)) continue;
        const bench = benchmarks[b];
        const servers = bench.servers(o);
        if (!servers.length) {
            log(`${b}: no server to run (keepwarm only)`);
            continue;
        }
        results[b] = {};
        const model = bench.model(o);
        const ctx = bench.ctx(o);
        const parallel = bench.parallel?.(o) ?? o.parallel;
        log(`${b}: ${bench.title} (ctx ${ctx}, ${parallel} slots, ${o.threads} threads, ${path.basename(model)})`);
        const makerFor = (kind) => (extra = []) => new Server(kind, {
            bin: kind === 'keepwarm' ? o.keepwarm : o.llamaServer,
            model, ctx, parallel, threads: o.threads,
            extra: [...(kind === 'keepwarm' ? o.keepwarmArgs : o.llamaServerArgs), ...extra],
            logFile: path.join(o.logDir, `${b}-${kind}.log`),
            opts: o,
        });
        if (bench.paired) {
            const makers = Object.fromEntries(servers.map((kind) => [kind, makerFor(kind)]));
            for (const kind of servers) meta.server_commands[`${b}/${kind}`] = makers[kind]().commandLine();
            try {
                Object.assign(results[b], await bench.run(o, texts, makers));
            } catch (e) {
                const msg = e instanceof ServerError ? e.message : `${e.stack ?? e}`;
                log(`${b}: FAILED: ${msg}`);
                for (const kind of servers) results[b][kind] = { error: msg };
            }
            continue;
        }
        for (const kind of servers) {
            const make = makerFor(kind);
            meta.server_commands[`${b}/${kind}`] = make(b === 'c' ? o.restartArgs : []).commandLine();
            let server;
            let scratchDir;
            try {
                if (bench.custom) {
                    results[b][kind] = await bench.run(null, o, texts, make);
                } else {
                    // A fresh disk tier per run: the default cache directory may hold these very prompts from an
                    // earlier run (same generator seed), which would make "cold" requests warm.
                    if (kind === 'keepwarm' && !o.keepwarmArgs.includes('--cache-dir')) {
                        scratchDir = fs.mkdtempSync(path.join(os.tmpdir(), 'keepwarm-bench-cache-'));
                        server = make(['--cache-dir', scratchDir]);
                    } else {
                        server = make();
                    }
                    await server.start();
                    log(`  ${kind} ready in ${fmt(server.loadMs)} ms (pid ${server.proc.pid}, log ${server.logFile})`);
                    await warmUp(server);
                    results[b][kind] = await bench.run(server, o, texts);
                }
            } catch (e) {
                const msg = e instanceof ServerError ? e.message : `${e.stack ?? e}${server ? `\n${server.logTail()}` : ''}`;
                log(`${b}: ${kind} FAILED: ${msg}`);
                results[b][kind] = { error: msg };
            } finally {
                if (server) {
                    const code = await server.stop();
                    if (code !== 0 && code !== 'SIGTERM' && code !== null && !results[b][kind]?.error) {
                        log(`  ${kind} exited with ${code} on SIGTERM`);
                    }
                }
                if (scratchDir) fs.rmSync(scratchDir, { recursive: true, force: true });
            }
        }
    }

    // Output: terminal tables, JSON, Markdown.
    const vs = views(results, o);
    for (const [b, title, headers, rows, notes] of vs) {
        console.log(`\n(${b}) ${title}\n${table(headers, rows)}`);
        for (const n of notes) console.log(`  ${n}`);
    }
    fs.mkdirSync(path.dirname(o.out), { recursive: true });
    fs.writeFileSync(o.out, JSON.stringify({ meta, results }, null, 2));
    const md = [];
    md.push(`Measured ${meta.date.slice(0, 10)} at commit ${meta.machine.git} on ${meta.machine.nproc} CPUs ` +
        `(${meta.machine.cpu}), load average ${meta.machine.loadavg.map((x) => x.toFixed(1)).join(' / ')} at the start.`);
    md.push('');
    md.push('```sh\n' + meta.command + '\n```');
    md.push('');
    if (models.dense) md.push(`- dense model: \`${path.basename(o.model)}\`: ${shape(models.dense.json)}`);
    if (models.hybrid) md.push(`- hybrid model: \`${path.basename(o.hybridModel)}\`: ${shape(models.hybrid.json)}`);
    md.push(`- ${o.threads} threads; slots: ${o.parallel} (b: ${o.bSlots}); ${o.maxTokens} generated tokens per request ` +
        '(temperature 0, `ignore_eos`), streamed; TTFT = wall time from sending the request to the first SSE event; ' +
        'one server running at a time');
    md.push('- server command lines (PORT chosen per run):');
    for (const [k, c] of Object.entries(meta.server_commands)) md.push(`  - ${k}: \`${c}\``);
    for (const [b, title, headers, rows, notes] of vs) {
        md.push('', `(${b}) ${title}`, '', mdTable(headers, rows));
        if (notes.length) md.push('', ...notes.map((n) => `- ${n}`));
    }
    const mdFile = o.out.replace(/\.json$/, '') + '.md';
    fs.writeFileSync(mdFile, md.join('\n') + '\n');
    log(`results: ${o.out}, ${mdFile}; server logs in ${o.logDir}`);
    const failed = Object.values(results).some((r) => Object.values(r).some((x) => x.error));
    keepAliveAgent.destroy();
    process.exitCode = failed ? 1 : 0;
}

main().catch((e) => {
    console.error(`prefix-cache: ${e.stack ?? e}`);
    for (const s of running) s.kill();
    process.exit(1);
});
