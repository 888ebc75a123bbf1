// `keepwarm proxy` routing by its upstreams' KV events: two real `keepwarm serve` upstreams, each with a publisher of
// the documented wire format beside it (tests/e2e/kv-events-publisher.py, python3-zmq and python3-msgpack: what the
// test publishes is what the proxy must believe), the proxy subscribed to both. A prompt goes where the events say its
// token blocks are, even against what the proxy's own inference remembers; a gap in a stream takes that upstream out
// of step until the snapshot its new subscription gets.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, startProcess, curl, waitFor, metrics } from './harness.mjs';
import { startPublisher } from './kv-events-publisher.mjs';

const BLOCK = 16;

const stored = (hashes, tokens, medium = 'GPU', parent = null) => [
    'BlockStored', hashes, parent, tokens, BLOCK, null, medium,
];
const removed = (hashes, medium = 'GPU') => ['BlockRemoved', hashes, medium];
const cleared = () => ['AllBlocksCleared'];

let upstreams, publishers, proxy;
before(async () => {
    upstreams = [await startServer(['-c', '4096', '-np', '2']), await startServer(['-c', '4096', '-np', '2'])];
    publishers = [await startPublisher(), await startPublisher()];
    proxy = await startProcess(['proxy', '--port', '0', '--route-block', '64', '--health-interval', '0.2',
        ...upstreams.flatMap((u, i) => ['--upstream', `${u.url},events=tcp://127.0.0.1:${publishers[i].port}`])]);
    // Each subscription is answered with a snapshot, as keepwarm serve answers it.
    for (const p of publishers) {
        await waitFor(() => p.subscriptions() >= 1);
        await p.send(0, [cleared()]);
    }
    await waitFor(async () => (await kvState()).every((k) => k.in_step));
});
after(async () => {
    await proxy?.stop();
    for (const u of upstreams ?? []) await u.stop();
    for (const p of publishers ?? []) p.stop();
});

const kvState = async () => (await curl(`${proxy.url}/v1/cache`)).body.upstreams.map((u) => u.kv_events);

const messages = [
    { role: 'system', content: 'You answer questions about the kestrel migration in one word. '.repeat(3) },
    { role: 'user', content: 'Which datacenter goes first?' },
];

// The prompt's token ids as the proxy asks an upstream for them (its template, then its tokenizer with BOS).
async function promptTokens() {
    const rendered = await curl(`${upstreams[0].url}/apply-template`, { method: 'POST', body: { messages } });
    assert.equal(rendered.status, 200);
    const tokenized = await curl(`${upstreams[0].url}/tokenize`, {
        method: 'POST',
        body: { content: rendered.body.prompt, add_special: true, parse_special: true },
    });
    assert.equal(tokenized.status, 200);
    return tokenized.body.tokens;
}

async function ask() {
    const client = new OpenAI({ baseURL: `${proxy.url}/v1`, apiKey: 'none', maxRetries: 0 });
    const { response } = await client.chat.completions
        .create({ model: 'tiny', messages, max_tokens: 2 })
        .withResponse();
    return response.headers.get('x-keepwarm-upstream');
}

test('a prompt goes to the upstream whose events hold its token prefix, and follows the blocks when they move', async () => {
    const tokens = await promptTokens();
    assert.ok(tokens.length >= 2 * BLOCK, `the prompt has ${tokens.length} tokens`);
    const two = tokens.slice(0, 2 * BLOCK);

    // Upstream 1 holds the prompt's first two blocks.
    await publishers[1].send(1, [stored([1001, 1002], two)]);
    await waitFor(async () => (await kvState())[1].blocks.gpu === 2);
    assert.equal(await ask(), upstreams[1].url);
    assert.equal(await ask(), upstreams[1].url);
    let state = await kvState();
    assert.equal(state[1].exact_hits, 2);
    assert.equal(state[1].exact_blocks, 4);

    // The blocks move to upstream 0's disk tier: the next request follows them there, although the proxy sent the
    // prompt to upstream 1 twice (its inferred tree points there).
    await publishers[1].send(2, [removed([1001, 1002])]);
    await publishers[0].send(1, [stored([7], two.slice(0, BLOCK), 'DISK'), stored([8], two.slice(BLOCK), 'DISK', 7)]);
    await waitFor(async () => {
        const s = await kvState();
        return s[0].blocks.disk === 2 && s[1].blocks.gpu === 0;
    });
    assert.equal(await ask(), upstreams[0].url);
    state = await kvState();
    assert.equal(state[0].exact_hits, 1);
    assert.equal(state[0].exact_blocks, 2);

    const m = await metrics(proxy.url);
    assert.equal(m[`keepwarm_proxy_exact_hits_total{upstream="${upstreams[0].url}"}`], 1);
    assert.equal(m[`keepwarm_proxy_kv_events_in_step{upstream="${upstreams[0].url}"}`], 1);
});

test('a gap in an upstream\'s sequence takes it out of step until the snapshot of its new subscription', async () => {
    const before = publishers[0].subscriptions();
    // Messages 2 and 3 are lost: the proxy cannot know what they removed.
    await publishers[0].send(4, [removed([8], 'DISK')]);
    await waitFor(async () => !(await kvState())[0].in_step);
    const state = await kvState();
    assert.equal(state[0].blocks.disk, 0);
    assert.ok(state[0].resyncs >= 1);
    // Routing for it falls back to inference; the other upstream is untouched.
    assert.equal(state[1].in_step, true);

    // The proxy subscribes again; the snapshot puts it back in step.
    await waitFor(() => publishers[0].subscriptions() > before, { timeoutMs: 10_000 });
    const tokens = await promptTokens();
    await publishers[0].send(5, [cleared(), stored([7, 8], tokens.slice(0, 2 * BLOCK), 'CPU')]);
    await waitFor(async () => {
        const s = (await kvState())[0];
        return s.in_step && s.blocks.cpu === 2;
    });
    assert.equal(await ask(), upstreams[0].url);
});
