// A stream whose prompt takes a while to compute is not silent: each API gets its own keep-alive while nothing else
// is sent (OpenAI an SSE comment, Anthropic a ping event, Ollama a line with empty content), so clients and proxies
// with idle timeouts keep the connection. The real clients read through them to the same answer.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { Ollama } from 'ollama';
import { startServer } from './harness.mjs';

let server;
before(async () => {
    server = await startServer(['-c', '16384', '--parallel', '1', '--stream-keepalive', '0.05']);
});
after(() => server?.stop());

// Long enough that computing it takes many keep-alive intervals (0.05 s) on a fast machine: about 2,000 tokens.
const longText = Array.from({ length: 250 }, (_, i) => `line ${i} of the design notes`).join('\n');
const user = (n) => [{ role: 'user', content: `${n}: ${longText}` }];

// The raw bytes of a streamed POST, and where the first answer text arrived.
async function rawStream(route, body) {
    const r = await fetch(`${server.url}${route}`, {
        method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    });
    assert.equal(r.status, 200, r.status === 200 ? "" : await r.text());
    return await r.text();
}

test('OpenAI: SSE comments while the prompt is computed, and the SDK reads the answer through them', async () => {
    const raw = await rawStream('/v1/chat/completions',
        { model: 'tiny', messages: user('a'), max_tokens: 4, stream: true });
    const firstData = raw.indexOf('data: ');
    assert.match(raw.slice(0, firstData), /^(: keep-alive\n\n)+$/, raw.slice(0, 300));

    const stream = await server.client().chat.completions.create(
        { model: 'tiny', messages: user('b'), max_tokens: 4, stream: true, stream_options: { include_usage: true } });
    let usage;
    for await (const chunk of stream) usage = chunk.usage ?? usage;
    assert.equal(usage.completion_tokens, 4);
});

test('Anthropic: ping events while the prompt is computed, and the SDK reads the answer through them', async () => {
    const raw = await rawStream('/v1/messages',
        { model: 'tiny', messages: user('c'), max_tokens: 4, stream: true });
    const pings = raw.slice(0, raw.indexOf('event: content_block_start')).match(/event: ping\n/g) ?? [];
    assert.ok(pings.length >= 2, `the first ping follows message_start; more came while computing:\n${raw.slice(0, 400)}`);

    const client = new Anthropic({ baseURL: server.url, apiKey: 'none', maxRetries: 0 });
    const message = await client.messages.stream({ model: 'tiny', messages: user('d'), max_tokens: 4 }).finalMessage();
    assert.equal(message.usage.output_tokens, 4);
});

test('Ollama: lines with empty content while the prompt is computed, and the client reads the answer through them',
    async () => {
        const raw = await rawStream('/api/chat', { model: 'tiny', messages: user('e'), stream: true,
            options: { num_predict: 4 } });
        const lines = raw.trim().split('\n').map((l) => JSON.parse(l));
        const empty = lines.filter((l) => !l.done && l.message.content === '' && !l.message.thinking);
        assert.ok(empty.length >= 2, `keep-alive lines: ${empty.length}`);
        assert.equal(lines.at(-1).done, true);

        const ollama = new Ollama({ host: server.url });
        let text = '';
        let last;
        for await (const part of await ollama.chat({ model: 'tiny', messages: user('f'), stream: true,
            options: { num_predict: 4 } })) {
            text += part.message.content;
            last = part;
        }
        assert.equal(last.done, true);
        assert.equal(last.eval_count, 4);
    });
