// Bad input never crashes the server and never leaves a slot busy: each case gets a 4xx with a JSON error body
// that says what is wrong, and the server keeps answering normally afterwards.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, curl, metrics } from './harness.mjs';

let server;
before(async () => {
    server = await startServer(['-c', '512', '-np', '2', '--max-body', '20000']);
});
after(async () => server?.stop());

const chat = (body, headers) => curl(`${server.url}/v1/chat/completions`, { method: 'POST', body, headers });

function assertError(res, status, pattern) {
    assert.equal(res.status, status, JSON.stringify(res.body));
    assert.equal(typeof res.body, 'object', `error body is JSON: ${res.body}`);
    assert.equal(typeof res.body.error?.message, 'string');
    assert.match(res.body.error.message, pattern);
}

test('malformed JSON', async () => {
    assertError(await chat('{"messages": [ {"role": "user", '), 400, /JSON/i);
});

test('body that is not an object', async () => {
    assertError(await chat('[1, 2, 3]'), 400, /object/i);
});

test('missing and empty messages', async () => {
    assertError(await chat({ model: 'x' }), 400, /messages/);
    assertError(await chat({ messages: [] }), 400, /messages/);
});

test('wrong types', async () => {
    assertError(await chat({ messages: 'hello' }), 400, /messages/);
    assertError(await chat({ messages: [{ role: 'user', content: 'hi' }], temperature: 'hot' }), 400, /temperature/);
    assertError(await chat({ messages: [{ role: 'user', content: 'hi' }], max_tokens: -5 }), 400, /max_tokens/);
    assertError(await chat({ messages: [{ role: 'user', content: 'hi' }], stream: 'yes' }), 400, /stream/);
    assertError(await chat({ messages: [{ role: 'wizard', content: 'hi' }] }), 400, /role/);
    assertError(await chat({ messages: [{ role: 'user', content: 'hi' }], tools: {} }), 400, /tools/);
});

test('body over the configured limit', async () => {
    const res = await chat({ messages: [{ role: 'user', content: 'x'.repeat(50_000) }] });
    assertError(res, 413, /20000/);
});

test('prompt longer than the context reports both counts', async () => {
    const content = Array.from({ length: 400 }, (_, i) => `word${i}`).join(' ');
    const res = await chat({ messages: [{ role: 'user', content }] });
    assertError(res, 400, /\d+ tokens.*256/);
});

test('unknown route and wrong method', async () => {
    assertError(await curl(`${server.url}/v1/nope`), 404, /.+/);
    assertError(await curl(`${server.url}/v1/chat/completions`), 405, /.+/);
});

test('after all that, no slot is busy and requests still work', async () => {
    const health = await curl(`${server.url}/health`);
    assert.equal(health.body.slots_processing, 0);
    const ok = await chat({ messages: [{ role: 'user', content: 'still there?' }], max_tokens: 4, temperature: 0 });
    assert.equal(ok.status, 200);
    assert.equal(ok.body.object, 'chat.completion');
    const m = await metrics(server.url);
    assert.ok(m.keepwarm_client_errors_total >= 10, `client errors counted: ${m.keepwarm_client_errors_total}`);
    assert.equal(server.proc.exitCode, null, 'server still running');
});

test('API key: required when configured, in either header style', async () => {
    const secured = await startServer(['-c', '512', '--api-key', 'sekret']);
    try {
        const body = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 };
        const url = `${secured.url}/v1/chat/completions`;
        assertError(await curl(url, { method: 'POST', body }), 401, /.+/);
        assertError(await curl(url, { method: 'POST', body, headers: { Authorization: 'Bearer wrong' } }), 401, /.+/);
        assert.equal((await curl(url, { method: 'POST', body, headers: { Authorization: 'Bearer sekret' } })).status, 200);
        assert.equal((await curl(url, { method: 'POST', body, headers: { 'x-api-key': 'sekret' } })).status, 200);
        // The openai client sends the key as a bearer token.
        const r = await secured.client({ apiKey: 'sekret' }).chat.completions.create({ model: 'm', ...body });
        assert.equal(r.object, 'chat.completion');
        // Health stays open for load balancers.
        assert.equal((await curl(`${secured.url}/health`)).status, 200);
    } finally {
        await secured.stop();
    }
});

test('logit_bias: token ids outside the vocabulary and bad values are refused', async () => {
    const base = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 };
    assertError(await chat({ ...base, logit_bias: { 99999999: 5 } }), 400, /logit_bias.*vocabulary/);
    assertError(await chat({ ...base, logit_bias: { abc: 5 } }), 400, /logit_bias/);
    assertError(await chat({ ...base, logit_bias: { 10: 500 } }), 400, /logit_bias/);
    assertError(await chat({ ...base, logit_bias: [1, 2] }), 400, /logit_bias/);
});

test('/tokenize and /detokenize round-trip, and refuse bad input', async () => {
    const text = 'Hello, keepwarm!';
    const tok = await curl(`${server.url}/tokenize`, { method: 'POST', body: { content: text } });
    assert.equal(tok.status, 200);
    assert.ok(tok.body.tokens.length > 1);
    const detok = await curl(`${server.url}/detokenize`, { method: 'POST', body: { tokens: tok.body.tokens } });
    assert.equal(detok.body.content, text);
    assertError(await curl(`${server.url}/tokenize`, { method: 'POST', body: { content: 5 } }), 400, /content/);
    assertError(await curl(`${server.url}/detokenize`, { method: 'POST', body: { tokens: [-1] } }), 400, /tokens/);
});
