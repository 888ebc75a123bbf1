// The Ollama API through the official `ollama` npm client (and curl for what the client hides): chat and generate,
// whole and streamed as NDJSON, thinking, tool definitions and tool results, the model list/show/ps/version, a
// num_ctx that must not resize the context, reuse reported on a second turn, and bad input as Ollama errors.
// The generated models have random weights: these tests check protocol and accounting, not wording.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Ollama } from 'ollama';
import { startServer, curl, metrics, testModel, tempDir } from './harness.mjs';

let server;
let ollama;
before(async () => {
    server = await startServer(['-c', '4096', '-np', '2']);
    ollama = new Ollama({ host: server.url });
});
after(async () => server?.stop());

const rfc3339Nano = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$/;
const greedy = { temperature: 0, num_predict: 16 };
const messages = [
    { role: 'system', content: 'You are a terse assistant. Answer in one sentence.' },
    { role: 'user', content: 'Name three colours of the rainbow.' },
];

function assertFinalNumbers(r) {
    assert.equal(r.done, true);
    assert.ok(['stop', 'length'].includes(r.done_reason), r.done_reason);
    for (const field of ['total_duration', 'load_duration', 'prompt_eval_duration', 'eval_duration']) {
        assert.ok(Number.isInteger(r[field]) && r[field] >= 0, `${field} is whole nanoseconds: ${r[field]}`);
    }
    assert.ok(r.total_duration >= r.prompt_eval_duration + r.eval_duration, 'total covers prompt and generation');
    assert.ok(r.prompt_eval_count > 0);
    assert.ok(r.eval_count > 0);
    assert.equal(r.prompt_eval_count, r.prompt_eval_cached_count + r.prompt_eval_computed_count);
    assert.equal(r.prompt_eval_cached_count,
                 r.prompt_eval_cached_device_count + r.prompt_eval_cached_ram_count + r.prompt_eval_cached_disk_count);
}

async function collect(stream) {
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    return chunks;
}

test('probes: GET and HEAD / say Ollama is running; /api/version is a plain semver', async () => {
    const root = await curl(server.url, { raw: true });
    assert.equal(root.status, 200);
    assert.equal(root.body, 'Ollama is running');
    const head = await curl(server.url, { method: 'HEAD', raw: true });
    assert.equal(head.status, 200);
    const { version } = await ollama.version();
    assert.match(version, /^\d+\.\d+\.\d+$/);
    const [major, minor, patch] = version.split('.').map(Number);
    assert.ok(major > 0 || minor > 6 || (minor === 6 && patch >= 4), `${version} is at least 0.6.4`);
});

test('chat, whole: the asked model name comes back with a message and the numbers', async () => {
    const r = await ollama.chat({ model: 'llama3.2:3b', messages, stream: false, options: greedy });
    assert.equal(r.model, 'llama3.2:3b');
    assert.match(r.created_at, rfc3339Nano);
    assert.equal(r.message.role, 'assistant');
    assert.equal(typeof r.message.content, 'string');
    assert.ok(r.message.content.length > 0);
    assertFinalNumbers(r);
    assert.ok(r.eval_count <= 16);
});

// A cold request computes its prompt in one batch, a warm one only its last token; compare runs that are both warm.
test('chat, streamed: NDJSON chunks add up to the whole answer and the last one has the numbers', async () => {
    const params = { model: 'tiny', messages, options: greedy };
    await ollama.chat({ ...params, stream: false });
    const whole = await ollama.chat({ ...params, stream: false });
    const chunks = await collect(await ollama.chat({ ...params, stream: true }));
    const last = chunks.at(-1);
    assert.ok(chunks.length > 2);
    for (const chunk of chunks.slice(0, -1)) {
        assert.equal(chunk.done, false);
        assert.equal(chunk.message.role, 'assistant');
        assert.match(chunk.created_at, rfc3339Nano);
    }
    assert.equal(chunks.map((c) => c.message.content).join(''), whole.message.content);
    assertFinalNumbers(last);
    assert.equal(last.message.content, '');
    assert.equal(last.eval_count, whole.eval_count);
    assert.equal(last.prompt_eval_count, whole.prompt_eval_count);
    assert.equal(last.done_reason, whole.done_reason);

    // Without "stream", Ollama streams: the body is application/x-ndjson, one object per line.
    const res = await fetch(`${server.url}/api/chat`, {
        method: 'POST', body: JSON.stringify({ model: 'tiny', messages, options: greedy }),
    });
    assert.equal(res.headers.get('content-type'), 'application/x-ndjson');
    const lines = (await res.text()).split('\n');
    assert.equal(lines.pop(), '', 'the stream ends with a newline');
    const objects = lines.map((line) => JSON.parse(line));
    assert.equal(objects.at(-1).done, true);
    assert.equal(objects.map((o) => o.message.content).join(''), whole.message.content);
});

test('generate: templated like a chat, raw as is, streamed the same as whole', async () => {
    const system = 'You are a terse assistant. Answer in one sentence.';
    const prompt = 'Name three colours of the rainbow.';
    const templated = await ollama.generate({ model: 'tiny', system, prompt, stream: false, options: greedy });
    assert.equal(typeof templated.response, 'string');
    assertFinalNumbers(templated);
    const asChat = await ollama.chat({ model: 'tiny', messages, stream: false,
                                      options: { ...greedy, num_predict: 1 } });
    assert.equal(templated.prompt_eval_count, asChat.prompt_eval_count, 'system + prompt render as the chat does');
    assert.equal(templated.context, undefined, 'no deprecated context is handed out');

    const chunks = await collect(
        await ollama.generate({ model: 'tiny', system, prompt, stream: true, options: greedy }));
    assert.equal(chunks.map((c) => c.response).join(''), templated.response);
    assertFinalNumbers(chunks.at(-1));

    const rawPrompt = 'The three primary colours are';
    const raw = await ollama.generate({ model: 'tiny', prompt: rawPrompt, raw: true, stream: false, options: greedy });
    const tokens = await curl(`${server.url}/tokenize`, { method: 'POST', body: { content: rawPrompt } });
    assert.equal(raw.prompt_eval_count, tokens.body.tokens.length, 'a raw prompt is not templated');
    assertFinalNumbers(raw);
    const rawChunks = await collect(
        await ollama.generate({ model: 'tiny', prompt: rawPrompt, raw: true, stream: true, options: greedy }));
    assert.equal(rawChunks.map((c) => c.response).join(''), raw.response);
    assert.equal(rawChunks.at(-1).eval_count, raw.eval_count);
});

test('format: a JSON schema constrains chat, templated generate and raw generate', async () => {
    const format = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'],
                     additionalProperties: false };
    const options = { temperature: 0, num_predict: 64 };
    const chat = await ollama.chat({ model: 'tiny', messages, format, stream: false, options });
    assert.equal(typeof JSON.parse(chat.message.content).ok, 'boolean', chat.message.content);
    const templated = await ollama.generate({ model: 'tiny', prompt: 'Is it?', format, stream: false, options });
    assert.equal(typeof JSON.parse(templated.response).ok, 'boolean', templated.response);
    const raw = await ollama.generate({ model: 'tiny', prompt: 'Answer:', raw: true, format, stream: false, options });
    assert.equal(typeof JSON.parse(raw.response).ok, 'boolean', raw.response);
    const json = await ollama.chat({ model: 'tiny', messages, format: 'json', stream: false, options });
    assert.equal(json.done_reason, 'stop');
    assert.equal(typeof JSON.parse(json.message.content), 'object', json.message.content);
});

test('load calls (no messages, empty prompt) answer done_reason "load" without generating', async () => {
    const before = (await metrics(server.url)).keepwarm_requests_total;
    const chat = await ollama.chat({ model: 'any-name', messages: [], keep_alive: '5m' });
    assert.equal(chat.done, true);
    assert.equal(chat.done_reason, 'load');
    assert.equal(chat.model, 'any-name');
    const gen = await ollama.generate({ model: 'any-name', prompt: '', keep_alive: 0 });
    assert.equal(gen.done_reason, 'load');
    assert.equal((await metrics(server.url)).keepwarm_requests_total, before, 'the engine was not asked');
});

test('think: false renders the template\'s empty thinking block; true leaves it open', async () => {
    const params = { model: 'tiny', messages, stream: false, options: { ...greedy, num_predict: 1 } };
    const off = await ollama.chat({ ...params, think: false });
    const on = await ollama.chat({ ...params, think: true });
    const high = await ollama.chat({ ...params, think: 'high' });
    assert.ok(off.prompt_eval_count > on.prompt_eval_count,
              `think false adds <think></think>: ${off.prompt_eval_count} vs ${on.prompt_eval_count}`);
    assert.equal(high.prompt_eval_count, on.prompt_eval_count);
});

test('think on a template that opens the thinking block: the answer comes back as thinking', async () => {
    const hybrid = await startServer(['-c', '2048', '-np', '1'], { preset: 'tiny-hybrid' });
    try {
        const client = new Ollama({ host: hybrid.url });
        const params = { model: 'tiny-hybrid', messages, options: greedy };
        const show = await client.show({ model: 'tiny-hybrid' });
        assert.ok(show.capabilities.includes('thinking'));

        const on = await client.chat({ ...params, think: true, stream: false });
        assert.ok(on.message.thinking.length > 0, JSON.stringify(on.message));
        const chunks = await collect(await client.chat({ ...params, think: true, stream: true }));
        assert.equal(chunks.map((c) => c.message.thinking ?? '').join(''), on.message.thinking);
        assert.equal(chunks.map((c) => c.message.content).join(''), on.message.content);

        const off = await client.chat({ ...params, think: false, stream: false });
        assert.equal(off.message.thinking, undefined);
        assert.ok(off.message.content.length > 0);

        const gen = await client.generate({ model: 'tiny-hybrid', prompt: 'Why?', think: true, stream: false,
                                            options: greedy });
        assert.ok(gen.thinking.length > 0);
    } finally {
        await hybrid.stop();
    }
});

test('a template without thinking or tools: /api/show says so and think is refused', async () => {
    const dir = tempDir('ollama');
    const template = path.join(dir, 'plain.jinja');
    writeFileSync(template,
                  "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}" +
                  "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}");
    const plain = await startServer(['-c', '2048', '-np', '1', '--chat-template-file', template]);
    try {
        const client = new Ollama({ host: plain.url });
        const show = await client.show({ model: 'tiny' });
        assert.deepEqual(show.capabilities, ['completion']);
        await assert.rejects(client.chat({ model: 'tiny', messages, think: true }), (e) => {
            assert.equal(e.status_code, 400);
            assert.match(e.error, /'think': the model's chat template has no thinking mode/);
            return true;
        });
        const r = await client.chat({ model: 'tiny', messages, think: false, stream: false, options: greedy });
        assertFinalNumbers(r);
    } finally {
        await plain.stop();
    }
});

const tools = [{
    type: 'function',
    function: {
        name: 'get_weather',
        description: 'Current weather for a city',
        parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Rome', 'Oslo'] } },
                      required: ['city'] },
    },
}];

// Ollama has no tool_choice, so a model with random weights cannot be made to call a tool: these check that the
// definitions reach the prompt and that a call and its result go back in and the conversation continues.
test('tools: definitions reach the prompt; a tool call and its result round-trip', async () => {
    const question = [{ role: 'user', content: 'What is the weather in Paris?' }];
    const plain = await ollama.chat({ model: 'tiny', messages: question, stream: false, options: greedy });
    const withTools = await ollama.chat({ model: 'tiny', messages: question, tools, stream: false, options: greedy });
    assert.ok(withTools.prompt_eval_count > plain.prompt_eval_count + 20, 'the tool list is in the prompt');

    const call = { function: { name: 'get_weather', arguments: { city: 'Paris' } } };
    const conversation = [
        ...question,
        { role: 'assistant', content: '', tool_calls: [call] },
        { role: 'tool', content: '{"temperature_c": 18, "sky": "clear"}', tool_name: 'get_weather' },
    ];
    const followUp = await ollama.chat({ model: 'tiny', messages: conversation, tools, stream: false,
                                         options: greedy });
    assertFinalNumbers(followUp);
    assert.ok(followUp.prompt_eval_count > withTools.prompt_eval_count + 10, 'the call and its result are rendered');
    const streamed = await collect(await ollama.chat({ model: 'tiny', messages: conversation, tools, stream: true,
                                                       options: greedy }));
    assertFinalNumbers(streamed.at(-1));
    assert.equal(streamed.at(-1).prompt_eval_count, followUp.prompt_eval_count);
});

test('list, show, ps and version describe the loaded model', async () => {
    const file = await testModel('tiny');
    const { models } = await ollama.list();
    assert.equal(models.length, 1);
    const [listed] = models;
    assert.equal(listed.name, 'tiny:latest');
    assert.equal(listed.model, 'tiny:latest');
    assert.equal(listed.size, statSync(file).size);
    assert.match(listed.digest, /^[0-9a-f]{32,64}$/);
    assert.ok(!Number.isNaN(Date.parse(listed.modified_at)));
    assert.deepEqual(listed.details, {
        parent_model: '', format: 'gguf', family: 'qwen3', families: ['qwen3'],
        parameter_size: listed.details.parameter_size, quantization_level: 'Q8_0',
    });
    assert.match(listed.details.parameter_size, /^\d+(\.\d+)?M$/);

    const show = await ollama.show({ model: 'whatever-the-client-calls-it' });
    assert.deepEqual(show.capabilities, ['completion', 'tools', 'thinking']);
    assert.equal(show.model_info['general.architecture'], 'qwen3');
    assert.equal(typeof show.model_info['qwen3.context_length'], 'number');
    assert.equal(show.model_info['qwen3.block_count'], 4);
    assert.equal(show.model_info['tokenizer.ggml.tokens'], null, 'the vocabulary is left out, as Ollama does');
    assert.ok(show.template.includes('<|im_start|>'));
    assert.deepEqual(show.details, listed.details);

    const ps = await ollama.ps();
    assert.equal(ps.models.length, 1);
    const [loaded] = ps.models;
    assert.equal(loaded.name, 'tiny:latest');
    assert.equal(loaded.context_length, 2048, 'a slot holds 4096 / 2 tokens');
    assert.ok(loaded.size > listed.size * 0.9, `weights and KV: ${loaded.size}`);
    assert.ok(loaded.size_vram >= 0 && loaded.size_vram <= loaded.size);
    assert.ok(Date.parse(loaded.expires_at) > Date.now() + 20 * 365 * 86400e3, 'never unloaded');
});

test('options.num_ctx never resizes the context', async () => {
    const long = 'Tell me about the weather in every city you know. '.repeat(30);
    const small = await ollama.chat({ model: 'tiny', messages: [{ role: 'user', content: long }], stream: false,
                                      options: { ...greedy, num_ctx: 128 } });
    assert.ok(small.prompt_eval_count > 128, 'a prompt longer than the asked num_ctx is still served whole');
    await ollama.chat({ model: 'tiny', messages, stream: false, options: { ...greedy, num_ctx: 65536 } });
    const ps = await ollama.ps();
    assert.equal(ps.models[0].context_length, 2048);
    const models = await curl(`${server.url}/v1/models`);
    assert.equal(models.body.data[0].meta.n_ctx_slot, 2048);
    assert.equal(models.body.data[0].meta.n_ctx, 4096);
});

test('a second turn that extends the first reuses its prefix and says so', async () => {
    const system = { role: 'system',
                     content: `Reuse check ${Date.now()}. ` + 'You answer questions about colours. '.repeat(20) };
    const first = await ollama.chat({ model: 'tiny', messages: [system, { role: 'user', content: 'Red?' }],
                                      stream: false, options: greedy });
    assert.ok(first.prompt_eval_cached_count < 5, 'a new system prompt: only the template\'s opening is shared');
    assert.equal(first.prompt_eval_computed_count, first.prompt_eval_count - first.prompt_eval_cached_count);
    const second = await ollama.chat({
        model: 'tiny', stream: false, options: greedy,
        messages: [system, { role: 'user', content: 'Red?' }, first.message, { role: 'user', content: 'Blue?' }],
    });
    assert.ok(second.prompt_eval_count > first.prompt_eval_count);
    assert.ok(second.prompt_eval_cached_count >= first.prompt_eval_count - 8,
              `reused ${second.prompt_eval_cached_count} of the first prompt's ${first.prompt_eval_count}`);
    assert.ok(second.prompt_eval_computed_count < first.prompt_eval_computed_count / 2,
              `computed ${second.prompt_eval_computed_count} vs ${first.prompt_eval_computed_count}`);
    assert.ok(second.prompt_eval_cached_device_count > 0);
    assertFinalNumbers(second);
});

test('bad input: the client throws ResponseError with the status and the message naming the field', async () => {
    const cases = [
        [() => ollama.chat({ model: 'tiny', messages: [{ role: 'robot', content: 'x' }] }), "'messages[0].role'"],
        [() => ollama.chat({ model: 'tiny', messages: [{ role: 'user', content: 'x', images: ['aGk='] }] }),
         'images are not supported'],
        [() => ollama.chat({ model: 'tiny', messages, stream: true, options: { temperature: 'hot' } }),
         "'options.temperature' must be a number"],
        [() => ollama.chat({ model: 'tiny', messages, think: 'extreme' }), "'think'"],
        [() => ollama.chat({ model: '', messages }), "'model' is required"],
        [() => ollama.generate({ model: 'tiny', prompt: 'def f(', suffix: 'return 1' }), "'suffix' is not supported"],
        [() => ollama.generate({ model: 'tiny', prompt: 'x', context: [1, 2, 3] }), "'context' is not supported"],
        [() => ollama.generate({ model: 'tiny', prompt: 'x', images: ['aGk='] }), 'images are not supported'],
        [() => ollama.show({ model: '' }), "'model' is required"],
    ];
    for (const [call, message] of cases) {
        await assert.rejects(call, (e) => {
            assert.equal(e.name, 'ResponseError');
            assert.equal(e.status_code, 400);
            assert.ok(e.error.includes(message), `${e.error} names ${message}`);
            return true;
        });
    }
    const broken = await curl(`${server.url}/api/chat`, { method: 'POST', body: '{"model": "tiny", "messages": [' });
    assert.equal(broken.status, 400);
    assert.deepEqual(Object.keys(broken.body), ['error']);
    assert.match(broken.body.error, /not valid JSON/);
    // The server still answers.
    const ok = await ollama.chat({ model: 'tiny', messages, stream: false, options: { ...greedy, num_predict: 2 } });
    assert.equal(ok.done, true);
});
