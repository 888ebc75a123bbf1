// The documentation's examples, run as written: each fenced block after a `<!-- snippet: NAME -->` marker is read
// from README.md or a page of docs/ (not copied here), its http://127.0.0.1:8080 turned into a test server's address,
// and run against that server; each must succeed and stay within the output bound it sets (issue 33: the first curl
// set no max_tokens and ran 140 s on the demo model, the Qwen Code settings six minutes). And a fenced request example
// added to README.md or docs/ without a bound or a marker fails the first test below.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, tempDir } from './harness.mjs';
import { startCapture } from './capture-requests.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.join(here, '../..');
// The files whose snippets are read, as paths from the repository's root (what error messages name).
const documents = ['README.md', ...readdirSync(path.join(root, 'docs')).filter((f) => f.endsWith('.md')).sort()
    .map((f) => `docs/${f}`)];
const readmeAddress = 'http://127.0.0.1:8080';

// Every fenced block of a document: { file, lang, code, line, marker } (marker: the snippet name right before it, if
// any).
function fencedBlocks(file, text) {
    const lines = text.split('\n');
    const blocks = [];
    for (let i = 0; i < lines.length; ++i) {
        const open = lines[i].match(/^```(\w*)\s*$/);
        if (!open) continue;
        let end = i + 1;
        while (end < lines.length && !lines[end].startsWith('```')) ++end;
        const before = lines.slice(0, i).reverse().find((l) => l.trim() !== '') ?? '';
        const marker = before.match(/^<!-- snippet: ([a-z0-9-]+) -->$/)?.[1];
        blocks.push({ file, lang: open[1], code: lines.slice(i + 1, end).join('\n'), line: i + 1, marker });
        i = end;
    }
    return blocks;
}

const blocks = documents.flatMap((file) => fencedBlocks(file, readFileSync(path.join(root, file), 'utf8')));
const where = (b) => `${b.file}:${b.line}`;
// The one block marked NAME in all the documents.
const snippet = (name) => {
    const found = blocks.filter((b) => b.marker === name);
    assert.equal(found.length, 1, `${found.length} blocks marked ${name}` +
        (found.length ? ` (${found.map(where).join(', ')})` : ` in ${documents.join(', ')}`));
    return found[0];
};
// A test's name: the snippet and the file it is in.
const named = (name, what) => `${blocks.find((b) => b.marker === name)?.file ?? 'missing'} ${name}: ${what}`;
const at = (code, url) => code.replaceAll(readmeAddress, url);

// What makes a block a request example (a request sent, a client or an agent pointed at a server), and what bounds
// its answers' length in each client's own terms.
const sendsRequests = /\bcurl\b[^\n]*\s-d\s|\.(chat|generate|create)\s*\(|base_?url|BASE_URL/i;
const bound =
    /max_tokens|max_completion_tokens|num_predict|max_output_tokens|MAX_OUTPUT_TOKENS|"output"\s*:\s*\d+/;
// Snippets whose client has no setting for an answer's length: keepwarm's -n (4096 by default) bounds them.
const unboundedByClient = {
    'codex-config': "Codex's config.toml has no key for max_output_tokens (checked in its binary's config schema)",
};
// The snippets this file runs: a marked block none of the tests below runs fails the first test.
const runHere = ['curl-chat', 'claude-code', 'curl-ollama-chat', 'ollama-js', 'codex-config', 'opencode-config',
    'qwen-code-settings'];

test('every fenced request example in README.md and docs/ is marked, run here, and bounds its answer', () => {
    const examples = blocks.filter((b) => sendsRequests.test(b.code));
    assert.ok(examples.length >= 7, `found only ${examples.length} request examples`);
    for (const b of examples) {
        assert.ok(b.marker, `${where(b)}: a request example without a <!-- snippet: NAME --> marker`);
        assert.ok(runHere.includes(b.marker), `${where(b)}: snippet ${b.marker} is run by no test`);
        if (!unboundedByClient[b.marker]) {
            assert.match(b.code, bound, `${where(b)}: snippet ${b.marker} sets no max_tokens (or equivalent)`);
        }
    }
    for (const name of runHere) snippet(name);
});

let server;
let small; // a slot of 64 tokens: an answer the agents' 8,192-token bounds allow ends there on the demo model
let keyed;
const started = [];
before(async () => {
    server = await startServer(['-c', '4096', '--parallel', '2']);
    started.push(server);
    small = await startServer(['-c', '64', '--parallel', '1']);
    started.push(small);
});
after(async () => {
    await Promise.all(started.map((s) => (s.stop ?? s.close)()));
});

// Runs a shell snippet with bash; resolves with { code, stdout, stderr }.
function bash(code, env = {}) {
    return new Promise((resolve) => {
        execFile('bash', ['-euo', 'pipefail', '-c', code], { env: { ...process.env, ...env }, timeout: 120_000,
            maxBuffer: 16 << 20 }, (error, stdout, stderr) =>
            resolve({ code: error ? (error.code ?? error.signal) : 0, stdout, stderr }));
    });
}

const numberAfter = (code, key) => Number(code.match(new RegExp(`"?${key}"?\\s*[:=]\\s*(\\d+)`))[1]);

test(named('curl-chat', 'the OpenAI curl answers within its max_tokens'), async () => {
    const { code } = snippet('curl-chat');
    const run = await bash(at(code, server.url));
    assert.equal(run.code, 0, run.stderr);
    const answer = JSON.parse(run.stdout);
    assert.equal(answer.object, 'chat.completion', run.stdout);
    const limit = numberAfter(code, 'max_tokens');
    assert.ok(answer.usage.completion_tokens <= limit, JSON.stringify(answer.usage));
});

test(named('curl-ollama-chat', 'the Ollama curl streams to its end within num_predict'), async () => {
    const { code } = snippet('curl-ollama-chat');
    const run = await bash(at(code, server.url));
    assert.equal(run.code, 0, run.stderr);
    const last = JSON.parse(run.stdout.trim().split('\n').at(-1));
    assert.equal(last.done, true, run.stdout.slice(-500));
    assert.ok(last.eval_count <= numberAfter(code, 'num_predict'), JSON.stringify(last));
});

test(named('ollama-js', 'the ollama package answers within num_predict'), async () => {
    const { code } = snippet('ollama-js');
    // A folder whose node_modules is the e2e tests' own, so that `import ... from 'ollama'` resolves as written.
    const dir = tempDir('readme-js');
    symlinkSync(path.join(here, 'node_modules'), path.join(dir, 'node_modules'));
    const file = path.join(dir, 'snippet.mjs');
    writeFileSync(file, `${at(code, server.url)}\nconsole.log(JSON.stringify(r));\n`);
    const run = await new Promise((resolve) => {
        execFile(process.execPath, [file], { cwd: dir, timeout: 120_000 }, (error, stdout, stderr) =>
            resolve({ code: error ? (error.code ?? error.signal) : 0, stdout, stderr }));
    });
    assert.equal(run.code, 0, run.stderr);
    const r = JSON.parse(run.stdout);
    assert.equal(r.message.role, 'assistant');
    assert.equal(r.done, true);
    assert.ok(r.eval_count <= numberAfter(code, 'num_predict'), JSON.stringify(r));
});

// The `export NAME=VALUE ...` lines of a shell snippet, as bash sets them.
async function exported(code, url) {
    const exports = at(code, url).split('\n').filter((l) => l.startsWith('export ')).join('\n');
    const run = await bash(`${exports}\nenv -0`, { PATH: process.env.PATH });
    assert.equal(run.code, 0, run.stderr);
    return Object.fromEntries(run.stdout.split('\0').filter(Boolean).map((kv) => [kv.slice(0, kv.indexOf('=')),
        kv.slice(kv.indexOf('=') + 1)]));
}

test(named('claude-code', 'Claude Code as set up there sends each answer its max_tokens, is answered'), async () => {
    const { code } = snippet('claude-code');
    const key = code.match(/--api-key (\S+)/)[1];
    // --max-sample-ms: the steering grammar below took over the default second per token on a loaded machine.
    keyed = await startServer(['-c', '16384', '--parallel', '1', '--api-key', key, '--max-sample-ms', '600000']);
    started.push(keyed);
    // A random-weight model never ends its turn, and Claude Code takes a max_tokens stop for an error: as in
    // claude-code.test.mjs, its own CLAUDE_CODE_EXTRA_BODY asks for a one-value JSON answer and no thinking, and
    // `--tools Read` keeps its prompt a few thousand tokens (all its tools: 20K, four minutes on a loaded machine).
    const capture = await startCapture(keyed.url);
    started.push(capture);
    const env = await exported(code, capture.url);
    const limit = Number(env.CLAUDE_CODE_MAX_OUTPUT_TOKENS);
    assert.ok(limit > 0, 'the snippet sets CLAUDE_CODE_MAX_OUTPUT_TOKENS');
    const home = tempDir('readme-claude');
    const schema = { type: 'object', properties: { answer: { type: 'string', enum: ['hi'] } }, required: ['answer'],
        additionalProperties: false };
    const claudeLine = code.split('\n').find((l) => /^claude\b/.test(l)).replace(/#.*/, '').trim().split(/\s+/);
    const claude = path.join(here, 'node_modules/@anthropic-ai/claude-code/bin/claude.exe');
    const run = await new Promise((resolve) => {
        const child = execFile(claude, [...claudeLine.slice(1), '--tools', 'Read', '-p', 'Say hi'], {
            cwd: home,
            timeout: 600_000,
            env: { ...env, HOME: home, DISABLE_TELEMETRY: '1', DISABLE_AUTOUPDATER: '1', DISABLE_ERROR_REPORTING: '1',
                CLAUDE_CODE_EXTRA_BODY: JSON.stringify({ thinking: { type: 'disabled' },
                    output_config: { format: { type: 'json_schema', schema } } }) },
        }, (error, stdout, stderr) => resolve({ code: error ? (error.code ?? error.signal) : 0, stdout, stderr }));
        child.stdin.end();  // print mode waits for a stdin that is not a terminal
    });
    assert.equal(run.code, 0, `claude exited ${run.code}\nstdout: ${run.stdout}\nstderr: ${run.stderr}`);
    const messages = capture.requests.filter((r) => r.path.startsWith('/v1/messages') && !r.path.includes('count'));
    assert.ok(messages.length >= 1, JSON.stringify(capture.requests.map((r) => r.path)));
    for (const r of messages) {
        assert.equal(r.response?.status, 200, r.response?.body);
        assert.equal(r.body.max_tokens, limit, `max_tokens ${r.body.max_tokens}`);
    }
    assert.deepEqual(JSON.parse(run.stdout), { answer: 'hi' });
});

// An agent's provider entry points at `base` (the snippet's address turned into the server's) and names `model`: a
// Chat Completions request to it, as the agent would send with `maxTokens`, is answered within that bound.
async function providerAnswers(base, model, maxTokens, headers = {}) {
    const res = await fetch(`${base}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hello' }], max_tokens: maxTokens }),
    });
    const body = await res.json();
    assert.equal(res.status, 200, JSON.stringify(body));
    assert.ok(body.usage.completion_tokens <= maxTokens, JSON.stringify(body.usage));
    return body;
}

test(named('qwen-code-settings', 'the provider entry reaches the server, with its max_tokens'), async () => {
    const settings = JSON.parse(at(snippet('qwen-code-settings').code, small.url));
    const entry = settings.modelProviders.openai.find((p) => p.id === settings.model.name);
    assert.ok(entry, 'the selected model names a provider entry');
    assert.equal(settings.security.auth.selectedType, 'openai');
    const limit = entry.generationConfig.samplingParams.max_tokens;
    assert.ok(Number.isInteger(limit) && limit > 0, JSON.stringify(entry));
    await providerAnswers(entry.baseUrl, entry.id, limit, { authorization: 'Bearer none' });
});

test(named('opencode-config', 'the provider entry reaches the server, with its output limit'), async () => {
    const config = JSON.parse(at(snippet('opencode-config').code, small.url));
    const [providerId, modelId] = config.model.split('/');
    const provider = config.provider[providerId];
    assert.equal(provider.npm, '@ai-sdk/openai-compatible');
    const limit = provider.models[modelId].limit.output;
    assert.ok(Number.isInteger(limit) && limit > 0);
    await providerAnswers(provider.options.baseURL, modelId, limit,
        { authorization: `Bearer ${provider.options.apiKey}` });
});

test(named('codex-config', 'the Responses provider reaches the server; its default bounds the answer'), async () => {
    const toml = at(snippet('codex-config').code, server.url);
    const value = (key) => toml.match(new RegExp(`^${key}\\s*=\\s*"([^"]*)"`, 'm'))[1];
    assert.equal(value('model_provider'), 'keepwarm');
    assert.equal(value('wire_api'), 'responses');
    const res = await fetch(`${value('base_url')}/responses`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: value('model'), input: 'hello', max_output_tokens: 16 }),
    });
    const body = await res.json();
    assert.equal(res.status, 200, JSON.stringify(body));
    assert.equal(body.object, 'response', JSON.stringify(body).slice(0, 500));
    assert.ok(body.usage.output_tokens <= 16, JSON.stringify(body.usage));
});
