// The command line as a user meets it: mkmodel and inspect output, and clear errors for bad arguments.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { binary, startServer, testModel, tempDir } from './harness.mjs';

const run = promisify(execFile);

async function fails(args) {
    try {
        await run(binary, args, { timeout: 60_000 });  // a command that runs on (a server started) fails, not hangs
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
    assert.match(notGguf.stderr, /failed to load model|cannot read \/etc\/hostname as a GGUF file/);
});

test('serve binds its port before it loads the model: a port in use stops it at once, naming the port', async () => {
    const first = await startServer();
    try {
        const port = new URL(first.url).port;
        const model = await testModel();
        const r = await new Promise((resolve) => {
            execFile(binary, ['serve', '-m', model, '--port', port, '-t', '1', '--cache-dir', tempDir('port'), '-v'],
                { timeout: 60_000 }, (e, stdout, stderr) => resolve({ code: e ? e.code : 0, out: stdout + stderr }));
        });
        assert.equal(r.code, 1, r.out);
        assert.match(r.out, new RegExp(`cannot listen on 127\\.0\\.0\\.1:${port}: port ${port} is in use`));
        assert.doesNotMatch(r.out, /llama_model_loader|loading the model/, 'the port is checked before the model loads');
    } finally {
        await first.stop();
    }
});

test('a number out of range is refused in words, never as CLI11\'s "Value 0 not in range 0.000000 to 1797693..."', async () => {
    const model = await testModel();
    const cases = [
        [['serve', '-m', model, '-c', '-1'], /--ctx-size: must be at least 0 \(tokens; 0: sized from the model and the free memory\), not -1/],
        [['serve', '-m', model, '-np', '300'], /--parallel: must be from 1 to 256 \(slots\), not 300/],
        [['serve', '-m', model, '--temp', '3'], /--temp: must be from 0 to 2, not 3/],
        [['serve', '-m', model, '--idle-timeout', '0'], /--idle-timeout: must be more than 0 \(seconds\), not 0/],
        [['serve', '-m', model, '-c', 'lots'], /--ctx-size: must be a whole number at least 0 \(tokens; 0: sized from the model and the free memory\), not 'lots'/],
        [['serve', '-m', model, '--port', '70000'], /--port: must be from 0 to 65535, not 70000/],
        [['proxy', '--upstream', 'http://127.0.0.1:9', '--health-failures', '0'],
            /--health-failures: must be from 1 to 1000 \(checks\), not 0/],
        [['mkmodel', '--layers', '0', '-o', '/tmp/keepwarm-never.gguf'], /--layers: must be at least 1 \(blocks\), not 0/],
    ];
    for (const [args, message] of cases) {
        const r = await fails(args);
        assert.ok(r.code > 0, args.join(' '));
        assert.match(r.stderr, message, args.join(' '));
        assert.doesNotMatch(r.stderr, /1797693|not in range/, args.join(' '));
    }
});

test('a mistyped command or option gets the nearest one suggested', async () => {
    const command = await fails(['sever', '-m', 'x.gguf']);
    assert.ok(command.code > 0);
    assert.match(command.stderr, /'sever' is not a command; did you mean 'serve'\?/);
    const option = await fails(['serve', '--ctx-sise', '4096']);
    assert.ok(option.code > 0);
    assert.match(option.stderr, /keepwarm serve: unknown option '--ctx-sise'; did you mean '--ctx-size'\?/);
    const proxy = await fails(['proxy', '--upstreem', 'http://127.0.0.1:9']);
    assert.match(proxy.stderr, /did you mean '--upstream'\?/);
    const far = await fails(['serve', '--frobnicate']);
    assert.match(far.stderr, /unknown option '--frobnicate' \(`keepwarm serve --help` lists the options\)/);
});

test('serve --help lists its options in groups, in order, with llama-server\'s short names', async () => {
    const { stdout } = await run(binary, ['serve', '--help']);
    const groups = ['Model:', 'Context & slots:', 'Cache:', 'Policy:', 'Network:', 'Security: keys, tenants',
        'Sampling defaults', 'Limits:', 'Settings & log:', 'llama-server flags that keepwarm follows anyway:'];
    let at = -1;
    for (const heading of groups) {
        const found = stdout.indexOf(heading);
        assert.ok(found > at, `${heading} after the group before it:\n${stdout}`);
        at = found;
    }
    for (const name of ['-c,--ctx-size', '-np,--parallel', '-ngl,--gpu-layers', '-fa,--flash-attn',
        '-ctk,--cache-type-k', '-ctv,--cache-type-v', '-ub,--ubatch-size', '-b,--batch-size', '-t,--threads',
        '-n,--n-predict', '-cram,--cache-ram', '-tb,--threads-batch']) {
        assert.ok(stdout.includes(name), `${name} in:\n${stdout}`);
    }
    // --help is the only option left outside the groups.
    const ungrouped = stdout.slice(stdout.indexOf('Options:'), stdout.indexOf('Model:'));
    assert.doesNotMatch(ungrouped, /--(?!help)[a-z]/, ungrouped);
});
