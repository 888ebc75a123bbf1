// OpenAI's Responses API (POST /v1/responses), what Codex speaks, through the `openai` library's responses.create:
// whole and streamed answers, a tool round trip whose second request reuses the first's prefix, the 400s of what is
// not supported, and the same route through `keepwarm proxy` in front of an Anthropic-dialect upstream.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startProcess, startServer } from './harness.mjs';

let server;
let client;
const started = [];
before(async () => {
    server = await startServer(['-c', '8192', '--parallel', '1']);
    started.push(server);
    client = server.client();
});
after(() => Promise.all(started.map((s) => s.stop())));

const shell = {
    type: 'function', name: 'shell', description: 'Runs a shell command',
    parameters: { type: 'object', properties: { cmd: { type: 'string', maxLength: 12 } }, required: ['cmd'] },
};

test('a whole answer: output items, output_text, usage and the token limit as incomplete', async () => {
    const r = await client.responses.create({ model: 'tiny', instructions: 'Be brief.', input: 'Say hello.',
        max_output_tokens: 6, reasoning: { effort: 'none' } });
    assert.equal(r.object, 'response');
    assert.match(r.id, /^resp_/);
    assert.equal(r.status, 'incomplete');
    assert.equal(r.incomplete_details.reason, 'max_output_tokens');
    assert.equal(r.usage.output_tokens, 6);
    assert.ok(r.usage.input_tokens > 5);
    assert.equal(typeof r.output_text, 'string');  // the library assembles it from the message item
    assert.ok(r.output.some((item) => item.type === 'message' && item.role === 'assistant'), JSON.stringify(r.output));
});

test('a streamed answer: events in order with sequence numbers, adding up to the final response', async () => {
    const stream = await client.responses.create({ model: 'tiny', input: [{ role: 'user', content: 'Hi' }],
        max_output_tokens: 8, reasoning: { effort: 'none' }, stream: true });
    const types = [];
    let text = '';
    let final;
    let sequence = 0;
    for await (const event of stream) {
        assert.equal(event.sequence_number, sequence++);
        types.push(event.type);
        if (event.type === 'response.output_text.delta') text += event.delta;
        if (event.type === 'response.incomplete' || event.type === 'response.completed') final = event.response;
    }
    assert.deepEqual(types.slice(0, 2), ['response.created', 'response.in_progress']);
    assert.ok(types.includes('response.output_item.added') && types.includes('response.output_item.done'), types);
    assert.equal(final.status, 'incomplete');
    const message = final.output.find((item) => item.type === 'message');
    assert.equal(message.content[0].text, text);
    assert.equal(final.usage.output_tokens, 8);
});

// A required call (the answer starts with the template's call marker and the grammar writes the rest), its output
// sent back as Codex does: the whole history as input, function_call items and a function_call_output.
test('a tool round trip: the call out, its output back, and the second request reuses the first', async () => {
    const input = [{ role: 'user', content: [{ type: 'input_text', text: 'List the files.' }] }];
    const first = await client.responses.create({ model: 'tiny', input, tools: [shell], tool_choice: 'required',
        parallel_tool_calls: false, temperature: 0, max_output_tokens: 200 });
    const calls = first.output.filter((item) => item.type === 'function_call');
    assert.equal(calls.length, 1, JSON.stringify(first.output));
    assert.equal(calls[0].name, 'shell');
    assert.match(calls[0].call_id, /^call_/);
    assert.equal(typeof JSON.parse(calls[0].arguments).cmd, 'string');

    const second = await client.responses.create({ model: 'tiny', tools: [shell], max_output_tokens: 4,
        input: [...input, ...first.output, { type: 'function_call_output', call_id: calls[0].call_id,
            output: 'a.txt\nb.txt' }] });
    assert.ok(second.usage.input_tokens > first.usage.input_tokens);
    // All but the first request's generation prompt: Qwen3's template renders the turn being generated with an empty
    // <think></think> block (thinking gives way to the required call) and the same turn in history without one.
    assert.ok(second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 12,
        `cached ${second.usage.input_tokens_details.cached_tokens} of the first's ${first.usage.input_tokens}`);
});

test('what keepwarm cannot serve is a 400 in OpenAI\'s shape, and the next request is served', async () => {
    const cases = [
        [{ input: 'x', tools: [{ type: 'custom', name: 'apply_patch' }] }, /'custom' tools are not supported/],
        [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x/y.png' }] }] },
            /input_image is not supported/],
        [{ input: 42 }, /'input' must be a string or an array/],
    ];
    for (const [body, message] of cases) {
        await assert.rejects(client.responses.create({ model: 'tiny', ...body }),
            (e) => e.status === 400 && message.test(e.message), JSON.stringify(body));
    }
    const r = await client.responses.create({ model: 'tiny', input: 'still here?', max_output_tokens: 2 });
    assert.equal(r.usage.output_tokens, 2);
});

// store (the default) keeps a response with its conversation: a request naming it continues it without sending it
// again (and reuses its KV), GET returns it, DELETE removes it, another tenant cannot see it, a restart keeps it.
test('stored responses: continued, fetched, deleted, kept across a restart', async () => {
    const first = await client.responses.create({ model: 'tiny', instructions: 'Be brief.',
        input: 'Remember the number 4711.', max_output_tokens: 6, reasoning: { effort: 'none' } });
    assert.equal(first.store, true);
    // Instructions are not carried over from a previous response (OpenAI's rule): a client sends them each time.
    const second = await client.responses.create({ model: 'tiny', previous_response_id: first.id,
        instructions: 'Be brief.', input: 'Which number?', max_output_tokens: 4, reasoning: { effort: 'none' } });
    assert.equal(second.previous_response_id, first.id);
    assert.ok(second.usage.input_tokens > first.usage.input_tokens + 4, 'the first conversation is read again');
    assert.ok(second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 12,
        `cached ${second.usage.input_tokens_details.cached_tokens} of ${first.usage.input_tokens}`);

    const fetched = await client.responses.retrieve(second.id);
    assert.equal(fetched.id, second.id);
    assert.deepEqual(fetched.output, second.output);

    await assert.rejects(client.responses.create({ model: 'tiny', previous_response_id: 'resp_doesnotexist',
        input: 'x' }), (e) => e.status === 404 && /resp_doesnotexist/.test(e.message));
    await assert.rejects(client.responses.retrieve('resp_doesnotexist'), (e) => e.status === 404);

    const unstored = await client.responses.create({ model: 'tiny', input: 'not kept', store: false,
        max_output_tokens: 2 });
    assert.equal(unstored.store, false);
    await assert.rejects(client.responses.retrieve(unstored.id), (e) => e.status === 404);

    // A restart on the same cache folder keeps what was stored.
    await server.stop();
    const again = await startServer(['-c', '8192', '--parallel', '1'], { cacheDir: server.cacheDir });
    started.push(again);
    const after = again.client();
    assert.equal((await after.responses.retrieve(first.id)).id, first.id);
    const third = await after.responses.create({ model: 'tiny', previous_response_id: second.id,
        instructions: 'Be brief.', input: 'And now?', max_output_tokens: 2, reasoning: { effort: 'none' } });
    assert.ok(third.usage.input_tokens > second.usage.input_tokens);
    await after.responses.delete(first.id);
    await assert.rejects(after.responses.retrieve(first.id), (e) => e.status === 404);
    server = again;
    client = after;
});

test('the proxy serves the Responses API in front of an upstream of another dialect', async () => {
    const proxy = await startProcess(['proxy', '--port', '0', '--upstream', `${server.url},dialect=anthropic`]);
    started.push(proxy);
    const viaProxy = new OpenAI({ baseURL: `${proxy.url}/v1`, apiKey: 'none', maxRetries: 0 });
    const r = await viaProxy.responses.create({ model: 'tiny', input: 'Hello through the proxy',
        max_output_tokens: 5, reasoning: { effort: 'none' } });
    assert.equal(r.usage.output_tokens, 5);
    assert.ok(r.output.some((item) => item.type === 'message'));
    // The library's stream helper takes its final response from response.completed only; a response the token
    // limit cut ends with response.incomplete, as OpenAI's does, so the events are read here.
    const stream = await viaProxy.responses.create({ model: 'tiny', input: 'Streamed through the proxy',
        max_output_tokens: 5, reasoning: { effort: 'none' }, stream: true });
    let final;
    for await (const event of stream) if (event.type === 'response.incomplete') final = event.response;
    assert.equal(final.usage.output_tokens, 5);
});
