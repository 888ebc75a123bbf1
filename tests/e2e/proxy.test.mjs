// `keepwarm proxy` in front of real `keepwarm serve` upstreams on loopback (no mocks): routing by prefix, each API
// through the proxy with the official clients, dialect translation with streaming, failover when an upstream is
// killed mid-answer, an upstream rejoining after a restart, three upstreams with llama-server among them, and
// cache-buster reports from the proxy.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { Ollama } from 'ollama';
import { binary, testModel, curl, metrics, waitFor, startProcess, tempDir, freePort, findLlamaServer } from './harness.mjs';


// An upstream on a port of its own, so that a restart comes back at the same URL.
async function startUpstream(port) {
    const model = await testModel('tiny');
    const cacheDir = tempDir('proxy-e2e');
    return startProcess(['serve', '-m', model, '--port', String(port), '-t', '1', '-c', '8192', '-np', '2',
        '--cache-dir', cacheDir]);
}

function startProxy(upstreams, extra = []) {
    return startProcess(['proxy', '--port', '0', ...upstreams.flatMap((u) => ['--upstream', u]),
        '--route-block', '64', '--health-interval', '0.2', ...extra]);
}

const cache = async (proxy) => (await curl(`${proxy.url}/v1/cache`)).body;

let ports, upstreams, proxy;
before(async () => {
    ports = [await freePort(), await freePort()];
    upstreams = [await startUpstream(ports[0]), await startUpstream(ports[1])];
    proxy = await startProxy(upstreams.map((u) => u.url));
});
after(async () => {
    await proxy?.stop();
    for (const u of upstreams ?? []) await u.stop();
});

const openai = (p) => new OpenAI({ baseURL: `${p.url}/v1`, apiKey: 'none', maxRetries: 0 });

// A conversation whose system prompt is its own from the first character, long enough for several routing blocks.
function conversation(name) {
    return [{ role: 'system', content: `${name}: you are a terse assistant. `.repeat(6) }];
}

async function turn(client, messages, extra = {}) {
    const { data, response } = await client.chat.completions
        .create({ model: 'anything', messages, max_tokens: 3, ...extra })
        .withResponse();
    messages.push({ role: 'assistant', content: data.choices[0].message.content ?? '' });
    return { data, upstream: response.headers.get('x-keepwarm-upstream') };
}

test('a conversation stays on one upstream across turns, and reuses its prefix there', async () => {
    const client = openai(proxy);
    const messages = conversation('alpha');
    const seen = new Set();
    let lastCached = 0;
    for (let i = 0; i < 3; i++) {
        messages.push({ role: 'user', content: `question ${i} about the alpha project` });
        const { data, upstream } = await turn(client, messages);
        seen.add(upstream);
        assert.equal(data.object, 'chat.completion');
        assert.ok(data.usage.prompt_tokens > 0);
        lastCached = data.usage.prompt_tokens_details.cached_tokens;
    }
    assert.equal(seen.size, 1, `served by ${[...seen]}`);
    assert.ok(upstreams.some((u) => seen.has(u.url)));
    assert.ok(lastCached > 0, 'the upstream reported reuse through the proxy');
    const state = await cache(proxy);
    const home = state.upstreams.find((u) => seen.has(u.url));
    assert.equal(home.requests, 3);
    assert.equal(home.prefix_hits, 2);
    assert.equal(home.in_flight, 0);
    assert.equal(home.healthy, true);
    // One kept-alive connection carried the three turns.
    assert.deepEqual(home.connections, { opened: 1, reused: 2, idle: 1 });
    // What the proxy added to each turn's time to first token, by its own clock.
    assert.equal(state.overhead_ms.requests, 3);
    for (const part of ['forward', 'first_delta', 'total']) {
        assert.ok(state.overhead_ms[part].p50 >= 0 && state.overhead_ms[part].p50 <= state.overhead_ms[part].max);
    }
    // The same on /metrics, per upstream, with the proxy's share of each turn's TTFT as a histogram.
    const m = await metrics(proxy.url);
    const at = (name) => m[`${name}{upstream="${home.url}"}`];
    assert.equal(at('keepwarm_proxy_requests_total'), 3);
    assert.equal(at('keepwarm_proxy_prefix_hits_total'), 2);
    assert.equal(at('keepwarm_proxy_upstream_up'), 1);
    assert.equal(at('keepwarm_proxy_in_flight'), 0);
    assert.equal(at('keepwarm_proxy_connections_opened_total'), 1);
    assert.equal(at('keepwarm_proxy_connections_reused_total'), 2);
    assert.equal(m.keepwarm_chat_completion_requests_total, 3);
    for (const phase of ['forward', 'first_delta', 'total']) {
        assert.equal(m[`keepwarm_proxy_added_latency_seconds_count{phase="${phase}"}`], 3, phase);
        assert.equal(m[`keepwarm_proxy_added_latency_seconds_bucket{phase="${phase}",le="+Inf"}`], 3, phase);
        assert.ok(m[`keepwarm_proxy_added_latency_seconds_sum{phase="${phase}"}`] > 0, phase);
    }
    // Cumulative buckets never decrease.
    const buckets = Object.entries(m).filter(([k]) => k.startsWith('keepwarm_proxy_added_latency_seconds_bucket{phase="total"'));
    for (let i = 1; i < buckets.length; i++) assert.ok(buckets[i][1] >= buckets[i - 1][1], JSON.stringify(buckets));
});

test('different conversations spread over the upstreams', async () => {
    const client = openai(proxy);
    const used = new Set();
    for (const name of ['beta', 'gamma']) {
        const messages = conversation(name);
        messages.push({ role: 'user', content: 'hello' });
        used.add((await turn(client, messages)).upstream);
    }
    // Nothing of alpha's prefix matches them, so they go to the least loaded upstream, not to alpha's.
    const state = await cache(proxy);
    assert.ok(state.upstreams.every((u) => u.requests > 0), JSON.stringify(state));
    assert.equal(used.size, 1);
    assert.equal(state.upstreams.find((u) => used.has(u.url)).prefix_hits, 0);
});

test('the OpenAI client through the proxy, whole and streamed', async () => {
    const client = openai(proxy);
    const messages = [{ role: 'user', content: 'openai client test' }];
    const whole = await client.chat.completions.create({ model: 'x', messages, max_tokens: 4 });
    assert.equal(whole.choices[0].message.role, 'assistant');
    assert.equal(whole.usage.completion_tokens, 4);
    assert.equal(whole.choices[0].finish_reason, 'length');

    const stream = await client.chat.completions.create({
        model: 'x', messages, max_tokens: 4, stream: true, stream_options: { include_usage: true },
    });
    let text = '', usage, finish;
    for await (const chunk of stream) {
        if (chunk.usage) usage = chunk.usage;
        for (const c of chunk.choices) {
            text += c.delta?.content ?? '';
            finish = c.finish_reason ?? finish;
        }
    }
    assert.equal(finish, 'length');
    assert.equal(usage.completion_tokens, 4);
    assert.ok(usage.prompt_tokens_details.cached_tokens > 0, 'the same prompt again reuses it');
    assert.equal(typeof text, 'string');
});

test('the Anthropic client through the proxy, whole and streamed', async () => {
    const client = new Anthropic({ baseURL: proxy.url, apiKey: 'none', maxRetries: 0 });
    const params = { model: 'claude-x', max_tokens: 4, messages: [{ role: 'user', content: 'anthropic client test' }] };
    const whole = await client.messages.create(params);
    assert.equal(whole.type, 'message');
    assert.equal(whole.model, 'claude-x');
    assert.equal(whole.stop_reason, 'max_tokens');
    assert.equal(whole.usage.output_tokens, 4);

    const stream = client.messages.stream(params);
    const events = [];
    stream.on('streamEvent', (e) => events.push(e.type));
    const final = await stream.finalMessage();
    assert.equal(events[0], 'message_start');
    assert.equal(events.at(-1), 'message_stop');
    assert.equal(final.stop_reason, 'max_tokens');
    assert.ok(final.usage.cache_read_input_tokens > 0, 'the same prompt again reuses it');
});

test('the Ollama client through the proxy, whole and streamed', async () => {
    const client = new Ollama({ host: proxy.url });
    const messages = [{ role: 'user', content: 'ollama client test' }];
    const whole = await client.chat({ model: 'tiny', messages, options: { num_predict: 4 } });
    assert.equal(whole.done, true);
    assert.equal(whole.done_reason, 'length');
    assert.equal(whole.eval_count, 4);
    let last;
    for await (const part of await client.chat({ model: 'tiny', messages, stream: true, options: { num_predict: 4 } })) {
        last = part;
    }
    assert.equal(last.done, true);
    assert.ok(last.prompt_eval_count > 0);
    const tags = await client.list();
    assert.equal(tags.models[0].name, 'keepwarm-proxy:latest');
});

test('bad input and what needs the local model answer in each API\'s error shape', async () => {
    const bad = await curl(`${proxy.url}/v1/chat/completions`, { method: 'POST', body: { messages: 'no' } });
    assert.equal(bad.status, 400);
    assert.equal(typeof bad.body.error.message, 'string');
    const noPrompt = await curl(`${proxy.url}/v1/completions`, { method: 'POST', body: { model: 'x' } });
    assert.equal(noPrompt.status, 400);
    assert.match(noPrompt.body.error.message, /'prompt' is required/);
    // count_tokens goes to an upstream, which counts with its own template and tokenizer.
    const countBody = { model: 'x', system: 'Be brief.', messages: [{ role: 'user', content: 'hi there' }] };
    const count = await curl(`${proxy.url}/v1/messages/count_tokens`, { method: 'POST', body: countBody });
    assert.equal(count.status, 200, JSON.stringify(count.body));
    const direct = await curl(`${upstreams[0].url}/v1/messages/count_tokens`, { method: 'POST', body: countBody });
    assert.equal(count.body.input_tokens, direct.body.input_tokens);
    assert.ok(count.body.input_tokens > 5);
    const badCount = await curl(`${proxy.url}/v1/messages/count_tokens`, { method: 'POST', body: { model: 'x' } });
    assert.equal(badCount.status, 400);
    assert.equal(badCount.body.type, 'error');
    const show = await curl(`${proxy.url}/api/show`, { method: 'POST', body: { model: 'tiny' } });
    assert.equal(show.status, 501);
    assert.match(show.body.error, /proxy/);
    const health = await curl(`${proxy.url}/health`);
    assert.equal(health.body.upstreams_healthy, 2);
});

test('an Anthropic client streams through the proxy from an Ollama-dialect upstream', async () => {
    const ollamaProxy = await startProxy([`${upstreams[0].url},dialect=ollama`]);
    try {
        const count = await curl(`${ollamaProxy.url}/v1/messages/count_tokens`, {
            method: 'POST', body: { model: 'x', messages: [{ role: 'user', content: 'hi' }] },
        });
        assert.equal(count.status, 501);
        assert.equal(count.body.type, 'error');
        assert.match(count.body.error.message, /speaks ollama/);
        const completion = await curl(`${ollamaProxy.url}/v1/completions`, { method: 'POST', body: { prompt: 'x' } });
        assert.equal(completion.status, 501);
        assert.match(completion.body.error.message, /speaks ollama/);
        const client = new Anthropic({ baseURL: ollamaProxy.url, apiKey: 'none', maxRetries: 0 });
        const stream = client.messages.stream({
            model: 'claude-x', max_tokens: 5, system: 'be brief', messages: [{ role: 'user', content: 'translate me' }],
        });
        const events = [];
        stream.on('streamEvent', (e) => events.push(e.type));
        const final = await stream.finalMessage();
        assert.ok(events.includes('content_block_delta') || final.content.length === 0);
        assert.equal(events.at(-1), 'message_stop');
        assert.equal(final.stop_reason, 'max_tokens');
        assert.equal(final.usage.output_tokens, 5);
        const state = await cache(ollamaProxy);
        assert.equal(state.upstreams[0].dialect, 'ollama');
        assert.equal(state.upstreams[0].model, 'tiny:latest');
        assert.equal(state.upstreams[0].requests, 1);
    } finally {
        await ollamaProxy.stop();
    }
});

test('an OpenAI client streams through the proxy from an Anthropic-dialect upstream', async () => {
    const anthropicProxy = await startProxy([`${upstreams[1].url},dialect=anthropic`]);
    try {
        const stream = await openai(anthropicProxy).chat.completions.create({
            model: 'x', messages: [{ role: 'user', content: 'translate me too' }], max_tokens: 5, stream: true,
            stream_options: { include_usage: true },
        });
        let usage, finish;
        for await (const chunk of stream) {
            if (chunk.usage) usage = chunk.usage;
            for (const c of chunk.choices) finish = c.finish_reason ?? finish;
        }
        assert.equal(finish, 'length');
        assert.equal(usage.completion_tokens, 5);
        assert.ok(usage.prompt_tokens > 0);
    } finally {
        await anthropicProxy.stop();
    }
});

test('killing an upstream mid-answer fails only that request; traffic moves; the restarted upstream rejoins', async () => {
    const client = openai(proxy);
    const { data: stream, response } = await client.chat.completions
        .create({ model: 'x', messages: conversation('long'), max_tokens: 100000, ignore_eos: true, stream: true })
        .withResponse();
    const victimUrl = response.headers.get('x-keepwarm-upstream');
    const victim = upstreams.findIndex((u) => u.url === victimUrl);
    assert.ok(victim >= 0);
    let chunks = 0;
    await assert.rejects(async () => {
        for await (const _ of stream) {
            if (++chunks === 3) await upstreams[victim].stop('SIGKILL');
        }
    }, 'the request in flight ends with an error');
    assert.ok(chunks >= 3);

    // Every conversation now lands on the survivor, without errors.
    for (const name of ['alpha', 'delta', 'long']) {
        const messages = conversation(name);
        messages.push({ role: 'user', content: 'after the failure' });
        const { upstream } = await turn(client, messages);
        assert.notEqual(upstream, victimUrl);
    }
    let state = await cache(proxy);
    assert.equal(state.upstreams[victim].healthy, false);

    upstreams[victim] = await startUpstream(ports[victim]);
    const back = await waitFor(async () => (await cache(proxy)).upstreams[victim].healthy);
    assert.ok(back, 'the restarted upstream is healthy again');
    state = await cache(proxy);
    assert.equal(state.upstreams[victim].tree_blocks, 0, 'its prefix tree was forgotten');
    assert.ok(state.upstreams[victim].forgotten >= 1);
    // A new conversation goes to the least loaded: the one that rejoined has had fewer requests.
    const messages = conversation('epsilon');
    messages.push({ role: 'user', content: 'hello again' });
    assert.equal((await turn(client, messages)).upstream, victimUrl);
});

// llama-server as an upstream: scripts/test.sh builds it with bench/build-llama-server.sh (cached by llama.cpp
// commit) and passes its path in LLAMA_SERVER; otherwise it is looked up where that script leaves it.

test('three upstreams, two keepwarm and one llama-server: conversations spread and each stays home', async () => {
    const llamaServer = findLlamaServer();
    assert.ok(llamaServer, 'no llama-server: run bench/build-llama-server.sh (scripts/test.sh does) or set LLAMA_SERVER');
    const model = await testModel('tiny');
    const port = await freePort();
    const server = spawn(llamaServer, ['-m', model, '--port', String(port), '-t', '1', '-c', '4096'],
        { stdio: 'ignore' });
    const url = `http://127.0.0.1:${port}`;
    try {
        assert.ok(await waitFor(async () => (await curl(`${url}/health`)).status === 200, { timeoutMs: 60_000 }));
        const p = await startProxy([upstreams[0].url, upstreams[1].url, url]);
        try {
            // A fresh proxy: three new conversations go to the three upstreams, fewest requests first.
            const conversations = ['one', 'two', 'three'].map((name) => conversation(`${name}-of-three`));
            const homes = [];
            for (const messages of conversations) {
                messages.push({ role: 'user', content: 'hello' });
                homes.push((await turn(openai(p), messages)).upstream);
            }
            assert.deepEqual(homes, [upstreams[0].url, upstreams[1].url, url]);
            // Their next turns stay where their prefixes are, and llama-server reports its reuse through the proxy.
            for (const [i, messages] of conversations.entries()) {
                messages.push({ role: 'user', content: 'and again' });
                const next = await turn(openai(p), messages);
                assert.equal(next.upstream, homes[i]);
                assert.ok(next.data.usage.prompt_tokens_details?.cached_tokens > 0,
                          `${homes[i]} reported reuse through the proxy: ${JSON.stringify(next.data.usage)}`);
            }
            const state = await cache(p);
            assert.deepEqual(state.upstreams.map((u) => [u.requests, u.prefix_hits]), [[2, 1], [2, 1], [2, 1]]);
        } finally {
            await p.stop();
        }
    } finally {
        server.kill('SIGTERM');
    }
});

test('the proxy reports a cache buster, with the tokens its upstream had to compute because of it', async () => {
    const client = new OpenAI({ baseURL: `${proxy.url}/v1`, apiKey: 'none', maxRetries: 0,
                                defaultHeaders: { 'x-keepwarm-client': 'proxy-buster' } });
    const rules = Array.from({ length: 30 }, (_, i) => `${i + 1}. Read the files before you change rule ${i + 1}.`);
    let last;
    for (const id of [randomBytes(16).toString('hex'), randomBytes(16).toString('hex')]) {
        last = await client.chat.completions.create({ model: 'anything', max_tokens: 2, messages: [
            { role: 'system', content: `You are a coding agent.\nsession: ${id}\n${rules.join('\n')}` },
            { role: 'user', content: 'List the files.' }] });
    }
    const { body } = await curl(`${proxy.url}/v1/cache/busters`);
    assert.equal(body.mode, 'auto');  // the built-in defaults: no --policy
    const r = body.reports.find((x) => x.client === 'proxy-buster');
    assert.ok(r, JSON.stringify(body));
    assert.equal(r.api, 'openai');
    assert.equal(r.kind, 'hex_id');
    assert.equal(r.rule.pattern, 'session: [0-9a-f]{32}');
    assert.equal(r.span.role, 'system');
    // No tokenizer in the proxy: the position comes from where the upstream's reuse ended.
    assert.equal(r.span.token_offset_estimated, true);
    assert.equal(r.prompt_tokens, last.usage.prompt_tokens);
    assert.equal(r.reused_tokens, last.usage.prompt_tokens_details.cached_tokens);
    assert.ok(r.reused_tokens < 40, `reused ${r.reused_tokens}: the upstream's cache stopped at the span`);
    assert.ok(r.cost_tokens > 200 && r.cost_tokens <= r.prompt_tokens - r.reused_tokens, JSON.stringify(r));
});

test('a forced logit bias given by token text is bound to each upstream\'s own token id', async () => {
    const dir = tempDir('proxy-policy');
    const policy = path.join(dir, 'policy.toml');
    // +100 on the end-of-turn token: the answer ends at once, whatever the random model would have said.
    writeFileSync(policy, '[options]\nlogit_bias = { "<|im_end|>" = 100 }\n');
    const p = await startProxy([upstreams[0].url], ['--policy', policy]);
    try {
        const { data, response } = await openai(p).chat.completions
            .create({ model: 'anything', max_tokens: 8, messages: [{ role: 'user', content: 'Say something long.' }] })
            .withResponse();
        assert.match(response.headers.get('x-keepwarm-policy'), /logit-bias:<\|im_end\|>=100/);
        assert.equal(data.choices[0].message.content, '');
        assert.equal(data.choices[0].finish_reason, 'stop');
        assert.equal(data.usage.completion_tokens, 1);
        assert.match(p.output(), /logit_bias '<\|im_end\|>' is token \d+/);
    } finally {
        await p.stop();
    }
    // Without the policy the same request goes on.
    const { data } = await openai(proxy).chat.completions
        .create({ model: 'anything', max_tokens: 8, messages: [{ role: 'user', content: 'Say something long.' }] })
        .withResponse();
    assert.ok(data.usage.completion_tokens > 1, JSON.stringify(data.usage));
});

test('--config: upstreams and settings from a TOML file, the command line over it; mistakes name their line',
    async () => {
        const dir = tempDir('proxy-config');
        const config = path.join(dir, 'proxy.toml');
        writeFileSync(config, `alias = "team-model"\n[listen]\nport = 1\n[health]\ninterval = 0.2\n` +
            `[[upstream]]\nurl = "${upstreams[0].url}"\n[[upstream]]\nurl = "${upstreams[1].url}"\n`);
        // --port 0 wins over the file's port 1.
        const p = await startProcess(['proxy', '--config', config, '--port', '0']);
        try {
            const state = await cache(p);
            assert.deepEqual(state.upstreams.map((u) => u.url), upstreams.map((u) => u.url));
            const models = (await curl(`${p.url}/v1/models`)).body;
            assert.equal(models.data[0].id, 'team-model');
            const messages = conversation('configured');
            messages.push({ role: 'user', content: 'hello' });
            const { data } = await turn(openai(p), messages);
            assert.equal(data.object, 'chat.completion');
        } finally {
            await p.stop();
        }

        writeFileSync(config, `[[upstream]]\nurl = "${upstreams[0].url}"\ndialect = "vllm"\n`);
        const bad = spawn(binary, ['proxy', '--config', config, '--port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
        let output = '';
        bad.stdout.on('data', (c) => { output += c; });
        bad.stderr.on('data', (c) => { output += c; });
        const code = await new Promise((resolve) => bad.on('exit', resolve));
        assert.notEqual(code, 0);
        assert.match(output, /proxy\.toml:3:\d+: upstream\.dialect: dialect 'vllm' is not one of openai, anthropic, ollama/);
    });

test('raw-prompt completions are forwarded to an upstream, whole and streamed', async () => {
    const client = openai(proxy);
    const prompt = 'Once upon a time, in a kitchen far away, a cook wrote down every recipe she knew. '.repeat(3);
    const { data, response } = await client.completions
        .create({ model: 'anything', prompt, max_tokens: 4, temperature: 0 })
        .withResponse();
    assert.equal(data.object, 'text_completion');
    assert.equal(typeof data.choices[0].text, 'string');
    assert.equal(data.usage.completion_tokens, 4);
    const home = response.headers.get('x-keepwarm-upstream');
    assert.ok(upstreams.some((u) => u.url === home), home);
    // The same prompt again goes to the same upstream (its prefix is there), and streams chunk by chunk.
    const stream = await client.completions
        .create({ model: 'anything', prompt, max_tokens: 4, temperature: 0, stream: true })
        .withResponse();
    assert.equal(stream.response.headers.get('x-keepwarm-upstream'), home);
    let text = '';
    let chunks = 0;
    for await (const chunk of stream.data) {
        text += chunk.choices[0]?.text ?? '';
        chunks++;
    }
    assert.ok(chunks >= 2, `${chunks} chunks`);
    assert.equal(text, data.choices[0].text, 'greedy: the same text streamed as whole');
});

test('without --policy the proxy runs the built-in defaults: a ping never reaches an upstream, the billing nonce is kept out', async () => {
    const upstreamRequests = async () => {
        let n = 0;
        for (const u of upstreams) n += (await metrics(u.url)).keepwarm_chat_completion_requests_total ?? 0;
        return n;
    };
    const before = await upstreamRequests();
    const ping = await openai(proxy).chat.completions.create(
        { model: 'claude-haiku-4-5', max_tokens: 1, messages: [{ role: 'user', content: 'quota' }] }).withResponse();
    assert.match(ping.response.headers.get('x-keepwarm-policy'), /(^|; )ping-absorbed$/);
    assert.equal(ping.data.choices[0].message.content, 'ok');
    assert.equal(await upstreamRequests(), before, 'no upstream was asked');

    const billing = () => `x-anthropic-billing-header: cc_version=2.1.197.${randomBytes(2).toString('hex').slice(0, 3)}; ` +
        `cc_entrypoint=cli; cch=${randomBytes(3).toString('hex').slice(0, 5)};`;
    const anthropic = new Anthropic({ baseURL: proxy.url, apiKey: 'none', maxRetries: 0 });
    const request = () => ({ model: 'claude-sonnet-4-5', max_tokens: 3, temperature: 0, messages: [
        { role: 'user', content: 'List the files.' }],
    system: [{ type: 'text', text: billing() }, { type: 'text', text: 'You are a careful agent. '.repeat(60) }] });
    await anthropic.messages.create(request());
    const second = await anthropic.messages.create(request()).withResponse();
    assert.match(second.response.headers.get('x-keepwarm-policy'), /span:claude-code-billing\(replace\)/);
    const { cache_read_input_tokens: read, cache_creation_input_tokens: computed } = second.data.usage;
    assert.ok(read > 200 && computed <= 2, `the nonce no longer costs the prefix: ${JSON.stringify(second.data.usage)}`);

    const { body } = await curl(`${proxy.url}/v1/policy`);
    assert.equal(body.source, 'built-in defaults');
    assert.match(proxy.output(), /policy: built-in defaults/);
});

test('requests with one prompt_cache_key go to one upstream, and the hint reaches it', async () => {
    const client = openai(proxy);
    const used = [];
    for (const name of ['eta', 'theta', 'iota']) {
        const messages = conversation(name);
        messages.push({ role: 'user', content: 'hello' });
        used.push((await turn(client, messages, { prompt_cache_key: 'team-session-7' })).upstream);
    }
    // Nothing of their prompts matches: without the key they would spread (as 'different conversations spread').
    assert.equal(new Set(used).size, 1, used.join(' '));
    const home = (await cache(proxy)).upstreams.find((u) => u.url === used[0]);
    assert.equal(home.keyed, 2, JSON.stringify(home));
    // The upstream (keepwarm, OpenAI dialect) got the key: each request marked its prompt there.
    const upstreamCache = (await curl(`${used[0]}/v1/cache`)).body;
    assert.ok(upstreamCache.hinted.requests >= 3, JSON.stringify(upstreamCache.hinted));
});
