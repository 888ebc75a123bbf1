// `keepwarm serve --config FILE`: an operator's settings in one TOML file (serve's long options, the policy as a
// [policy] table, tenants' keys as a [tenants] table), relative paths taken from the file's folder, the command line
// over the file, and every mistake stopping start-up with the file's line.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { binary, curl, startProcess, testModel, tempDir } from './harness.mjs';

const dir = tempDir('serve-config');
const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');  // ctest runs from build/tests
const servers = [];
after(() => Promise.all(servers.map((s) => s.stop())));

function settingsFile(name, text) {
    const file = path.join(dir, name);
    writeFileSync(file, text);
    return file;
}

// Runs `keepwarm serve ARGS` to its end: { code, stdout, stderr }.
function serveExits(args) {
    return new Promise((resolve) => {
        execFile(binary, ['serve', ...args], { timeout: 60_000 },
            (e, stdout, stderr) => resolve({ code: e ? e.code : 0, stdout, stderr }));
    });
}

test('a settings file runs the server: options, [policy] and [tenants], with the command line winning', async () => {
    const model = await testModel();
    const file = settingsFile('serve.toml', `# keepwarm serve --config
model = "${path.relative(dir, model)}"   # relative to this file's folder
alias = "team-model"
port = 0
threads = 1
ctx-size = 4096
parallel = 1
cache_dir = "prefix-cache"
n-predict = 40

[tenants]
alice = "alice-key-5f2a91c3"
bob = ["bob-key-77b0e4d1", "bob-key-rotated-9c1d"]

[policy.options]
max_tokens_cap = 3
`);
    const server = await startProcess(['serve', '--config', file, '--parallel', '2']);
    servers.push(server);
    const out = server.output();
    assert.match(out, new RegExp(`settings: ${file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} \\(the command line and the environment win\\)`));
    assert.match(out, /serving team-model/);
    assert.match(out, /2 slots/, 'the command line\'s --parallel 2 wins over the file\'s 1');
    assert.match(out, /tenants: 2 isolated \(3 keys\)/);
    assert.match(out, /policy: .*serve\.toml/, 'the policy comes from the settings file');

    assert.equal((await curl(`${server.url}/v1/models`)).status, 401);
    const alice = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'alice-key-5f2a91c3', maxRetries: 0 });
    assert.deepEqual((await alice.models.list()).data.map((m) => m.id), ['team-model']);
    const r = await alice.chat.completions.create({ model: 'team-model', messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 50, chat_template_kwargs: { enable_thinking: false } });
    assert.equal(r.usage.completion_tokens, 3, 'the [policy] table caps max_tokens');
    const bob = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'bob-key-rotated-9c1d', maxRetries: 0 });
    assert.equal((await bob.models.list()).data.length, 1);
});

test('a mistake in the settings file stops start-up naming its line', async () => {
    const model = await testModel();
    const cases = [
        ['unknown.toml', `model = "${model}"\n\nctx_sise = 4096\n`, /unknown\.toml:3:1: unknown setting 'ctx_sise'/],
        ['range.toml', `model = "${model}"\nparallel = 0\n`, /range\.toml:2:\d+: 'parallel'/],
        ['type.toml', `model = "${model}"\nno-mmap = "yes"\n`, /type\.toml:2:\d+: 'no-mmap' must be true or false/],
        ['policy.toml', `model = "${model}"\n[policy.ping]\nreplay = "x"\n`, /policy\.toml:3:\d+: unknown key 'replay'/],
        ['keys.toml', `model = "${model}"\n[tenants]\nalice = "short"\n`, /keys\.toml:3:\d+: 'tenants\.alice': the key has 5 characters/],
        ['download.toml', `hf-repo = "Qwen/Qwen3-8B-GGUF"\n`, /keepwarm does not download models/],
        ['syntax.toml', `model = "${model}"\nparallel = \n`, /syntax\.toml:2:/],
    ];
    for (const [name, text, message] of cases) {
        const r = await serveExits(['--config', settingsFile(name, text), '--port', '0', '-t', '1']);
        assert.notEqual(r.code, 0, `${name}: ${r.stdout}${r.stderr}`);
        assert.match(r.stderr + r.stdout, message, name);
        assert.doesNotMatch(r.stdout, /listening on/, name);
    }
    const keyText = (await serveExits(['--config', settingsFile('k2.toml', `[tenants]\nalice = "short"\n`)])).stderr;
    assert.ok(!keyText.includes('"short"'), 'no error quotes a key');
});

// The files an operator copies (docs/operations.md: Running it as a service) are the ones tested: the example settings start a
// server (the command line overriding what this machine lacks: the model path, the port, the cache folder), and the
// systemd unit passes systemd's own check wherever systemd-analyze is installed.
test('etc/keepwarm-serve.toml starts a server, and etc/keepwarm.service passes systemd-analyze', async (t) => {
    const model = await testModel();
    const example = path.join(repo, 'etc/keepwarm-serve.toml');
    const server = await startProcess(['serve', '--config', example, '-m', model, '--host', '127.0.0.1', '--port', '0',
        '-t', '1', '-c', '4096', '--cache-dir', tempDir('example'),
        '--log-format', 'text']);
    servers.push(server);
    assert.match(server.output(), /serving qwen3-8b/);
    assert.match(server.output(), /tenants: 2 isolated \(3 keys\)/);
    const ci = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'sk-ci-rotated-replace-me-0003', maxRetries: 0 });
    assert.deepEqual((await ci.models.list()).data.map((m) => m.id), ['qwen3-8b']);
    await server.stop();

    const analyze = await new Promise((resolve) => execFile('systemd-analyze', ['--version'], (e) => resolve(!e)));
    if (!analyze) {
        t.diagnostic('systemd-analyze is not installed: the unit file was not checked');
        return;
    }
    const unit = path.join(dir, 'keepwarm.service');
    writeFileSync(unit, readFileSync(path.join(repo, 'etc/keepwarm.service'), 'utf8')
        .replace('/opt/keepwarm/build/keepwarm', binary));
    const verify = await new Promise((resolve) => execFile('systemd-analyze', ['verify', unit],
        (e, stdout, stderr) => resolve({ code: e ? e.code : 0, out: stdout + stderr })));
    assert.equal(verify.code, 0, verify.out);
    assert.equal(verify.out.trim(), '', verify.out);
});
