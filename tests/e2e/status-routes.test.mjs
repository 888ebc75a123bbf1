// llama-server's status routes on `keepwarm serve` (GET /slots: each slot's state and the tokens its sequence holds,
// growing with a request; GET /props), GET /v1/models/{id} on serve and proxy (the served name and a policy alias
// answer OpenAI's model object, any other name a 404 in OpenAI's shape), and unknown paths under /api/ answered in
// Ollama's error shape, which the official `ollama` client turns into a readable message. With tenants, /slots needs
// a key and shows another tenant's slot by its numbers only.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { Ollama } from 'ollama';
import { startServer, startProcess, curl, waitFor, tempDir } from './harness.mjs';

const dir = tempDir('status-routes');
const policyFile = path.join(dir, 'policy.toml');
writeFileSync(policyFile, '[model]\nmode = "strict"\naliases = { "claude-*" = "tiny" }\n');
const keyA = 'sk-alice-3c51e0a9d2';
const keyB = 'sk-bob-9e27f4b18c06';
const keysFile = path.join(dir, 'keys.txt');
writeFileSync(keysFile, `alice ${keyA}\nbob ${keyB}\n`);

let server;   // keepwarm serve, 2 slots of 2048 tokens
let tenants;  // keepwarm serve with two isolated tenants
let proxy;    // keepwarm proxy in front of `server`, with a policy alias
before(async () => {
    [server, tenants] = await Promise.all([
        startServer(['-c', '4096', '-np', '2']),
        startServer(['-c', '4096', '-np', '2', '--api-keys-file', keysFile]),
    ]);
    proxy = await startProcess(['proxy', '--port', '0', '--upstream', server.url, '--alias', 'tiny',
        '--policy', policyFile]);
    assert.ok(await waitFor(async () => (await curl(`${proxy.url}/health`)).status === 200), 'the upstream is up');
});
after(async () => Promise.all([proxy?.stop(), server?.stop(), tenants?.stop()]));

// One short chat through fetch, so the response's x-request-id can be read: { body, requestId }.
async function chat(url, content, key) {
    const res = await fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
        body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content }], max_tokens: 4, temperature: 0 }),
    });
    assert.equal(res.status, 200);
    return { body: await res.json(), requestId: res.headers.get('x-request-id') };
}

const held = (slots) => slots.reduce((sum, s) => sum + s.n_tokens_cached, 0);

test('GET /slots: llama-server\'s shape; the serving slot holds the prompt afterwards and names the request', async () => {
    const before = await curl(`${server.url}/slots`);
    assert.equal(before.status, 200);
    assert.equal(before.body.length, 2);
    for (const [i, slot] of before.body.entries()) {
        assert.equal(slot.id, i);
        assert.equal(slot.n_ctx, 2048, '--ctx-size / --parallel');
        assert.equal(slot.speculative, false);
        assert.equal(slot.is_processing, false);
        assert.equal(slot.state, 'idle');
        assert.equal(typeof slot.n_tokens_cached, 'number');
    }

    const { body, requestId } = await chat(server.url, `Slots check ${Date.now()}: name a colour of the sea.`);
    const after = (await curl(`${server.url}/slots`)).body;
    assert.ok(held(after) > held(before.body), `the slots hold more tokens: ${held(before.body)} -> ${held(after)}`);
    const served = after.find((s) => s.request_id === requestId);
    assert.ok(served, `a slot names the request ${requestId}: ${JSON.stringify(after)}`);
    assert.equal(served.is_processing, false);
    assert.equal(served.state, 'idle');
    assert.equal(served.n_prompt_tokens, body.usage.prompt_tokens);
    assert.equal(served.n_prompt_tokens_cache, body.usage.prompt_tokens_details.cached_tokens);
    assert.equal(served.n_prompt_tokens_processed, body.usage.prompt_tokens - served.n_prompt_tokens_cache);
    assert.equal(served.next_token[0].n_decoded, body.usage.completion_tokens);
    assert.equal(served.next_token[0].has_next_token, false);
    assert.ok(served.n_tokens_cached >= body.usage.prompt_tokens, 'prompt (and answer) stay in the sequence');
    assert.ok(Math.abs(served.last_used - Date.now() / 1000) < 60, `last_used in unix seconds: ${served.last_used}`);
    assert.ok(!('prompt' in served), 'no prompt text');

    const spare = await curl(`${server.url}/slots?fail_on_no_slot=1`);
    assert.equal(spare.status, 200, 'idle slots: no 503');
});

test('GET /props: llama-server\'s shape with keepwarm\'s values', async () => {
    const { status, body } = await curl(`${server.url}/props`);
    assert.equal(status, 200);
    assert.equal(body.default_generation_settings.n_ctx, 2048, 'a slot\'s context: --ctx-size / --parallel');
    assert.equal(body.default_generation_settings.params.n_predict, 4096, 'the default --n-predict');
    assert.equal(typeof body.default_generation_settings.params.temperature, 'number');
    assert.equal(body.total_slots, 2);
    assert.equal(body.model_alias, 'tiny');
    assert.match(body.model_path, /tiny\.gguf$/);
    assert.deepEqual(body.modalities, { vision: false, video: false, audio: false });
    assert.ok(body.chat_template.includes('<|im_start|>'), 'the GGUF\'s template');
    assert.match(body.build_info, /^keepwarm \S+ \(llama\.cpp .+\)$/);
    assert.equal(body.endpoint_slots, true);
    assert.equal(body.is_sleeping, false);
});

test('GET /v1/models/{id}: the served model, else a 404 in OpenAI\'s shape (serve, and through the official client)', async () => {
    const one = await curl(`${server.url}/v1/models/tiny`);
    assert.equal(one.status, 200);
    const listed = (await curl(`${server.url}/v1/models`)).body.data[0];
    assert.deepEqual(one.body, listed, 'the object the list holds');
    assert.equal(one.body.object, 'model');
    assert.equal(one.body.meta.n_ctx_slot, 2048);
    assert.equal((await curl(`${server.url}/models/tiny`)).status, 200);

    const missing = await curl(`${server.url}/v1/models/gpt-4o`);
    assert.equal(missing.status, 404);
    assert.equal(typeof missing.body.error.message, 'string');
    assert.match(missing.body.error.message, /gpt-4o/);

    const client = server.client();
    assert.equal((await client.models.retrieve('tiny')).id, 'tiny');
    await assert.rejects(client.models.retrieve('gpt-4o'), (e) => e.status === 404);
});

test('GET /v1/models/{id} through the proxy: the served name and a policy alias; anything else 404', async () => {
    const one = await curl(`${proxy.url}/v1/models/tiny`);
    assert.equal(one.status, 200);
    assert.deepEqual(one.body, (await curl(`${proxy.url}/v1/models`)).body.data[0]);
    const alias = await curl(`${proxy.url}/v1/models/claude-sonnet-4`);
    assert.equal(alias.status, 200, 'the policy serves claude-* as tiny');
    assert.equal(alias.body.id, 'claude-sonnet-4');
    const missing = await curl(`${proxy.url}/v1/models/gpt-4o`);
    assert.equal(missing.status, 404);
    assert.equal(typeof missing.body.error.message, 'string');
});

test('unknown paths under /api/ answer 404 in Ollama\'s shape; the ollama client shows the message', async () => {
    for (const url of [server.url, proxy.url]) {
        const r = await curl(`${url}/api/nope`);
        assert.equal(r.status, 404);
        assert.equal(typeof r.body.error, 'string', JSON.stringify(r.body));
        assert.match(r.body.error, /\/api\/nope/);
        const openai = await curl(`${url}/v1/nope`);
        assert.equal(openai.status, 404);
        assert.equal(typeof openai.body.error.message, 'string', 'outside /api/: OpenAI\'s shape');

        // Embeddings are not served (a chat model; the proxy forwards none): the client's error says so instead of
        // "[object Object]".
        const ollama = new Ollama({ host: url });
        await assert.rejects(ollama.embed({ model: 'tiny', input: 'hello' }), (e) => {
            if (url === server.url) {
                assert.equal(e.status_code, 400);
                assert.match(e.message, /'tiny' is a chat model: it makes no embeddings/);
            } else {
                assert.equal(e.status_code, 404);
                assert.match(e.message, /Invalid URL \(POST \/api\/embed\)/);
            }
            return true;
        });
    }
});

test('tenants: /slots needs a key; another tenant\'s slot shows its numbers, not its request', async () => {
    assert.equal((await curl(`${tenants.url}/slots`)).status, 401);
    assert.equal((await curl(`${tenants.url}/props`)).status, 401);
    const secret = `PIN 482913 ${Date.now()}`;
    const { requestId } = await chat(tenants.url, `The door code is ${secret}. Remember it.`, keyA);

    const own = await curl(`${tenants.url}/slots`, { headers: { authorization: `Bearer ${keyA}` } });
    assert.equal(own.status, 200);
    const mine = own.body.find((s) => s.request_id === requestId);
    assert.ok(mine, 'alice sees her request in its slot');

    const other = await curl(`${tenants.url}/slots`, { headers: { authorization: `Bearer ${keyB}` } });
    assert.equal(other.status, 200);
    const same = other.body.find((s) => s.id === mine.id);
    assert.equal(same.n_tokens_cached, mine.n_tokens_cached, 'counts are the same for everyone');
    assert.ok(!('request_id' in same), 'bob does not see alice\'s request');
    for (const body of [own.body, other.body]) {
        assert.ok(!JSON.stringify(body).includes('482913'), 'no prompt text for anyone');
    }
});
