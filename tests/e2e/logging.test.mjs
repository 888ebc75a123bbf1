// The server's log as an operator reads it: --log-format json gives one JSON object per stderr line, every HTTP
// request ends with an access line whose id the response carries in x-request-id, and --log-level filters.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { binary, startServer, tempDir, testModel, waitFor } from './harness.mjs';

const servers = [];
after(async () => {
    for (const s of servers) await s.stop();
});

// The stderr lines the server wrote so far (the harness mixes stdout's banner in; it never starts with '{').
function jsonLines(server) {
    return server.output().split('\n').filter((line) => line.startsWith('{')).map((line) => JSON.parse(line));
}

test('--log-format json: access lines with method, path, status, client, duration and the x-request-id', async () => {
    const server = await startServer(['--log-format', 'json', '--log-level', 'info']);
    servers.push(server);
    const response = await fetch(`${server.url}/v1/chat/completions?ignored=query`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ messages: [{ role: 'user', content: 'Hi "there"\n' }], max_tokens: 2 }),
    });
    assert.equal(response.status, 200);
    const id = response.headers.get('x-request-id');
    assert.match(id, /^[0-9a-f]{8}-\d+$/);
    const missing = await fetch(`${server.url}/no/such/path`);
    assert.equal(missing.status, 404);

    let lines = [];
    for (let i = 0; i < 600 && !lines.some((l) => l.path === '/no/such/path'); ++i) { // a hang guard: 60 s
        await new Promise((resolve) => setTimeout(resolve, 100));
        lines = jsonLines(server);
    }
    for (const line of lines) {
        assert.match(line.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
        assert.ok(['error', 'warn', 'info', 'debug'].includes(line.level), JSON.stringify(line));
        assert.equal(typeof line.component, 'string');
        assert.equal(typeof line.msg, 'string');
    }
    const access = lines.find((l) => l.request_id === id);
    assert.ok(access, `no access line for ${id} in:\n${server.output()}`);
    assert.equal(access.component, 'http');
    assert.equal(access.method, 'POST');
    assert.equal(access.path, '/v1/chat/completions');
    assert.equal(access.status, 200);
    assert.match(access.client, /^127\.0\.0\.1:\d+$/);
    assert.ok(access.duration_ms >= 0);
    const notFound = lines.find((l) => l.path === '/no/such/path');
    assert.equal(notFound.status, 404);
    assert.equal(notFound.request_id, missing.headers.get('x-request-id'));
    // The generation's own line is JSON too, and holds no prompt text without --log-prompts.
    assert.ok(lines.some((l) => l.component === 'generation' && /slot \d+: prompt \d+ tokens/.test(l.msg)));
    assert.ok(!server.output().includes('there'));
});

test('--log-level warn leaves out access and generation lines; a bad level is refused', async () => {
    const server = await startServer(['--log-level', 'warn']);
    servers.push(server);
    const response = await fetch(`${server.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 }),
    });
    assert.equal(response.status, 200);
    assert.ok(response.headers.get('x-request-id'));
    await new Promise((resolve) => setTimeout(resolve, 300));
    assert.doesNotMatch(server.output(), /INFO /);
    assert.doesNotMatch(server.output(), /request_id=/);

    await assert.rejects(startServer(['--log-level', 'verbose']), /log-level/);
});

test('--log-format json: every line on stdout and stderr is JSON, llama.cpp\'s (-v) too, from start to SIGTERM', async () => {
    const proc = spawn(binary, ['serve', '-m', await testModel(), '--port', '0', '-t', '1', '--cache-dir',
        tempDir('json-log'), '--log-format', 'json', '-v'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    proc.stdout.on('data', (chunk) => { stdout += chunk; });
    proc.stderr.on('data', (chunk) => { stderr += chunk; });
    const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve(code ?? signal)));
    try {
        await waitFor(() => /listening on/.test(stdout) || proc.exitCode !== null, { timeoutMs: 120_000 });
        const listening = stdout.split('\n').find((line) => line.includes('listening on'));
        assert.ok(listening, `no listening line:\n${stdout}\n${stderr}`);
        const url = JSON.parse(listening).url;
        assert.match(url, /^http:\/\/127\.0\.0\.1:\d+$/);
        const response = await fetch(`${url}/v1/chat/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 }),
        });
        assert.equal(response.status, 200);
        await response.text();
    } finally {
        proc.kill('SIGTERM');
    }
    assert.equal(await exited, 0, stderr);
    const parse = (stream, text) => text.split('\n').filter((line) => line.trim() !== '').map((line) => {
        try {
            return JSON.parse(line);
        } catch {
            assert.fail(`a ${stream} line is not JSON: ${line}`);
        }
    });
    const out = parse('stdout', stdout);
    const err = parse('stderr', stderr);
    assert.ok(out.some((l) => /^context \d+ tokens/.test(l.msg)), 'the banner, a record per line');
    assert.ok(out.some((l) => /shutting down/.test(l.msg)));
    assert.ok(err.some((l) => l.component === 'llama.cpp'), 'llama.cpp\'s messages go through the log');
    assert.ok(err.some((l) => l.component === 'http' && l.status === 200));
});
