// Several models on one port (`keepwarm serve --models-dir DIR`): a router in front of one child server per loaded
// model. Two chat models and an embedding model with --models-max 1: each API's requests reach the model they name,
// a request for another model swaps the first out and its conversation comes back from its disk tier as if it had
// stayed, keep_alive 0 unloads, a name no model has goes to the default model (a 404 under a strict policy), and a
// client that goes away mid-stream cancels only itself.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { Ollama } from 'ollama';
import { startProcess, startServer, testModel, tempDir, curl, metrics, waitFor, words } from './harness.mjs';

const args = ['--parallel', '1', '--cache-parked', '0']; // startServer adds -t 1
let router;
let dir;
const others = [];

before(async () => {
    dir = tempDir('models');
    const modelsDir = path.join(dir, 'models');
    mkdirSync(path.join(modelsDir, 'beta'), { recursive: true });
    copyFileSync(await testModel('tiny'), path.join(modelsDir, 'alpha.gguf'));
    copyFileSync(await testModel('tiny'), path.join(modelsDir, 'beta', 'beta.gguf')); // a folder holding one model
    copyFileSync(await testModel('tiny-embed'), path.join(modelsDir, 'embed.gguf'));
    writeFileSync(path.join(modelsDir, 'README.md'), 'not a model');
    router = await startProcess(['serve', '--models-dir', modelsDir, '--models-max', '1', '--port', '0',
        '--cache-dir', path.join(dir, 'cache'), '-t', '1', ...args]);
});
after(async () => {
    for (const s of others) await s.stop();
    await router?.stop();
});

const statuses = async () => {
    const { body } = await curl(`${router.url}/v1/models`);
    return Object.fromEntries(body.data.map((m) => [m.id, m.status.value]));
};

function chat(model, system, user) {
    return { model, temperature: 0, max_tokens: 4, messages: [{ role: 'system', content: system }, { role: 'user', content: user }] };
}
function nextTurn(body, answer, question) {
    return { ...body, messages: [...body.messages, { role: 'assistant', content: answer }, { role: 'user', content: question }] };
}
async function complete(url, body) {
    const res = await curl(`${url}/v1/chat/completions`, { method: 'POST', body });
    assert.equal(res.status, 200, JSON.stringify(res.body));
    return res.body;
}

test('the listing names every model of the folder with its status; none is loaded before a request', async () => {
    assert.deepEqual(await statuses(), { alpha: 'unloaded', beta: 'unloaded', embed: 'unloaded' });
    const tags = (await curl(`${router.url}/api/tags`)).body;
    assert.deepEqual(tags.models.map((m) => m.name), ['alpha', 'beta', 'embed']);
    assert.deepEqual((await curl(`${router.url}/api/ps`)).body.models, []);
    assert.match(router.output(), /alpha: .*alpha\.gguf/);
    assert.match(router.output(), /beta: .*beta\/beta\.gguf/);
});

test('OpenAI, Anthropic and Ollama requests reach the model they name', async () => {
    const openai = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: 'none', maxRetries: 0 });
    const r = await openai.chat.completions.create({ model: 'alpha', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.model, 'alpha');
    assert.equal((await statuses()).alpha, 'loaded');

    const anthropic = new Anthropic({ baseURL: router.url, apiKey: 'none', maxRetries: 0 });
    const m = await anthropic.messages.create({ model: 'alpha', max_tokens: 3, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(m.type, 'message');
    const count = await anthropic.messages.countTokens({ model: 'alpha', messages: [{ role: 'user', content: 'hi' }] });
    assert.ok(count.input_tokens > 0);

    const ollama = new Ollama({ host: router.url });
    const o = await ollama.chat({ model: 'alpha', messages: [{ role: 'user', content: 'hi' }], stream: false, options: { num_predict: 3 } });
    assert.equal(o.done, true);
    let pieces = 0;
    for await (const part of await ollama.generate({ model: 'alpha', prompt: 'once', stream: true, options: { num_predict: 3 } })) {
        pieces += part.done ? 0 : 1;
    }
    assert.ok(pieces > 0, 'NDJSON streamed through');
    assert.equal((await curl(`${router.url}/tokenize`, { method: 'POST', body: { model: 'alpha', content: 'hello' } })).status, 200);
});

test('a request for another model swaps the first out, and its conversation comes back from disk whole', async () => {
    // What the second turn reuses on a server that never unloaded the model.
    const baseline = await startServer(args);
    others.push(baseline);
    const first = chat('alpha', words(400, 13), 'a question before the swap');
    const b1 = await complete(baseline.url, first);
    const b2 = await complete(baseline.url, nextTurn(first, b1.choices[0].message.content, 'and after it'));
    const expected = b2.usage.prompt_tokens_details.cached_tokens;
    assert.ok(expected > 300, `${expected}`);

    const a1 = await complete(router.url, first);
    assert.deepEqual(a1.choices[0].message, b1.choices[0].message);
    const other = await complete(router.url, chat('beta', words(50, 3), 'another model'));
    assert.equal(other.model, 'beta');
    assert.deepEqual(await statuses(), { alpha: 'unloaded', beta: 'loaded', embed: 'unloaded' });
    const a2 = await complete(router.url, nextTurn(first, a1.choices[0].message.content, 'and after it'));
    assert.equal(a2.usage.prompt_tokens_details.cached_tokens, expected, JSON.stringify(a2.timings));
    assert.equal(a2.timings.cache_disk_n, expected, 'all of it from the disk tier its server wrote when it unloaded');
    assert.deepEqual(await statuses(), { alpha: 'loaded', beta: 'unloaded', embed: 'unloaded' });
});

test('the official clients make embeddings through the router', async () => {
    const openai = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: 'none', maxRetries: 0 });
    const e = await openai.embeddings.create({ model: 'embed', input: ['hello', 'world'] });
    assert.equal(e.data.length, 2);
    assert.ok(e.data[0].embedding.length > 0);
    const ollama = new Ollama({ host: router.url });
    const o = await ollama.embed({ model: 'embed', input: 'hello' });
    assert.equal(o.embeddings.length, 1);
    assert.equal(o.embeddings[0].length, e.data[0].embedding.length);
    assert.equal((await statuses()).embed, 'loaded');
});

test('keep_alive 0 unloads the model once its request is done; /api/ps lists what is loaded', async () => {
    const ollama = new Ollama({ host: router.url });
    await ollama.chat({ model: 'beta', messages: [{ role: 'user', content: 'hi' }], stream: false, options: { num_predict: 2 } });
    const ps = (await curl(`${router.url}/api/ps`)).body;
    assert.deepEqual(ps.models.map((m) => m.name), ['beta']);
    assert.ok(ps.models[0].expires_at && ps.models[0].size > 0, JSON.stringify(ps));
    await ollama.chat({ model: 'beta', messages: [{ role: 'user', content: 'bye' }], stream: false, keep_alive: 0, options: { num_predict: 2 } });
    assert.ok(await waitFor(async () => (await curl(`${router.url}/api/ps`)).body.models.length === 0), 'unloaded');
    assert.ok(await waitFor(async () => (await statuses()).beta === 'unloaded'), JSON.stringify(await statuses()));
    // A duration: unloaded once it has been idle that long.
    await ollama.chat({ model: 'beta', messages: [{ role: 'user', content: 'hi' }], stream: false, keep_alive: '1s', options: { num_predict: 2 } });
    const expires = Date.parse((await curl(`${router.url}/api/ps`)).body.models[0].expires_at);
    assert.ok(expires < Date.now() + 60_000, `expires_at ${expires}`);
    assert.ok(await waitFor(async () => (await statuses()).beta === 'unloaded'), 'unloaded after its keep_alive');
    // `ollama stop`: an empty generate with keep_alive 0 unloads a loaded model, and loads none that is not.
    await ollama.chat({ model: 'beta', messages: [{ role: 'user', content: 'hi' }], stream: false, options: { num_predict: 2 } });
    const stop = await curl(`${router.url}/api/generate`, { method: 'POST', body: { model: 'beta', keep_alive: 0 } });
    assert.equal(stop.body.done_reason, 'unload', JSON.stringify(stop.body));
    assert.equal((await statuses()).beta, 'unloaded');
    const again = await curl(`${router.url}/api/generate`, { method: 'POST', body: { model: 'embed', keep_alive: 0 } });
    assert.equal(again.body.done_reason, 'unload');
    assert.equal((await statuses()).embed, 'unloaded');
});

test('a name no model has goes to the default model, as one model\'s server serves any name; a strict policy 404s it', async () => {
    // An agent's background calls name a model of its own vendor ("claude-haiku-..."): the first model serves them.
    const res = await curl(`${router.url}/v1/chat/completions`, { method: 'POST', body: chat('claude-haiku-4-5', 'x', 'y') });
    assert.equal(res.status, 200, JSON.stringify(res.body));
    assert.deepEqual((await curl(`${router.url}/api/ps`)).body.models.map((m) => m.name), ['alpha']);
    // A request that names a model to act on is not sent elsewhere.
    const load = await curl(`${router.url}/models/load`, { method: 'POST', body: { model: 'nope' } });
    assert.equal(load.status, 404);
    assert.match(load.body.error.message, /'nope' does not exist.*alpha, beta, embed/);
    assert.equal((await curl(`${router.url}/models/unload`, { method: 'POST', body: { model: 'alpha' } })).status, 200);

    const d = tempDir('models-strict');
    const policy = path.join(d, 'strict.toml');
    writeFileSync(policy, '[model]\nmode = "strict"\n');
    const strict = await startProcess(['serve', '--models-dir', path.join(dir, 'models'), '--policy', policy,
        '--port', '0', '--cache-dir', path.join(d, 'cache'), ...args]);
    others.push(strict);
    const openai = await curl(`${strict.url}/v1/chat/completions`, { method: 'POST', body: chat('nope', 'x', 'y') });
    assert.equal(openai.status, 404);
    assert.match(openai.body.error.message, /'nope' does not exist.*alpha, beta, embed/);
    const ollama = await curl(`${strict.url}/api/chat`, { method: 'POST', body: chat('nope', 'x', 'y') });
    assert.equal(ollama.status, 404);
    assert.equal(typeof ollama.body.error, 'string');
    assert.deepEqual((await curl(`${strict.url}/api/ps`)).body.models, [], 'nothing loaded for it');
    // No model named: the one loaded now, else a 400 naming the models.
    assert.equal((await curl(`${router.url}/models/load`, { method: 'POST', body: { model: 'alpha' } })).status, 200);
    assert.equal((await curl(`${router.url}/props`)).body.model_alias, 'alpha');
    assert.equal((await curl(`${router.url}/models/unload`, { method: 'POST', body: { model: 'alpha' } })).status, 200);
    const none = await curl(`${router.url}/v1/chat/completions`, { method: 'POST', body: { messages: [] } });
    assert.equal(none.status, 400);
    assert.match(none.body.error.message, /say which model.*alpha, beta, embed/);
    const notJson = await curl(`${router.url}/v1/chat/completions`, { method: 'POST', body: '{"model": "alpha",' });
    assert.equal(notJson.status, 400);
    assert.match(notJson.body.error.message, /not valid JSON/);
});

test('POST /models/load and /models/unload; /metrics counts loads and unloads', async () => {
    assert.equal((await curl(`${router.url}/models/load`, { method: 'POST', body: { model: 'beta' } })).status, 200);
    assert.equal((await statuses()).beta, 'loaded');
    assert.equal((await curl(`${router.url}/models/unload`, { method: 'POST', body: { model: 'beta' } })).status, 200);
    assert.equal((await statuses()).beta, 'unloaded');
    const { body } = await curl(`${router.url}/metrics`, { raw: true });
    const loads = Number(body.match(/^keepwarm_router_loads_total (\d+)/m)[1]);
    const unloads = Number(body.match(/^keepwarm_router_unloads_total (\d+)/m)[1]);
    assert.ok(loads >= 5 && unloads >= 4, body);
});

test('a client that goes away mid-stream cancels its generation; the router keeps serving', async () => {
    const openai = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: 'none', maxRetries: 0 });
    const controller = new AbortController();
    const stream = await openai.chat.completions.create(
        { model: 'alpha', messages: [{ role: 'user', content: 'Write a very long story.' }], max_tokens: 100000,
          ignore_eos: true, stream: true },
        { signal: controller.signal });
    let chunks = 0;
    try {
        for await (const _ of stream) {
            if (++chunks === 3) {
                controller.abort();
                break;
            }
        }
    } catch {
        // The abort may surface as an error; the connection is closed either way.
    }
    assert.equal(chunks, 3);
    const cancelled = await waitFor(async () => {
        const { body } = await curl(`${router.url}/metrics?model=alpha`, { raw: true });
        return /^keepwarm_requests_cancelled_total 1$/m.test(body);
    });
    assert.ok(cancelled, 'the model server cancelled the generation');
    const r = await openai.chat.completions.create({ model: 'alpha', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
    assert.equal(r.object, 'chat.completion');
});

test('both models\' clients at once, one model loaded at a time: every request is answered', async () => {
    // Two clients per chat model, three turns each, all at once: the router swaps the models back and forth under
    // them, and each request waits for its model instead of failing.
    const before = await metrics(router.url);
    const client = async (model, n) => {
        for (let turn = 0; turn < 3; turn++) {
            const body = { ...chat(model, `client ${n} of ${model}`, `turn ${turn}: ${words(40)}`), max_tokens: 8, stream: turn % 2 === 1 };
            const res = await fetch(`${router.url}/v1/chat/completions`, {
                method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
            });
            const text = await res.text();
            assert.equal(res.status, 200, `${model} client ${n} turn ${turn}: ${text.slice(0, 300)}`);
            if (body.stream) assert.match(text, /data: \[DONE\]/);
        }
    };
    await Promise.all([client('alpha', 1), client('beta', 1), client('alpha', 2), client('beta', 2)]);
    const after = await metrics(router.url);
    for (const name of ['keepwarm_router_wait_timeouts_total', 'keepwarm_router_queue_refused_total']) {
        assert.equal(after[name], before[name], name);
    }
    assert.ok(after.keepwarm_router_loads_total >= before.keepwarm_router_loads_total + 2, 'the models swapped');
});

test('SIGTERM stops every model server, each writing its cache', async () => {
    await complete(router.url, chat('alpha', 'last', 'before the stop'));  // whichever model the test before left
    assert.equal(await router.stop(), 0);
    assert.match(router.output(), /stopping model alpha's server/);
});

test('a settings file\'s [models.NAME] tables: path, aliases, load = true and the model\'s own serve options', async () => {
    const d = tempDir('models-config');
    const settings = path.join(d, 'keepwarm.toml');
    copyFileSync(await testModel('tiny'), path.join(d, 'coder.gguf'));
    writeFileSync(settings, [
        'parallel = 1',
        '[models.coder]',
        'path = "coder.gguf"', // relative to the file's folder
        'aliases = ["big", "qwen-coder", "claude-haiku-*"]',
        'ctx-size = 2048',
        'load = true',
        '[models.small]',
        `path = "${await testModel('tiny')}"`,
        'ctx-size = 1024',
    ].join('\n'));
    // Named relative to the working folder, as an operator types it.
    const server = await startProcess(['serve', '--config', 'keepwarm.toml', '--port', '0', '-t', '1', '--cache-dir',
        path.join(d, 'cache')], { cwd: d });
    others.push(server);
    assert.ok(await waitFor(async () => {
        const { body } = await curl(`${server.url}/v1/models`);
        return body.data.find((m) => m.id === 'coder')?.status.value === 'loaded';
    }), 'load = true loads it at start');
    const props = (await curl(`${server.url}/props?model=big`)).body;
    assert.match(JSON.stringify(props), /"n_ctx":2048/);
    const r = await complete(server.url, chat('qwen-coder', 'x', 'y'));
    assert.equal(r.model, 'coder'); // an alias answers under the model's name, as a single-model server's -a does
    const haiku = await curl(`${server.url}/v1/chat/completions`, { method: 'POST', body: chat('claude-haiku-4-5', 'x', 'y') });
    assert.equal(haiku.status, 200, JSON.stringify(haiku.body)); // a pattern alias: coder serves it
    assert.deepEqual((await curl(`${server.url}/api/ps`)).body.models.map((m) => m.name), ['coder']);
    assert.match(JSON.stringify((await curl(`${server.url}/props?model=small`)).body), /"n_ctx":1024/);

    writeFileSync(settings, '[models.coder]\npath = "coder.gguf"\nctx-sise = 2048\n');
    const bad = await startProcess(['serve', '--config', settings, '--port', '0']).catch((e) => e);
    assert.match(String(bad), /keepwarm\.toml:3:\d+: unknown key 'ctx-sise' in \[models\.coder\]/);
});

// A router of one model, `solo`, in a folder of its own, with the model loaded.
async function soloRouter(tag) {
    const d = tempDir(tag);
    mkdirSync(path.join(d, 'models'));
    copyFileSync(await testModel('tiny'), path.join(d, 'models', 'solo.gguf'));
    const server = await startProcess(['serve', '--models-dir', path.join(d, 'models'), '--port', '0', '-t', '1',
        '--cache-dir', path.join(d, 'cache')]);
    others.push(server);
    await complete(server.url, chat('solo', 'x', 'y'));
    return server;
}

test('a model server that dies is marked unloaded and its next request starts it again', async () => {
    const server = await soloRouter('models-crash');
    const { body } = await curl(`${server.url}/v1/models`);
    const pid = body.data[0].status.pid;
    assert.ok(pid > 0, JSON.stringify(body));
    // A request in flight when it dies gets an error, not a hang.
    const pending = curl(`${server.url}/v1/chat/completions`, { method: 'POST',
        body: { model: 'solo', messages: [{ role: 'user', content: 'a long story' }], max_tokens: 100000, ignore_eos: true } });
    assert.ok(await waitFor(async () => {
        const slots = (await curl(`${server.url}/slots?model=solo`)).body;
        return Array.isArray(slots) && slots.some((s) => s.is_processing);
    }), 'the long request is being generated');
    process.kill(pid, 'SIGKILL');
    const cut = await pending;
    assert.equal(cut.status, 502, JSON.stringify(cut.body));
    assert.ok(await waitFor(async () => (await curl(`${server.url}/v1/models`)).body.data[0].status.value === 'unloaded'));
    assert.match(server.output(), /model solo's server was killed by signal 9/);
    const again = await complete(server.url, chat('solo', 'x', 'y'));
    assert.equal(again.object, 'chat.completion');
});

test('no model server outlives its router, even one killed with SIGKILL', async () => {
    const server = await soloRouter('models-orphans');
    const pid = (await curl(`${server.url}/v1/models`)).body.data[0].status.pid;
    // From another connection than the one that loaded it: the model server's life does not follow a connection's.
    await complete(server.url, chat('solo', 'x', 'z'));
    assert.equal(await server.stop('SIGKILL'), 'SIGKILL');
    const alive = () => {
        try {
            process.kill(pid, 0);
            return true;
        } catch {
            return false;
        }
    };
    assert.ok(await waitFor(() => !alive()), `model server ${pid} still runs`);
});

test('--models-memory: a model that does not fit unloads the idle one under --models-max; one over it alone is a 503', async () => {
    const d = tempDir('models-memory');
    mkdirSync(path.join(d, 'models'));
    copyFileSync(await testModel('tiny'), path.join(d, 'models', 'one.gguf'));
    copyFileSync(await testModel('tiny'), path.join(d, 'models', 'two.gguf'));
    copyFileSync(await testModel('tiny-swa'), path.join(d, 'models', 'wide.gguf'));
    // A tiny model's footprint at -c 2048 with an 8 MiB RAM tier is about 113 MiB, the tiny-swa's about 190 MiB.
    const server = await startProcess(['serve', '--models-dir', path.join(d, 'models'), '--models-max', '4',
        '--models-memory', '150MiB', '-c', '2048', '--cache-ram', '8MiB', '--port', '0', '-t', '1',
        '--cache-dir', path.join(d, 'cache'), ...args]);
    others.push(server);
    assert.match(server.output(), /one: .*footprint \d+(\.\d+)? MiB \(weights .* \+ KV .* for 2048 tokens/);
    const listed = Object.fromEntries((await curl(`${server.url}/v1/models`)).body.data.map((m) => [m.id, m]));
    assert.ok(listed.one.footprint_bytes > 0 && listed.one.footprint_bytes <= 150 << 20, JSON.stringify(listed.one));
    assert.ok(listed.wide.footprint_bytes > 150 << 20, JSON.stringify(listed.wide));

    await complete(server.url, chat('one', 'x', 'y'));
    await complete(server.url, chat('two', 'x', 'y')); // both would not fit: one goes, though --models-max is 4
    const states = Object.fromEntries((await curl(`${server.url}/v1/models`)).body.data.map((m) => [m.id, m.status.value]));
    assert.deepEqual(states, { one: 'unloaded', two: 'loaded', wide: 'unloaded' });
    const ps = (await curl(`${server.url}/api/ps`)).body.models;
    assert.deepEqual(ps.map((m) => [m.name, m.size]), [['two', listed.two.footprint_bytes]]);
    assert.equal((await metrics(server.url)).keepwarm_router_memory_bytes, listed.two.footprint_bytes);

    const refused = await curl(`${server.url}/v1/chat/completions`, { method: 'POST', body: chat('wide', 'x', 'y') });
    assert.equal(refused.status, 503);
    assert.match(refused.body.error.message, /model 'wide' needs .* but --models-memory is 150\.0 MiB/);
    assert.equal((await curl(`${server.url}/v1/models`)).body.data.find((m) => m.id === 'two').status.value, 'loaded');
});
