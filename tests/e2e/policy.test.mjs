// The policy layer (--policy FILE, the built-in defaults without one, nothing with --no-policy) through the official
// `openai` and `@anthropic-ai/sdk` clients: a per-request nonce no longer costs the prefix (also by default), pings are
// answered without the engine or the cache while a one-token request that means it is generated, strict model
// pinning, forced options, and the x-keepwarm-policy header that names what fired. A bad policy file stops start-up
// with its line.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, curl, metrics, tempDir } from './harness.mjs';

const dir = tempDir('policy');
const policyFile = path.join(dir, 'policy.toml');
writeFileSync(policyFile, `
[model]
mode = "strict"
aliases = { "claude-*" = "tiny" }

[[client]]
client = "tool-test"
tool_choice = "required"

[[client]]
client = "capped"
max_tokens_cap = 8

[[client]]
client = "greeter"
logit_bias = { "Hello" = 100 }

[[spans.rule]]
name = "request-nonce"
pattern = ' ?nonce-[0-9a-z]{12}'
action = "drop"
`);

let server;    // with the policy file
let defaults;  // the same model without a file: the built-in defaults
let plain;     // with --no-policy
before(async () => {
    [server, defaults, plain] = await Promise.all([
        startServer(['-c', '4096', '-np', '2', '--policy', policyFile]),
        startServer(['-c', '4096', '-np', '2']),
        startServer(['-c', '4096', '-np', '2', '--no-policy']),
    ]);
});
after(async () => Promise.all([server?.stop(), defaults?.stop(), plain?.stop()]));

const hex = (n) => randomBytes(n).toString('hex').slice(0, n);
// Claude Code's first system block: cc_version's suffix hashes the first user message, cch the request body.
const billing = () => `x-anthropic-billing-header: cc_version=2.1.197.${hex(3)}; cc_entrypoint=cli; cch=${hex(5)};`;
const instructions = Array.from({ length: 60 }, (_, i) =>
    `Rule ${i}: read the files you change, keep each edit small, and run the tests before you answer.`).join('\n');
const agentRequest = (extra = {}) => ({
    model: 'tiny',
    messages: [
        { role: 'system', content: `${billing()}\n${instructions}` },
        { role: 'user', content: 'List the files in the repository.' },
    ],
    temperature: 0,
    max_tokens: 4,
    ...extra,
});

const cacheCounters = async (url) => {
    const { body } = await curl(`${url}/v1/cache`);
    return { lookups: body.lookups, hits: body.hits, misses: body.misses };
};

test('a per-request cch= nonce: a policy file and the defaults keep the whole prefix, --no-policy recomputes it', async () => {
    for (const s of [server, defaults, plain]) {
        const openai = s.client();
        await openai.chat.completions.create(agentRequest());
        const second = await openai.chat.completions.create(agentRequest()).withResponse();
        const { cached_tokens: cached } = second.data.usage.prompt_tokens_details;
        const prompt = second.data.usage.prompt_tokens;
        assert.ok(prompt > 900, `a long prefix: ${prompt} tokens`);
        if (s === plain) {
            assert.ok(cached < 50, `the nonce near the start ends reuse there: ${cached} cached`);
            assert.equal(second.response.headers.get('x-keepwarm-policy'), null);
        } else {
            assert.equal(cached, prompt - 1, 'everything but the last token reused');
            assert.match(second.response.headers.get('x-keepwarm-policy'), /span:claude-code-billing\(replace\)/);
        }
    }
});

test('the defaults keep Claude Code\'s nonce out of the cache through the Anthropic API too', async () => {
    const anthropic = new Anthropic({ baseURL: defaults.url, apiKey: 'none', maxRetries: 0 });
    // As Claude Code sends it: the billing line is the first system block.
    const request = () => ({
        model: 'claude-sonnet-4-5',
        max_tokens: 4,
        temperature: 0,
        system: [{ type: 'text', text: billing() }, { type: 'text', text: instructions }],
        messages: [{ role: 'user', content: 'List the files in the repository.' }],
    });
    await anthropic.messages.create(request());
    const second = await anthropic.messages.create(request());
    const { cache_read_input_tokens: read, cache_creation_input_tokens: computed } = second.usage;
    assert.ok(read + computed > 900, `a long prefix: ${read + computed} tokens`);
    assert.equal(computed, 1, `everything but the last token reused: ${JSON.stringify(second.usage)}`);
});

test('the defaults absorb a health ping and generate a one-token request that means it', async () => {
    const openai = defaults.client();
    const before = (await metrics(defaults.url)).keepwarm_requests_total ?? 0;
    // Claude Code's quota check and an Ollama client's num_predict 1 ping: a few words, one token, no tools.
    const quota = await openai.chat.completions.create(
        { model: 'claude-haiku-4-5', max_tokens: 1, messages: [{ role: 'user', content: 'quota' }] }).withResponse();
    assert.match(quota.response.headers.get('x-keepwarm-policy'), /(^|; )ping-absorbed$/);
    assert.equal(quota.data.choices[0].message.content, 'ok');
    const { body: pong } = await curl(`${defaults.url}/api/chat`, { method: 'POST', body:
        { model: 'tiny', stream: false, messages: [{ role: 'user', content: 'hi' }], options: { num_predict: 1 } } });
    assert.equal(pong.message.content, 'ok');
    assert.equal((await metrics(defaults.url)).keepwarm_requests_total ?? 0, before, 'the engine was not asked');

    // A classification asks for one token with its text: the model answers it.
    const classify = await openai.chat.completions.create({ model: 'tiny', max_tokens: 1, temperature: 0, messages: [
        { role: 'user', content: 'Review: "Great phone, but the battery dies by noon." Is it positive? Answer yes or no.' },
    ] }).withResponse();
    assert.equal(classify.response.headers.get('x-keepwarm-policy'), null);
    assert.equal(classify.data.usage.completion_tokens, 1);
    assert.ok(classify.data.usage.prompt_tokens > 10);
    assert.equal((await metrics(defaults.url)).keepwarm_requests_total, before + 1);
});

test('x-keepwarm-policy names every rule that fired, whole and streamed, and the log says the same', async () => {
    const openai = server.client({ defaultHeaders: { 'x-keepwarm-client': 'capped' } });
    const params = agentRequest({ model: 'claude-sonnet-4', max_tokens: 50, ignore_eos: true });
    params.messages[1].content += ` Request nonce-${hex(12)}.`;
    const expected = 'model-alias:claude-sonnet-4->tiny; max-tokens-cap:8; span:claude-code-billing(replace); ' +
                     'span:request-nonce(drop)';
    const { data, response } = await openai.chat.completions.create(params).withResponse();
    assert.equal(response.headers.get('x-keepwarm-policy'), expected);
    assert.equal(data.usage.completion_tokens, 8, 'the cap applies');
    assert.equal(data.choices[0].finish_reason, 'length');
    assert.match(server.output(), new RegExp(`${data.id} policy \\(capped via openai\\): ${expected.replace(/[()]/g, '\\$&')}`));

    const streamed = await openai.chat.completions.create({ ...params, stream: true }).withResponse();
    assert.equal(streamed.response.headers.get('x-keepwarm-policy'), expected);
    let chunks = 0;
    for await (const chunk of streamed.data) chunks += chunk.choices.length;
    assert.ok(chunks > 0);

    // A request the policy leaves alone carries no header.
    const untouched = await server.client().chat.completions.create(
        { model: 'tiny', messages: [{ role: 'user', content: 'Nothing to change here.' }], max_tokens: 2 }).withResponse();
    assert.equal(untouched.response.headers.get('x-keepwarm-policy'), null);
});

test('a ping is answered without the engine, a slot or the cache', async () => {
    const openai = server.client();
    // A conversation whose next turn must still find all of its prefix.
    const turn = agentRequest({ max_tokens: 6 });
    const first = await openai.chat.completions.create(turn);
    const cacheBefore = await cacheCounters(server.url);
    const metricsBefore = await metrics(server.url);

    const ping = { model: 'tiny', messages: [{ role: 'user', content: 'ping' }], max_tokens: 1 };
    const { data, response } = await openai.chat.completions.create(ping).withResponse();
    assert.equal(response.headers.get('x-keepwarm-policy'), 'ping-absorbed');
    assert.equal(data.object, 'chat.completion');
    assert.equal(data.choices[0].message.role, 'assistant');
    assert.equal(data.choices[0].message.content, 'ok');
    assert.equal(data.choices[0].finish_reason, 'stop');
    assert.equal(data.usage.prompt_tokens, 0);
    assert.equal(data.usage.completion_tokens, 0);

    const stream = await openai.chat.completions.create({ ...ping, stream: true, stream_options: { include_usage: true } })
        .withResponse();
    assert.equal(stream.response.headers.get('x-keepwarm-policy'), 'ping-absorbed');
    let text = '';
    let finish = null;
    let usage = null;
    for await (const chunk of stream.data) {
        usage = chunk.usage ?? usage;
        for (const choice of chunk.choices) {
            text += choice.delta?.content ?? '';
            finish = choice.finish_reason ?? finish;
        }
    }
    assert.equal(text, 'ok');
    assert.equal(finish, 'stop');
    assert.equal(usage.prompt_tokens, 0);

    assert.deepEqual(await cacheCounters(server.url), cacheBefore, '/v1/cache lookups, hits and misses unchanged');
    const metricsAfter = await metrics(server.url);
    for (const name of ['keepwarm_requests_total', 'keepwarm_prompt_tokens_total', 'keepwarm_generated_tokens_total',
                        'keepwarm_decode_steps_total', 'keepwarm_cache_hits_total', 'keepwarm_cache_misses_total']) {
        assert.equal(metricsAfter[name], metricsBefore[name], name);
    }

    const next = await openai.chat.completions.create({
        ...turn,
        messages: [...turn.messages, first.choices[0].message, { role: 'user', content: 'And the tests?' }],
    });
    assert.ok(next.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1,
              `cached ${next.usage.prompt_tokens_details.cached_tokens} of the first turn's ${first.usage.prompt_tokens}`);
});

test('strict mode rejects an unknown model with a 404 and touches nothing', async () => {
    const before = await cacheCounters(server.url);
    await assert.rejects(
        server.client().chat.completions.create({ ...agentRequest(), model: 'llama3:70b' }),
        (err) => {
            assert.equal(err.status, 404);
            assert.match(err.message, /model 'llama3:70b' is not served here; this server serves 'tiny'/);
            assert.equal(err.type, 'model_not_found');
            return true;
        });
    assert.deepEqual(await cacheCounters(server.url), before);
    // The server without a policy serves any name.
    const any = await plain.client().chat.completions.create({ ...agentRequest(), model: 'llama3:70b' }).withResponse();
    assert.equal(any.response.headers.get('x-keepwarm-policy'), 'model-alias:llama3:70b->tiny');
});

test('a forced tool_choice makes a random model answer with a tool call', async () => {
    // The reply starts a call (a trailing assistant message is continued); only with tool_choice "required" does the
    // grammar force that call to complete (under "auto" the grammar waits for a trigger the prompt already holds).
    const tokenize = async (content) =>
        (await curl(`${server.url}/tokenize`, { method: 'POST', body: { content } })).body.tokens;
    const [endOfTurn] = await tokenize('<|im_end|>');
    const [closeTag] = await tokenize('</tool_call>');
    const params = {
        model: 'tiny',
        messages: [{ role: 'user', content: 'What is the weather in Paris?' },
                   { role: 'assistant', content: '<tool_call>\n' }],
        tools: [{
            type: 'function',
            function: {
                name: 'get_weather',
                parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Rome'] } },
                              required: ['city'], additionalProperties: false },
            },
        }],
        temperature: 0,
        max_tokens: 60,
        logit_bias: { [endOfTurn]: 100, [closeTag]: 100 },
    };
    const forced = await server.client({ defaultHeaders: { 'x-keepwarm-client': 'tool-test' } }).chat.completions
        .create(params).withResponse();
    assert.equal(forced.response.headers.get('x-keepwarm-policy'), 'tool-choice:required');
    const choice = forced.data.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
    assert.equal(choice.message.tool_calls[0].function.name, 'get_weather');
    assert.ok(['Paris', 'Rome'].includes(JSON.parse(choice.message.tool_calls[0].function.arguments).city));

    const free = await server.client().chat.completions.create(params);
    assert.equal(free.choices[0].message.tool_calls, undefined, 'without the rule: no call');
});

test('a forced logit bias, named by its token text, steers every reply of that client', async () => {
    const params = { model: 'tiny', messages: [{ role: 'user', content: 'Say something.' }], temperature: 0,
                     max_tokens: 4, ignore_eos: true };
    const greeter = server.client({ defaultHeaders: { 'x-keepwarm-client': 'greeter' } });
    const { data, response } = await greeter.chat.completions.create(params).withResponse();
    assert.equal(response.headers.get('x-keepwarm-policy'), 'logit-bias:Hello=100');
    assert.equal(data.choices[0].message.content, 'Hello'.repeat(4));
    // The policy's bias replaces the client's own for that token.
    const [hello] = (await curl(`${server.url}/tokenize`, { method: 'POST', body: { content: 'Hello' } })).body.tokens;
    const banned = await greeter.chat.completions.create({ ...params, logit_bias: { [hello]: -100 } });
    assert.equal(banned.choices[0].message.content, 'Hello'.repeat(4));
    const other = await server.client().chat.completions.create(params);
    assert.notEqual(other.choices[0].message.content, 'Hello'.repeat(4));
});

test('GET /v1/policy returns the effective policy', async () => {
    const { status, body } = await curl(`${server.url}/v1/policy`);
    assert.equal(status, 200);
    assert.equal(body.source, policyFile);
    assert.equal(body.served_model, 'tiny');
    assert.equal(body.model.mode, 'strict');
    assert.deepEqual(body.model.aliases, { 'claude-*': 'tiny' });
    assert.deepEqual(body.clients.map((c) => c.match.client), ['tool-test', 'capped', 'greeter']);
    assert.deepEqual(body.clients[2].options, { logit_bias: { Hello: 100 } });
    assert.equal(body.ping.enabled, true);
    assert.deepEqual(body.spans.map((s) => s.name), ['claude-code-billing', 'uuid', 'timestamp', 'request-nonce']);
    const builtIn = await curl(`${defaults.url}/v1/policy`);
    assert.equal(builtIn.body.source, 'built-in defaults');
    assert.equal(builtIn.body.ping.enabled, true);
    assert.deepEqual(builtIn.body.ping.match, [{ max_tokens_at_most: 1, prompt_chars_at_most: 32, tools: false }]);
    assert.deepEqual(builtIn.body.spans.map((s) => [s.name, s.action]),
                     [['claude-code-billing', 'replace'], ['uuid', 'move'], ['timestamp', 'move']]);
    assert.equal(builtIn.body.detect.mode, 'auto');
    assert.match(defaults.output(), /policy: built-in defaults \(model any, 0 aliases; 0 client rules; pings absorbed; spans: claude-code-billing, uuid, timestamp; cache-buster detection auto\)/);
    const none = await curl(`${plain.url}/v1/policy`);
    assert.equal(none.body.source, null);
    assert.deepEqual(none.body.spans, []);
    assert.equal(none.body.ping.enabled, false);
    assert.equal(none.body.detect.mode, 'off');
});

test('a bad policy file stops start-up with its line', async () => {
    const bad = path.join(dir, 'bad.toml');
    writeFileSync(bad, '[model]\nmode = "any"\n\n[[spans.rule]]\nname = "backref"\npattern = \'(a+)\\1\'\n');
    // Both stop before the model loads (serve logs "bound ...; loading the model" when it starts to).
    await assert.rejects(startServer(['--policy', bad]), (err) => {
        assert.match(err.message, /serve exited with 1/);
        assert.doesNotMatch(err.message, /loading the model/);
        assert.match(err.message, new RegExp(`ERROR serve: ${bad.replace(/[.]/g, '\\.')}:6:11: span rule 'backref': ` +
                                             'invalid pattern'));
        return true;
    });
    const unknownKey = path.join(dir, 'unknown.toml');
    writeFileSync(unknownKey, '[options]\nthinking = false\ntemprature = 0.2\n');
    await assert.rejects(startServer(['--policy', unknownKey]), (err) => {
        assert.match(err.message, /unknown\.toml:3:1: unknown key 'temprature' in \[options\]/);
        assert.doesNotMatch(err.message, /loading the model/);
        return true;
    });
    // A forced bias must name one token of the model: checked once the vocabulary is loaded.
    const multiToken = path.join(dir, 'multi-token.toml');
    writeFileSync(multiToken, '[options]\nlogit_bias = { "</tool_call>" = 100 }\n');
    await assert.rejects(startServer(['--policy', multiToken]),
                         /logit_bias names '<\/tool_call>', which is not a single token of this model/);
});
