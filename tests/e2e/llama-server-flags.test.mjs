// llama-server's command line on `keepwarm serve`: the flags with the same meaning work (-fa, --jinja, -a, --temp,
// --top-k, --top-p, -n, --n-gpu-layers, --api-key-file, --no-mmap, ...), those true of keepwarm anyway are accepted,
// and those it cannot honour (downloads, --timeout, ...) exit 2 with what to do instead, never with the help text.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { binary, curl, startServer, testModel, tempDir } from './harness.mjs';

const dir = tempDir('llama-flags');

// Runs `keepwarm serve ARGS` to its end: { code, stdout, stderr }.
async function serveExits(args) {
    const model = await testModel();
    return new Promise((resolve) => {
        execFile(binary, ['serve', '-m', model, '--port', '0', '-t', '1', '--cache-dir', dir, ...args],
            { timeout: 60_000 }, (e, stdout, stderr) => resolve({ code: e ? e.code : 0, stdout, stderr }));
    });
}

test('a download flag exits 2 saying to download the GGUF and pass -m, and never prints the help', async () => {
    for (const args of [['-hf', 'Qwen/Qwen3-8B-GGUF'], ['-hfr', 'Qwen/Qwen3-8B-GGUF:Q4_K_M'], ['--hf-repo', 'x/y'],
        ['-hf'], ['-mu', 'https://example.com/m.gguf'], ['-hff', 'm.gguf'], ['-dr', 'ai/smollm2']]) {
        const r = await serveExits(args);
        assert.equal(r.code, 2, `${args.join(' ')}: ${r.stdout}${r.stderr}`);
        assert.match(r.stderr, /keepwarm does not download models/, args.join(' '));
        assert.match(r.stderr, /-m FILE/, args.join(' '));
        assert.doesNotMatch(r.stdout + r.stderr, /Options:|--ctx-size/, `${args.join(' ')} printed the help`);
    }
});

test('flags keepwarm cannot honour exit 2 naming what to use instead', async () => {
    const cases = [
        [['--timeout', '600'], /--idle-timeout/],
        [['-to', '600'], /--header-timeout/],
        [['--threads-http', '8'], /--max-connections/],
        [['--no-jinja'], /Jinja template/],
        [['-nocb'], /--parallel 1/],
        [['--reasoning-format', 'none'], /reasoning_content/],
        [['-sm', 'row'], /'-sm' is not an option of keepwarm/],
        [['-cram', '0'], /'-cram' is not an option/],
    ];
    for (const [args, message] of cases) {
        const r = await serveExits(args);
        assert.equal(r.code, 2, `${args.join(' ')}: ${r.stdout}${r.stderr}`);
        assert.match(r.stderr, message, args.join(' '));
        assert.doesNotMatch(r.stdout, /Options:/, `${args.join(' ')} printed the help`);
    }
});

const servers = [];
after(() => Promise.all(servers.map((s) => s.stop())));

test('llama-server flags with the same meaning start a server that follows them', async () => {
    const server = await startServer(['-fa', 'on', '--jinja', '-a', 'my-model,other-name', '--temp', '0', '--top-k',
        '40', '--top-p', '0.9', '--min-p', '0.05', '-n', '6', '--n-gpu-layers', 'all', '--no-webui', '--metrics',
        '--slots', '-cb', '--cont-batching', '--no-mmap', '--reasoning-format', 'deepseek', '-np', '1', '-c', '2048',
        '-ncmoe', '1']);
    servers.push(server);
    const models = await curl(`${server.url}/v1/models`);
    assert.equal(models.status, 200);
    assert.deepEqual(models.body.data.map((m) => m.id), ['my-model']);

    // --temp 0 is the default of requests that set no temperature: the same request gets the same answer (at
    // llama.cpp's 0.8 and a random seed, a random-weight model's answers differ); -n 6 caps what sets no limit.
    const ask = () => server.client().chat.completions.create({
        model: 'other-name',
        messages: [{ role: 'user', content: 'Say something.' }],
    });
    const first = await ask();
    const second = await ask();
    assert.equal(first.usage.completion_tokens, 6);
    assert.equal(first.choices[0].finish_reason, 'length');
    assert.equal(second.choices[0].message.content, first.choices[0].message.content);
    assert.match(server.output(), /GET \/slots is always on/);
    assert.match(server.output(), /expert weights of the first 1 blocks in host memory \(--n-cpu-moe\)/);
});

test('--api-key-file takes llama-server\'s file: one key per line, all of one shared cache', async () => {
    const keys = path.join(dir, 'keys.txt');
    writeFileSync(keys, '# llama-server keys\nkey-one-5f2a91c3\n\n  key-two-77b0e4d1  \n');
    const server = await startServer(['--api-key-file', keys, '-fa', 'off']);
    servers.push(server);
    assert.match(server.output(), /tenants: 2 keys sharing one cache/);
    const models = (key) => curl(`${server.url}/v1/models`, { headers: key ? { Authorization: `Bearer ${key}` } : {} });
    assert.equal((await models('key-one-5f2a91c3')).status, 200);
    assert.equal((await models('key-two-77b0e4d1')).status, 200);
    assert.equal((await models('key-three-0000000')).status, 401);
    assert.equal((await models()).status, 401);

    const spaced = path.join(dir, 'tenant-style.txt');
    writeFileSync(spaced, 'alice key-one-5f2a91c3\n');
    const r = await serveExits(['--api-key-file', spaced]);
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /tenant-style\.txt:1: one key per line, without spaces/);
    assert.ok(!r.stderr.includes('key-one-5f2a91c3'), r.stderr);
});
