// A client that goes away mid-answer stops its generation and frees its slot.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, curl, metrics, waitFor } from './harness.mjs';

let server;
before(async () => {
    server = await startServer(['-c', '4096', '-np', '1']);
});
after(async () => server?.stop());

test('a disconnect mid-stream frees the slot', async () => {
    const controller = new AbortController();
    const stream = await server.client().chat.completions.create(
        { model: 'tiny', messages: [{ role: 'user', content: 'Write a very long story.' }], max_tokens: 100000,
          ignore_eos: true, stream: true },
        { signal: controller.signal });
    let chunks = 0;
    try {
        for await (const _ of stream) {
            if (++chunks === 3) {
                controller.abort();
                break;
            }
        }
    } catch {
        // The client may report the abort as an error; either way the connection is closed.
    }
    assert.equal(chunks, 3);
    const freed = await waitFor(async () => (await curl(`${server.url}/health`)).body.slots_processing === 0);
    assert.ok(freed, 'slot freed after the client disconnected');
    const m = await metrics(server.url);
    assert.equal(m.keepwarm_requests_cancelled_total, 1);
    // With one slot, the next request can only be served if the slot really is free.
    const r = await server.client().chat.completions.create(
        { model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
    assert.equal(r.object, 'chat.completion');
});

test('a disconnect while waiting for a non-streamed answer frees the slot', async () => {
    const controller = new AbortController();
    const pending = server.client().chat.completions.create(
        { model: 'tiny', messages: [{ role: 'user', content: 'Another long story.' }], max_tokens: 100000,
          ignore_eos: true },
        { signal: controller.signal });
    await waitFor(async () => (await curl(`${server.url}/health`)).body.slots_processing === 1);
    controller.abort();
    await assert.rejects(pending);
    const freed = await waitFor(async () => (await curl(`${server.url}/health`)).body.slots_processing === 0);
    assert.ok(freed, 'slot freed after the client disconnected');
    const m = await metrics(server.url);
    assert.equal(m.keepwarm_requests_cancelled_total, 2);
});
