// The command line as a user meets it: mkmodel and inspect output, and clear errors for bad arguments.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { binary, testModel, tempDir } from './harness.mjs';

const run = promisify(execFile);

async function fails(args) {
    try {
        await run(binary, args);
    } catch (e) {
        return { code: e.code, stderr: e.stderr + e.stdout };
    }
    assert.fail(`keepwarm ${args.join(' ')} succeeded`);
}

test('inspect reports shape, layer kinds and KV cost', async () => {
    const dense = await run(binary, ['inspect', await testModel('tiny')]);
    assert.match(dense.stdout, /qwen3/);
    assert.match(dense.stdout, /KV per token/);
    assert.match(dense.stdout, /random|RANDOM/);
    const hybrid = await run(binary, ['inspect', await testModel('tiny-hybrid'), '--json']);
    const report = JSON.parse(hybrid.stdout);
    assert.equal(report.architecture, 'qwen35');
    assert.ok(JSON.stringify(report).includes('recurrent'));
});

test('bad arguments get a clear error and a non-zero exit, never a crash', async () => {
    const arch = await fails(['mkmodel', '--arch', 'gpt9', '-o', '/tmp/keepwarm-never.gguf']);
    assert.equal(arch.code, 1);
    assert.match(arch.stderr, /gpt9/);
    const heads = await fails(['mkmodel', '--preset', 'tiny', '--heads', '7', '-o', '/tmp/keepwarm-never.gguf']);
    assert.equal(heads.code, 1);
    assert.match(heads.stderr, /head/i);
    const missing = await fails(['inspect', '/nonexistent/model.gguf']);
    assert.ok(missing.code > 0);
    assert.match(missing.stderr, /nonexistent/);
    const serve = await fails(['serve', '-m', '/nonexistent/model.gguf']);
    assert.ok(serve.code > 0);
    assert.match(serve.stderr, /nonexistent/);
    // A directory of its own: the default one may be locked by a server running beside the tests.
    const notGguf = await fails(['serve', '-m', '/etc/hostname', '--port', '0', '--cache-dir',
        tempDir('cli')]);
    assert.ok(notGguf.code > 0);
    assert.match(notGguf.stderr, /failed to load model/);
});
