// llama-server's command line on `keepwarm serve`: the flags with the same meaning work (-fa, --jinja, -a, --temp,
// --top-k, --top-p, -n, --n-gpu-layers, --api-key-file, --no-mmap, ...), those true of keepwarm anyway are accepted,
// and those it cannot honour (downloads, --timeout, ...) exit 2 with what to do instead, never with the help text.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { binary, curl, startProcess, startServer, testModel, tempDir } from './harness.mjs';

const dir = tempDir('llama-flags');

// Runs `keepwarm serve ARGS` (with `env` over this process's environment) to its end: { code, stdout, stderr }.
async function serveExits(args, env = {}) {
    const model = await testModel();
    return new Promise((resolve) => {
        execFile(binary, ['serve', '-m', model, '--port', '0', '-t', '1', '--cache-dir', dir, ...args],
            { timeout: 60_000, env: { ...process.env, ...env } },
            (e, stdout, stderr) => resolve({ code: e ? e.code : 0, stdout, stderr }));
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
        [['-ctxcp', '0'], /'-ctxcp' is not an option/],
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

test('--cache-ram and --cache-disk read a bare number as MiB, as llama-server; units still work', async () => {
    const budgets = async (server) => {
        const cache = await curl(`${server.url}/v1/cache`);
        assert.equal(cache.status, 200);
        return [cache.body.tiers.ram.budget_bytes, cache.body.tiers.disk.budget_bytes];
    };
    const server = await startServer(['--cache-ram', '8192', '--cache-disk', '1.5GiB']);
    servers.push(server);
    assert.deepEqual(await budgets(server), [8 * 2 ** 30, 1.5 * 2 ** 30]);
    assert.match(server.output(), /cache: device \d+ slots \+ \d+ parked conversations; RAM tier 8 GiB; disk tier 1\.5 GiB in /);
    await server.stop();

    // llama-server's -cram, and a settings file's bare number: MiB too.
    const settings = path.join(dir, 'cache.toml');
    writeFileSync(settings, 'cache-ram = 512\ncache-disk = "2GB"\n');
    const again = await startServer(['-cram', '2048', '--config', settings]);
    servers.push(again);
    assert.deepEqual(await budgets(again), [2048 * 2 ** 20, 2 * 2 ** 30]);
    await again.stop();
    const fromFile = await startServer(['--config', settings, '--cache-disk', '0']);
    servers.push(fromFile);
    assert.deepEqual(await budgets(fromFile), [512 * 2 ** 20, 0]);
    assert.match(fromFile.output(), /RAM tier 512 MiB; disk tier off/);

    for (const [value, message] of [['8 parsecs', /unknown unit 'parsecs'/], ['lots', /expected a size/]]) {
        const r = await serveExits(['--cache-ram', value]);
        assert.notEqual(r.code, 0);
        assert.match(r.stderr, message);
    }
});

test('--api-key KEY1,KEY2 is two keys, as llama-server; LLAMA_API_KEY too; the list itself is no key', async () => {
    const status = async (url, key) =>
        (await curl(`${url}/v1/models`, { headers: key ? { Authorization: `Bearer ${key}` } : {} })).status;
    const server = await startServer(['--api-key', 'key-one-5f2a91c3,key-two-77b0e4d1']);
    servers.push(server);
    assert.match(server.output(), /tenants: 2 keys sharing one cache/);
    assert.equal(await status(server.url, 'key-one-5f2a91c3'), 200);
    assert.equal(await status(server.url, 'key-two-77b0e4d1'), 200);
    assert.equal(await status(server.url, 'key-one-5f2a91c3,key-two-77b0e4d1'), 401);
    assert.equal(await status(server.url), 401);
    await server.stop();

    const fromEnv = await startServer([], { env: { LLAMA_API_KEY: 'key-three-0c1d2e3f,key-four-4a5b6c7d' } });
    servers.push(fromEnv);
    assert.equal(await status(fromEnv.url, 'key-three-0c1d2e3f'), 200);
    assert.equal(await status(fromEnv.url, 'key-four-4a5b6c7d'), 200);
    assert.equal(await status(fromEnv.url, 'key-three-0c1d2e3f,key-four-4a5b6c7d'), 401);
    assert.doesNotMatch(fromEnv.output(), /key-three/, 'a key is never printed');
    await fromEnv.stop();

    const proxy = await startProcess(['proxy', '--upstream', 'http://127.0.0.1:9', '--port', '0', '--api-key',
        'key-one-5f2a91c3,key-two-77b0e4d1']);
    servers.push(proxy);
    assert.equal(await status(proxy.url, 'key-one-5f2a91c3'), 200);
    assert.equal(await status(proxy.url, 'key-two-77b0e4d1'), 200);
    assert.equal(await status(proxy.url, 'key-one-5f2a91c3,key-two-77b0e4d1'), 401);
});

test('LLAMA_ARG_* variables set the options they name in llama-server; the command line wins over them', async () => {
    const model = await testModel();
    const env = { LLAMA_ARG_MODEL: model, LLAMA_ARG_CTX_SIZE: '1536', LLAMA_ARG_N_PARALLEL: '2',
        LLAMA_ARG_FLASH_ATTN: 'off', LLAMA_ARG_SPLIT_MODE: 'row' };
    const server = await startProcess(['serve', '--port', '0', '-t', '1', '--cache-dir', tempDir('env')], { env });
    servers.push(server);
    const models = await curl(`${server.url}/v1/models`);
    assert.deepEqual(models.body.data.map((m) => m.id), ['tiny'], 'LLAMA_ARG_MODEL, not the demo model');
    assert.match(server.output(), /context 1536 tokens, 2 slots/);
    assert.match(server.output(), /environment: LLAMA_ARG_MODEL, LLAMA_ARG_CTX_SIZE, LLAMA_ARG_N_PARALLEL, LLAMA_ARG_FLASH_ATTN/);
    assert.match(server.output(), /not read: LLAMA_ARG_SPLIT_MODE/);
    await server.stop();

    const wins = await startProcess(['serve', '--port', '0', '-t', '1', '--cache-dir', tempDir('env'), '-c', '1024'],
        { env });
    servers.push(wins);
    assert.match(wins.output(), /context 1024 tokens, 2 slots/);
    await wins.stop();

    const refused = await new Promise((resolve) => {
        execFile(binary, ['serve', '--port', '0', '-m', model], { env: { ...process.env, LLAMA_ARG_HF_REPO: 'a/b' } },
            (e, stdout, stderr) => resolve({ code: e ? e.code : 0, stderr }));
    });
    assert.equal(refused.code, 2, refused.stderr);
    assert.match(refused.stderr, /LLAMA_ARG_HF_REPO \(environment\): -hf\/--hf-repo: keepwarm does not download models/);
    const bad = await serveExits([], { LLAMA_ARG_CTX_SIZE: 'lots' });
    assert.notEqual(bad.code, 0);
    assert.match(bad.stderr, /LLAMA_ARG_CTX_SIZE \(environment\)/);
});
