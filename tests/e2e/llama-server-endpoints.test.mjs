// llama-server's native endpoints on `keepwarm serve`, for tools written against llama-server (issue 33): POST
// /completion and /completions in its own shape (a text prompt, token ids, or both mixed; n_predict, stop words,
// return_tokens; streamed without [DONE]), keepwarm's cache report in its timings, n_predict on the OpenAI routes,
// return_progress's prompt_progress events, /apply-template, /infill (a model with FIM tokens and one without), and
// the llamacpp: families of /metrics.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { binary, startServer, startProcess, curl, tempDir, words } from './harness.mjs';

let server;  // the tiny model (a Qwen vocab: no FIM tokens)
let coder;   // the tiny model with StarCoder's vocab, which has <fim_prefix>, <fim_suffix>, <fim_middle>
before(async () => {
    const fimModel = path.join(tempDir('fim-model'), 'tiny-starcoder.gguf');
    await promisify(execFile)(binary, ['mkmodel', '--preset', 'tiny', '--vocab', 'starcoder', '--seed', '1', '-o',
        fimModel], { timeout: 300_000 });
    [server, coder] = await Promise.all([
        startServer(['-c', '4096', '-np', '2']),
        startProcess(['serve', '-m', fimModel, '--port', '0', '-t', '1', '-c', '4096', '-np', '1', '--cache-dir',
            tempDir('fim-cache')]),
    ]);
});
after(async () => Promise.all([server?.stop(), coder?.stop()]));

const post = (url, body) => curl(url, { method: 'POST', body });

// A streamed POST: every `data:` payload parsed, and the raw text (to see what closes the stream).
async function stream(url, body) {
    const res = await fetch(url, {
        method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }),
    });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type'), /text\/event-stream/);
    const text = await res.text();
    const events = text.split('\n').filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]')
        .map((l) => JSON.parse(l.slice(6)));
    return { text, events };
}

test('POST /completion: a text prompt answered in llama-server\'s shape, with keepwarm\'s cache report', async () => {
    const body = { prompt: 'The cache keeps', n_predict: 5, temperature: 0, ignore_eos: true, cache_prompt: true };
    const r = await post(`${server.url}/completion`, body);
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const c = r.body;
    assert.equal(typeof c.content, 'string');
    assert.deepEqual(c.tokens, [], 'no ids unless return_tokens');
    assert.equal(c.stop, true);
    assert.equal(c.model, 'tiny');
    assert.equal(c.tokens_predicted, 5);
    assert.ok(c.tokens_evaluated > 0);
    assert.equal(c.stop_type, 'limit');
    assert.equal(c.stopping_word, '');
    assert.equal(c.truncated, false);
    assert.ok(c.id_slot >= 0);
    assert.match(c.prompt, /The cache keeps/);
    assert.equal(c.tokens_cached, c.tokens_evaluated + 4, 'the prompt and every sampled token but the last');
    for (const key of ['prompt_n', 'prompt_ms', 'prompt_per_token_ms', 'prompt_per_second', 'predicted_n',
        'predicted_ms', 'predicted_per_token_ms', 'predicted_per_second', 'cache_n', 'cache_device_n']) {
        assert.equal(typeof c.timings[key], 'number', key);
    }
    assert.equal(c.timings.predicted_n, 5);
    assert.equal(c.timings.prompt_n + c.timings.cache_n, c.tokens_evaluated);

    const again = await post(`${server.url}/completions`, { ...body, return_tokens: true });
    assert.equal(again.status, 200);
    assert.equal(again.body.content, c.content, 'the alias answers the same, at temperature 0');
    assert.equal(again.body.timings.cache_n, c.tokens_evaluated - 1, 'the second time the prompt comes from cache');
    assert.equal(again.body.timings.prompt_n, 1);
    assert.equal(again.body.tokens.length, 5, 'return_tokens: the ids');
    assert.ok(again.body.tokens.every((t) => Number.isInteger(t)));
});

test('POST /completion: token ids, and text and ids mixed, read as llama-server reads them', async () => {
    const text = 'Tokens as ids';
    const tok = await post(`${server.url}/tokenize`, { content: text });
    assert.equal(tok.status, 200);
    const ids = tok.body.tokens;
    assert.ok(ids.length > 1);
    const opts = { n_predict: 4, temperature: 0, ignore_eos: true };
    const byText = await post(`${server.url}/completion`, { prompt: text, ...opts });
    const byIds = await post(`${server.url}/completion`, { prompt: ids, ...opts });
    assert.equal(byIds.status, 200, JSON.stringify(byIds.body));
    assert.equal(byIds.body.tokens_evaluated, byText.body.tokens_evaluated);
    assert.equal(byIds.body.content, byText.body.content);
    const mixed = await post(`${server.url}/completion`, { prompt: [ids[0], text.slice(text.indexOf(' '))], ...opts });
    assert.equal(mixed.status, 200, JSON.stringify(mixed.body));
    assert.ok(mixed.body.tokens_evaluated >= 2);

    const bad = await post(`${server.url}/completion`, { prompt: [1, 1_000_000_000], n_predict: 1 });
    assert.equal(bad.status, 400);
    assert.deepEqual(bad.body, { error: { message: 'Prompt contains invalid tokens', type: 'invalid_request_error',
        code: 400 } });
    const none = await post(`${server.url}/completion`, { n_predict: 1 });
    assert.equal(none.status, 400);
    assert.equal(none.body.error.code, 400);
    assert.equal(none.body.error.type, 'invalid_request_error');
    assert.match(none.body.error.message, /'prompt'/);
});

test('POST /completion: a stop word ends the answer, named in stopping_word', async () => {
    const opts = { prompt: 'Stop words', n_predict: 12, temperature: 0, ignore_eos: true };
    const full = (await post(`${server.url}/completion`, opts)).body.content;
    const word = full.slice(3, 5);
    assert.ok(word.length === 2 && full.indexOf(word) >= 1, `an answer to cut: ${JSON.stringify(full)}`);
    const r = await post(`${server.url}/completion`, { ...opts, stop: [word] });
    assert.equal(r.status, 200);
    assert.equal(r.body.stop_type, 'word');
    assert.equal(r.body.stopping_word, word);
    assert.equal(r.body.content, full.slice(0, full.indexOf(word)));
});

test('POST /completion stream: content chunks, then a last chunk with stop and the totals, and no [DONE]', async () => {
    const opts = { prompt: 'Streams flow', n_predict: 6, temperature: 0, ignore_eos: true };
    const whole = (await post(`${server.url}/completion`, opts)).body;
    const { text, events } = await stream(`${server.url}/completion`, opts);
    assert.ok(!text.includes('[DONE]'), 'llama-server ends a native stream without [DONE]');
    const last = events.at(-1);
    const chunks = events.slice(0, -1);
    assert.ok(chunks.length >= 1);
    for (const c of chunks) {
        assert.equal(c.stop, false);
        assert.equal(typeof c.content, 'string');
        assert.equal(c.prompt_progress, undefined, 'no progress unless asked');
    }
    assert.equal(chunks.map((c) => c.content).join(''), whole.content);
    assert.equal(last.stop, true);
    assert.equal(last.content, '');
    assert.equal(last.tokens_predicted, 6);
    assert.equal(last.stop_type, 'limit');
    assert.equal(last.timings.predicted_n, 6);
    assert.ok(last.timings.cache_n > 0, 'the same prompt as before');
});

test('n_predict on /v1/chat/completions and /v1/completions: the answer\'s token limit', async () => {
    const chat = await post(`${server.url}/v1/chat/completions`, {
        messages: [{ role: 'user', content: 'Count' }], n_predict: 3, temperature: 0, ignore_eos: true });
    assert.equal(chat.status, 200, JSON.stringify(chat.body));
    assert.equal(chat.body.usage.completion_tokens, 3);
    assert.equal(chat.body.choices[0].finish_reason, 'length');
    const comp = await post(`${server.url}/v1/completions`, { prompt: 'Count', n_predict: 3, max_tokens: 9,
        temperature: 0, ignore_eos: true });
    assert.equal(comp.status, 200, JSON.stringify(comp.body));
    assert.equal(comp.body.usage.completion_tokens, 3, 'n_predict wins over max_tokens, as in llama-server');
});

test('return_progress: prompt_progress events while the prompt is processed, and the cache counted', async () => {
    const prompt = words(300, 7);
    const opts = { prompt, n_predict: 2, temperature: 0, ignore_eos: true, return_progress: true };
    const first = await stream(`${server.url}/completion`, opts);
    const progress = first.events.filter((e) => e.prompt_progress).map((e) => e.prompt_progress);
    assert.ok(progress.length >= 1, 'at least one progress event');
    const total = first.events.at(-1).tokens_evaluated;
    assert.ok(total > 200, `a prompt of a few hundred tokens (${total})`);
    for (const p of progress) {
        assert.equal(p.total, total);
        assert.ok(p.processed <= p.total && p.cache <= p.processed);
        assert.equal(typeof p.time_ms, 'number');
    }
    assert.equal(progress.at(-1).processed, total, 'processed (the cached tokens included) reaches total');
    assert.equal(progress[0].cache, first.events.at(-1).timings.cache_n);

    const second = await stream(`${server.url}/completion`, opts);
    const again = second.events.filter((e) => e.prompt_progress).map((e) => e.prompt_progress);
    assert.ok(again.length >= 1);
    assert.equal(again[0].cache, total - 1, 'all but the last prompt token from the cache');
    assert.equal(again.at(-1).processed, total);

    const chat = await stream(`${server.url}/v1/chat/completions`, {
        messages: [{ role: 'user', content: prompt }], max_tokens: 2, temperature: 0, return_progress: true });
    const chatProgress = chat.events.filter((e) => e.prompt_progress);
    assert.ok(chatProgress.length >= 1, 'chat streams carry them too');
    const p = chatProgress.at(-1).prompt_progress;
    assert.equal(p.processed, p.total);
    assert.equal(chatProgress[0].choices[0].delta.role, 'assistant');
    assert.ok(chat.text.includes('data: [DONE]'), 'the OpenAI stream still ends with [DONE]');
});

test('POST /apply-template: the chat prompt the model would read', async () => {
    const r = await post(`${server.url}/apply-template`, {
        messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello there' }] });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.deepEqual(Object.keys(r.body), ['prompt']);
    assert.match(r.body.prompt, /<\|im_start\|>system\nBe brief\.<\|im_end\|>/);
    assert.match(r.body.prompt, /<\|im_start\|>user\nHello there<\|im_end\|>/);
    assert.match(r.body.prompt, /<\|im_start\|>assistant\n/);
    const bad = await post(`${server.url}/apply-template`, { messages: [] });
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.type, 'invalid_request_error');
});

test('POST /infill: a FIM prompt from the vocab\'s FIM tokens; a model without them answers llama-server\'s 501',
    async () => {
        const body = { input_prefix: 'def add(a, b):\n    return ', input_suffix: '\n\nprint(add(1, 2))\n',
            input_extra: [{ filename: 'util.py', text: 'import math\n' }], n_predict: 4, temperature: 0,
            ignore_eos: true };
        const r = await post(`${coder.url}/infill`, body);
        assert.equal(r.status, 200, JSON.stringify(r.body));
        assert.equal(r.body.tokens_predicted, 4);
        assert.equal(r.body.stop, true);
        const p = r.body.prompt;
        // StarCoder's vocab has no token llama.cpp takes for a repo or a file separator: llama-server's snippet
        // marker stands before each other file.
        assert.ok(p.startsWith('\n\n--- snippet ---\n\nimport math\n'), p);
        assert.ok(p.includes('<fim_prefix>def add(a, b):\n    return <fim_suffix>\n\nprint(add(1, 2))\n'), p);
        assert.ok(p.endsWith('<fim_middle>'), p);
        assert.ok(p.indexOf('import math') < p.indexOf('<fim_prefix>'), 'the other files first');

        const streamed = await stream(`${coder.url}/infill`, body);
        assert.equal(streamed.events.at(-1).stop, true);
        assert.equal(streamed.events.slice(0, -1).map((e) => e.content).join(''), r.body.content);

        const missing = await post(`${coder.url}/infill`, { input_suffix: '' });
        assert.equal(missing.status, 400);
        assert.equal(missing.body.error.message, '"input_prefix" is required');

        const unsupported = await post(`${server.url}/infill`, body);
        assert.equal(unsupported.status, 501);
        assert.equal(unsupported.body.error.type, 'not_supported_error');
        assert.match(unsupported.body.error.message, /^Infill is not supported by this model: prefix token is missing/);
    });

// /metrics' llamacpp: samples as { name: value }.
async function llamacppMetrics(url) {
    const { body } = await curl(`${url}/metrics`, { raw: true });
    const values = {};
    for (const line of body.split('\n')) {
        const m = line.match(/^llamacpp:(\w+) ([0-9.e+-]+)$/);
        if (m) values[m[1]] = Number(m[2]);
    }
    return { text: body, values };
}

test('/metrics: llama-server\'s llamacpp: families, moved by a request by its own numbers', async () => {
    const before = await llamacppMetrics(server.url);
    for (const [name, type] of [['prompt_tokens_total', 'counter'], ['prompt_seconds_total', 'counter'],
        ['tokens_predicted_total', 'counter'], ['tokens_predicted_seconds_total', 'counter'],
        ['n_decode_total', 'counter'], ['n_tokens_max', 'counter'], ['prompt_tokens_seconds', 'gauge'],
        ['predicted_tokens_seconds', 'gauge'], ['requests_processing', 'gauge'], ['requests_deferred', 'gauge'],
        ['n_busy_slots_per_decode', 'gauge']]) {
        assert.ok(before.text.includes(`# TYPE llamacpp:${name} ${type}\n`), name);
    }
    const r = await post(`${server.url}/completion`, { prompt: words(40, 3), n_predict: 7, temperature: 0,
        ignore_eos: true });
    assert.equal(r.status, 200);
    const after = await llamacppMetrics(server.url);
    assert.equal(after.values.prompt_tokens_total - before.values.prompt_tokens_total, r.body.timings.prompt_n);
    assert.equal(after.values.tokens_predicted_total - before.values.tokens_predicted_total, 7);
    assert.ok(after.values.n_decode_total > before.values.n_decode_total);
    assert.ok(after.values.n_tokens_max >= r.body.tokens_evaluated);
    assert.ok(after.values.predicted_tokens_seconds > 0, 'tokens were generated since the last scrape');
    const idle = await llamacppMetrics(server.url);
    assert.equal(idle.values.predicted_tokens_seconds, 0, 'nothing since the last scrape');
    assert.equal(idle.values.requests_processing, 0);
});
