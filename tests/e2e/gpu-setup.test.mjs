// The GPU backend's set-up on a machine without a GPU: scripts/fetch-llama-cuda.sh fetches nothing unless asked,
// refuses a download whose integrity does not match, and a keepwarm whose libggml-cuda.so cannot load (no CUDA
// runtime, no driver, a damaged file) serves on the CPU and says why at start-up.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, readdirSync, writeFileSync, chmodSync } from 'node:fs';
import path from 'node:path';
import { binary, startServer, tempDir } from './harness.mjs';

const script = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../../scripts/fetch-llama-cuda.sh');
const temp = tempDir('gpu-setup');
const servers = [];
after(async () => {
    await Promise.all(servers.map((s) => s.stop()));
});

function fetchCuda(env, extraPath = '') {
    const cache = path.join(temp, `cache-${Math.random().toString(36).slice(2)}`);
    const r = spawnSync(script, [], {
        encoding: 'utf8',
        env: { PATH: `${extraPath}${extraPath ? ':' : ''}/usr/bin:/bin`, HOME: temp, KEEPWARM_CACHE_DIR: cache, ...env },
    });
    return { code: r.status, stdout: r.stdout.trim(), stderr: r.stderr, cache };
}

test('KEEPWARM_GPU=cpu fetches no GPU backend; a bad value is refused', () => {
    const none = fetchCuda({ KEEPWARM_GPU: 'cpu' });
    assert.equal(none.code, 0, none.stderr);
    assert.equal(none.stdout, '');
    assert.equal(existsSync(none.cache), false);
    const bad = fetchCuda({ KEEPWARM_GPU: 'rocm' });
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /KEEPWARM_GPU=rocm: expected auto, cuda or cpu/);
});

test('without an NVIDIA driver the default (auto) fetches nothing', { skip: existsSync('/proc/driver/nvidia/version') &&
        'this machine has an NVIDIA driver' }, () => {
    const r = fetchCuda({});
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, '');
});

test('a CUDA backend download whose integrity does not match is refused and nothing is cached', () => {
    // A registry (or a proxy in between) that hands out another file under the pinned name.
    const fakeBin = path.join(temp, 'fake-npm');
    mkdirSync(fakeBin, { recursive: true });
    writeFileSync(path.join(fakeBin, 'npm'),
        '#!/bin/sh\necho "not the package" > node-llama-cpp-linux-x64-cuda-3.21.1.tgz\n');
    chmodSync(path.join(fakeBin, 'npm'), 0o755);
    const r = fetchCuda({ KEEPWARM_GPU: 'cuda', KEEPWARM_CUDA_BUILD: 'prebuilt' }, fakeBin);
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, /integrity mismatch for .*node-llama-cpp-linux-x64-cuda-3\.21\.1\.tgz/);
    assert.equal(r.stdout, '');
    const cached = existsSync(r.cache) ? readdirSync(r.cache) : [];
    assert.deepEqual(cached.filter((name) => name.includes('cuda')), []);
});

test('a libggml-cuda.so that cannot load leaves keepwarm on the CPU, saying why, and serving', async () => {
    const copy = path.join(temp, 'install');
    mkdirSync(copy, { recursive: true });
    cpSync(binary, path.join(copy, 'keepwarm'));
    cpSync(path.join(path.dirname(binary), 'lib'), path.join(copy, 'lib'), { recursive: true });
    writeFileSync(path.join(copy, 'lib', 'libggml-cuda.so'), 'an interrupted download\n');
    const server = await startServer(['-c', '1024'], { executable: path.join(copy, 'keepwarm') });
    servers.push(server);
    const compute = server.output().match(/compute: (.*)/)[1];
    assert.match(compute, /^CPU, .*; GPU backend not used: libggml-cuda\.so cannot be loaded: /);
    const r = await server.client().completions.create({ model: 'tiny', prompt: 'Hello', max_tokens: 4,
                                                         ignore_eos: true, temperature: 0 });
    assert.equal(r.usage.completion_tokens, 4);
});
