// A KV-events publisher of the documented wire format for the proxy's tests (kv-events-publisher.py beside it,
// Debian's python3-zmq and python3-msgpack): what a test publishes is what the proxy must believe. `port`, the lines
// it printed, how many subscriptions it heard, and send(seq, events), which resolves once the message went out.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { waitFor } from './harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));

export async function startPublisher() {
    const proc = spawn('/usr/bin/python3', [path.join(here, 'kv-events-publisher.py')], {
        stdio: ['pipe', 'pipe', 'pipe'],
    });
    const lines = [];
    let err = '';
    proc.stderr.on('data', (d) => (err += d));
    let buffer = '';
    proc.stdout.on('data', (d) => {
        buffer += d;
        let nl;
        while ((nl = buffer.indexOf('\n')) >= 0) {
            lines.push(buffer.slice(0, nl));
            buffer = buffer.slice(nl + 1);
        }
    });
    await waitFor(() => lines.some((l) => l.startsWith('port ')) || proc.exitCode !== null);
    assert.equal(proc.exitCode, null, `the publisher did not start: ${err}`);
    const port = Number(lines.find((l) => l.startsWith('port ')).slice(5));
    return {
        port,
        lines,
        subscriptions: () => lines.filter((l) => l === 'subscribed').length,
        send(seq, events) {
            proc.stdin.write(JSON.stringify({ seq, events }) + '\n');
            return waitFor(() => lines.includes(`sent ${seq}`));
        },
        stop() {
            proc.kill();
        },
    };
}
