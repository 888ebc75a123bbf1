// Tool calls through the chat template in the model's GGUF (Qwen3's): definitions reach the prompt, generated
// calls come back as structured tool_calls (whole and streamed), and results go back in for the next turn.
// The model has random weights, so `tool_choice: "required"` (a grammar) makes it call a tool.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer } from './harness.mjs';

let server;
let openai;
before(async () => {
    server = await startServer(['-c', '4096', '-np', '2']);
    openai = server.client();
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
const params = { model: 'tiny', messages, tools, tool_choice: 'required', temperature: 0, max_tokens: 64 };

test('a required tool call comes back structured', async () => {
    const r = await openai.chat.completions.create(params);
    const choice = r.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls');
    assert.equal(choice.message.tool_calls.length, 1);
    const call = choice.message.tool_calls[0];
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'get_weather');
    assert.ok(call.id.length > 0);
    const args = JSON.parse(call.function.arguments);
    assert.ok(['Paris', 'Rome', 'Oslo'].includes(args.city), call.function.arguments);
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
    assert.equal(finish, 'tool_calls');
    assert.equal(calls.length, 1);
    assert.equal(calls[0].name, 'get_weather');
    assert.deepEqual(JSON.parse(calls[0].arguments), JSON.parse(whole.choices[0].message.tool_calls[0].function.arguments));
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
    // The first turn's prompt is a prefix of the second's: it is reused, not recomputed.
    assert.ok(followUp.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1,
              `cached ${followUp.usage.prompt_tokens_details.cached_tokens} of ${first.usage.prompt_tokens}`);
});
