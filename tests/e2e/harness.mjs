// Shared helpers for the end-to-end tests: generated test models, and the real keepwarm binary started on a
// free port. Each test file starts the servers it needs and stops them when it ends.
import { spawn, execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import { promisify } from 'node:util';
import path from 'node:path';
import OpenAI from 'openai';

const run = promisify(execFile);

export const binary = process.env.KEEPWARM_BINARY ?? path.resolve('build/keepwarm');
export const modelsDir = process.env.KEEPWARM_TEST_MODELS_DIR ?? path.resolve('build/test-models');

// Path of a generated test model (`keepwarm mkmodel --preset NAME`), generated on first use.
export async function testModel(preset = 'tiny') {
    mkdirSync(modelsDir, { recursive: true });
    const file = path.join(modelsDir, `${preset}.gguf`);
    if (!existsSync(file)) {
        await run(binary, ['mkmodel', '--preset', preset, '--seed', '1', '-o', file], { timeout: 300_000 });
    }
    return file;
}

// Starts the keepwarm binary with `args` (serve, proxy, ...) and resolves once it listens: { url, proc, output(),
// stop(signal) }. stop() resolves with the exit code or signal, and kills the process if it takes over 10 s.
// `executable`: a copy of the binary elsewhere (with the libraries beside it that it should load).
export async function startProcess(args, { env = {}, timeoutMs = 120_000, executable = binary, cwd } = {}) {
    const proc = spawn(executable, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env }, cwd });
    let output = '';
    const url = await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`${args[0]} did not start:\n${output}`)), timeoutMs);
        const onData = (chunk) => {
            output += chunk;
            const m = output.match(/listening on (http:\/\/[^\s"]+)/);
            if (m) {
                clearTimeout(timer);
                resolve(m[1]);
            }
        };
        proc.stdout.on('data', onData);
        proc.stderr.on('data', onData);
        proc.on('exit', (code, signal) => {
            clearTimeout(timer);
            reject(new Error(`${args[0]} exited with ${code ?? signal}:\n${output}`));
        });
    });
    proc.removeAllListeners('exit');
    return {
        url,
        proc,
        output: () => output,
        async stop(signal = 'SIGTERM') {
            if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode ?? proc.signalCode;
            const exited = new Promise((resolve) => proc.on('exit', (code, sig) => resolve(sig ?? code)));
            proc.kill(signal);
            const timer = setTimeout(() => proc.kill('SIGKILL'), 10_000);
            const result = await exited;
            clearTimeout(timer);
            return result;
        },
    };
}

// The temporary folders the tests made in this process (tempDir, and startServer's cache folders), removed when it
// exits: not when a server stops, since a test may start one again on the folder of one it stopped. (Never removed
// before: 1,498 cache folders, up to 243 MB each, and 700 others had piled up in /tmp over two days of test runs.)
const madeDirs = [];
process.on('exit', () => {
    for (const dir of madeDirs) rmSync(dir, { recursive: true, force: true });
});

// A fresh folder /tmp/keepwarm-NAME-XXXXXX, removed when this test process exits.
export function tempDir(name) {
    const dir = mkdtempSync(path.join(os.tmpdir(), `keepwarm-${name}-`));
    madeDirs.push(dir);
    return dir;
}

// Starts `keepwarm serve` with the given extra arguments; resolves once it listens. Each server gets its own
// disk-cache folder (a fresh temporary one unless `cacheDir` is given, e.g. to restart on the same cache).
export async function startServer(args = [], { preset = 'tiny', env = {}, cacheDir, executable } = {}) {
    const model = await testModel(preset);
    cacheDir ??= tempDir('e2e');
    const server = await startProcess(['serve', '-m', model, '--port', '0', '-t', '1', '--cache-dir', cacheDir, ...args],
        { env, executable });
    return {
        ...server,
        cacheDir,
        client: (options = {}) => new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0, ...options }),
    };
}

// curl, as a second real client: returns { status, body } with body parsed as JSON when it is JSON.
export async function curl(url, { method = 'GET', body, headers = {}, raw = false } = {}) {
    const args = ['-s', '-o', '-', '-w', '\n%{http_code}', '-X', method];
    for (const [k, v] of Object.entries(headers)) args.push('-H', `${k}: ${v}`);
    if (body !== undefined) {
        args.push('-H', 'Content-Type: application/json', '--data-binary', '@-');
    }
    const child = execFile('curl', [...args, url], { maxBuffer: 64 << 20 });
    const out = new Promise((resolve, reject) => {
        let stdout = '';
        child.stdout.on('data', (d) => (stdout += d));
        child.on('error', reject);
        child.on('close', () => resolve(stdout));
    });
    if (body !== undefined) child.stdin.end(typeof body === 'string' ? body : JSON.stringify(body));
    else child.stdin.end();
    const text = await out;
    const nl = text.lastIndexOf('\n');
    const status = Number(text.slice(nl + 1));
    const payload = text.slice(0, nl);
    if (raw) return { status, body: payload };
    try {
        return { status, body: JSON.parse(payload) };
    } catch {
        return { status, body: payload };
    }
}

// /metrics as { name: value }; a labelled sample is keyed as written, e.g. 'requests_total{upstream="http://..."}'.
export async function metrics(url) {
    const { body } = await curl(`${url}/metrics`, { raw: true });
    const values = {};
    for (const line of body.split('\n')) {
        const m = line.match(/^(\w+(?:\{[^}]*\})?) ([0-9.e+-]+)$/);
        if (m) values[m[1]] = Number(m[2]);
    }
    return values;
}

// A hang guard, not a timing claim: it polls until the predicate holds, for a minute by default (a loaded machine).
export async function waitFor(predicate, { timeoutMs = 60_000, intervalMs = 50 } = {}) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
        const value = await predicate();
        if (value) return value;
        if (Date.now() > deadline) return value;
        await new Promise((r) => setTimeout(r, intervalMs));
    }
}

// Deterministic filler text of roughly `n` words.
export function words(n, seed) {
    const vocab = ['cache', 'prefix', 'agent', 'tool', 'model', 'turn', 'state', 'block', 'the', 'of', 'and', 'with'];
    let x = seed;
    const out = [];
    for (let i = 0; i < n; i++) {
        x = (x * 1103515245 + 12345) % 2147483648;
        out.push(vocab[x % vocab.length]);
    }
    return out.join(' ');
}

// A loopback port nothing listens on now (for a server that must come back at the same URL, or one that is not ours).
export async function freePort() {
    const server = net.createServer();
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address();
    await new Promise((resolve) => server.close(resolve));
    return port;
}

// The pinned llama-server that bench/build-llama-server.sh builds into the llama.cpp cache entry ($LLAMA_SERVER
// first), or null.
export function findLlamaServer() {
    if (process.env.LLAMA_SERVER) return process.env.LLAMA_SERVER;
    const root = process.env.KEEPWARM_CACHE_DIR ?? path.join(os.homedir(), '.cache', 'keepwarm');
    if (!existsSync(root)) return null;
    for (const entry of readdirSync(root)) {
        const candidate = path.join(root, entry, 'tools', 'llama-server');
        if (entry.startsWith('llama.cpp-') && existsSync(candidate)) return candidate;
    }
    return null;
}
