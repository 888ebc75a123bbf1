// `keepwarm proxy` in front of two `keepwarm serve --kv-events` upstreams: the proxy routes by the blocks the
// upstreams' own events report, including those of conversations it never saw (sent to an upstream directly), and
// catches up with an upstream that restarts (a new process: its first message clears and lists its disk tier).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { testModel, startProcess, curl, waitFor, freePort, tempDir } from './harness.mjs';

const BLOCK = 16;

// On ports of its own, so that a restart comes back at the same URL and events endpoint.
async function startUpstream(port, eventsPort, cacheDir) {
    return startProcess(['serve', '-m', await testModel('tiny'), '--port', String(port), '-t', '1', '-c', '4096',
        '-np', '2', '--cache-dir', cacheDir, '--cache-block', String(BLOCK), '--kv-events', `tcp://*:${eventsPort}`]);
}

let ports, eventsPorts, cacheDirs, upstreams, proxy;
before(async () => {
    ports = [await freePort(), await freePort()];
    eventsPorts = [await freePort(), await freePort()];
    cacheDirs = [tempDir('kv-events-a'), tempDir('kv-events-b')];
    upstreams = [];
    for (let i = 0; i < 2; i++) upstreams.push(await startUpstream(ports[i], eventsPorts[i], cacheDirs[i]));
    proxy = await startProcess(['proxy', '--port', '0', '--route-block', '64', '--health-interval', '0.2',
        ...upstreams.flatMap((u, i) => ['--upstream', `${u.url},events=tcp://127.0.0.1:${eventsPorts[i]}`])]);
    await waitFor(async () => (await kvState()).every((k) => k.in_step));
});
after(async () => {
    await proxy?.stop();
    for (const u of upstreams ?? []) await u.stop();
});

const kvState = async () => (await curl(`${proxy.url}/v1/cache`)).body.upstreams.map((u) => u.kv_events);
const client = (url) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 });

async function chat(url, messages) {
    const { data, response } = await client(url)
        .chat.completions.create({ model: 'tiny', messages, max_tokens: 3, temperature: 0 })
        .withResponse();
    return { data, upstream: response.headers.get('x-keepwarm-upstream') };
}

const conversation = (name) => [
    { role: 'system', content: `${name}: you keep the release notes of the ${name} project, tersely. `.repeat(4) },
    { role: 'user', content: `What changed in ${name} this week?` },
];

test('a conversation the proxy never saw goes where the events say it is cached', async () => {
    const messages = conversation('osprey');
    // Straight to upstream 1: the proxy's inference knows nothing of it.
    await chat(upstreams[1].url, messages);
    await waitFor(async () => (await kvState())[1].blocks.gpu >= 2);
    // By inference, a fresh proxy with two idle upstreams would pick upstream 0 (fewest requests, then first).
    const { data, upstream } = await chat(proxy.url, messages);
    assert.equal(upstream, upstreams[1].url);
    assert.ok(data.usage.prompt_tokens_details.cached_tokens >= 2 * BLOCK, JSON.stringify(data.usage));
    const state = await kvState();
    assert.equal(state[1].exact_hits, 1);
    assert.ok(state[1].exact_blocks >= 2);
    assert.equal(state[0].exact_hits, 0);
});

test('after an upstream restarts, the proxy is in step with what it announces from its disk tier', async () => {
    const messages = conversation('heron');
    await chat(upstreams[0].url, messages);
    await waitFor(async () => (await kvState())[0].blocks.gpu >= 2);
    // A restart on the same cache folder: the device and RAM tiers are gone, the disk tier's blocks come back.
    await upstreams[0].stop();
    await waitFor(async () => (await kvState())[0].blocks.gpu === 0, { timeoutMs: 20_000 });
    upstreams[0] = await startUpstream(ports[0], eventsPorts[0], cacheDirs[0]);
    await waitFor(async () => {
        const u = (await curl(`${proxy.url}/v1/cache`)).body.upstreams[0];
        return u.healthy && u.kv_events.in_step && u.kv_events.blocks.disk >= 2;
    });
    const { data, upstream } = await chat(proxy.url, messages);
    assert.equal(upstream, upstreams[0].url);
    assert.equal((await kvState())[0].exact_hits, 1);  // by its events: it had none before
    assert.ok(data.usage.prompt_tokens_details.cached_tokens >= 2 * BLOCK, JSON.stringify(data.usage));
});
