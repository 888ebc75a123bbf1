// bench/proxy-load.mjs --kv-events, short: a few clients for a few seconds through `keepwarm proxy` in front of two
// `keepwarm serve --kv-events` upstreams, so that CI runs its no-event-lost check (issue 38). The check must have
// had something to check (events received by its witnesses, requests routed by them, blocks listed), and must catch
// a loss: a witness told to drop one message makes the bench fail.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { binary, testModel, tempDir } from './harness.mjs';

const bench = fileURLToPath(new URL('../../bench/proxy-load.mjs', import.meta.url));

// Runs the bench; resolves with { code, output, summary } whatever its exit status.
async function runBench(extra) {
    const json = path.join(tempDir('proxy-load-kv'), 'run.json');
    const argv = [bench, '--keepwarm', binary, '--model', await testModel('tiny'), '--kv-events', '--cache-block', '16',
        '--warmup', '1', '--think-ms', '50', '--json', json, ...extra];
    const { code, output } = await new Promise((resolve) => {
        execFile(process.execPath, argv, { timeout: 120_000, maxBuffer: 16 << 20 }, (error, stdout, stderr) => {
            resolve({ code: error ? error.code : 0, output: stdout + stderr });
        });
    });
    let summary = null;
    try {
        summary = JSON.parse(readFileSync(json, 'utf8')).summary;
    } catch {
        // asserted below, with the output
    }
    return { code, output, summary };
}

test('under load, no KV event is lost, and the check had events to check', async () => {
    const { code, output, summary } = await runBench(['--clients', '4', '--seconds', '5']);
    assert.equal(code, 0, output);
    assert.match(output, /^lost events: 0$/m);
    assert.equal(summary.errors, 0, output);
    const kv = summary.kv_events;
    assert.equal(kv.ok, true, JSON.stringify(kv.failures));
    assert.equal(kv.lost_messages, 0);
    assert.ok(kv.exact_hits > 0, 'the proxy routed requests by the events');
    for (const u of kv.upstreams) {
        const w = u.witness;
        assert.ok(w.messages > 1 && w.events > 0 && w.blocks_stored > 0, JSON.stringify(w));
        assert.equal(w.gaps, 0);
        assert.equal(w.saw_last_message, true);
        // Agreement over an empty listing would prove nothing.
        assert.ok(w.index.agree && w.index.blocks > 0 && w.index.blocks === w.index.server_blocks, JSON.stringify(w));
        assert.ok(u.proxy.messages > 1 && u.proxy.index_agrees, JSON.stringify(u.proxy));
        assert.equal(u.proxy.resyncs_max, 0);
        assert.equal(u.proxy.in_step_at_end, 1);
        assert.equal(u.server.overflow_resyncs_max, 0);
        // Its own snapshot, then the one the proxy's subscription brought (the proxy starts after the witnesses):
        // an index cleared and rebuilt mid-stream, still in step.
        assert.ok(w.cleared >= 2 && u.server.subscriber_snapshots >= 2, JSON.stringify({ w, s: u.server }));
    }
});

test('a lost message fails the run', async () => {
    // Upstream 0's witness drops its 3rd message after its snapshot: the proxy's own snapshot, then the load's.
    const { code, output, summary } = await runBench(['--clients', '4', '--seconds', '3', '--drop-message', '3']);
    assert.equal(code, 1, output);
    assert.match(output, /^lost events: YES/m);
    const kv = summary.kv_events;
    assert.equal(kv.ok, false);
    assert.equal(kv.lost_messages, 1);
    assert.equal(kv.upstreams[0].witness.gaps, 1);
    assert.equal(kv.upstreams[1].witness.gaps, 0);
});
