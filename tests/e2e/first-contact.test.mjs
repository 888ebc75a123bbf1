// What a new user meets with the defaults (issue 33): a context that takes an agent's first request, said in the
// banner and in GET /v1/models, and a prompt that does not fit answered with what to change.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, curl, words } from './harness.mjs';

const chat = (text, extra = {}) => ({ messages: [{ role: 'user', content: text }], max_tokens: 1, ...extra });

test('without -c each slot holds the model\'s trained context, an agent\'s first request fits, and a prompt that does not is told what to change', async () => {
    // The test model is trained for 32,768 tokens; its KV cache is small enough for any machine's memory.
    const server = await startServer();
    try {
        assert.match(server.output(),
            /context 65536 tokens, 2 slots of 32768 tokens \(auto: the model's trained 32768 tokens per slot; -c sets another\)/);
        const models = await curl(`${server.url}/v1/models`);
        assert.equal(models.body.data[0].context_length, 32768);
        assert.equal(models.body.data[0].max_model_len, 32768);
        assert.equal(models.body.data[0].meta.n_ctx_train, 32768);

        // What an agent sends before its user types (7K-13K tokens): served, where the former default (8,192 tokens in
        // 2 slots of 4,096) answered 400.
        const agent = await curl(`${server.url}/v1/chat/completions`, { method: 'POST', body: chat(words(8500, 1)) });
        assert.equal(agent.status, 200, JSON.stringify(agent.body).slice(0, 300));
        assert.ok(agent.body.usage.prompt_tokens > 8192, `${agent.body.usage.prompt_tokens} prompt tokens`);

        const huge = await curl(`${server.url}/v1/chat/completions`, { method: 'POST', body: chat(words(40000, 2)) });
        assert.equal(huge.status, 400);
        assert.match(huge.body.error.message, /context holds 32768 tokens per request/);
        assert.match(huge.body.error.message, /65536 tokens in 2 slots: start it with a larger -c\/--ctx-size/);
    } finally {
        await server.stop();
    }
});

test('-c 0 sizes the context as the default does; -c N is taken as given', async () => {
    const [auto, given] = await Promise.all([startServer(['-c', '0', '-np', '1']), startServer(['-c', '8192'])]);
    try {
        assert.match(auto.output(), /context 32768 tokens, 1 slot of 32768 tokens \(auto: /);
        assert.match(given.output(), /context 8192 tokens, 2 slots of 4096 tokens, KV cache/);
        assert.equal((await curl(`${given.url}/v1/models`)).body.data[0].context_length, 4096);
    } finally {
        await Promise.all([auto.stop(), given.stop()]);
    }
});
