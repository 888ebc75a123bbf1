// `keepwarm serve` with no --model generates a demo model once, says plainly that its output is noise, and serves.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readdirSync } from 'node:fs';
import path from 'node:path';
import { binary, tempDir } from './harness.mjs';

test('serve without --model runs the generated demo model and says its output is noise', async () => {
    const cache = tempDir('demo');
    const proc = spawn(binary, ['serve', '--port', '0', '-t', '1', '-c', '1024'],
                       { env: { ...process.env, KEEPWARM_CACHE_DIR: cache }, stdio: ['ignore', 'pipe', 'pipe'] });
    try {
        let output = '';
        const url = await new Promise((resolve, reject) => {
            const timer = setTimeout(() => reject(new Error(`no start:\n${output}`)), 240_000);
            const onData = (d) => {
                output += d;
                const m = output.match(/listening on (http:\/\/\S+)/);
                if (m) { clearTimeout(timer); resolve(m[1]); }
            };
            proc.stdout.on('data', onData);
            proc.stderr.on('data', onData);
            proc.on('exit', (code) => reject(new Error(`exited ${code}:\n${output}`)));
        });
        assert.match(output, /random weights/);
        assert.match(output, /noise/);
        assert.equal(readdirSync(path.join(cache, 'models')).filter((f) => f.endsWith('.gguf')).length, 1);
        const res = await fetch(`${url}/v1/chat/completions`, {
            method: 'POST', headers: { 'Content-Type': 'application/json' },
            body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
        });
        assert.equal(res.status, 200);
        assert.equal((await res.json()).object, 'chat.completion');
    } finally {
        // The server writes its cache on the way out: it has exited before its folder goes (tempDir).
        const exited = new Promise((resolve) => (proc.exitCode !== null ? resolve() : proc.once('exit', resolve)));
        proc.kill('SIGTERM');
        await exited;
    }
});
