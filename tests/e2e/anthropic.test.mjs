// The Anthropic Messages API through the official `@anthropic-ai/sdk` client: message and stream shapes, the SDK's
// stream helper, tool_use / tool_result turns, thinking, count_tokens, usage from the prefix cache, and errors as
// the SDK's typed errors. The models have random weights: tests check protocol and accounting, not wording.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startServer } from './harness.mjs';

let server;
let client;
before(async () => {
    server = await startServer(['-c', '8192', '-np', '2']);
    client = anthropicClient(server);
});
after(async () => server?.stop());

function anthropicClient(s, options = {}) {
    return new Anthropic({ baseURL: s.url, apiKey: 'none', maxRetries: 0, ...options });
}

const system = [
    { type: 'text', text: 'You are a terse assistant.' },
    { type: 'text', text: 'Answer in one sentence.', cache_control: { type: 'ephemeral' } },
];
const params = {
    model: 'claude-test',
    max_tokens: 12,
    temperature: 0,
    system,
    messages: [{ role: 'user', content: 'Name three colours of the rainbow.' }],
};

async function countTokens(body) {
    const { model, system: sys, messages, tools, tool_choice, thinking } = body;
    const res = await client.messages.countTokens({ model, system: sys, messages, tools, tool_choice, thinking });
    return res.input_tokens;
}

const promptTokens = (usage) => usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens;

// Checks the order of a message's stream events and returns the text/thinking/tool input each block received.
function checkEventOrder(events) {
    assert.equal(events[0].type, 'message_start');
    assert.equal(events.at(-1).type, 'message_stop');
    assert.equal(events.at(-2).type, 'message_delta');
    const blocks = [];
    let open = null;
    for (const e of events.slice(1, -2)) {
        if (e.type === 'content_block_start') {
            assert.equal(open, null, 'a block starts only after the previous one stopped');
            assert.equal(e.index, blocks.length, 'blocks are numbered in order');
            open = e.index;
            blocks.push({ type: e.content_block.type, text: '', signatures: 0 });
        } else if (e.type === 'content_block_delta') {
            assert.equal(e.index, open, 'deltas belong to the open block');
            const block = blocks[open];
            const d = e.delta;
            if (d.type === 'text_delta') block.text += d.text;
            else if (d.type === 'thinking_delta') block.text += d.thinking;
            else if (d.type === 'input_json_delta') block.text += d.partial_json;
            else if (d.type === 'signature_delta') block.signatures++;
            else assert.fail(`unexpected delta ${d.type}`);
            assert.ok(
                { text: ['text_delta'], thinking: ['thinking_delta', 'signature_delta'],
                  tool_use: ['input_json_delta'] }[block.type].includes(d.type),
                `${d.type} in a ${block.type} block`);
        } else if (e.type === 'content_block_stop') {
            assert.equal(e.index, open);
            if (blocks[open].type === 'thinking') assert.equal(blocks[open].signatures, 1, 'a signature closes thinking');
            open = null;
        } else {
            assert.fail(`unexpected event ${e.type} inside the message`);
        }
    }
    assert.equal(open, null, 'every block was stopped');
    return blocks;
}

async function collect(stream) {
    const events = [];
    // A copy: the SDK keeps mutating the message_start snapshot as later events arrive.
    for await (const event of stream) events.push(structuredClone(event));
    return { events, message: await stream.finalMessage() };
}

test('a message comes back in Anthropic shape, with usage from the prefix cache and timings', async () => {
    const { data: msg, response } = await client.messages.create(params).withResponse();
    assert.match(msg.id, /^msg_/);
    assert.equal(response.headers.get('request-id'), msg.id);
    assert.equal(msg.type, 'message');
    assert.equal(msg.role, 'assistant');
    assert.equal(msg.model, 'claude-test', 'the model name is echoed as asked');
    assert.equal(msg.content.length, 1);
    assert.equal(msg.content[0].type, 'text');
    assert.ok(msg.content[0].text.length > 0);
    assert.equal(msg.stop_reason, 'max_tokens');
    assert.equal(msg.stop_sequence, null);
    assert.equal(msg.usage.output_tokens, 12);
    assert.equal(msg.usage.input_tokens, 0);
    assert.equal(promptTokens(msg.usage), await countTokens(params), 'count_tokens equals a real request');
    assert.equal(msg.usage.cache_read_input_tokens, msg.timings.cache_n);
    assert.equal(msg.usage.cache_creation_input_tokens, msg.timings.prompt_n);
    assert.equal(msg.timings.cache_n, msg.timings.cache_device_n + msg.timings.cache_ram_n + msg.timings.cache_disk_n);
    assert.ok(msg.timings.setup_ms >= 0);
    // 12 tokens sampled: the time they took in all and the longest one.
    const { sampling_ms: all, sampling_max_ms: longest } = msg.timings;
    assert.ok(longest > 0 && longest <= all, JSON.stringify(msg.timings));
});

test('the stream helper assembles the same message from valid events', async () => {
    await client.messages.create(params); // warm, so both runs below see the same cache state
    const whole = await client.messages.create(params);
    const { events, message } = await collect(client.messages.stream(params));
    const blocks = checkEventOrder(events);
    assert.deepEqual(blocks.map((b) => b.type), ['text']);
    assert.equal(message.content[0].text, blocks[0].text, 'finalMessage equals the concatenated deltas');
    assert.equal(message.content[0].text, whole.content[0].text, 'greedy output is the same streamed or not');
    assert.equal(message.stop_reason, 'max_tokens');
    assert.equal(message.model, 'claude-test');
    // message_start counts the whole prompt as written; message_delta carries the final split, which the SDK keeps.
    const start = events[0].message.usage;
    assert.equal(start.cache_creation_input_tokens, promptTokens(whole.usage));
    assert.equal(start.cache_read_input_tokens, 0);
    assert.equal(message.usage.cache_read_input_tokens, promptTokens(whole.usage) - 1, 'warm: all but the last token');
    assert.equal(message.usage.cache_creation_input_tokens, 1);
    assert.equal(message.usage.output_tokens, 12);
    assert.ok(events.at(-2).timings, 'message_delta carries keepwarm timings');
});

test('the raw stream names every event, and pings once the message started', async () => {
    const res = await fetch(`${server.url}/v1/messages`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
        body: JSON.stringify({ ...params, stream: true }),
    });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type'), /^text\/event-stream/);
    const frames = (await res.text()).trim().split('\n\n');
    const names = frames.map((frame) => {
        const [eventLine, dataLine] = frame.split('\n');
        const name = eventLine.replace(/^event: /, '');
        assert.equal(JSON.parse(dataLine.replace(/^data: /, '')).type, name, frame);
        return name;
    });
    assert.deepEqual(names.slice(0, 2), ['message_start', 'ping']);
    assert.deepEqual(names.slice(-2), ['message_delta', 'message_stop']);
});

// A random model never starts a tool call by itself, and common's grammar for Qwen3 lets text come before the
// call even under tool_choice any; so the request prefills the call's opening tag (Anthropic allows a final
// assistant message as prefill), the grammar forces a valid call, and the stop sequence ends the answer when the
// call closes instead of letting noise add another.
const tools = [{
    name: 'get_weather',
    description: 'Current weather for a city',
    input_schema: {
        type: 'object',
        properties: { city: { type: 'string', enum: ['Paris', 'Rome', 'Oslo'] } },
        required: ['city'],
        additionalProperties: false,
    },
}];
const question = { role: 'user', content: 'What is the weather in Paris?' };
const toolParams = {
    model: 'claude-test',
    max_tokens: 400,
    temperature: 0,
    tools,
    tool_choice: { type: 'any', disable_parallel_tool_use: true },
    stop_sequences: ['</tool_call>'],
    messages: [question, { role: 'assistant', content: '<tool_call>\n' }],
};

test('tool_choice any yields a tool_use block, streamed or not, and a tool_result turn follows', async () => {
    const msg = await client.messages.create(toolParams);
    assert.equal(msg.stop_reason, 'tool_use', JSON.stringify(msg.content));
    const calls = msg.content.filter((b) => b.type === 'tool_use');
    assert.equal(calls.length, 1);
    assert.match(calls[0].id, /^toolu_/);
    assert.equal(calls[0].name, 'get_weather');
    assert.ok(['Paris', 'Rome', 'Oslo'].includes(calls[0].input.city), JSON.stringify(calls[0].input));

    const { events, message } = await collect(client.messages.stream(toolParams));
    const blocks = checkEventOrder(events);
    const toolBlocks = blocks.filter((b) => b.type === 'tool_use');
    assert.equal(toolBlocks.length, 1);
    const streamed = message.content.find((b) => b.type === 'tool_use');
    assert.deepEqual(streamed.input, JSON.parse(toolBlocks[0].text), 'input is the concatenated partial_json');
    assert.equal(streamed.name, 'get_weather');
    assert.equal(message.stop_reason, 'tool_use');

    // The client runs the tool (or fails to) and sends the result back: an ordinary answer follows.
    for (const result of [{ content: 'Sunny, 21 C' },
                          { content: [{ type: 'text', text: 'service down' }], is_error: true }]) {
        const followUp = await client.messages.create({
            model: 'claude-test',
            max_tokens: 8,
            tools,
            messages: [question, { role: 'assistant', content: msg.content },
                       { role: 'user', content: [{ type: 'tool_result', tool_use_id: calls[0].id, ...result }] }],
        });
        assert.equal(followUp.type, 'message');
        assert.ok(['max_tokens', 'end_turn', 'tool_use'].includes(followUp.stop_reason));
        assert.ok(promptTokens(followUp.usage) > promptTokens(msg.usage));
    }
});

test('a later turn reads the earlier one from the cache and writes only its new tokens', async () => {
    const first = {
        model: 'claude-test', max_tokens: 4, temperature: 0, system,
        messages: [{ role: 'user', content: 'A conversation about caches, turn one: 52c1.' }],
    };
    const one = await client.messages.create(first);
    const firstTokens = await countTokens(first);
    assert.equal(promptTokens(one.usage), firstTokens);
    assert.ok(one.usage.cache_creation_input_tokens > firstTokens / 2, 'mostly new: only the system prompt was seen');

    // The next request extends the first prompt token for token (a prefilled answer): everything before it is read.
    const second = { ...first, messages: [...first.messages, { role: 'assistant', content: 'Caches keep prefixes' }] };
    const two = await client.messages.create(second);
    const secondTokens = await countTokens(second);
    assert.equal(two.usage.cache_read_input_tokens, firstTokens);
    assert.equal(two.usage.cache_creation_input_tokens, secondTokens - firstTokens);
    assert.equal(two.usage.input_tokens, 0);

    // A real second turn (answer, then a new question): the template renders the earlier answer differently from how
    // it was generated (Qwen3 drops its empty thinking block), so a few tokens there are computed again.
    const third = {
        ...first,
        messages: [...first.messages, { role: 'assistant', content: one.content },
                   { role: 'user', content: 'Turn two.' }],
    };
    const three = await client.messages.create(third);
    assert.ok(three.usage.cache_read_input_tokens > firstTokens - 8, JSON.stringify(three.usage));
    assert.equal(promptTokens(three.usage), await countTokens(third));
});

test('bad requests surface as the SDK typed errors, in Anthropic error shape', async () => {
    const badRequests = [
        [{ ...params, temperature: 1.5 }, /'temperature'/],
        [{ ...params, max_tokens: undefined }, /'max_tokens' is required/],
        [{ ...params, messages: [] }, /'messages' must be a non-empty array/],
        [{ ...params, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64',
            media_type: 'image/png', data: 'iVBORw0KGgo=' } }] }] }, /image blocks are not supported/],
        [{ ...params, tools: [{ type: 'web_search_20250305', name: 'web_search' }] }, /server tool/],
        // Anthropic's wording, which Claude Code reads to compact its conversation.
        [{ ...params, messages: [{ role: 'user', content: 'word '.repeat(5000) }] },
         /^prompt is too long: \d+ tokens > 4096 maximum/],
    ];
    for (const [body, message] of badRequests) {
        await assert.rejects(client.messages.create(body), (err) => {
            assert.ok(err instanceof Anthropic.BadRequestError, `${err.constructor.name}: ${err.message}`);
            assert.equal(err.status, 400);
            assert.equal(err.error.type, 'error');
            assert.equal(err.error.error.type, 'invalid_request_error');
            assert.match(err.error.error.message, message);
            return true;
        });
    }
    await assert.rejects(client.messages.countTokens({ model: 'm', messages: [{ role: 'robot', content: 'x' }] }),
                         Anthropic.BadRequestError);
    await assert.rejects(client.get('/v1/messages'),
                         (err) => err.status === 405 && err.error.error.type === 'invalid_request_error');
});

test('with --api-key, x-api-key is checked and a wrong key is an AuthenticationError', async () => {
    const guarded = await startServer(['-c', '2048', '--api-key', 'sekrit']);
    try {
        const ok = await anthropicClient(guarded, { apiKey: 'sekrit' }).messages.create({ ...params, max_tokens: 2 });
        assert.equal(ok.type, 'message');
        await assert.rejects(anthropicClient(guarded, { apiKey: 'wrong' }).messages.create(params), (err) => {
            assert.ok(err instanceof Anthropic.AuthenticationError, `${err.constructor.name}: ${err.message}`);
            assert.equal(err.error.error.type, 'authentication_error');
            return true;
        });
        const missing = await fetch(`${guarded.url}/v1/messages`, { method: 'POST', body: JSON.stringify(params) });
        assert.equal(missing.status, 401);
        assert.equal((await missing.json()).error.type, 'authentication_error');
    } finally {
        await guarded.stop();
    }
});

// The hybrid preset's template (Qwen3.5) opens a thinking block in the generation prompt when thinking is on, so a
// random model's output is all reasoning; with thinking off the template closes it and the output is text.
test('thinking enabled gives thinking blocks, streamed with a signature; disabled gives none', async () => {
    const hybrid = await startServer(['-c', '2048'], { preset: 'tiny-hybrid' });
    try {
        const c = anthropicClient(hybrid);
        const thinking = { ...params, max_tokens: 10, thinking: { type: 'enabled', budget_tokens: 1024 } };
        const msg = await c.messages.create(thinking);
        assert.equal(msg.content[0].type, 'thinking', JSON.stringify(msg.content));
        assert.ok(msg.content[0].thinking.length > 0);
        assert.equal(msg.content[0].signature, '');

        const { events, message } = await collect(c.messages.stream(thinking));
        const blocks = checkEventOrder(events);
        assert.equal(blocks[0].type, 'thinking');
        assert.equal(message.content[0].type, 'thinking');
        assert.equal(message.content[0].thinking, blocks[0].text);

        const plain = await c.messages.create({ ...params, max_tokens: 10, thinking: { type: 'disabled' } });
        assert.ok(plain.content.every((b) => b.type !== 'thinking'), JSON.stringify(plain.content));
        // The thinking block goes back in the next turn as the assistant's reasoning.
        const next = await c.messages.create({
            ...thinking,
            messages: [...params.messages, { role: 'assistant', content: msg.content }, { role: 'user', content: 'ok' }],
        });
        assert.equal(next.type, 'message');
    } finally {
        await hybrid.stop();
    }
});

// At temperature 0 the same request writes the same text, so a piece of the first answer is a stop sequence the
// second one certainly meets: stop_reason says so and stop_sequence names it, whole and streamed.
test('a stop sequence that ends the answer is reported as stop_sequence', async () => {
    const ask = { model: 'claude-test', max_tokens: 24, temperature: 0,
                  messages: [{ role: 'user', content: 'Count to ten.' }] };
    const free = await client.messages.create(ask);
    const text = free.content.find((b) => b.type === 'text')?.text ?? '';
    assert.ok(text.length >= 8, `the model wrote too little to cut: ${JSON.stringify(text)}`);
    const stop = text.slice(4, 8);
    const cut = await client.messages.create({ ...ask, stop_sequences: [stop] });
    assert.equal(cut.stop_reason, 'stop_sequence', JSON.stringify(cut));
    assert.equal(cut.stop_sequence, stop);
    assert.ok(!cut.content.find((b) => b.type === 'text')?.text.includes(stop), 'the stop sequence is not returned');
    const streamed = await client.messages.stream({ ...ask, stop_sequences: [stop] }).finalMessage();
    assert.equal(streamed.stop_reason, 'stop_sequence');
    assert.equal(streamed.stop_sequence, stop);
    assert.equal(free.stop_reason, 'max_tokens');
    assert.equal(free.stop_sequence, null);
});
