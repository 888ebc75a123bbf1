// Tool calls through the chat template in the model's GGUF (Qwen3's): definitions reach the prompt, generated
// calls come back as structured tool_calls (whole and streamed), and results go back in for the next turn.
// The model has random weights and would never start a call by itself, so the request prefills the start of one
// (a trailing assistant message is continued) and `tool_choice: "required"` makes the grammar force the rest: the
// city must be one of the enum values, then the call must close. A strong logit_bias on "</" (which the grammar only
// admits to close the call) and on the end-of-turn token ends the answer as soon as the grammar allows it, after
// one complete call, instead of letting noise add more calls.
// Template, grammar, sampler and parser all take part.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, curl } from './harness.mjs';

let server;
let openai;
let params;
before(async () => {
    server = await startServer(['-c', '4096', '-np', '2']);
    openai = server.client();
    const tokenize = async (content) =>
        (await curl(`${server.url}/tokenize`, { method: 'POST', body: { content } })).body.tokens;
    const [endOfTurn] = await tokenize('<|im_end|>');
    const [closeTag] = await tokenize('</tool_call>');
    params = { model: 'tiny', messages: [...messages, prefill], tools, tool_choice: 'required', temperature: 0,
               max_tokens: 200, logit_bias: { [endOfTurn]: 100, [closeTag]: 100 } };
});
after(async () => server?.stop());

const tools = [{
    type: 'function',
    function: {
        name: 'get_weather',
        description: 'Current weather for a city',
        parameters: {
            type: 'object',
            properties: { city: { type: 'string', enum: ['Paris', 'Rome', 'Oslo'] } },
            required: ['city'],
            additionalProperties: false,
        },
    },
}];
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
const prefill = { role: 'assistant', content: '<tool_call>\n' };

test('a required tool call comes back structured', async () => {
    const r = await openai.chat.completions.create(params);
    const choice = r.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls');
    assert.equal(choice.message.tool_calls.length, 1);
    const ids = new Set();
    for (const call of choice.message.tool_calls) {
        assert.equal(call.type, 'function');
        assert.equal(call.function.name, 'get_weather');
        assert.ok(call.id.length > 0);
        ids.add(call.id);
        const args = JSON.parse(call.function.arguments);
        assert.ok(['Paris', 'Rome', 'Oslo'].includes(args.city), call.function.arguments);
    }
    assert.equal(ids.size, choice.message.tool_calls.length, 'tool call ids are unique');
});

test('streamed tool call deltas assemble into the same call', async () => {
    const whole = await openai.chat.completions.create(params);
    const stream = await openai.chat.completions.create({ ...params, stream: true });
    const calls = [];
    let finish = null;
    for await (const chunk of stream) {
        const choice = chunk.choices[0];
        if (!choice) continue;
        finish = choice.finish_reason ?? finish;
        for (const d of choice.delta?.tool_calls ?? []) {
            calls[d.index] ??= { id: '', name: '', arguments: '' };
            if (d.id) calls[d.index].id = d.id;
            if (d.function?.name) calls[d.index].name += d.function.name;
            if (d.function?.arguments) calls[d.index].arguments += d.function.arguments;
        }
    }
    assert.equal(finish, 'tool_calls', JSON.stringify({ calls, whole: whole.choices[0], usage: whole.usage }));
    assert.equal(calls.length, whole.choices[0].message.tool_calls.length);
    calls.forEach((call, i) => {
        const expected = whole.choices[0].message.tool_calls[i];
        assert.equal(call.name, 'get_weather');
        assert.equal(call.id, call.id.trim());
        assert.deepEqual(JSON.parse(call.arguments), JSON.parse(expected.function.arguments));
    });
});

test('a tool result goes back in and the conversation continues', async () => {
    const first = await openai.chat.completions.create(params);
    const call = first.choices[0].message.tool_calls[0];
    const followUp = await openai.chat.completions.create({
        model: 'tiny', tools, temperature: 0, max_tokens: 16,
        messages: [
            ...messages,
            { role: 'assistant', content: null, tool_calls: [call] },
            { role: 'tool', tool_call_id: call.id, content: '{"temperature_c": 18, "sky": "clear"}' },
        ],
    });
    assert.equal(followUp.object, 'chat.completion');
    assert.ok(followUp.usage.prompt_tokens > first.usage.prompt_tokens);
    // Everything up to the assistant turn is reused. (Qwen3's template renders the turn being generated with an
    // empty <think></think> block and the same turn in history without one, so the tokens after the assistant header
    // differ; keeping those is the prefix-cache work's job, not this test's.)
    const header = await openai.chat.completions.create({ model: 'tiny', tools, messages, max_tokens: 1 });
    assert.ok(followUp.usage.prompt_tokens_details.cached_tokens >= header.usage.prompt_tokens - 1,
              `cached ${followUp.usage.prompt_tokens_details.cached_tokens}, prompt up to the assistant turn ` +
              `${header.usage.prompt_tokens}`);
});

// Without a prefill, a required call with thinking off starts the answer with the template's tool-call marker (what
// Anthropic documents for tool_choice any/tool): the grammar alone would let the model write text first, forever.
test('a required tool call needs no prefill when thinking is off', async () => {
    const noPrefill = { ...params, messages, chat_template_kwargs: { enable_thinking: false } };
    const r = await openai.chat.completions.create(noPrefill);
    const choice = r.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice.message));
    assert.equal(choice.message.tool_calls[0].function.name, 'get_weather');
    assert.ok(!choice.message.content, `no text around the call: ${JSON.stringify(choice.message.content)}`);

    const stream = await openai.chat.completions.create({ ...noPrefill, stream: true });
    let text = '';
    let name = '';
    for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? '';
        for (const d of chunk.choices[0]?.delta?.tool_calls ?? []) name += d.function?.name ?? '';
    }
    assert.equal(name, 'get_weather');
    assert.equal(text, '', 'the marker is not streamed as text');
});

// Thinking is on by default for this template: a plain OpenAI client asking for a required call gets the call (the
// thinking gives way), and a client that asked for thinking explicitly is told why it cannot have both.
test('a required tool call is enforced when thinking is on by default, and refused when thinking was asked for', async () => {
    // parallel_tool_calls false: at temperature 1 the template's grammar would let the random model repeat calls until
    // max_tokens; keepwarm ends the answer at the first one.
    const plain = { ...params, messages, parallel_tool_calls: false };
    delete plain.chat_template_kwargs;
    for (let i = 0; i < 3; i++) {  // random weights: every sample must still be a call, and one
        const r = await openai.chat.completions.create({ ...plain, temperature: 1, seed: i });
        const choice = r.choices[0];
        assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice.message));
        assert.equal(choice.message.tool_calls.length, 1, JSON.stringify(choice.message));
        assert.equal(choice.message.tool_calls[0].function.name, 'get_weather');
    }
    await assert.rejects(
        openai.chat.completions.create({ ...plain, chat_template_kwargs: { enable_thinking: true } }),
        (e) => e.status === 400 && /required tool call cannot be enforced with thinking on/.test(e.message) &&
               /enable_thinking/.test(e.message));
});
