// keepwarm serve on an embedding model (the tiny-embed preset: qwen3 with last-token pooling, as Qwen3-Embedding):
// its vectors against llama-server --embeddings on the same model and inputs, the official openai and ollama clients,
// llama-server's own shapes, bounded inputs answered 4xx in each API's shape, and chat routes refused (and the
// embedding routes of a chat server); a reranker (tiny-rerank) against llama-server --reranking.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import OpenAI from 'openai';
import { Ollama } from 'ollama';
import { startServer, curl, metrics, testModel, freePort, findLlamaServer, waitFor, words } from './harness.mjs';

let server;
const CONTEXT = 256; // tokens one input may have on this server (-c)

before(async () => {
    server = await startServer(['-c', String(CONTEXT)], { preset: 'tiny-embed' });
});

after(async () => {
    await server?.stop();
});

const openai = () => new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0 });

function maxDifference(a, b) {
    assert.equal(a.length, b.length);
    let d = 0;
    for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i] - b[i]));
    return d;
}

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

const inputs = [
    'hello world',
    'The quick brown fox jumps over the lazy dog.',
    words(60, 7),
    'a',
    'Embeddings map text to vectors; <|im_start|> is a special token.',
];

// ggml's CPU flash attention rounds differently in batches of 64 rows or more than below (tests/unit/test-embedder's
// batch_tolerance): the two servers may cut the same inputs into other batches, so vectors agree to this, per value,
// on unit vectors of 128 values. Measured: 0 when both batch alike, 2e-4 to 2.5e-3 when not.
const TOLERANCE = 5e-3;

test('vectors equal llama-server --embeddings on the same model and inputs', async () => {
    const llamaServer = findLlamaServer();
    assert.ok(llamaServer, 'no llama-server: run bench/build-llama-server.sh (scripts/test.sh does) or set LLAMA_SERVER');
    const model = await testModel('tiny-embed');
    const port = await freePort();
    const ls = spawn(llamaServer, ['-m', model, '--embeddings', '--port', String(port), '-t', '1', '-c', '4096',
                                   '-b', '512', '-ub', '512'], { stdio: 'ignore' });
    const url = `http://127.0.0.1:${port}`;
    try {
        assert.ok(await waitFor(async () => (await curl(`${url}/health`)).status === 200, { timeoutMs: 60_000 }));
        const body = { input: [...inputs, [9707, 1879], [785, 3974, 13876, 38835]] };
        const theirs = await curl(`${url}/v1/embeddings`, { method: 'POST', body });
        const ours = await curl(`${server.url}/v1/embeddings`, { method: 'POST', body });
        assert.equal(theirs.status, 200, JSON.stringify(theirs.body));
        assert.equal(ours.status, 200, JSON.stringify(ours.body));
        assert.equal(ours.body.data.length, body.input.length);
        // The same tokens (llama-server appends the vocab's EOS to text, not to token ids): the same usage.
        assert.deepEqual(ours.body.usage, theirs.body.usage);
        for (let i = 0; i < body.input.length; i++) {
            assert.equal(ours.body.data[i].index, i);
            const d = maxDifference(ours.body.data[i].embedding, theirs.body.data[i].embedding);
            assert.ok(d <= TOLERANCE, `input ${i}: keepwarm and llama-server differ by ${d}`);
        }
        // One input alone, and llama-server's native /embedding shape on both.
        for (const path of ['/embedding', '/embeddings']) {
            const a = await curl(`${server.url}${path}`, { method: 'POST', body: { content: inputs[1] } });
            const b = await curl(`${url}${path}`, { method: 'POST', body: { content: inputs[1] } });
            assert.equal(a.status, 200);
            assert.deepEqual(Object.keys(a.body[0]), Object.keys(b.body[0]));
            assert.equal(a.body[0].embedding.length, 1);
            assert.ok(maxDifference(a.body[0].embedding[0], b.body[0].embedding[0]) <= TOLERANCE, path);
        }
        // embd_normalize -1: the raw pooled vector, as llama-server gives it.
        const rawOurs = await curl(`${server.url}/embedding`, { method: 'POST', body: { content: 'hi', embd_normalize: -1 } });
        const rawTheirs = await curl(`${url}/embedding`, { method: 'POST', body: { content: 'hi', embd_normalize: -1 } });
        assert.ok(Math.abs(norm(rawOurs.body[0].embedding[0]) - 1) > 1e-3);
        const scale = norm(rawTheirs.body[0].embedding[0]);
        assert.ok(maxDifference(rawOurs.body[0].embedding[0], rawTheirs.body[0].embedding[0]) <= TOLERANCE * scale);
    } finally {
        ls.kill('SIGTERM');
    }
});

test('the openai client: embeddings.create, base64 (its default) and float', async () => {
    const client = openai();
    const b64 = await client.embeddings.create({ model: 'tiny-embed', input: ['hello world', 'another text'] });
    const floats = await client.embeddings.create({ model: 'tiny-embed', input: ['hello world', 'another text'],
                                                    encoding_format: 'float' });
    assert.equal(b64.object, 'list');
    assert.equal(b64.data.length, 2);
    assert.equal(b64.model, 'tiny-embed');
    assert.ok(b64.usage.prompt_tokens > 0);
    assert.equal(b64.usage.total_tokens, b64.usage.prompt_tokens);
    for (let i = 0; i < 2; i++) {
        assert.equal(floats.data[i].embedding.length, 128);
        assert.ok(Math.abs(norm(floats.data[i].embedding) - 1) < 1e-5);
        // base64 carries the same float32 values.
        assert.ok(maxDifference(b64.data[i].embedding, floats.data[i].embedding) < 1e-7);
    }
    const one = await client.embeddings.create({ model: 'x', input: 'hello world', encoding_format: 'float' });
    assert.deepEqual(one.data[0].embedding, floats.data[0].embedding); // the same input alone: the same vector
    const tokens = await client.embeddings.create({ model: 'x', input: [[9707, 1879]], encoding_format: 'float' });
    assert.equal(tokens.usage.prompt_tokens, 2);
    const shortened = await client.embeddings.create({ model: 'x', input: 'hello world', dimensions: 32,
                                                       encoding_format: 'float' });
    assert.equal(shortened.data[0].embedding.length, 32);
    assert.ok(Math.abs(norm(shortened.data[0].embedding) - 1) < 1e-5);
});

test('the ollama client: embed (and truncate), legacy embeddings; tags and show list the model', async () => {
    const ollama = new Ollama({ host: server.url });
    const r = await ollama.embed({ model: 'tiny-embed', input: ['hello world', 'another text'] });
    assert.equal(r.embeddings.length, 2);
    assert.equal(r.embeddings[0].length, 128);
    assert.ok(Math.abs(norm(r.embeddings[0]) - 1) < 1e-5);
    assert.ok(r.prompt_eval_count > 0);
    assert.ok(r.total_duration > 0);
    assert.equal(r.model, 'tiny-embed');
    const single = await ollama.embed({ model: 'tiny-embed', input: 'hello world' });
    assert.equal(single.embeddings.length, 1);

    // Over the context: cut to it by default (Ollama's truncate), a 400 with truncate false.
    const long = words(400, 3);
    const cut = await ollama.embed({ model: 'tiny-embed', input: long });
    assert.equal(cut.prompt_eval_count, CONTEXT);
    // A text of megabytes is cut before it is tokenized, to the same first tokens.
    const huge = await ollama.embed({ model: 'tiny-embed', input: long + ' filler'.repeat(300_000) });
    assert.equal(huge.prompt_eval_count, CONTEXT);
    assert.ok(maxDifference(huge.embeddings[0], cut.embeddings[0]) < 1e-6);
    await assert.rejects(ollama.embed({ model: 'tiny-embed', input: long, truncate: false }),
                         (e) => e.status_code === 400 && /tokens/.test(e.message));

    const legacy = await ollama.embeddings({ model: 'tiny-embed', prompt: 'hello world' });
    assert.equal(legacy.embedding.length, 128);
    // Not normalised (Ollama's legacy endpoint), but the same direction.
    const n = norm(legacy.embedding);
    assert.ok(maxDifference(legacy.embedding.map((x) => x / n), r.embeddings[0]) < TOLERANCE);

    const tags = await ollama.list();
    assert.deepEqual(tags.models.map((m) => m.name), ['tiny-embed:latest']);
    const show = await ollama.show({ model: 'tiny-embed' });
    assert.deepEqual(show.capabilities, ['embedding']);
    const models = await openai().models.list();
    assert.deepEqual(models.data.map((m) => m.id), ['tiny-embed']);
});

test('bad inputs get a 400 in each API\'s shape, and the server keeps serving', async () => {
    const before = await metrics(server.url);
    const openaiShape = async (body, pattern) => {
        const r = await curl(`${server.url}/v1/embeddings`, { method: 'POST', body });
        assert.equal(r.status, 400, JSON.stringify(body));
        assert.equal(typeof r.body.error.message, 'string');
        assert.equal(r.body.error.code, 400);
        assert.match(r.body.error.message, pattern);
    };
    await openaiShape({}, /'input' is required/);
    await openaiShape({ input: 5 }, /'input'/);
    await openaiShape({ input: [] }, /empty/);
    await openaiShape({ input: [[1, -2]] }, /token id/);
    await openaiShape({ input: [[1, 99999999]] }, /outside the vocab/);
    await openaiShape({ input: 'x', encoding_format: 'int8' }, /encoding_format/);
    await openaiShape({ input: 'x', dimensions: 4096 }, /dimensions/);
    await openaiShape({ input: words(400, 5) }, /more than the 256/);
    await openaiShape({ input: Array(2049).fill('a') }, /at most 2048/);
    // Text that cannot fit is refused before it is tokenized (2 MB here: no token is longer than its longest piece).
    await openaiShape({ input: 'word '.repeat(400_000) }, /bytes of text makes more than the 256 tokens/);
    await openaiShape({ input: Array(2000).fill(words(250, 9)) }, /more than 300000 tokens together/);
    const notJson = await curl(`${server.url}/v1/embeddings`, { method: 'POST', body: '{"input": ' });
    assert.equal(notJson.status, 400);
    assert.equal(typeof notJson.body.error.message, 'string');

    const ollamaShape = async (path, body) => {
        const r = await curl(`${server.url}${path}`, { method: 'POST', body });
        assert.equal(r.status, 400, JSON.stringify(body));
        assert.equal(typeof r.body.error, 'string');
    };
    await ollamaShape('/api/embed', { model: 'm', input: [1, 2] });
    await ollamaShape('/api/embed', { model: 'm', input: 'x', truncate: 'no' });
    await ollamaShape('/api/embeddings', { model: 'm', prompt: 5 });
    const native = await curl(`${server.url}/embedding`, { method: 'POST', body: { content: 'x', embd_normalize: 'a' } });
    assert.equal(native.status, 400);
    assert.equal(native.body.error.code, 400);

    // Still serving, and none of the refused requests reached the embedder.
    const ok = await curl(`${server.url}/v1/embeddings`, { method: 'POST', body: { input: ['still', 'here'] } });
    assert.equal(ok.status, 200);
    assert.equal(ok.body.data.length, 2);
    const after = await metrics(server.url);
    assert.equal(after.keepwarm_embedding_requests_total - before.keepwarm_embedding_requests_total, 1);
    assert.equal(after.keepwarm_embedding_inputs_total - before.keepwarm_embedding_inputs_total, 2);
});

test('a chat request to an embedding server, and an embedding request to a chat server, get a 400 in shape', async () => {
    const chat = await curl(`${server.url}/v1/chat/completions`, {
        method: 'POST', body: { model: 'tiny-embed', messages: [{ role: 'user', content: 'hi' }] } });
    assert.equal(chat.status, 400);
    assert.match(chat.body.error.message, /embedding model/);
    const messages = await curl(`${server.url}/v1/messages`, {
        method: 'POST', body: { model: 'x', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] } });
    assert.equal(messages.status, 400);
    assert.equal(messages.body.type, 'error'); // Anthropic's shape
    assert.match(messages.body.error.message, /embedding model/);
    const ollamaChat = await curl(`${server.url}/api/chat`, {
        method: 'POST', body: { model: 'x', messages: [{ role: 'user', content: 'hi' }], stream: false } });
    assert.equal(ollamaChat.status, 400);
    assert.match(ollamaChat.body.error, /embedding model/);
    // Every other chat or completion route, in its own shape, and the server goes on.
    const others = [
        ['/v1/completions', { model: 'x', prompt: 'hi', max_tokens: 4 }],
        ['/v1/responses', { model: 'x', input: 'hi' }],
        ['/v1/messages/count_tokens', { model: 'x', messages: [{ role: 'user', content: 'hi' }] }],
        ['/completion', { prompt: 'hi' }],
        ['/completions', { prompt: 'hi' }],
        ['/infill', { input_prefix: 'a', input_suffix: 'b' }],
        ['/api/generate', { model: 'x', prompt: 'hi', stream: false }],
        ['/api/generate', { model: 'x', prompt: 'hi', raw: true, stream: false }],
        ['/v1/chat/completions', { model: 'x', messages: [{ role: 'user', content: 'hi' }], stream: true }],
    ];
    for (const [path, body] of others) {
        const r = await curl(`${server.url}${path}`, { method: 'POST', body });
        assert.equal(r.status, 400, `${path}: ${JSON.stringify(r.body)}`);
        assert.match(JSON.stringify(r.body), /embedding model/, path);
    }
    assert.equal((await curl(`${server.url}/health`)).status, 200);

    const chatServer = await startServer([], { preset: 'tiny' });
    try {
        const e = await curl(`${chatServer.url}/v1/embeddings`, { method: 'POST', body: { input: 'hi' } });
        assert.equal(e.status, 400);
        assert.match(e.body.error.message, /chat model/);
        const o = await curl(`${chatServer.url}/api/embed`, { method: 'POST', body: { model: 'x', input: 'hi' } });
        assert.equal(o.status, 400);
        assert.match(o.body.error, /chat model/);
        const rerank = await curl(`${chatServer.url}/v1/rerank`, { method: 'POST', body: { query: 'q', documents: ['a'] } });
        assert.equal(rerank.status, 400);
        assert.match(rerank.body.error.message, /chat model/);
        await assert.rejects(chatServer.client().embeddings.create({ model: 'tiny', input: 'hi' }),
                             (err) => err.status === 400);
    } finally {
        await chatServer.stop();
    }
});

test('--pooling (or llama-server\'s LLAMA_ARG_POOLING) serves a model that declares none as an embedding model', async () => {
    const pooled = await startServer(['-c', '128'], { preset: 'tiny', env: { LLAMA_ARG_POOLING: 'mean' } });
    try {
        assert.match(pooled.output(), /as an embedding model\n.*mean pooling/);
        const r = await curl(`${pooled.url}/v1/embeddings`, { method: 'POST', body: { input: ['hello', 'world'] } });
        assert.equal(r.status, 200);
        assert.equal(r.body.data.length, 2);
        assert.equal(r.body.data[0].embedding.length, 512); // tiny's width
    } finally {
        await pooled.stop();
    }
    // --embeddings alone on a model that declares no pooling: start-up stops, saying what to give.
    await assert.rejects(startServer(['--embeddings'], { preset: 'tiny' }), /declares no pooling type.*--pooling/s);
});

test('a reranker (tiny-rerank, Qwen3-Reranker\'s shape): /rerank scores equal llama-server --reranking\'s', async () => {
    const llamaServer = findLlamaServer();
    assert.ok(llamaServer, 'no llama-server: run bench/build-llama-server.sh (scripts/test.sh does) or set LLAMA_SERVER');
    const reranker = await startServer(['-c', '512'], { preset: 'tiny-rerank' });
    const port = await freePort();
    const ls = spawn(llamaServer, ['-m', await testModel('tiny-rerank'), '--reranking', '--port', String(port), '-t',
                                   '1', '-c', '4096'], { stdio: 'ignore' });
    const url = `http://127.0.0.1:${port}`;
    try {
        assert.match(reranker.output(), /as a reranker/);
        assert.ok(await waitFor(async () => (await curl(`${url}/health`)).status === 200, { timeoutMs: 60_000 }));
        const body = { model: 'r', query: 'what is a panda?',
                       documents: ['hi', 'The giant panda is a bear species endemic to China.', 'pandas eat bamboo',
                                   words(80, 4)] };
        for (const path of ['/rerank', '/v1/rerank', '/reranking', '/v1/reranking']) {
            const ours = await curl(`${reranker.url}${path}`, { method: 'POST', body });
            assert.equal(ours.status, 200, JSON.stringify(ours.body));
            assert.equal(ours.body.object, 'list');
            assert.equal(ours.body.model, 'r');
            assert.equal(ours.body.results.length, 4);
            const scores = ours.body.results.map((r) => r.relevance_score);
            assert.deepEqual(scores, [...scores].sort((a, b) => b - a)); // the best first
            if (path !== '/rerank') continue;
            const theirs = await curl(`${url}${path}`, { method: 'POST', body });
            assert.equal(theirs.status, 200);
            assert.deepEqual(ours.body.usage, theirs.body.usage); // the same prompts: the rerank template filled in
            const byIndex = (r) => Object.fromEntries(r.body.results.map((x) => [x.index, x.relevance_score]));
            const a = byIndex(ours), b = byIndex(theirs);
            for (let i = 0; i < body.documents.length; i++) {
                assert.ok(Math.abs(a[i] - b[i]) <= TOLERANCE, `document ${i}: ${a[i]} and ${b[i]}`);
            }
        }
        // TEI's shape: texts in, an array out, with the text when asked.
        const tei = await curl(`${reranker.url}/rerank`, { method: 'POST',
            body: { query: 'q', texts: ['one', 'two'], return_text: true, top_n: 1 } });
        assert.equal(tei.status, 200);
        assert.equal(tei.body.length, 1);
        assert.ok(['one', 'two'].includes(tei.body[0].text));
        assert.equal(typeof tei.body[0].score, 'number');

        for (const bad of [{ documents: ['a'] }, { query: 'q', documents: [] }, { query: 'q', documents: [1] },
                           { query: 'q', documents: ['a'], top_n: -1 }, { query: 'q', documents: [words(600, 1)] }]) {
            const r = await curl(`${reranker.url}/rerank`, { method: 'POST', body: bad });
            assert.equal(r.status, 400, JSON.stringify(bad));
            assert.equal(r.body.error.code, 400);
        }
        const embed = await curl(`${reranker.url}/v1/embeddings`, { method: 'POST', body: { input: 'x' } });
        assert.equal(embed.status, 400);
        assert.match(embed.body.error.message, /is a reranker/);
        // An embedding model is no reranker.
        const notRanking = await curl(`${server.url}/rerank`, { method: 'POST', body: { query: 'q', documents: ['a'] } });
        assert.equal(notRanking.status, 400);
        assert.match(notRanking.body.error.message, /not a reranker/);
    } finally {
        ls.kill('SIGTERM');
        await reranker.stop();
    }
});
