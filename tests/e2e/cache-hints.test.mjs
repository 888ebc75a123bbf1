// Client cache hints, used: a prefix a client marks (Anthropic's cache_control, OpenAI's prompt_cache_key) stays
// cached while unmarked conversations push each other out, /v1/cache and /metrics say what is held because a client
// asked, and a bad hint is a 400 in the API's shape.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, curl, metrics, words } from './harness.mjs';

const servers = [];
after(async () => {
    for (const s of servers) await s.stop();
});

// One slot and one parked sequence, no RAM or disk tier: what leaves the device is gone.
async function start(extra = []) {
    const s = await startServer(['--parallel', '1', '--cache-parked', '1', '--cache-ram', '0', '--cache-disk', '0',
        '--cache-block', '32', ...extra]);
    servers.push(s);
    return s;
}

// An Anthropic request whose system prompt carries a breakpoint when `marked`.
function anthropicTurn(system, question, marked) {
    return {
        model: 'any',
        max_tokens: 2,
        temperature: 0,
        system: [{ type: 'text', text: system, ...(marked ? { cache_control: { type: 'ephemeral' } } : {}) }],
        messages: [{ role: 'user', content: question }],
    };
}

async function post(server, path, body) {
    const res = await curl(`${server.url}${path}`, { method: 'POST', body });
    assert.equal(res.status, 200, JSON.stringify(res.body));
    return res.body;
}

const openaiTurn = (system, question, extra = {}) => ({
    model: 'any',
    max_tokens: 2,
    temperature: 0,
    messages: [
        { role: 'system', content: system },
        { role: 'user', content: question },
    ],
    ...extra,
});

// A, then two other conversations, then A again: how much of A's prompt came back.
async function returnAfterOthers(server, marked) {
    const system = words(300, 11);
    const question = words(200, 12);
    await post(server, '/v1/messages', anthropicTurn(system, question, marked));
    for (const seed of [21, 31]) await post(server, '/v1/chat/completions', openaiTurn(words(300, seed), 'hello'));
    return post(server, '/v1/messages', anthropicTurn(system, question, marked));
}

test('a system prompt the client marked stays on the device while unmarked conversations push each other out',
    async () => {
        const unmarked = await returnAfterOthers(await start(), false);
        assert.ok(unmarked.usage.cache_read_input_tokens < 32, JSON.stringify(unmarked.usage));

        // An operator who does not trust clients' marks turns them off: the marked conversation goes like the rest.
        const ignoring = await start(['--no-cache-hints']);
        const ignored = await returnAfterOthers(ignoring, true);
        assert.ok(ignored.usage.cache_read_input_tokens < 32, JSON.stringify(ignored.usage));
        assert.equal((await curl(`${ignoring.url}/v1/cache`)).body.hinted.requests, 0);

        const server = await start();
        const again = await returnAfterOthers(server, true);
        const prompt = again.usage.cache_read_input_tokens + again.usage.cache_creation_input_tokens +
            again.usage.input_tokens;
        // The conversation stayed parked on the device (the one parked sequence went to B, then C's arrival pushed
        // B out, not A), with the question after the marked system prompt: the device keeps whole conversations.
        assert.equal(again.usage.cache_read_input_tokens, prompt - 1, JSON.stringify(again.usage));

        const cache = (await curl(`${server.url}/v1/cache`)).body;
        assert.equal(cache.hinted.requests, 2, JSON.stringify(cache.hinted));
        // Only the marked part counts as held because the client asked: the system prompt (~300 tokens, in whole
        // 32-token blocks), not the question after it.
        assert.ok(cache.hinted.device_tokens >= 250 && cache.hinted.device_tokens < prompt - 100,
            JSON.stringify(cache.hinted));
        const m = await metrics(server.url);
        assert.equal(m.keepwarm_cache_hinted_requests_total, 2);
        assert.equal(m.keepwarm_cache_hinted_device_tokens, cache.hinted.device_tokens);
    });

test('prompt_cache_key marks the whole prompt (Chat Completions and Responses)', async () => {
    const server = await start();
    const system = words(300, 41);
    const first = await post(server, '/v1/chat/completions',
        openaiTurn(system, 'first question', { prompt_cache_key: 'session-1' }));
    for (const seed of [51, 61]) await post(server, '/v1/chat/completions', openaiTurn(words(300, seed), 'hello'));
    const again = await post(server, '/v1/chat/completions',
        openaiTurn(system, 'first question', { prompt_cache_key: 'session-1' }));
    assert.equal(again.usage.prompt_tokens_details.cached_tokens, first.usage.prompt_tokens - 1);

    await post(server, '/v1/responses', {
        model: 'any', instructions: system, input: 'first question', max_output_tokens: 2,
        prompt_cache_key: 'session-1', prompt_cache_retention: '24h',
    });
    const cache = (await curl(`${server.url}/v1/cache`)).body;
    assert.equal(cache.hinted.requests, 3, JSON.stringify(cache.hinted));
});

test('a hint the API does not allow is a 400 in its shape, and the next request is served', async () => {
    const server = await start();
    const bad = anthropicTurn('rules', 'hi', false);
    bad.system[0].cache_control = { type: 'ephemeral', ttl: '2d' };
    let res = await curl(`${server.url}/v1/messages`, { method: 'POST', body: bad });
    assert.equal(res.status, 400);
    assert.equal(res.body.type, 'error');
    assert.match(res.body.error.message, /system\[0\]\.cache_control\.ttl/);
    res = await curl(`${server.url}/v1/chat/completions`, {
        method: 'POST', body: openaiTurn('rules', 'hi', { prompt_cache_retention: 'forever' }),
    });
    assert.equal(res.status, 400);
    assert.match(res.body.error.message, /prompt_cache_retention/);
    await post(server, '/v1/messages', anthropicTurn('rules', 'hi', true));
});
