// One server per --cache-dir: a second `keepwarm serve` on the directory exits non-zero naming the first (its pid
// and address), and once the first is killed (SIGKILL: no clean-up), a new server starts on it at once.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { binary, startServer, testModel } from './harness.mjs';

const servers = [];
after(() => Promise.all(servers.map((s) => s.stop())));

test('a second server on one cache directory refuses to start, naming the first; a kill frees it', async () => {
    const first = await startServer();
    servers.push(first);
    const model = await testModel();
    const second = await new Promise((resolve) => {
        execFile(binary, ['serve', '-m', model, '--port', '0', '-t', '1', '--cache-dir', first.cacheDir],
            { timeout: 60_000 }, (e, stdout, stderr) => resolve({ code: e ? e.code : 0, text: stdout + stderr }));
    });
    assert.equal(second.code, 1, second.text);
    assert.match(second.text, new RegExp(`in use by another server \\(pid ${first.proc.pid}, started `));
    assert.ok(second.text.includes(`keepwarm serve on ${first.url}`), second.text);
    assert.match(second.text, /--cache-dir of its own/);
    assert.doesNotMatch(second.text, /listening on/);

    assert.equal(await first.stop('SIGKILL'), 'SIGKILL');
    const third = await startServer([], { cacheDir: first.cacheDir });
    servers.push(third);
    assert.match(third.url, /^http:/);
});
