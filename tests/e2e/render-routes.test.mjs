// The render routes llm-d's token producer calls (POST /v1/chat/completions/render, POST /v1/completions/render, in
// vLLM's shapes): their token ids are the ids keepwarm itself computes for the same request, so they hash as the
// blocks it publishes. Checked against the KV events (read by tests/e2e/kv-events-tokens.py from the documented wire
// format), against /tokenize of /apply-template for a fresh prompt, and for a conversation whose answer came back as
// history, where the ids are the model's own (which re-tokenizing the text does not give). Bad bodies get the
// generation routes' 4xx; with API keys, a tenant's render follows its own auth and prompt index. keepwarm proxy,
// routing by the events, gets a prompt's ids from the route and so matches past an answer that came back as history;
// from llama-server, which has no such route, it gets them with /apply-template and /tokenize.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, startProcess, curl, waitFor, freePort, tempDir, testModel, findLlamaServer } from './harness.mjs';
import { startPublisher } from './kv-events-publisher.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const BLOCK = 16;

// The published blocks, by hash: { parent, tokens }.
function subscribe(endpoint) {
    const proc = spawn('/usr/bin/python3', [path.join(here, 'kv-events-tokens.py'), endpoint], {
        stdio: ['ignore', 'pipe', 'pipe'],
    });
    const blocks = new Map();
    let lines = 0;
    let buffer = '';
    let err = '';
    proc.stderr.on('data', (d) => (err += d));
    proc.stdout.on('data', (d) => {
        buffer += d;
        let nl;
        while ((nl = buffer.indexOf('\n')) >= 0) {
            const e = JSON.parse(buffer.slice(0, nl));
            buffer = buffer.slice(nl + 1);
            lines++;
            if (e.cleared) blocks.clear();
            let parent = e.parent;
            (e.stored ?? []).forEach((hash, i) => {
                blocks.set(hash, { parent, tokens: e.tokens.slice(i * BLOCK, (i + 1) * BLOCK) });
                parent = hash;
            });
        }
    });
    return {
        blocks,
        lines: () => lines,
        error: () => err,
        // Whether some published chain of blocks from the start spells exactly `ids` (whole blocks only).
        holds(ids) {
            for (const start of blocks.keys()) {
                const path = [];
                for (let h = start; h != null; h = blocks.get(h)?.parent) path.unshift(...(blocks.get(h)?.tokens ?? []));
                if (path.length === ids.length && path.every((t, i) => t === ids[i])) return true;
            }
            return false;
        },
        stop: () => proc.kill(),
    };
}

const wholeBlocks = (ids) => ids.slice(0, ids.length - (ids.length % BLOCK));

const keysFile = path.join(tempDir('render'), 'keys.txt');
const keyA = 'sk-render-alice-5c1e';
const keyB = 'sk-render-bob-9d02';
writeFileSync(keysFile, `alice ${keyA}\nbob ${keyB}\n`);

let server, events, eventsPort, tenants;
before(async () => {
    eventsPort = await freePort();
    [server, tenants] = await Promise.all([
        startServer(['-c', '4096', '-np', '1', '--cache-block', String(BLOCK), '--kv-events', `tcp://*:${eventsPort}`]),
        startServer(['-c', '4096', '-np', '1', '--api-keys-file', keysFile]),
    ]);
    events = subscribe(`tcp://127.0.0.1:${eventsPort}`);
    // Each new subscriber gets a snapshot, which starts with AllBlocksCleared, at the engine's next step: a chat makes
    // one.
    assert.ok(await waitFor(async () => {
        await chat(server, [{ role: 'user', content: 'warm up' }], { max_tokens: 1 });
        return events.lines() > 0;
    }, { timeoutMs: 30_000 }), `no events: ${events.error()}`);
});
after(async () => {
    events?.stop();
    await Promise.all([server?.stop(), tenants?.stop()]);
});

const post = (s, route, body, key) =>
    curl(`${s.url}${route}`, { method: 'POST', body, headers: key ? { Authorization: `Bearer ${key}` } : {} });

async function chat(s, messages, extra = {}, key) {
    const r = await post(s, '/v1/chat/completions', { model: 'tiny', messages, temperature: 0, ...extra }, key);
    assert.equal(r.status, 200, JSON.stringify(r.body));
    return r.body;
}

async function render(s, body, key) {
    const r = await post(s, '/v1/chat/completions/render', { model: 'tiny', ...body }, key);
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.ok(Array.isArray(r.body.token_ids) && r.body.token_ids.length > 0, JSON.stringify(r.body));
    return r.body.token_ids;
}

// What a client (keepwarm proxy, before this route) got with two calls: the template's text, tokenized afresh.
async function retokenized(s, body, key) {
    const prompt = (await post(s, '/apply-template', body, key)).body.prompt;
    const r = await post(s, '/tokenize', { content: prompt, add_special: true, parse_special: true }, key);
    return r.body.tokens;
}

const tools = [{
    type: 'function',
    function: {
        name: 'release_notes',
        description: 'The release notes of a project for a week',
        parameters: { type: 'object', properties: { project: { type: 'string' } }, required: ['project'] },
    },
}];

const opening = (name) => [
    { role: 'system', content: `${name}: you keep the release notes of the ${name} project, tersely. `.repeat(4) },
    { role: 'user', content: `What changed in ${name} this week?` },
];

test('a fresh prompt with tools: the ids of the template tokenized, and of the blocks the server publishes', async () => {
    const body = { messages: opening('osprey'), tools };
    const ids = await render(server, body);
    assert.deepEqual(ids, await retokenized(server, body));
    assert.ok(!events.holds(wholeBlocks(ids)), 'not served yet');
    const answer = await chat(server, body.messages, { tools, max_tokens: 2 });
    assert.equal(answer.usage.prompt_tokens, ids.length);
    assert.ok(await waitFor(() => events.holds(wholeBlocks(ids)), { timeoutMs: 10_000 }));
});

// An answer the model writes one "o" token at a time (a logit bias forces it): its text, "oooo...", tokenizes back to
// fewer, longer tokens, so only ids kept from the generation match what the server cached.
async function answerInOs(s, messages, key) {
    const [o] = (await post(s, '/tokenize', { content: 'o' }, key)).body.tokens;
    const answer = await chat(s, messages, { max_tokens: 24, logit_bias: { [o]: 100 } }, key);
    const text = answer.choices[0].message.content;
    assert.match(text, /^o{8,}$/, JSON.stringify(answer));
    return [...messages, { role: 'assistant', content: text }, { role: 'user', content: 'And before that?' }];
}

test('an answer that comes back as history: the ids are the model\'s own, as cached and published', async () => {
    const messages = await answerInOs(server, opening('heron'));
    const ids = await render(server, { messages });
    // The two calls (template, then tokenize) give other ids from the answer on, which match no block the server
    // holds.
    const fresh = await retokenized(server, { messages });
    assert.notDeepEqual(ids, fresh);
    const second = await chat(server, messages, { max_tokens: 1 });
    assert.equal(second.usage.prompt_tokens, ids.length);
    assert.ok(await waitFor(() => events.holds(wholeBlocks(ids)), { timeoutMs: 10_000 }));
    assert.ok(!events.holds(wholeBlocks(fresh)), 'the re-tokenized prompt is not what the server cached');
});

test('/v1/completions/render: an array of one, the ids /v1/completions prompts with', async () => {
    const prompt = 'The osprey release notes, tersely: '.repeat(6);
    const r = await post(server, '/v1/completions/render', { model: 'tiny', prompt });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.length, 1);
    const ids = r.body[0].token_ids;
    const tokenized = await post(server, '/tokenize', { content: prompt, add_special: true, parse_special: true });
    assert.deepEqual(ids, tokenized.body.tokens);
    const done = await post(server, '/v1/completions', { model: 'tiny', prompt, max_tokens: 1, temperature: 0 });
    assert.equal(done.body.usage.prompt_tokens, ids.length);
    assert.ok(await waitFor(() => events.holds(wholeBlocks(ids)), { timeoutMs: 10_000 }));
});

test('bad bodies get the generation routes\' 4xx, in OpenAI\'s error shape', async () => {
    const long = 'osprey '.repeat(40_000);  // far more tokens than the 4,096-token context
    const cases = {
        '/v1/chat/completions': [
            'not json',
            '[1, 2]',
            { model: 'tiny' },
            { model: 'tiny', messages: 'hello' },
            { model: 'tiny', messages: [{ role: 'user', content: 7 }] },
            { model: 'tiny', messages: [{ role: 'user', content: long }] },
            { model: 'tiny', messages: [{ role: 'user', content: 'hi' }], tools: 'none' },
        ],
        '/v1/completions': [
            'not json',
            { model: 'tiny' },
            { model: 'tiny', prompt: '' },
            { model: 'tiny', prompt: [1, 2, 3] },
            { model: 'tiny', prompt: ['a', 'b'] },
            { model: 'tiny', prompt: long },
        ],
    };
    for (const [route, bodies] of Object.entries(cases)) {
        for (const body of bodies) {
            const generated = await post(server, route, body);
            const rendered = await post(server, `${route}/render`, body);
            const what = `${route}/render ${JSON.stringify(body).slice(0, 80)}: ${JSON.stringify(rendered.body)}`;
            assert.ok(rendered.status >= 400 && rendered.status < 500, what);
            assert.equal(rendered.status, generated.status, what);
            assert.equal(rendered.body.error.type, generated.body.error.type, what);
            assert.equal(rendered.body.error.message, generated.body.error.message, what);
        }
    }
});

test('with API keys: a tenant\'s render needs its key and reads its own prompt index', async () => {
    const first = opening('kestrel');
    const none = await post(tenants, '/v1/chat/completions/render', { model: 'tiny', messages: first });
    assert.equal(none.status, 401, JSON.stringify(none.body));
    const messages = await answerInOs(tenants, first, keyA);
    const ids = { alice: await render(tenants, { messages }, keyA), bob: await render(tenants, { messages }, keyB) };
    // Alice's model wrote the answer: her ids are its own. Bob's index never saw it: his are the text's.
    assert.equal((await chat(tenants, messages, { max_tokens: 1 }, keyA)).usage.prompt_tokens, ids.alice.length);
    assert.deepEqual(ids.bob, await retokenized(tenants, { messages }, keyB));
    assert.notDeepEqual(ids.alice, ids.bob);
});

test('keepwarm proxy routing by events takes the ids from the route: its match goes on past an earlier answer', async () => {
    const proxy = await startProcess(['proxy', '--port', '0', '--health-interval', '0.2',
        '--upstream', `${server.url},events=tcp://127.0.0.1:${eventsPort}`]);
    try {
        const upstream = async () => (await curl(`${proxy.url}/v1/cache`)).body.upstreams[0].kv_events;
        assert.ok(await waitFor(async () => (await upstream()).in_step), 'the proxy is in step with the events');
        const first = opening('plover');
        const answerAt = (await render(server, { messages: first })).length;  // where the answer starts
        const messages = await answerInOs(server, first);  // sent to the server directly: cached and published there
        const before = (await upstream()).exact_blocks;
        const r = await post(proxy, '/v1/chat/completions', { model: 'tiny', messages, max_tokens: 1, temperature: 0 });
        assert.equal(r.status, 200, JSON.stringify(r.body));
        // The answer's text tokenized afresh (/apply-template, then /tokenize) would match no block from it on.
        const matched = (await upstream()).exact_blocks - before;
        assert.ok(matched * BLOCK > answerAt, `${matched} blocks of ${BLOCK} matched; the answer starts at ${answerAt}`);
    } finally {
        await proxy.stop();
    }
});

test('keepwarm proxy asks the route with the model name the upstream serves: a strictly pinned upstream answers it', async () => {
    const policy = path.join(tempDir('render-strict'), 'policy.toml');
    writeFileSync(policy, '[model]\nmode = "strict"\n');
    const port = await freePort();
    const strict = await startServer(['-c', '4096', '-np', '1', '--cache-block', String(BLOCK), '--policy', policy,
        '--kv-events', `tcp://*:${port}`]);
    let proxy;
    try {
        const refused = await post(strict, '/v1/chat/completions/render', { model: 'claude-sonnet-4-5', messages: opening('tern') });
        assert.equal(refused.status, 404, 'strict pinning refuses a name it does not serve');
        proxy = await startProcess(['proxy', '--port', '0', '--health-interval', '0.2',
            '--upstream', `${strict.url},events=tcp://127.0.0.1:${port}`]);
        const upstream = async () => (await curl(`${proxy.url}/v1/cache`)).body.upstreams[0].kv_events;
        assert.ok(await waitFor(async () => (await upstream()).in_step), 'the proxy is in step with the events');
        const messages = opening('tern');
        await chat(strict, messages, { max_tokens: 1 });  // cached and published there
        assert.ok(await waitFor(async () => (await upstream()).blocks.gpu > 0), 'the proxy heard the blocks');
        const r = await post(proxy, '/v1/chat/completions',
            { model: 'claude-sonnet-4-5', messages, max_tokens: 1, temperature: 0 });
        assert.equal(r.status, 200, JSON.stringify(r.body));
        const s = await upstream();
        assert.ok(s.exact_hits === 1 && s.exact_blocks > 0, `routed by the events: ${JSON.stringify(s)}`);
        // By the route, in one call: not a 404 that sends the proxy to the two calls from then on.
        const log = strict.output();
        assert.match(log, /path=\/v1\/chat\/completions\/render status=200/);
        assert.doesNotMatch(log, /path=\/apply-template/);
    } finally {
        await proxy?.stop();
        await strict.stop();
    }
});

test('keepwarm proxy in front of llama-server (no render route): the ids from /apply-template and /tokenize', async () => {
    const llamaServer = findLlamaServer();
    assert.ok(llamaServer, 'no llama-server: run bench/build-llama-server.sh (scripts/test.sh does) or set LLAMA_SERVER');
    const port = await freePort();
    const upstream = spawn(llamaServer, ['-m', await testModel('tiny'), '--port', String(port), '-t', '1', '-c', '4096'],
        { stdio: 'ignore' });
    const url = `http://127.0.0.1:${port}`;
    const publisher = await startPublisher();
    let proxy;
    try {
        assert.ok(await waitFor(async () => (await curl(`${url}/health`)).status === 200));
        const none = await post({ url }, '/v1/chat/completions/render', { messages: opening('ibis') });
        assert.equal(none.status, 404, 'llama-server has no render route');
        proxy = await startProcess(['proxy', '--port', '0', '--health-interval', '0.2',
            '--upstream', `${url},events=tcp://127.0.0.1:${publisher.port}`]);
        assert.ok(await waitFor(() => publisher.subscriptions() > 0));
        await publisher.send(0, [['AllBlocksCleared']]);
        const state = async () => (await curl(`${proxy.url}/v1/cache`)).body.upstreams[0].kv_events;
        assert.ok(await waitFor(async () => (await state()).in_step));
        // What llama-server would publish for the prompt's first two blocks, as its own two calls tokenize it.
        const messages = opening('ibis');
        const ids = await retokenized({ url }, { messages });
        await publisher.send(1, [['BlockStored', [11, 12], null, ids.slice(0, 2 * BLOCK), BLOCK, null, 'GPU']]);
        assert.ok(await waitFor(async () => (await state()).blocks.gpu === 2));
        for (const turn of [1, 2]) {  // the second after the proxy has learnt that the route is missing
            const r = await post(proxy, '/v1/chat/completions', { model: 'tiny', messages, max_tokens: 1 });
            assert.equal(r.status, 200, JSON.stringify(r.body));
            const s = await state();
            assert.deepEqual([s.exact_hits, s.exact_blocks], [turn, 2 * turn], JSON.stringify(s));
        }
    } finally {
        await proxy?.stop();
        publisher.stop();
        upstream.kill('SIGTERM');
    }
});
