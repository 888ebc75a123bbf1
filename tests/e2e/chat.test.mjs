// The OpenAI chat API through the official `openai` client: determinism, streaming, usage and timings.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, curl, metrics } from './harness.mjs';

let server;
let openai;
before(async () => {
    server = await startServer(['-c', '4096', '-np', '2']);
    openai = server.client();
});
after(async () => server?.stop());

const messages = [
    { role: 'system', content: 'You are a terse assistant. Answer in one sentence.' },
    { role: 'user', content: 'Name three colours of the rainbow.' },
];

async function collectStream(params) {
    const stream = await openai.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
    let text = '';
    let finish = null;
    let usage = null;
    let role = null;
    for await (const chunk of stream) {
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices) {
            role ??= choice.delta?.role ?? null;
            text += choice.delta?.content ?? '';
            finish = choice.finish_reason ?? finish;
        }
    }
    return { text, finish, usage, role };
}

test('health and model list', async () => {
    const health = await curl(`${server.url}/health`);
    assert.equal(health.status, 200);
    assert.equal(health.body.status, 'ok');
    const models = await openai.models.list();
    assert.equal(models.data.length, 1);
    assert.equal(models.data[0].id, 'tiny');
});

// Note on determinism: a cold request computes its whole prompt in one batch, a warm one only its last token;
// different batch shapes may change float summation order and so, rarely, a greedy token. So runs are compared
// in the same cache state: all warm here, and cold-vs-cold across two server processes below.
test('greedy output is identical across runs, streamed or not', async () => {
    const params = { model: 'tiny', messages, temperature: 0, max_tokens: 24 };
    await openai.chat.completions.create(params);  // warm the prefix
    const a = await openai.chat.completions.create(params);
    const streamed = await collectStream(params);
    const b = await openai.chat.completions.create(params);
    assert.ok(a.choices[0].message.content.length > 0, 'generated some text');
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
    assert.equal(a.usage.completion_tokens, b.usage.completion_tokens);
    assert.equal(streamed.role, 'assistant');
    assert.equal(streamed.text, a.choices[0].message.content);
    assert.equal(streamed.finish, a.choices[0].finish_reason);
    assert.equal(streamed.usage.completion_tokens, a.usage.completion_tokens);
    assert.equal(streamed.usage.prompt_tokens, a.usage.prompt_tokens);
});

test('greedy output is identical across two server processes', async () => {
    const params = { model: 'tiny', messages: [{ role: 'user', content: 'Cold start check.' }], temperature: 0,
                     max_tokens: 24 };
    const fresh = await Promise.all([startServer(['-c', '4096']), startServer(['-c', '4096'])]);
    try {
        const [a, b] = await Promise.all(fresh.map((s) => s.client().chat.completions.create(params)));
        assert.equal(a.timings.cache_n, 0);
        assert.equal(b.timings.cache_n, 0);
        assert.ok(a.choices[0].message.content.length > 0);
        assert.equal(a.choices[0].message.content, b.choices[0].message.content);
    } finally {
        await Promise.all(fresh.map((s) => s.stop()));
    }
});

test('usage reports cached tokens and llama-server timings', async () => {
    const params = { model: 'tiny', messages: [...messages, { role: 'user', content: 'A unique question 7f3a?' }],
                     temperature: 0, max_tokens: 4 };
    const first = await openai.chat.completions.create(params);
    const second = await openai.chat.completions.create(params);
    for (const r of [first, second]) {
        assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
        for (const k of ['prompt_n', 'cache_n', 'prompt_ms', 'predicted_n', 'predicted_ms']) {
            assert.equal(typeof r.timings[k], 'number', `timings.${k}`);
        }
        assert.equal(r.timings.prompt_n + r.timings.cache_n, r.usage.prompt_tokens);
        assert.equal(r.timings.cache_n, r.usage.prompt_tokens_details.cached_tokens);
    }
    // The same prompt again reuses all of it but the last token, whose logits start the answer.
    assert.equal(second.usage.prompt_tokens_details.cached_tokens, second.usage.prompt_tokens - 1);
    assert.equal(second.timings.prompt_n, 1);
    // The server's log names each request with what it reused.
    const reused = second.usage.prompt_tokens - 1;
    const line = new RegExp(`${second.id} slot \\d+: prompt ${second.usage.prompt_tokens} tokens ` +
                            `\\(reused ${reused}: ${reused} device, computed 1\\)`);
    assert.match(server.output(), line);
});

test('max_tokens stops with finish_reason length', async () => {
    const r = await openai.chat.completions.create({ model: 'tiny', messages, temperature: 0, max_tokens: 3,
                                                     ignore_eos: true });
    assert.equal(r.usage.completion_tokens, 3);
    assert.equal(r.choices[0].finish_reason, 'length');
});

test('a stop string ends the answer and is not returned', async () => {
    const params = { model: 'tiny', messages, temperature: 0, max_tokens: 24, ignore_eos: true };
    const free = await openai.chat.completions.create(params);
    const text = free.choices[0].message.content;
    // Pick a stop string from the greedy answer itself, so we know it will appear.
    const stop = text.slice(4, 7);
    assert.ok(stop.length > 0);
    const cut = await openai.chat.completions.create({ ...params, stop: [stop] });
    assert.equal(cut.choices[0].finish_reason, 'stop');
    assert.equal(cut.choices[0].message.content, text.slice(0, text.indexOf(stop)));
    const streamed = await collectStream({ ...params, stop: [stop] });
    assert.equal(streamed.text, cut.choices[0].message.content);
});

test('several concurrent requests all complete', async () => {
    const prompts = Array.from({ length: 6 }, (_, i) => `Request number ${i}: count to five.`);
    const results = await Promise.all(prompts.map((content) =>
        openai.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content }], temperature: 0,
                                          max_tokens: 16, ignore_eos: true })));
    for (const r of results) {
        assert.equal(r.usage.completion_tokens, 16);
        assert.equal(r.choices[0].finish_reason, 'length');
    }
    // Continuous batching: both slots' tokens went through llama_decode together.
    const m = await metrics(server.url);
    assert.ok(m.keepwarm_shared_decode_steps_total > 0, `shared steps: ${m.keepwarm_shared_decode_steps_total}`);
});

test('/v1/completions, whole and streamed, agree', async () => {
    const params = { model: 'tiny', prompt: 'The quick brown fox', temperature: 0, max_tokens: 12, ignore_eos: true };
    const whole = await openai.completions.create(params);
    assert.equal(whole.object, 'text_completion');
    assert.equal(whole.usage.completion_tokens, 12);
    const stream = await openai.completions.create({ ...params, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
    assert.equal(text, whole.choices[0].text);
});

test('sampling: the same seed gives the same answer, another seed another one', async () => {
    const params = { model: 'tiny', messages: [{ role: 'user', content: 'Sample something.' }], temperature: 1.5,
                     top_k: 0, top_p: 1, min_p: 0, max_tokens: 16, ignore_eos: true };
    await openai.chat.completions.create({ ...params, seed: 1 });  // warm the prefix: later runs share its state
    const a = await openai.chat.completions.create({ ...params, seed: 1234 });
    const b = await openai.chat.completions.create({ ...params, seed: 1234 });
    const c = await openai.chat.completions.create({ ...params, seed: 99 });
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
    assert.notEqual(a.choices[0].message.content, c.choices[0].message.content);
});

test('sampling: a strong repeat penalty changes a greedy answer that repeats itself', async () => {
    const params = { model: 'tiny', messages: [{ role: 'user', content: 'Repeat after me.' }], temperature: 0,
                     max_tokens: 16, ignore_eos: true };
    const plain = await openai.chat.completions.create(params);
    const penalized = await openai.chat.completions.create({ ...params, repeat_penalty: 5, repeat_last_n: 64 });
    assert.notEqual(plain.choices[0].message.content, penalized.choices[0].message.content);
});

test('/metrics counts requests and tokens in Prometheus text format', async () => {
    const { body: text } = await curl(`${server.url}/metrics`, { raw: true });
    assert.match(text, /# TYPE keepwarm_prompt_tokens_total counter/);
    const value = (name) => Number(text.match(new RegExp(`^${name} (\\S+)$`, 'm'))[1]);
    assert.ok(value('keepwarm_requests_total') >= 10);
    assert.ok(value('keepwarm_prompt_tokens_total') > 0);
    assert.ok(value('keepwarm_reused_tokens_total') > 0);
    assert.ok(value('keepwarm_generated_tokens_total') > 0);
    assert.ok(value('keepwarm_prefill_seconds_total') > 0);
    assert.ok(value('keepwarm_decode_seconds_total') > 0);
    assert.equal(value('keepwarm_prompt_tokens_total'),
                 value('keepwarm_reused_tokens_total') + value('keepwarm_computed_prompt_tokens_total'));
    // Where the engine thread's time went, and how long streams waited for each token.
    const part = (p) => value(`keepwarm_engine_seconds_total\\{part="${p}"\\}`);
    assert.ok(part('decode') > 0 && part('sampling') > 0);
    assert.ok(part('all') >= part('decode') + part('sampling') + part('restore') + part('make_way'));
    assert.match(text, /# TYPE keepwarm_stream_step_seconds histogram/);
    assert.ok(value('keepwarm_stream_step_seconds_count') > 0);
    assert.ok(value('keepwarm_slow_stream_steps_total') >= 0);
});

test('/metrics counts requests per API', async () => {
    const before = await metrics(server.url);
    // Longer than a health ping (the default policy answers those without the engine).
    const messages = [{ role: 'user', content: 'Count me: one request through each of the APIs.' }];
    const post = async (route, body) => {
        const { status } = await curl(`${server.url}${route}`, { method: 'POST', body });
        assert.equal(status, 200, route);
    };
    await post('/v1/chat/completions', { model: 'tiny', messages, max_tokens: 1 });
    await post('/v1/completions', { model: 'tiny', prompt: 'Count me.', max_tokens: 1 });
    await post('/v1/messages', { model: 'tiny', messages, max_tokens: 1 });
    await post('/api/chat', { model: 'tiny', messages, stream: false, options: { num_predict: 1 } });
    await post('/api/generate', { model: 'tiny', prompt: 'Count me as a request through the generate route.', stream: false, options: { num_predict: 1 } });
    await post('/api/generate', { model: 'tiny', prompt: 'Count me twice, as a second request through the generate route.', stream: false, options: { num_predict: 1 } });
    const after = await metrics(server.url);
    const added = (name) => after[name] - (before[name] ?? 0);
    assert.equal(added('keepwarm_chat_completion_requests_total'), 1);
    assert.equal(added('keepwarm_completion_requests_total'), 1);
    assert.equal(added('keepwarm_messages_requests_total'), 1);
    assert.equal(added('keepwarm_ollama_chat_requests_total'), 1);
    assert.equal(added('keepwarm_ollama_generate_requests_total'), 2);
    assert.equal(added('keepwarm_requests_total'), 6);
});

test('logit_bias steers sampling: a banned token never appears, a favoured one always does', async () => {
    const params = { model: 'tiny', messages: [{ role: 'user', content: 'Bias me.' }], temperature: 0, max_tokens: 8,
                     ignore_eos: true };
    const plain = await openai.chat.completions.create(params);
    const { body } = await curl(`${server.url}/tokenize`, { method: 'POST',
                                                            body: { content: plain.choices[0].message.content } });
    const first = body.tokens[0];
    const banned = await openai.chat.completions.create({ ...params, logit_bias: { [first]: -100 } });
    const { body: again } = await curl(`${server.url}/tokenize`, { method: 'POST',
                                                                   body: { content: banned.choices[0].message.content } });
    assert.ok(!again.tokens.includes(first), 'banned token absent');
    const { body: hello } = await curl(`${server.url}/tokenize`, { method: 'POST', body: { content: 'Hello' } });
    assert.equal(hello.tokens.length, 1);
    const favoured = await openai.chat.completions.create({ ...params, logit_bias: { [hello.tokens[0]]: 100 } });
    assert.equal(favoured.choices[0].message.content, 'Hello'.repeat(8));
});
