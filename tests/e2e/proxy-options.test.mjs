// What `keepwarm serve` and `keepwarm proxy` share on the command line. The listening side (commands/listen-options.h):
// both commands offer the same listening options with the same help, and the proxy enforces them as serve does: a
// body over --max-body (or its settings file's listen.max_body) gets a 413 in the API's error shape before any
// upstream is asked. The settings file (config/settings-file.h): read one way, so a mistake in either command's file
// ends it the same way, one error line naming the file and line.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { binary, curl, startProcess, tempDir } from './harness.mjs';

const run = promisify(execFile);

const listening = ['--host', '--port', '--api-key', '--max-body', '--max-connections', '--max-connections-per-address',
    '--header-timeout', '--idle-timeout', '--stream-keepalive', '--cors-origin'];

// Each option's entry in `--help`: its line and the help text under it, spaces collapsed.
function entries(help) {
    const out = new Map();
    let current;
    for (const line of help.split('\n')) {
        const m = line.match(/^ {2}(-[^\s]+)/);
        if (m) {
            current = m[1].split(',').at(-1);
            out.set(current, line.trim());
        } else if (current && /^ {6,}\S/.test(line)) {
            out.set(current, `${out.get(current)} ${line.trim()}`);
        } else {
            current = undefined;
        }
    }
    for (const [k, v] of out) out.set(k, v.replace(/\s+/g, ' '));
    return out;
}

test('serve and proxy have the same listening options, with the same help', async () => {
    const serve = entries((await run(binary, ['serve', '--help'])).stdout);
    const proxy = entries((await run(binary, ['proxy', '--help'])).stdout);
    for (const name of listening) {
        assert.ok(serve.has(name), `serve --help lacks ${name}`);
        assert.ok(proxy.has(name), `proxy --help lacks ${name}`);
        assert.equal(proxy.get(name), serve.get(name), name);
    }
});

const procs = [];
after(async () => {
    for (const p of procs) await p.stop();
});

// A proxy whose one upstream never answers: what is tested here is refused before any upstream is asked.
async function startProxy(args) {
    const p = await startProcess(['proxy', '--port', '0', '--upstream', 'http://127.0.0.1:9', '--health-interval',
        '60', ...args]);
    procs.push(p);
    return p;
}

const chat = (p, size) => curl(`${p.url}/v1/chat/completions`, {
    method: 'POST',
    body: { model: 'any', messages: [{ role: 'user', content: 'x'.repeat(size) }] },
});

function assertTooLarge(res, limit) {
    assert.equal(res.status, 413, JSON.stringify(res.body));
    assert.equal(typeof res.body, 'object', `error body is JSON: ${res.body}`);
    assert.equal(typeof res.body.error?.message, 'string');
    assert.match(res.body.error.message, new RegExp(`${limit}-byte limit`));
}

test('the proxy refuses a body over --max-body with a 413 in the API\'s shape', async () => {
    const p = await startProxy(['--max-body', '20000']);
    assertTooLarge(await chat(p, 50_000), 20000);
    // Under the limit it goes on to the upstream, which is down: not a 413.
    const small = await chat(p, 100);
    assert.notEqual(small.status, 413, JSON.stringify(small.body));
});

test('the proxy\'s settings file sets listen.max_body, and --max-body wins over it', async () => {
    const file = path.join(tempDir('proxy-listen'), 'proxy.toml');
    writeFileSync(file, '[listen]\nmax_body = 30000\n');
    const fromFile = await startProxy(['--config', file]);
    assertTooLarge(await chat(fromFile, 50_000), 30000);
    const overridden = await startProxy(['--config', file, '--max-body', '100000']);
    const res = await chat(overridden, 50_000);
    assert.notEqual(res.status, 413, JSON.stringify(res.body));
});

// Runs `keepwarm ARGS` to its end: { code, out }.
const exits = (args) => new Promise((resolve) => execFile(binary, args, { timeout: 60_000 },
    (e, stdout, stderr) => resolve({ code: e ? e.code : 0, out: stdout + stderr })));

test('a mistake in either command\'s settings file ends it the same way, naming the file and line', async () => {
    const dir = tempDir('settings-mistakes');
    const serveFile = path.join(dir, 'serve.toml');
    writeFileSync(serveFile, '# serve\nfrobnicate = 1\n');
    const proxyFile = path.join(dir, 'proxy.toml');
    writeFileSync(proxyFile, '# proxy\n[listen]\nhots = "x"\n');
    const serve = await exits(['serve', '--config', serveFile]);
    const proxy = await exits(['proxy', '--config', proxyFile]);
    for (const [command, r, file, line, message] of [['serve', serve, serveFile, 2, /unknown setting 'frobnicate'/],
        ['proxy', proxy, proxyFile, 3, /unknown key 'hots' in \[listen\]/]]) {
        assert.equal(r.code, 1, `${command}: ${r.out}`);
        const escaped = file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
        assert.match(r.out, new RegExp(`ERROR ${command}: ${escaped}:${line}:\\d+: `), r.out);
        assert.match(r.out, message);
        assert.doesNotMatch(r.out, /Run with --help/, `${command}: a file's mistake is not a command-line mistake`);
    }
});
