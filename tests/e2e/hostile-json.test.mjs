// Issue 14, items 2 and 5: JSON that is too deep, too wide or too long for the context, on every API. Each case
// is a 4xx in its API's error shape within seconds (before the fix: a segfault in dump(), or 16-60 s of parsing and
// tokenizing), then the server still answers a normal request.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, curl } from './harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const fixturesDir = path.join(here, '../fixtures/claude-code');

// Slow enough to fail the way the issue saw it (16 s and more), fast enough on a loaded two-core machine.
const quickMs = 8_000;
// A 30 MB body is still read and parsed before its size is checked (chat messages are checked before rendering).
const hugePromptMs = 20_000;

let server;
before(async () => {
    server = await startServer(['-c', '65536', '--parallel', '2']);
});
after(async () => server?.stop());

const post = async (route, body) => {
    const started = Date.now();
    const res = await curl(`${server.url}${route}`, { method: 'POST', body });
    return { ...res, ms: Date.now() - started };
};

// A JSON schema nested `depth` levels of objects (two JSON levels each), as text: JSON.stringify recurses and
// cannot write 20,000 levels.
function deepSchemaText(depth) {
    return '{"type":"object","properties":{"a":'.repeat(depth) + '{"type":"string"}' + '}}'.repeat(depth);
}
function deepValueText(depth) {
    return '{"a":'.repeat(depth) + '1' + '}'.repeat(depth);
}
// Puts raw JSON text where the placeholder string sits in `body`.
function withRaw(body, raw) {
    return JSON.stringify(body).replace('"@RAW@"', raw);
}

function assertOpenAIError(res, pattern, limitMs = quickMs) {
    assert.ok(res.status >= 400 && res.status < 500, `${res.status}: ${JSON.stringify(res.body).slice(0, 300)}`);
    assert.equal(typeof res.body?.error?.message, 'string', JSON.stringify(res.body).slice(0, 300));
    assert.match(res.body.error.message, pattern);
    assert.ok(res.ms < limitMs, `answered in ${res.ms} ms`);
}
function assertAnthropicError(res, pattern, limitMs = quickMs) {
    assert.ok(res.status >= 400 && res.status < 500, `${res.status}: ${JSON.stringify(res.body).slice(0, 300)}`);
    assert.equal(res.body?.type, 'error', JSON.stringify(res.body).slice(0, 300));
    assert.equal(res.body.error.type, 'invalid_request_error');
    assert.match(res.body.error.message, pattern);
    assert.ok(res.ms < limitMs, `answered in ${res.ms} ms`);
}
function assertOllamaError(res, pattern, limitMs = quickMs) {
    assert.ok(res.status >= 400 && res.status < 500, `${res.status}: ${JSON.stringify(res.body).slice(0, 300)}`);
    assert.deepEqual(Object.keys(res.body), ['error']);
    assert.match(res.body.error, pattern);
    assert.ok(res.ms < limitMs, `answered in ${res.ms} ms`);
}

// The next normal request completes: the server is up and no slot was left busy.
async function stillServes() {
    assert.equal(server.proc.exitCode, null, 'server still running');
    assert.equal(server.proc.signalCode, null, 'server not killed');
    const ok = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
    assert.equal(ok.body.object, 'chat.completion');
    const health = await curl(`${server.url}/health`);
    assert.equal(health.body.slots_processing, 0);
}

const user = [{ role: 'user', content: 'hi' }];
const tooDeep = /nests deeper than 128 levels/;

test('Anthropic tool input_schema nested 20,000 deep: count_tokens and messages', async () => {
    const body = withRaw(
        { model: 'm', max_tokens: 4, messages: user, tools: [{ name: 't', input_schema: '@RAW@' }] },
        deepSchemaText(20_000),
    );
    assert.ok(body.length > 120_000);
    assertAnthropicError(await post('/v1/messages/count_tokens', body), tooDeep);
    assertAnthropicError(await post('/v1/messages', body), tooDeep);
    await stillServes();
});

test('Anthropic schemas and tool_use.input within the body limit but too deep for a schema', async () => {
    const schema = JSON.parse(deepSchemaText(40)); // 81 levels: the body is fine, the schema is not
    assertAnthropicError(
        await post('/v1/messages/count_tokens', { model: 'm', messages: user, tools: [{ name: 't', input_schema: schema }] }),
        /'tools\[0\]\.input_schema' nests deeper than 64 levels/,
    );
    assertAnthropicError(
        await post('/v1/messages', {
            model: 'm', max_tokens: 4, messages: user,
            output_config: { format: { type: 'json_schema', schema } },
        }),
        /'output_config\.format\.schema' nests deeper than 64 levels/,
    );
    const input = withRaw(
        {
            model: 'm', max_tokens: 4,
            messages: [
                { role: 'user', content: 'hi' },
                { role: 'assistant', content: [{ type: 'tool_use', id: 'c1', name: 't', input: '@RAW@' }] },
                { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'c1', content: 'ok' }] },
            ],
        },
        deepValueText(20_000),
    );
    assertAnthropicError(await post('/v1/messages', input), tooDeep);
    await stillServes();
});

test('OpenAI tool parameters, arguments, response_format and chat_template_kwargs nested 20,000 deep', async () => {
    const deep = deepSchemaText(20_000);
    const tools = withRaw(
        { messages: user, max_tokens: 4, tools: [{ type: 'function', function: { name: 't', parameters: '@RAW@' } }] },
        deep,
    );
    assertOpenAIError(await post('/v1/chat/completions', tools), tooDeep);
    const format = withRaw(
        { messages: user, max_tokens: 4, response_format: { type: 'json_schema', json_schema: { name: 's', schema: '@RAW@' } } },
        deep,
    );
    assertOpenAIError(await post('/v1/chat/completions', format), tooDeep);
    const kwargs = withRaw({ messages: user, max_tokens: 4, chat_template_kwargs: { x: '@RAW@' } }, deepValueText(20_000));
    assertOpenAIError(await post('/v1/chat/completions', kwargs), tooDeep);
    // Arguments are a JSON string: the body is shallow, the text inside is not.
    const args = {
        messages: [
            { role: 'user', content: 'hi' },
            {
                role: 'assistant', content: null,
                tool_calls: [{ id: 'c1', type: 'function', function: { name: 't', arguments: deepValueText(20_000) } }],
            },
            { role: 'tool', tool_call_id: 'c1', content: 'ok' },
        ],
        max_tokens: 4,
    };
    assertOpenAIError(
        await post('/v1/chat/completions', args),
        /'messages\[1\]\.tool_calls\[0\]\.function\.arguments' nests deeper than 128 levels/,
    );
    await stillServes();
});

test('OpenAI: a $ref chain is bounded, a $ref cycle is served, wide kwargs are refused', async () => {
    const defs = {};
    for (let i = 0; i < 1000; i++) defs[`d${i}`] = { type: 'array', items: { $ref: `#/$defs/d${i + 1}` } };
    defs.d1000 = { type: 'string' };
    const chain = { $defs: defs, $ref: '#/$defs/d0' };
    assertOpenAIError(
        await post('/v1/chat/completions', {
            messages: user, max_tokens: 4,
            response_format: { type: 'json_schema', json_schema: { name: 's', schema: chain } },
        }),
        /'response_format\.json_schema\.schema' nests deeper than 128 levels once its \$refs are followed/,
    );
    const cycle = {
        $defs: { node: { type: 'object', properties: { next: { $ref: '#/$defs/node' } } } },
        $ref: '#/$defs/node',
    };
    const served = await post('/v1/chat/completions', {
        messages: user, max_tokens: 4,
        response_format: { type: 'json_schema', json_schema: { name: 's', schema: cycle } },
    });
    assert.equal(served.status, 200, JSON.stringify(served.body));
    const wide = Object.fromEntries(Array.from({ length: 5000 }, (_, i) => [`k${i}`, i]));
    assertOpenAIError(
        await post('/v1/chat/completions', { messages: user, max_tokens: 4, chat_template_kwargs: { wide } }),
        /'chat_template_kwargs' has an object with 5000 keys; at most 1024/,
    );
    await stillServes();
});

test('Ollama tool_calls.arguments and format nested 20,000 deep', async () => {
    const args = withRaw(
        {
            model: 'm', stream: false,
            messages: [
                { role: 'user', content: 'hi' },
                { role: 'assistant', content: '', tool_calls: [{ function: { name: 't', arguments: '@RAW@' } }] },
            ],
        },
        deepValueText(20_000),
    );
    assertOllamaError(await post('/api/chat', args), tooDeep);
    const format = withRaw({ model: 'm', stream: false, messages: user, format: '@RAW@' }, deepSchemaText(20_000));
    assertOllamaError(await post('/api/chat', format), tooDeep);
    assertOllamaError(
        await post('/api/generate', { model: 'm', stream: false, prompt: 'hi', format: JSON.parse(deepSchemaText(40)) }),
        /'format' nests deeper than 64 levels/,
    );
    await stillServes();
});

test('Claude Code real tool schemas still pass the schema checks', async () => {
    const { body } = JSON.parse(readFileSync(path.join(fixturesDir, 'main-turn.json'), 'utf8'));
    const res = await post('/v1/messages/count_tokens', { model: body.model, messages: body.messages, system: body.system, tools: body.tools });
    assert.equal(res.status, 200, JSON.stringify(res.body).slice(0, 500));
    assert.ok(res.body.input_tokens > 1000);
});

test('100,000 keys in an ignored field of /tokenize parse in linear time', async () => {
    const ignored = Object.fromEntries(Array.from({ length: 100_000 }, (_, i) => [`key${i}`, i]));
    const res = await post('/tokenize', { content: 'hello', ignored });
    assert.equal(res.status, 200, JSON.stringify(res.body));
    assert.ok(res.body.tokens.length > 0);
    assert.ok(res.ms < quickMs, `answered in ${res.ms} ms`);
    // Also in a body that fails: the 400 comes as quickly.
    const bad = await post('/tokenize', { content: 5, ignored });
    assert.equal(bad.status, 400);
    assert.ok(bad.ms < quickMs, `answered in ${bad.ms} ms`);
    await stillServes();
});

test('a logit_bias of 152,000 keys is refused within seconds', async () => {
    const logit_bias = Object.fromEntries(Array.from({ length: 152_000 }, (_, i) => [String(i), 1]));
    assertOpenAIError(
        await post('/v1/chat/completions', { messages: user, max_tokens: 2, logit_bias }),
        /'logit_bias' names token \d+ but the vocabulary has \d+ tokens/,
    );
    assertOpenAIError(
        await post('/v1/completions', { prompt: 'hi', max_tokens: 2, logit_bias }),
        /'logit_bias' names token/,
    );
    await stillServes();
});

test('a 30 MB prompt is refused before it is tokenized, on every route that tokenizes', async () => {
    const huge = 'lorem ipsum dolor sit amet '.repeat(30_000_000 / 27);
    // A chat request's text is held to max_text_bytes before it is rendered (issue 39); a raw prompt to the context.
    const tooLong =
        /the prompt has at least \d+ tokens but the context holds 32768 tokens per request \(it has \d+ bytes|the request's text holds \d+ bytes; keepwarm's request limit max_text_bytes is 16777216/;
    assertOpenAIError(
        await post('/v1/chat/completions', { messages: [{ role: 'user', content: huge }], max_tokens: 2 }),
        tooLong,
        hugePromptMs,
    );
    assertOpenAIError(await post('/v1/completions', { prompt: huge, max_tokens: 2 }), tooLong, hugePromptMs);
    assertAnthropicError(
        await post('/v1/messages/count_tokens', { model: 'm', messages: [{ role: 'user', content: huge }] }),
        tooLong,
        hugePromptMs,
    );
    assertAnthropicError(
        await post('/v1/messages', { model: 'm', max_tokens: 2, messages: [{ role: 'user', content: huge }] }),
        tooLong,
        hugePromptMs,
    );
    assertOllamaError(
        await post('/api/chat', { model: 'm', stream: false, messages: [{ role: 'user', content: huge }] }),
        tooLong,
        hugePromptMs,
    );
    assertOllamaError(await post('/api/generate', { model: 'm', stream: false, raw: true, prompt: huge }), tooLong, hugePromptMs);
    const tokenize = await post('/tokenize', { content: huge });
    assert.equal(tokenize.status, 400, JSON.stringify(tokenize.body).slice(0, 300));
    assert.match(tokenize.body.error.message, /'content' has \d+ bytes, at least \d+ tokens, more than the context's 65536/);
    assert.ok(tokenize.ms < hugePromptMs, `answered in ${tokenize.ms} ms`);
    await stillServes();
});
