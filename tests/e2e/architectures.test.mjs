// The other generated architectures serve correctly too: a hybrid recurrent/attention model (qwen35, the
// Qwen3.5 template), a mixture of experts (qwen3moe), the two together (qwen35moe, as Qwen3.5-35B-A3B and
// Qwen3-Next), a sliding-window model (gemma3, the Gemma 4 template) and gpt-oss (sliding-window and full layers,
// sinks, MoE, the harmony template; tests/e2e/harmony.test.mjs has more).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, curl, words } from './harness.mjs';

for (const preset of ['tiny-hybrid', 'tiny-moe', 'tiny-hybrid-moe', 'tiny-swa', 'tiny-gpt-oss']) {
    test(`${preset}: greedy answers repeat, streamed or not, and an extended prompt reuses the first`, async () => {
        const server = await startServer(['-c', '4096', '-np', '2'], { preset });
        try {
            const openai = server.client();
            const messages = [{ role: 'user', content: 'Tell me about the sea.' }];
            const params = { model: preset, messages, temperature: 0, max_tokens: 12, ignore_eos: true };
            const a = await openai.chat.completions.create(params);
            const b = await openai.chat.completions.create(params);
            assert.equal(a.usage.completion_tokens, 12);
            assert.equal(a.choices[0].message.content, b.choices[0].message.content);

            const stream = await openai.chat.completions.create({ ...params, stream: true });
            let text = '';
            for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
            assert.equal(text, a.choices[0].message.content);

            // A prompt that extends the previous one reuses it. With max_tokens 1 the slot holds exactly the first
            // prompt (the one sampled token is never decoded), so even a recurrent model, which cannot roll its state
            // back, can extend it. (Chat turns on the hybrid do not extend yet: the Qwen3.5 template drops the
            // "<think>" that ends the previous generation prompt; checkpoints in the prefix-cache work handle that.)
            const prompt = 'The sea is large and deep. Ships cross it every day.';
            const first = await openai.completions.create({ model: preset, prompt, max_tokens: 1 });
            const second = await openai.completions.create({ model: preset, prompt: `${prompt} Fish live in it.`,
                                                            max_tokens: 1 });
            assert.equal(second.usage.prompt_tokens_details.cached_tokens, first.usage.prompt_tokens,
                         `reused ${second.usage.prompt_tokens_details.cached_tokens} of the first prompt's ` +
                         `${first.usage.prompt_tokens} tokens`);
        } finally {
            await server.stop();
        }
    });
}

// Agent turns on both hybrid layouts (qwen35 as Qwen3.5-4B; qwen35moe as Qwen3.5-35B-A3B and Qwen3-Next), through the
// Qwen3.5 template with tools and thinking on. The template drops the previous turn's "<think>" and reasoning, so each
// next turn leaves the cached path at the start of the last assistant message, a few tokens before the end of the
// previous prompt: the recurrent state there comes from the checkpoint taken at that message start.
const hybridTools = [{ type: 'function', function: { name: 'read_file', description: 'Read a file of the project',
    parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } } }];

function agentTurn(preset) {
    return { model: preset, temperature: 0, max_tokens: 8, tools: hybridTools, messages: [
        { role: 'system', content: words(400, 21) },
        { role: 'user', content: 'Look at the cache code.' },
        { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function',
            function: { name: 'read_file', arguments: JSON.stringify({ path: 'src/cache.cpp' }) } }] },
        { role: 'tool', tool_call_id: 'call_1', content: words(120, 22) },
        { role: 'user', content: 'What does it keep?' },
    ] };
}

// `body`'s next turn: the answer as the client got it (reasoning included), then a new question.
function nextAgentTurn(body, answer, question) {
    const { content, reasoning_content } = answer.choices[0].message;
    return { ...body, messages: [...body.messages, { role: 'assistant', content: content ?? '', reasoning_content },
                                 { role: 'user', content: question }] };
}

async function chatCompletion(server, body) {
    const res = await curl(`${server.url}/v1/chat/completions`, { method: 'POST', body });
    assert.equal(res.status, 200, JSON.stringify(res.body));
    return res.body;
}

// What the next turn gets back of `previous`: all of its prompt but the generation prompt's last few tokens.
function assertNextTurnReuse(next, previous, where) {
    const cached = next.usage.prompt_tokens_details.cached_tokens;
    const prompt = previous.usage.prompt_tokens;
    assert.ok(cached >= prompt - 8 && cached < prompt, `${where}: reused ${cached} of the previous ${prompt}: ` +
              JSON.stringify(next.timings));
    assert.equal(next.timings.checkpoint_pos, cached, `${where}: from the message-start checkpoint`);
}

for (const preset of ['tiny-hybrid', 'tiny-hybrid-moe']) {
    test(`${preset}: each next agent turn (tools, reasoning) restarts from the checkpoint at the last message start`,
         async () => {
        const server = await startServer(['-c', '4096', '-np', '1'], { preset });
        try {
            const first = await chatCompletion(server, agentTurn(preset));
            assert.ok(first.choices[0].message.reasoning_content.length > 0, 'thinking is on: the answer is reasoning');
            const second = await chatCompletion(server, nextAgentTurn(agentTurn(preset), first, 'And then?'));
            assertNextTurnReuse(second, first, 'second turn');
            assert.equal(second.timings.cache_device_n, second.usage.prompt_tokens_details.cached_tokens);
            const history = nextAgentTurn(agentTurn(preset), first, 'And then?');
            const third = await chatCompletion(server, nextAgentTurn(history, second, 'Anything else?'));
            assertNextTurnReuse(third, second, 'third turn');
        } finally {
            await server.stop();
        }
    });

    // After a demotion to RAM or a restart the KV between the last whole block and the last message start comes from
    // a tail that ends at that message start's checkpoint (before, only tails ending further on were kept, and the
    // turn went back to the last whole block: up to --checkpoint-every tokens recomputed).
    test(`${preset}: the next agent turn after a demotion to RAM and after a restart restarts from the same checkpoint`,
         async () => {
        const args = ['-c', '4096', '-np', '1', '--cache-parked', '0'];
        const server = await startServer(args, { preset });
        let restarted;
        try {
            const first = await chatCompletion(server, agentTurn(preset));
            const other = [{ role: 'user', content: words(200, 5) }];
            await chatCompletion(server, { model: preset, max_tokens: 4, messages: other });  // takes the only slot
            const second = await chatCompletion(server, nextAgentTurn(agentTurn(preset), first, 'And then?'));
            assert.ok(second.timings.cache_ram_n > 0, JSON.stringify(second.timings));
            assertNextTurnReuse(second, first, 'after a demotion');
            await server.stop();
            restarted = await startServer(args, { preset, cacheDir: server.cacheDir });
            const history = nextAgentTurn(agentTurn(preset), first, 'And then?');
            const third = await chatCompletion(restarted, nextAgentTurn(history, second, 'Anything else?'));
            assert.ok(third.timings.cache_disk_n > 0, JSON.stringify(third.timings));
            assertNextTurnReuse(third, second, 'after a restart');
        } finally {
            await server.stop();
            await restarted?.stop();
        }
    });
}

// A sliding-window model (512-token window) through its own chat template: the second turn of a conversation about three
// windows long reuses all of the first turn's prompt, and a conversation that only shares the system prompt reuses
// it from the parked first one (docs/sliding-window.md).
test('tiny-swa: chat turns past the window reuse the whole previous prompt', async () => {
    const server = await startServer(['-c', '8192', '-np', '1'], { preset: 'tiny-swa' });
    try {
        const openai = server.client();
        const words = ['cache', 'prefix', 'token', 'agent', 'model', 'tool', 'the', 'of', 'and', 'to'];
        const system = Array.from({ length: 1500 }, (_, i) => words[(i * 7 + (i >> 3)) % words.length]).join(' ');
        const messages = [{ role: 'system', content: system }, { role: 'user', content: 'Tell me about the sea.' }];
        const params = { model: 'tiny-swa', temperature: 0, max_tokens: 8 };
        const first = await openai.chat.completions.create({ ...params, messages });
        assert.ok(first.usage.prompt_tokens > 1024, `${first.usage.prompt_tokens} tokens: two windows at least`);
        messages.push({ role: 'assistant', content: first.choices[0].message.content },
                      { role: 'user', content: 'And the sky?' });
        const second = await openai.chat.completions.create({ ...params, messages });
        // All of the first prompt, and of the answer what the template renders as it was generated.
        assert.ok(second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens,
                  `${second.usage.prompt_tokens_details.cached_tokens} of ${first.usage.prompt_tokens} reused`);

        const other = [{ role: 'system', content: system }, { role: 'user', content: 'What about rivers?' }];
        const third = await openai.chat.completions.create({ ...params, messages: other });
        const again = await openai.chat.completions.create({ ...params, messages: other });
        assert.ok(third.usage.prompt_tokens_details.cached_tokens > 1500, 'the system prompt comes from the parked turn');
        assert.equal(again.choices[0].message.content, third.choices[0].message.content);
    } finally {
        await server.stop();
    }
});

// Drafting on a hybrid model keeps recurrent-state snapshots for every sequence of the context: the banner says how
// many and what they take, where a dense model and a hybrid without them say nothing of it.
test('the banner says what a hybrid model\'s draft rollback keeps in memory', async () => {
    const banner = async (preset, args) => {
        const server = await startServer(['-c', '4096', '-np', '2', ...args], { preset });
        try {
            return server.output();
        } finally {
            await server.stop();
        }
    };
    const hybrid = (await banner('tiny-hybrid', [])).match(
        /drafting on a hybrid model: 4 recurrent-state snapshots per sequence to drop rejected draft tokens, ([\d.]+) (\w+) over (\d+) sequences/);
    assert.ok(hybrid, 'the hybrid\'s banner names its snapshots');
    assert.ok(Number(hybrid[1]) > 0 && Number(hybrid[3]) > 2, hybrid[0]);
    assert.doesNotMatch(await banner('tiny-hybrid', ['--spec-rollback-tokens', '0']), /recurrent-state snapshots/);
    assert.doesNotMatch(await banner('tiny', []), /recurrent-state snapshots/);
});

// The prebuilt libraries carry one CPU backend per instruction-set generation and the best one is picked at run
// time. Forcing the baseline x86-64 variant (no AVX at all) shows keepwarm runs on CPUs without AVX-512 or AMX.
test('runs on the baseline x86-64 CPU backend (no AVX, no AVX-512, no AMX)', async () => {
    const server = await startServer(['-c', '1024'], { env: { KEEPWARM_CPU_BACKEND: 'x64' } });
    try {
        const compute = server.output().match(/compute: (.*)/)[1];
        assert.doesNotMatch(compute, /AVX/);
        const r = await server.client().completions.create({ model: 'tiny', prompt: 'Hello there', max_tokens: 8,
                                                             ignore_eos: true, temperature: 0 });
        assert.equal(r.usage.completion_tokens, 8);
    } finally {
        await server.stop();
    }
});

test('quantized KV cache types serve (q8_0 and q4_0)', async () => {
    for (const type of ['q8_0', 'q4_0']) {
        const server = await startServer(['-c', '1024', '--cache-type-k', type, '--cache-type-v', type]);
        try {
            assert.match(server.output(), new RegExp(`KV cache ${type}/${type}`));
            const r = await server.client().chat.completions.create({ model: 'tiny', max_tokens: 6, ignore_eos: true,
                messages: [{ role: 'user', content: 'hi' }] });
            assert.equal(r.usage.completion_tokens, 6);
        } finally {
            await server.stop();
        }
    }
});

test('an invalid KV cache type is refused at start-up with a clear message', async () => {
    await assert.rejects(startServer(['--cache-type-k', 'q3_weird']), /q3_weird.*f16/s);
});
